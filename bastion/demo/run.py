"""``bastion demo``: the real pipeline, end to end on CPU, with the shipped trained pair.

On held-out prompts (the first lines of standard-library files the models never saw, shipped in
``models/prompts.json``) it decodes with target-only AR, the DFlash chain (block 16), fixed-N
best-first and Bastion's adaptive controller through the one engine step, at each batch size
asked for (continuous batching: all prompts, B at a time); checks that every policy's output at
every batch size equals AR's at the first (losslessness, T = 0); and reports τ, mean tree size,
time per output token (median and spread over ``repeats`` timed runs, after ``warmup``
untimed ones, every policy's runs in lockstep with the others'), throughput, and the cost
model's predicted cycle time next to the measured one.
The adaptive policy's cost model is calibrated on this CPU first (``bastion calibrate
--target``, cached) and its T_draft fitted to the drafter's measured batched pass (cached too);
the calibration's RMSE before/after is reported.

What this module does not do: train (see :mod:`bastion.demo.train`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bastion.demo import DRAFTER_DIR, PROMPTS_FILE, TARGET_DIR
from bastion.errors import ConfigError
from bastion.guard import has, integer, public, readable_file
from bastion.records import json_safe

__all__ = [
    "DEMO_DTYPES",
    "DEMO_POLICIES",
    "DemoResult",
    "PolicyRow",
    "calibrated_beliefs",
    "load_prompts",
    "run_demo",
]

log = logging.getLogger(__name__)

DEMO_POLICIES = ("ar", "chain", "fixed:32", "bastion")
DEMO_DTYPES = ("float32", "bfloat16")  # the precisions `bastion demo --dtype` runs the pair in
CALIBRATION_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CALIBRATION_CONTEXTS = (64, 256)


@dataclass(frozen=True)
class PolicyRow:
    """One policy at one batch size, in the record vocabulary (:mod:`bastion.records`)."""

    policy: str
    tau: float  # committed tokens per step, bonus included, macro-averaged over prompts
    mean_tree_size: float
    tpot_s: float  # median over timed runs of the requests' mean time per output token
    # AR's median TPOT over requests (tpot_p50_s) at the same batch size / this policy's
    speedup: float
    steps: int  # batched steps of one run
    batch_size: int = 1
    tpot_min_s: float = float("nan")  # spread of tpot_s over the timed runs
    tpot_max_s: float = float("nan")
    tpot_runs_s: tuple[float, ...] = ()  # every timed run's TPOT, in order (the first first)
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
    # batch size → policy → every timed run's per-request TPOTs (prompt order)
    request_tpots: dict[int, dict[str, list[tuple[float, ...]]]] = field(default_factory=dict)

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


@public(target=has("config", "parameters"), drafter=has("cfg", "draft_batch"))
def calibrated_beliefs(
    target: Any,
    drafter: Any,
    policies: Sequence[str],
    calibrate: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[Any, Any, dict[str, float]]:
    """What the cost-model policies believe about this device: (the roofline calibrated on it
    with the drafter's measured pass, the learning controller's start-up table timed on it — None
    unless a policy learns —, the calibration's figures). Both None without ``calibrate``."""
    from bastion.backends.torch.calibrate import calibrate_drafter, calibrate_target
    from bastion.backends.torch.timing import with_draft_timing
    from bastion.cost.costmodel import RooflineCostModel

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

    return cost_model, learned, calibration


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
    dtype: str = "float32",
    linears: str = "auto",
) -> DemoResult:
    """Decode ``prompts`` with every policy at every batch size; compare; summarise. Needs torch.

    The policies decode in lockstep (:func:`~bastion.backends.torch.lockstep.generate_lockstep`):
    after every policy's ``warmup`` untimed runs, their ``repeats`` timed runs go on together,
    step by step, the next step to the policy whose own clock is furthest behind, each policy
    timed on a clock that runs only during its own steps. The machine's drift, 10–20 % over
    seconds on a shared CPU, so reaches every policy alike, instead of one policy's whole run.
    A learning controller keeps one learner over its warm-up and runs at each batch size.

    Traces (``record_dir``) are recorded at the first batch size, for every policy but AR and
    the learning controller (a trace needs a draft at every step, which it may skip).

    ``dtype`` (one of :data:`DEMO_DTYPES`) is the precision both models run in. In ``float32``
    every policy's output equals AR's; ``bfloat16`` is faster on CPUs with bf16 matrix
    instructions, but its sums depend on the pass's shape, so near-ties can decode differently
    (AR's own output then changes with the batch size) and ``identical`` may be False.

    ``linears`` (``auto``, ``stream`` or ``torch``) chooses the matrix products, as in
    :func:`~bastion.backends.torch.load_target`: in fp32 on a CPU with AVX-512 or AVX2 ``auto``
    streams the weights with the batch-invariant kernel."""
    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter, load_target
    from bastion.backends.torch.lockstep import Contender, generate_lockstep

    for model_dir in (target_dir, drafter_dir):
        if not (model_dir / "config.json").exists():
            raise ConfigError(
                f"no model at {model_dir}; train it with `bastion train` or reinstall"
            )
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be ≥ 1; got {max_new_tokens}")
    if not batch_sizes or min(batch_sizes) < 1:
        raise ConfigError(f"batch sizes must be ≥ 1; got {list(batch_sizes)}")
    if not isinstance(dtype, str) or dtype not in DEMO_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DEMO_DTYPES)}; got {dtype!r}")
    from bastion.backends.torch.cpu_linear import check_linears

    check_linears(linears)
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be ≥ 1 and warmup ≥ 0; got {repeats}, {warmup}")
    texts = list(prompts) if prompts is not None else load_prompts()
    if not texts:
        raise ConfigError("no prompts to decode")
    import torch

    target = load_target(target_dir, "cpu", dtype=getattr(torch, dtype), linears=linears)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    prompt_ids = [list(tokenizer(t)["input_ids"]) for t in texts]

    cost_model, learned, calibration = calibrated_beliefs(
        target, drafter, policies, calibrate, progress
    )

    eos = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[arg-type]
    batched: dict[int, dict[str, list[list[int]]]] = {}
    request_tpots: dict[int, dict[str, list[tuple[float, ...]]]] = {}
    acceptance: dict[str, list[list[int]]] = {}
    rows = []
    repeated = True  # every timed run of a policy decoded what its first did
    # each contender its own drafter (a drafter keeps per-request state)
    drafters = {
        name: None if name == "ar" else DFlashDrafter.from_pretrained(drafter_dir, target)
        for name in policies
    }
    for b_i, b in enumerate(batch_sizes):
        # a learner: its own copy of the start-up table, kept over its warm-up and runs
        models = {
            name: learned.copy()
            if learned is not None and _learns(name)
            else cost_model
            if name.startswith("bastion")
            else None
            for name in policies
        }
        if progress:
            progress(
                f"decoding with {', '.join(policies)} at batch {b}, in lockstep "
                f"({warmup} warm-up and {repeats} timed run(s) each)"
            )
        contenders = []
        for name in policies:
            traces = None
            # AR drafts nothing; the learning controller would have to draft every step
            if record_dir is not None and name != "ar" and not _learns(name) and b_i == 0:
                record_dir.mkdir(parents=True, exist_ok=True)
                traces = [
                    record_dir / f"{name.replace(':', '-')}-{i}.json"
                    for i in range(len(prompt_ids))
                ]
            contenders.append(
                Contender(
                    name,
                    drafters[name],
                    models[name],
                    predict_cycles=cost_model,
                    record_traces=traces,
                    trace_metadata={"target": "bastion-demo"},
                    dense_trace=traces is not None,
                )
            )
        reports = dict(
            zip(
                policies,
                generate_lockstep(
                    target,
                    contenders,
                    prompt_ids,
                    batch_size=b,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos,
                    repeats=repeats,
                    warmup=warmup,
                    progress=progress,
                ),
                strict=True,
            )
        )
        repeated &= all(report.repeats_agree for report in reports.values())
        nan = float("nan")
        ar_tpot = reports["ar"].latency()["tpot_p50_s"] if "ar" in reports else nan
        for name in policies:
            report = reports[name]
            batched.setdefault(b, {})[name] = [list(r.output_ids) for r in report.records]
            request_tpots.setdefault(b, {})[name] = [run.request_tpots for run in report.runs]
            if b_i == 0:
                acceptance[name] = [list(r.committed_per_step) for r in report.records]
            runs_tpot = tuple(run.tpot_s for run in report.runs)
            cycle = report.cycle
            latency: dict[str, Any] = report.latency()
            rows.append(
                PolicyRow(
                    policy=name,
                    tau=float(np.mean([r.tau for r in report.records])),
                    mean_tree_size=float(np.mean([r.mean_tree_size for r in report.records])),
                    tpot_s=float(statistics.median(runs_tpot)),
                    speedup=ar_tpot / latency["tpot_p50_s"] if latency["tpot_p50_s"] else nan,
                    steps=report.steps,
                    batch_size=b,
                    tpot_min_s=min(runs_tpot),
                    tpot_max_s=max(runs_tpot),
                    tpot_runs_s=runs_tpot,
                    throughput_tok_s=report.throughput_tok_s,
                    cycle_predicted_s=cycle.get("predicted_s", nan),
                    cycle_observed_s=cycle.get("measured_s", nan),
                    predicted_draft_s=cycle.get("predicted_draft_s", nan),
                    measured_draft_s=cycle.get("measured_draft_s", nan),
                    policy_spec=report.policy_spec,
                    tokens=report.tokens,
                    **latency,  # floats, by name
                    **report.acceptance(),
                )
            )
    first = batched[batch_sizes[0]]
    reference = first[policies[0]]
    identical = repeated and all(out[p] == reference for out in batched.values() for p in policies)
    return DemoResult(rows, identical, dict(first), acceptance, calibration, batched, request_tpots)
