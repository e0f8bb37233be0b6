"""The shipped demo pairs: Qwen3 targets and DFlash drafters trained on Python's own
standard-library sources, and the code that trained them (``bastion train``, ``bastion demo``).

- ``small`` (``models/target``, ``models/drafter``): a 2 M-parameter target (8.6 MB in fp32,
  inside a CPU's L3 cache) and a drafter trained on the corpus's text. The tests' pair.
- ``base`` (``models/base/``): an 18 M-parameter target (72 MB in fp32, beyond the cache, so
  that its step is dominated by reading its weights) and a drafter trained on the target's own
  continuations. Stored in bf16, upcast to fp32 at load. The demo's default.

Importing this package imports neither torch nor transformers; the training and demo modules do.
"""

from dataclasses import dataclass
from pathlib import Path

from bastion.errors import ConfigError

MODELS_DIR = Path(__file__).resolve().parent / "models"
TARGET_DIR = MODELS_DIR / "target"  # the small pair's
DRAFTER_DIR = MODELS_DIR / "drafter"
PROMPTS_FILE = MODELS_DIR / "prompts.json"
# prompts from the training split, disjoint from PROMPTS_FILE, for timing the machine
# (bastion.demo.corpus.calibration_prompts(load_corpus(), exclude=held-out prompts))
CALIBRATION_PROMPTS_FILE = MODELS_DIR / "calibration_prompts.json"


@dataclass(frozen=True)
class Pair:
    """A shipped (target, drafter) pair's directories."""

    name: str
    target: Path
    drafter: Path

    def require_installed(self) -> None:
        """Raise ConfigError unless both models of the pair are on disk."""
        for d, what in ((self.target, "target"), (self.drafter, "drafter")):
            if not (d / "config.json").is_file():
                raise ConfigError(
                    f"the {self.name} pair's {what} is not installed at {d} (no config.json); "
                    f"train it with `bastion train {what} --pair {self.name}`"
                )


PAIRS = {
    "small": Pair("small", TARGET_DIR, DRAFTER_DIR),
    "base": Pair("base", MODELS_DIR / "base" / "target", MODELS_DIR / "base" / "drafter"),
}
DEFAULT_PAIR = "base"


def get_pair(name: str) -> Pair:
    """The shipped pair called ``name`` (``small`` or ``base``)."""
    if not isinstance(name, str) or name not in PAIRS:
        raise ConfigError(f"unknown demo pair {name!r}; the shipped pairs are {', '.join(PAIRS)}")
    return PAIRS[name]


__all__ = [
    "CALIBRATION_PROMPTS_FILE",
    "DEFAULT_PAIR",
    "DRAFTER_DIR",
    "MODELS_DIR",
    "PAIRS",
    "PROMPTS_FILE",
    "TARGET_DIR",
    "Pair",
    "get_pair",
]
