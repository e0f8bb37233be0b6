"""The shipped demo pair: a small Qwen3 target and a DFlash drafter trained on Python's own
standard-library sources, and the code that trained them (``bastion train``, ``bastion demo``).

Importing this package imports neither torch nor transformers; the training and demo modules do.
"""

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent / "models"
TARGET_DIR = MODELS_DIR / "target"
DRAFTER_DIR = MODELS_DIR / "drafter"
PROMPTS_FILE = MODELS_DIR / "prompts.json"
# prompts from the training split, disjoint from PROMPTS_FILE, for timing the machine
# (bastion.demo.corpus.calibration_prompts(load_corpus(), exclude=held-out prompts))
CALIBRATION_PROMPTS_FILE = MODELS_DIR / "calibration_prompts.json"

__all__ = ["CALIBRATION_PROMPTS_FILE", "DRAFTER_DIR", "MODELS_DIR", "PROMPTS_FILE", "TARGET_DIR"]
