"""``bastion demo``: the real pipeline, end to end on CPU, with the shipped trained pair.

On held-out prompts (the first lines of standard-library files the models never saw, shipped in
``models/prompts.json``) it decodes with target-only AR, the DFlash chain (block 16), fixed-N
best-first and Bastion's adaptive controller through the one engine loop; checks that every
policy's output equals AR's at T = 0 (losslessness); and reports τ, mean tree size and time per
output token per policy. The adaptive policy's cost model is calibrated on this CPU first
(``bastion calibrate --target``, cached), and the calibration's RMSE before/after is reported.

What this module does not do: train (see :mod:`bastion.demo.train`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bastion.demo import DRAFTER_DIR, PROMPTS_FILE, TARGET_DIR
from bastion.errors import ConfigError

__all__ = ["DEMO_POLICIES", "DemoResult", "PolicyRow", "load_prompts", "run_demo"]

log = logging.getLogger(__name__)

DEMO_POLICIES = ("ar", "chain", "fixed:32", "bastion")
CALIBRATION_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CALIBRATION_CONTEXTS = (64, 256)


@dataclass(frozen=True)
class PolicyRow:
    policy: str
    tau: float  # committed tokens per step, bonus included, macro-averaged over prompts
    mean_tree_size: float
    tpot_s: float  # mean over prompts of each run's time per output token
    speedup: float  # AR's mean TPOT / this policy's
    steps: int


@dataclass
class DemoResult:
    rows: list[PolicyRow]
    identical: bool  # every policy's output equals AR's, on every prompt
    outputs: dict[str, list[list[int]]] = field(default_factory=dict)
    acceptance: dict[str, list[list[int]]] = field(default_factory=dict)
    calibration: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policies": [r.__dict__ for r in self.rows],
            "identical": self.identical,
            "calibration": self.calibration,
        }


def load_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    if not path.exists():
        raise ConfigError(f"{path} is missing; the demo models are not installed")
    prompts = json.loads(path.read_text())
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ConfigError(f"{path} must hold a JSON list of prompt strings")
    return prompts


def run_demo(
    prompts: Sequence[str] | None = None,
    max_new_tokens: int = 64,
    policies: Sequence[str] = DEMO_POLICIES,
    calibrate: bool = True,
    record_dir: Path | None = None,
    target_dir: Path = TARGET_DIR,
    drafter_dir: Path = DRAFTER_DIR,
    progress: Callable[[str], None] | None = None,
) -> DemoResult:
    """Decode ``prompts`` with every policy; compare outputs; summarise. Needs torch."""
    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter, generate, load_target
    from bastion.backends.torch.calibrate import calibrate_target
    from bastion.cost.costmodel import RooflineCostModel
    from bastion.cost.models import DrafterSpec, ModelSpec

    for d in (target_dir, drafter_dir):
        if not (d / "config.json").exists():
            raise ConfigError(f"no model at {d}; train it with `bastion train` or reinstall")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be ≥ 1; got {max_new_tokens}")
    texts = list(prompts) if prompts is not None else load_prompts()
    target = load_target(target_dir, "cpu")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    prompt_ids = [list(tokenizer(t)["input_ids"]) for t in texts]

    cost_model = None
    calibration: dict[str, float] = {}
    if calibrate and any(p.startswith("bastion") for p in policies):
        if progress:
            progress("calibrating the cost model on this CPU")
        record, hw, spec = calibrate_target(
            target, tokens=CALIBRATION_TOKENS, contexts=CALIBRATION_CONTEXTS, repeats=3
        )
        draft_spec = DrafterSpec(
            model=ModelSpec.from_hf_config(drafter_dir / "config.json", name="demo-drafter"),
            block_size=drafter.cfg.block_size,
            taps=len(drafter.cfg.target_layer_ids),
        )
        cost_model = RooflineCostModel(hw, spec, draft_spec, calibration=record)
        calibration = {
            "rmse_bare_s": record.rmse_bare_s,
            "rmse_calibrated_s": record.rmse_calibrated_s,
            "points": float(len(record.points)),
        }

    eos = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[arg-type]
    outputs: dict[str, list[list[int]]] = {}
    acceptance: dict[str, list[list[int]]] = {}
    stats: dict[str, list[tuple[float, float, float, int]]] = {}
    for name in policies:
        if progress:
            progress(f"decoding with {name}")
        for i, ids in enumerate(prompt_ids):
            trace = None
            if record_dir is not None and name != "ar":  # AR drafts nothing to replay
                record_dir.mkdir(parents=True, exist_ok=True)
                trace = record_dir / f"{name.replace(':', '-')}-{i}.json"
            report = generate(
                target,
                drafter if name != "ar" else None,
                name,
                ids,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                cost_model=cost_model if name.startswith("bastion") else None,
                record_trace=trace,
                trace_metadata={"prompt_id": i, "target": "bastion-demo"},
                dense_trace=trace is not None,
            )
            outputs.setdefault(name, []).append(list(report.output_ids))
            acceptance.setdefault(name, []).append(list(report.acceptance_lengths))
            sizes = [t["size"] for t in report.trees] or [1]
            stats.setdefault(name, []).append(
                (report.tau, float(np.mean(sizes)), report.time_per_output_token, len(sizes))
            )
    ar_tpot = float(np.mean([s[2] for s in stats["ar"]])) if "ar" in stats else float("nan")
    rows = []
    for name in policies:
        s = stats[name]
        tpot = float(np.mean([x[2] for x in s]))
        rows.append(
            PolicyRow(
                policy=name,
                tau=float(np.mean([x[0] for x in s])),
                mean_tree_size=float(np.mean([x[1] for x in s])),
                tpot_s=tpot,
                speedup=ar_tpot / tpot if tpot > 0 else float("nan"),
                steps=int(sum(x[3] for x in s)),
            )
        )
    reference = outputs[policies[0]]
    identical = all(outputs[p] == reference for p in policies)
    return DemoResult(rows, identical, outputs, acceptance, calibration)
