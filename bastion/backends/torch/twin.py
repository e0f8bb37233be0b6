"""``bastion twin``'s real side: decode for real, time the machine, and hand both to the simulator.

:func:`run_twin` decodes the prompts with every policy at every batch size, in lockstep
(:mod:`.lockstep`), and — unless it is given a truth — times the machine *in the same lockstep*:
calibration sessions (:data:`CALIBRATION_POLICIES` on calibration prompts disjoint from the
predicted ones) take their steps between the predicted runs' steps, weighted so that they spread
over the whole session (the machine's speed drifts by tens of percent over minutes; a truth timed
before the runs would be timed on another machine). Every calibration step's stages
(:class:`bastion.stepcosts.StepSample`) and every prefill are fitted into a measured truth of the
machine at its mean speed, with the machine's drift read from the calibration steps and taken
out (:func:`bastion.sim.measured_pace.fit_paced`); the predicted runs' own times are never used
for it. Then the simulator replays exactly the requests that ran (:func:`bastion.sim.twin.replay`):
the same prompts and output lengths, batch sizes and order, at T = 0 the target's recorded tokens
and the drafter's recorded marginals at every position (dense traces), and the same belief for
the cost-model policies — each replayed step at the machine's speed when its real step ran (read
from the calibration steps around that moment). The result sets real and simulated side by
side, and beside them what the simulator predicts without measuring (the probed profile under
the bare roofline).

:func:`measure_truth` is the timing alone (``bastion truth measure``): the calibration sessions in
lockstep with each other, fitted into a truth file.

On a CUDA device the same code runs; every clock is the device-synchronised one (the target's
device clock), so the stages are the device's.

What this module does not do: price anything (the simulator does) or print (the CLI does).
"""

from __future__ import annotations

import logging
import math
import platform
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bastion.errors import BudgetError, ConfigError
from bastion.guard import has, integer, public
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.measured import MeasuredCosts
from bastion.sim.measured_pace import MachinePace, fit_paced
from bastion.sim.twin import TwinRow, compare, replay, summary, with_speedups
from bastion.stepcosts import PrefillSample, StepSample
from bastion.trace import Trace

from .lockstep import TurnClock, lockstep
from .reports import BatchGenerationReport
from .runner import _session
from .timing import device_clock

__all__ = [
    "CALIBRATION_POLICIES",
    "TWIN_POLICIES",
    "TwinResult",
    "measure_truth",
    "run_twin",
]

log = logging.getLogger(__name__)

TWIN_POLICIES: tuple[str, ...] = ("ar", "chain", "fixed:16", "fixed:32", "fixed:64", "beam:4x15")
TWIN_POLICIES += ("bastion:paper", "bastion")
# what the truth is timed with: every step kind, tree sizes 2 … 128, both controllers
CALIBRATION_POLICIES: tuple[str, ...] = ("ar", "chain", "fixed:2", "fixed:4", "fixed:8")
CALIBRATION_POLICIES += ("fixed:16", "fixed:32", "fixed:64", "fixed:128", "beam:2x8", "beam:8x8")
CALIBRATION_POLICIES += ("bastion:paper", "bastion")
# new tokens per calibration prompt (measure_truth; the twin times the machine over the
# predicted runs' own length, so that its contexts span theirs), and how many prompts
CALIBRATION_TOKENS = 96
CALIBRATION_PROMPTS = 4
PREFILL_LENGTHS = (16, 32, 64, 96, 128, 192, 256)  # prompt lengths of the prefill sweep


