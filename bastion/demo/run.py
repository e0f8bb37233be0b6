"""``bastion demo``: the real pipeline, end to end on CPU, with the shipped trained pair.

On held-out prompts (the first lines of standard-library files the models never saw, shipped in
``models/prompts.json``) it decodes with target-only AR, the DFlash chain (block 16), fixed-N
best-first and Bastion's adaptive controller through the one engine step, at each batch size
asked for (continuous batching: all prompts, B at a time); checks that every policy's output at
every batch size equals AR's at the first (losslessness, T = 0); and reports τ, mean tree size,
time per output token (median and spread over ``repeats`` timed runs, after ``warmup``
untimed ones), throughput, and the cost model's predicted cycle time next to the measured one.
The adaptive policy's cost model is calibrated on this CPU first (``bastion calibrate
--target``, cached) and its T_draft fitted to the drafter's measured batched pass (cached too);
the calibration's RMSE before/after is reported.

What this module does not do: train (see :mod:`bastion.demo.train`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bastion.demo import DRAFTER_DIR, PROMPTS_FILE, TARGET_DIR
from bastion.errors import ConfigError
from bastion.guard import integer, public, readable_file
from bastion.records import json_safe

__all__ = ["DEMO_POLICIES", "DemoResult", "PolicyRow", "load_prompts", "run_demo"]

log = logging.getLogger(__name__)

DEMO_POLICIES = ("ar", "chain", "fixed:32", "bastion")
CALIBRATION_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CALIBRATION_CONTEXTS = (64, 256)


@dataclass(frozen=True)
class PolicyRow:
    """One policy at one batch size, in the record vocabulary (:mod:`bastion.records`)."""

    policy: str
    tau: float  # committed tokens per step, bonus included, macro-averaged over prompts
    mean_tree_size: float
    tpot_s: float  # median over timed runs of the requests' mean time per output token
    speedup: float  # AR's TPOT at the same batch size / this policy's
    steps: int  # batched steps of one run
    batch_size: int = 1
    tpot_min_s: float = float("nan")  # spread of tpot_s over the timed runs
    tpot_max_s: float = float("nan")
    throughput_tok_s: float = float("nan")  # median over timed runs, prefills included
    # mean Ĉ of the steps taken: the learning controller's own prediction for its choice, the
    # cost model's price of the step (AR steps without a draft pass) for any other policy
    cycle_predicted_s: float = float("nan")
    cycle_observed_s: float = float("nan")  # mean measured draft + build + verify
    predicted_draft_s: float = float("nan")
    measured_draft_s: float = float("nan")
    policy_spec: str = ""
    tokens: int = 0  # output tokens over all prompts (first timed run)
    ttft_mean_s: float = float("nan")  # over the prompts of the first timed run
    ttft_p50_s: float = float("nan")
    ttft_p99_s: float = float("nan")
    tpot_p50_s: float = float("nan")
    tpot_p99_s: float = float("nan")
    e2e_mean_s: float = float("nan")
    e2e_p50_s: float = float("nan")
    e2e_p99_s: float = float("nan")
    acceptance_rate: float = float("nan")  # nan for AR (no draft)
    acceptance_by_position: tuple[float, ...] = ()

    @property
    def cycle_measured_s(self) -> float:
        """The previous release's name of :attr:`cycle_observed_s` (deprecated)."""
        warnings.warn(
            "PolicyRow.cycle_measured_s is renamed cycle_observed_s (bastion.records)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.cycle_observed_s


@dataclass
class DemoResult:
    rows: list[PolicyRow]
    # every policy's output at every batch size equals AR's, on every prompt (and each of a
    # policy's timed runs decoded what its first did)
    identical: bool
    outputs: dict[str, list[list[int]]] = field(default_factory=dict)  # at the first batch size
    acceptance: dict[str, list[list[int]]] = field(default_factory=dict)  # likewise
    calibration: dict[str, float] = field(default_factory=dict)
    batched_outputs: dict[int, dict[str, list[list[int]]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            # one per policy and batch size
            "records": [json_safe(dataclasses.asdict(r)) for r in self.rows],
            "identical": self.identical,
            "calibration": json_safe(self.calibration),
        }


def _learns(policy: str) -> bool:
    """Whether a demo policy spec is the learning controller (``bastion[:N_MAX]``)."""
    from bastion.policies import make_policy

    return bool(getattr(make_policy(policy), "learns", False))


def _joined(parts: Sequence[Any]) -> Any:
    """One timed run made of the single runs of consecutive batches of its prompts: walls and
    tokens add up; the TPOT is the mean over every request, as for a run in one piece."""
    from bastion.backends.torch.runner import RunTiming

    runs = [part.runs[0] for part in parts]
    requests = [len(part.records) for part in parts]
    return RunTiming(
        sum(run.wall_s for run in runs),
        sum(run.output_tokens for run in runs),
        sum(run.tpot_s * n for run, n in zip(runs, requests, strict=True)) / sum(requests),
    )


@public(path=readable_file)
def load_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    if not path.exists():
        raise ConfigError(f"{path} is missing; the demo models are not installed")
    prompts = json.loads(path.read_text())
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ConfigError(f"{path} must hold a JSON list of prompt strings")
    return prompts


@public(max_new_tokens=integer(1, 1 << 20), repeats=integer(1, 1000), warmup=integer(0, 1000))
def run_demo(
    prompts: Sequence[str] | None = None,
    max_new_tokens: int = 64,
    policies: Sequence[str] = DEMO_POLICIES,
    calibrate: bool = True,
    record_dir: Path | None = None,
    target_dir: Path = TARGET_DIR,
    drafter_dir: Path = DRAFTER_DIR,
    progress: Callable[[str], None] | None = None,
    batch_sizes: Sequence[int] = (1,),
    repeats: int = 1,
    warmup: int = 1,
) -> DemoResult:
    """Decode ``prompts`` with every policy at every batch size; compare; summarise. Needs torch.

    Each policy's first timed run follows its warm-up; the other ``repeats − 1`` timed runs go
    in rounds, and within a round the policies take turns batch by batch (``b`` prompts at a
    time, the order reversed at every turn), so the machine's drift, seconds long on a shared
    CPU, reaches every policy's runs alike instead of one policy's whole run. A run's TPOT is
    the mean over its requests, as for a run in one piece. A learning controller keeps one
    learner over its runs.

    Traces (``record_dir``) are recorded at the first batch size, for every policy but AR and
    the learning controller (a trace needs a draft at every step, which it may skip)."""
    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter, generate_batch, load_target
    from bastion.backends.torch.calibrate import calibrate_drafter, calibrate_target
    from bastion.backends.torch.timing import with_draft_timing
    from bastion.cost.costmodel import RooflineCostModel

    for model_dir in (target_dir, drafter_dir):
        if not (model_dir / "config.json").exists():
            raise ConfigError(
                f"no model at {model_dir}; train it with `bastion train` or reinstall"
            )
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be ≥ 1; got {max_new_tokens}")
    if not batch_sizes or min(batch_sizes) < 1:
        raise ConfigError(f"batch sizes must be ≥ 1; got {list(batch_sizes)}")
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be ≥ 1 and warmup ≥ 0; got {repeats}, {warmup}")
    texts = list(prompts) if prompts is not None else load_prompts()
    if not texts:
        raise ConfigError("no prompts to decode")
    target = load_target(target_dir, "cpu")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    prompt_ids = [list(tokenizer(t)["input_ids"]) for t in texts]

    cost_model = None
    calibration: dict[str, float] = {}
    if calibrate:
        if progress:
            progress("calibrating the cost model on this CPU (target and drafter)")
        record, hw, spec = calibrate_target(
            target, tokens=CALIBRATION_TOKENS, contexts=CALIBRATION_CONTEXTS, repeats=3
        )
        timing = calibrate_drafter(target, drafter)
        cost_model = with_draft_timing(RooflineCostModel(hw, spec, calibration=record), timing)
        calibration = {
            "rmse_bare_s": record.rmse_bare_s,
            "rmse_calibrated_s": record.rmse_calibrated_s,
            "points": float(len(record.points)),
            "draft_d0_s": timing.d0_s,
            "draft_d_batch_s": timing.d_batch_s,
            "draft_d_context_s": timing.d_context_s,
            "draft_rmse_s": timing.rmse_s,
            "draft_points": float(len(timing.points)),
        }

    learned = None  # the learning controller's start-up table, timed once on this CPU
    if cost_model is not None and any(_learns(name) for name in policies):
        from bastion.backends.torch.calibrate import calibrate_cycles_on_device
        from bastion.learned import LearnedCostModel

        if progress:
            progress("timing the learning controller's start-up cycles on this CPU")
        learned = LearnedCostModel(cost_model)
        startup = calibrate_cycles_on_device(learned, target, drafter)
        calibration["startup_cycles"] = float(startup["passes"])
        calibration["startup_device_s"] = float(startup["device_s"])

    eos = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[arg-type]
    batched: dict[int, dict[str, list[list[int]]]] = {}
    acceptance: dict[str, list[list[int]]] = {}
    rows = []
    repeated = True  # every timed run of a policy decoded what its first did

    def decode(name: str, b: int, model: Any, part: Any = None, **options: Any) -> Any:
        """One generate_batch run of policy ``name`` on the prompts (or ``part`` of them) at
        batch ``b``."""
        return generate_batch(
            target,
            drafter if name != "ar" else None,
            name,
            prompt_ids if part is None else part,
            batch_size=b,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            cost_model=model,
            **options,
        )

    for b_i, b in enumerate(batch_sizes):
        reports: dict[str, Any] = {}
        models: dict[str, Any] = {}
        for name in policies:
            if progress:
                progress(f"decoding with {name} at batch {b}")
            traces = None
            # AR drafts nothing; the learning controller would have to draft every step
            if record_dir is not None and name != "ar" and not _learns(name) and b_i == 0:
                record_dir.mkdir(parents=True, exist_ok=True)
                traces = [
                    record_dir / f"{name.replace(':', '-')}-{i}.json"
                    for i in range(len(prompt_ids))
                ]
            models[name] = (
                learned.copy()
                if learned is not None and _learns(name)
                else cost_model
                if name.startswith("bastion")
                else None
            )
            reports[name] = decode(
                name,
                b,
                models[name],
                predict_cycles=cost_model,
                record_traces=traces,
                trace_metadata={"target": "bastion-demo"},
                dense_trace=traces is not None,
                warmup=warmup,
            )
        # the other timed runs in rounds; within a round the policies take turns batch by
        # batch (the order reversed at every turn), so that a slow spell of the machine spreads
        # over every policy instead of slowing one policy's whole run
        chunks = [prompt_ids[i : i + b] for i in range(0, len(prompt_ids), b)]
        turn = 0
        for r in range(1, repeats):
            if progress:
                progress(f"timed run {r + 1} of {repeats} at batch {b}, policies taking turns")
            parts: dict[str, list[Any]] = {name: [] for name in policies}
            for chunk in chunks:
                for name in policies if turn % 2 else policies[::-1]:
                    # a learner keeps learning, as in one session
                    parts[name].append(decode(name, b, models[name], chunk))
                turn += 1
            for name in policies:
                reports[name].runs.append(_joined(parts[name]))
                outputs = [list(x.output_ids) for part in parts[name] for x in part.records]
                repeated &= outputs == [list(x.output_ids) for x in reports[name].records]
        ar_tpot = reports["ar"].tpot_s if "ar" in reports else float("nan")
        for name in policies:
            report = reports[name]
            batched.setdefault(b, {})[name] = [list(r.output_ids) for r in report.records]
            if b_i == 0:
                acceptance[name] = [list(r.committed_per_step) for r in report.records]
            tpot: dict[str, float] = report.to_dict()["repeats"]["tpot_s"]
            cycle = report.cycle
            nan = float("nan")
            rows.append(
                PolicyRow(
                    policy=name,
                    tau=float(np.mean([r.tau for r in report.records])),
                    mean_tree_size=float(np.mean([r.mean_tree_size for r in report.records])),
                    tpot_s=tpot["median"],
                    speedup=ar_tpot / tpot["median"] if tpot["median"] > 0 else nan,
                    steps=report.steps,
                    batch_size=b,
                    tpot_min_s=tpot["min"],
                    tpot_max_s=tpot["max"],
                    throughput_tok_s=report.throughput_tok_s,
                    cycle_predicted_s=cycle.get("predicted_s", nan),
                    cycle_observed_s=cycle.get("measured_s", nan),
                    predicted_draft_s=cycle.get("predicted_draft_s", nan),
                    measured_draft_s=cycle.get("measured_draft_s", nan),
                    policy_spec=report.policy_spec,
                    tokens=report.tokens,
                    **report.latency(),  # floats, by name
                    **report.acceptance(),
                )
            )
    first = batched[batch_sizes[0]]
    reference = first[policies[0]]
    identical = repeated and all(out[p] == reference for out in batched.values() for p in policies)
    return DemoResult(rows, identical, dict(first), acceptance, calibration, batched)