@dataclass
class TwinResult:
    """Real and simulated rows, their comparison, and how the truth was had."""

    rows: list[TwinRow]  # real, sim and each prediction without measuring
    entries: list[dict[str, Any]]  # compare(rows): one per (policy, batch size, other source)
    truth: GroundTruth
    identical: bool  # every policy's output equals AR's at every batch size
    summary: dict[str, dict[str, float]] = field(default_factory=dict)  # per other source
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each part
    samples: list[StepSample] = field(default_factory=list)  # the truth's calibration steps
    prefills: list[PrefillSample] = field(default_factory=list)
    traces: list[Trace] = field(default_factory=list)  # what was replayed (dense)
    # every predicted run's steps, by (policy, batch size): what the real columns summarise
    real_samples: dict[tuple[str, int], list[StepSample]] = field(default_factory=dict)
    # the machine's mean speed in each timed run (batch size → one factor per run), from the
    # calibration steps around its steps; the replay follows it step by step
    speeds: dict[int, list[float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "records": [r.to_record() for r in self.rows],
            "comparison": self.entries,
            "summary": self.summary,
            "identical": self.identical,
            "seconds": self.seconds,
            "truth": self.truth.name,
            "speeds": {str(b): v for b, v in self.speeds.items()},
            "stall_share": (
                self.truth.measured.meta.get("stall_share") if self.truth.measured else None
            ),
        }


def _drafter(path: Path, target: Any) -> Any:
    from .drafter import DFlashDrafter

    return DFlashDrafter.from_pretrained(path, target)


def _sessions(
    target: Any,
    drafter_dir: Path,
    policies: Sequence[str],
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_new_tokens: int,
    repeats: int,
    warmup: int,
    beliefs: dict[str, Any],
    clock: Callable[[], float],
) -> tuple[list[Generator[bool, None, BatchGenerationReport]], list[TurnClock]]:
    """One lockstep session per policy, each with its own drafter and turn clock."""
    from bastion.policies import make_policy

    sessions, clocks = [], []
    for name in policies:
        turn = TurnClock(clock)
        learns = bool(getattr(make_policy(name), "learns", False))
        belief = beliefs.get(name)
        if learns and belief is not None:
            belief = belief.copy()  # one learner per session: its warm-up and runs
        sessions.append(
            _session(
                target,
                None if name == "ar" else _drafter(drafter_dir, target),
                name,
                prompts,
                batch_size=batch_size,
                max_new_tokens=max_new_tokens,
                sampling=None,
                seed=0,
                eos_token_id=-1,
                cost_model=belief,
                record_traces=None,
                trace_metadata=None,
                dense_trace=False,
                verifier=None,
                repeats=repeats,
                warmup=warmup,
                predict_cycles=None,
                policy_spec=None,
                clock=turn,
            )
        )
        clocks.append(turn)
    return sessions, clocks


def _prefill_sweep(target: Any, ids: Sequence[int], repeats: int) -> list[PrefillSample]:
    """Prefills of ``ids`` cut to each of :data:`PREFILL_LENGTHS` (cycled if too short), in
    turn, ``repeats`` rounds: the prefill term over the lengths a prompt may have."""
    from .verifier import TorchVerifier

    clock = device_clock(next(target.parameters()).device)
    verifier = TorchVerifier(target)
    limit = int(getattr(target.config, "max_position_embeddings", 1 << 30))
    out = []
    for _ in range(repeats):
        for n in PREFILL_LENGTHS:
            if n > limit:
                continue
            prompt = [ids[i % len(ids)] for i in range(n)]
            t0 = clock()
            verifier.prefill(0, prompt)
            out.append(PrefillSample(n, clock() - t0))
            verifier.release_all()
    return out


def _gathered(
    reports: Sequence[BatchGenerationReport], sweep: list[PrefillSample]
) -> tuple[list[StepSample], list[PrefillSample]]:
    """The calibration sessions' steps, and the prefill sweep's prefills with theirs."""
    steps = [s for r in reports for s in r.samples]
    return steps, sweep + [p for r in reports for p in r.prefills]


def _fit(
    steps: list[StepSample], prefills: list[PrefillSample], seconds: float, device: str
) -> tuple[MeasuredCosts, MachinePace]:
    """The truth of the machine at its mean speed, and its speed over the timing
    (:func:`bastion.sim.measured_pace.fit_paced`)."""
    meta = {
        "origin": f"bastion twin / truth measure, {platform.machine()} {device}, "
        f"{time.strftime('%Y-%m-%d')}",
        "device": device,
        "seconds": round(seconds, 1),
    }
    return fit_paced(steps, prefills, meta)


def _paces(
    pace: MachinePace,
    real: dict[int, list[BatchGenerationReport]],
    policies: Sequence[str],
    repeats: int,
) -> dict[int, dict[str, list[list[float]]]]:
    """Per batch size and policy, per timed run, the machine's speed at each of the real run's
    decode steps (when the step began), read from the calibration steps around that moment
    (stalls included: a busy spell slows every session's steps alike, so the replay of a step
    taken in it pays for it too). Only the predicted steps' start times are used, never their
    durations."""
    out: dict[int, dict[str, list[list[float]]]] = {}
    for b, reports in real.items():
        out[b] = {}
        for name, report in zip(policies, reports, strict=True):
            runs: list[list[float]] = []
            for r in range(repeats):
                times = sorted(s.at for s in report.samples if s.run == r)
                runs.append(pace.at(times).tolist() if times else [1.0])
            out[b][name] = runs
    return out


def _mean_speeds(paces: dict[str, list[list[float]]], repeats: int) -> list[float]:
    """The machine's mean speed in each timed run over every policy's steps (for the report)."""
    return [float(np.mean([v for runs in paces.values() for v in runs[r]])) for r in range(repeats)]


def measured_truth(costs: MeasuredCosts, name: str = "measured") -> GroundTruth:
    """A :class:`GroundTruth` that prices every pass from ``costs``."""
    return GroundTruth(name=name, noise=costs.noise, measured=costs)


def _check_batch_sizes(batch_sizes: Sequence[int]) -> None:
    if not batch_sizes or not all(
        isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 1 << 12 for b in batch_sizes
    ):
        raise BudgetError(f"batch sizes must be whole numbers in [1, 4096]; got {batch_sizes!r}")


def _usable(policies: Sequence[str], beliefs: dict[str, Any]) -> list[str]:
    """The calibration policies that can run: a cost-model policy only with its belief."""
    from bastion.policies import make_policy

    return [
        p
        for p in policies
        if not getattr(make_policy(p), "uses_cost_model", False) or beliefs.get(p) is not None
    ]


@public(
    target=has("config", "parameters"), repeats=integer(1, 100), max_new_tokens=integer(2, 1 << 16)
)
def measure_truth(
    target: Any,
    drafter_dir: Path,
    calibration_ids: Sequence[Sequence[int]],
    *,
    batch_sizes: Sequence[int] = (1, 4),
    repeats: int = 2,
    max_new_tokens: int = CALIBRATION_TOKENS,
    beliefs: dict[str, Any] | None = None,
    policies: Sequence[str] = CALIBRATION_POLICIES,
    progress: Callable[[str], None] | None = None,
) -> MeasuredCosts:
    """Time this machine's costs on calibration prompts and fit them (no predicted runs):
    ``policies`` decode ``calibration_ids`` in lockstep at each batch size, then a prefill sweep.
    ``beliefs``: the cost model of each cost-model policy (those without one are left out)."""
    _check_batch_sizes(batch_sizes)
    start = time.perf_counter()
    clock = device_clock(next(target.parameters()).device)
    beliefs = beliefs or {}
    usable = _usable(policies, beliefs)
    reports: list[BatchGenerationReport] = []
    for b in batch_sizes:
        if progress:
            progress(f"timing this machine at batch {b} ({len(usable)} policies in lockstep)")
        sessions, clocks = _sessions(
            target,
            drafter_dir,
            usable,
            calibration_ids,
            batch_size=b,
            max_new_tokens=max_new_tokens,
            repeats=repeats,
            warmup=1,
            beliefs=beliefs,
            clock=clock,
        )
        reports += lockstep(sessions, clocks)
    steps, prefills = _gathered(reports, _prefill_sweep(target, calibration_ids[0], repeats + 1))
    device = str(next(target.parameters()).device)
    return _fit(steps, prefills, time.perf_counter() - start, device)[0]


def _dense_traces(
    target: Any, drafter: Any, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> list[Trace]:
    from .record import dense_marginals

    vocab = int(target.config.vocab_size)
    traces = []
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        dense = dense_marginals(target, drafter, [*prompt, *out], len(prompt))
        meta = {"policy": "ar", "prompt_id": i, "vocab_size": vocab, "temperature": 0.0}
        traces.append(Trace(tuple(prompt), tuple(out), (), meta, dense))
    return traces


def bulk_mean(values: Sequence[float]) -> float:
    """The mean of ``values`` without the stalls — those above the median by more than
    :data:`bastion.sim.measured_fit.STALL_SIGMAS` robust standard deviations of their logs — the
    statistic the measured truth fits (what a step costs when the machine does not stall)."""
    from bastion.sim.measured_fit import STALL_SIGMAS

    v = np.asarray(values, dtype=np.float64)
    if not v.size:
        return math.nan
    positive = v[v > 0]
    if not positive.size:
        return float(v.mean())
    mid = float(np.median(positive))
    logs = np.log(positive / mid)
    sigma = 1.4826 * float(np.median(np.abs(logs - np.median(logs))))
    return float(v[v <= mid * math.exp(STALL_SIGMAS * max(sigma, 1e-3))].mean())


def _real_row(report: BatchGenerationReport, name: str) -> TwinRow:
    lat = report.latency()
    every = report.samples  # every timed run's steps, as the TPOT pools every run's requests
    kinds = [s.kind for s in every]
    share = {k: kinds.count(k) / max(len(kinds), 1) for k in ("ar", "chain", "tree")}
    return TwinRow(
        source="real",
        policy=name,
        batch_size=report.batch_size,
        tpot_p50_s=lat["tpot_p50_s"],
        tpot_mean_s=float(np.mean([t for run in report.runs for t in run.request_tpots if t > 0])),
        ttft_mean_s=lat["ttft_mean_s"],
        e2e_mean_s=lat["e2e_mean_s"],
        tau=report.tau,
        mean_tree_size=report.mean_tree_size,
        steps=report.steps,
        draft_s=bulk_mean([s.draft_s for s in every]),
        host_s=bulk_mean([s.host_s for s in every]),
        verify_s=bulk_mean([s.verify_s for s in every]),
        share_ar=share["ar"],
        share_chain=share["chain"],
        share_tree=share["tree"],
        committed=tuple(tuple(r.committed_per_step) for r in report.records),
        request_tpots=tuple(tuple(run.request_tpots) for run in report.runs),
    )


@public(
    target=has("config", "parameters"),
    max_new_tokens=integer(2, 1 << 16),
    repeats=integer(1, 100),
    warmup=integer(0, 100),
    n_max=integer(1, 1 << 12),
)
def run_twin(
    target: Any,
    drafter_dir: Path,
    prompt_ids: Sequence[Sequence[int]],
    calibration_ids: Sequence[Sequence[int]],
    *,
    policies: Sequence[str] = TWIN_POLICIES,
    batch_sizes: Sequence[int] = (1, 4),
    max_new_tokens: int = 96,
    repeats: int = 5,
    warmup: int = 1,
    truth: GroundTruth | None = None,
    beliefs: dict[str, Any] | None = None,
    hardware: Any = None,
    unmeasured: dict[str, GroundTruth] | None = None,
    n_max: int = 1024,
    calibration_policies: Sequence[str] = CALIBRATION_POLICIES,
    calibration_tokens: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> TwinResult:
    """Decode for real, time the machine (unless ``truth`` is given), replay in the simulator.

    ``beliefs[policy]``: the cost model a cost-model policy decides with, on both sides (a
    learning controller's is copied per run). ``hardware``: the device's profile for the
    simulator's roofline parts (the measured truth does not use them) and for ``unmeasured``,
    the truths predicted without measuring (name → truth), each replayed like the measured one.
    ``calibration_policies`` decode ``calibration_ids`` to time the machine, each for
    ``calibration_tokens`` new tokens (default: ``max_new_tokens``, so that the calibration's
    contexts span the predicted runs' — a context term fitted on a narrower range extrapolates
    badly); the cost-model policies among them need a belief.
    """
    from bastion.cost.models import DrafterSpec

    from .calibrate import target_spec

    if not policies or policies[0] != "ar":
        raise BudgetError("the twin's policies must start with 'ar' (the speedups' baseline)")
    _check_batch_sizes(batch_sizes)
    if hardware is None:
        raise ConfigError("run_twin needs the device's hardware profile (hardware=)")
    beliefs = beliefs or {}
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    clock = device_clock(next(target.parameters()).device)
    measuring = truth is None
    real: dict[int, list[BatchGenerationReport]] = {}
    timing_at: dict[int, list[BatchGenerationReport]] = {}  # the calibration sessions
    eval_work = len(prompt_ids) * max_new_tokens
    if calibration_tokens is None:
        calibration_tokens = max_new_tokens
    if isinstance(calibration_tokens, bool) or not isinstance(calibration_tokens, int):
        raise BudgetError(f"calibration_tokens must be a whole number; got {calibration_tokens!r}")
    if not 2 <= calibration_tokens <= 1 << 16:
        raise BudgetError(f"calibration_tokens must be in [2, 65536]; got {calibration_tokens}")
    cal_work = len(calibration_ids) * calibration_tokens
    for b in batch_sizes:
        sessions, clocks = _sessions(
            target,
            drafter_dir,
            policies,
            prompt_ids,
            batch_size=b,
            max_new_tokens=max_new_tokens,
            repeats=repeats,
            warmup=warmup,
            beliefs=beliefs,
            clock=clock,
        )
        weights = [1.0] * len(sessions)
        if measuring:
            usable = _usable(calibration_policies, beliefs)
            cal, cal_clocks = _sessions(
                target,
                drafter_dir,
                usable,
                calibration_ids,
                batch_size=b,
                max_new_tokens=calibration_tokens,
                repeats=repeats,
                warmup=1,
                beliefs=beliefs,
                clock=clock,
            )
            sessions += cal
            clocks += cal_clocks
            weights += [min(cal_work / eval_work, 1.0)] * len(cal)
        if progress:
            extra = f" and {len(sessions) - len(policies)} timing sessions" if measuring else ""
            progress(
                f"decoding {len(prompt_ids)} prompts at batch {b}: {len(policies)} policies"
                f"{extra} in lockstep ({warmup} warm-up and {repeats} timed run(s) each)"
            )
        reports = lockstep(sessions, clocks, weights)
        real[b] = reports[: len(policies)]
        timing_at[b] = reports[len(policies) :]
    seconds["real_s"] = time.perf_counter() - start
    if measuring:
        t0 = time.perf_counter()
        sweep = _prefill_sweep(target, calibration_ids[0], repeats + 1)
        timing = [r for reports in timing_at.values() for r in reports]
        samples, prefills = _gathered(timing, sweep)
        device = str(next(target.parameters()).device)
        costs, pace = _fit(samples, prefills, seconds["real_s"], device)
        truth = measured_truth(costs)
        paces = _paces(pace, real, policies, repeats)
        speeds = {b: _mean_speeds(p, repeats) for b, p in paces.items()}
        seconds["truth_s"] = time.perf_counter() - t0
    else:
        samples, prefills, speeds, paces = [], [], {}, {}
    # what ran: AR's outputs (every policy's, if lossless), with the drafter's marginals
    first = real[batch_sizes[0]][0]
    outputs = [r.output_ids for r in first.records]
    identical = all(
        [r.output_ids for r in rep.records] == outputs and rep.repeats_agree
        for reps in real.values()
        for rep in reps
    )
    t0 = time.perf_counter()
    drafter = _drafter(drafter_dir, target)
    traces = _dense_traces(target, drafter, prompt_ids, outputs)
    seconds["traces_s"] = time.perf_counter() - t0
    rows: list[TwinRow] = []
    for reports in real.values():
        rows += with_speedups([_real_row(r, p) for r, p in zip(reports, policies, strict=True)])
    spec = target_spec(target)
    drafter_spec = DrafterSpec.from_hf_config(drafter_dir / "config.json")
    t0 = time.perf_counter()
    assert truth is not None
    for source, sim_truth in {"sim": truth, **(unmeasured or {})}.items():
        for b in batch_sizes:
            rows += replay(
                traces,
                policies,
                batch_size=b,
                hardware=hardware,
                model=spec,
                drafter=drafter_spec,
                truth=sim_truth,
                beliefs=beliefs,
                source=source,
                n_max=n_max,
                repeats=repeats,
                speeds=paces.get(b) if source == "sim" else None,
                progress=progress,
            )
    seconds["sim_s"] = time.perf_counter() - t0
    entries = compare(rows)
    sources = sorted({e["source"] for e in entries})
    seconds["total_s"] = time.perf_counter() - start
    return TwinResult(
        rows,
        entries,
        truth,
        identical,
        {s: summary(entries, s) for s in sources},
        seconds,
        samples,
        prefills,
        traces,
        {
            (p, b): list(r.samples)
            for b, reports in real.items()
            for p, r in zip(policies, reports, strict=True)
        },
        speeds,
    )
