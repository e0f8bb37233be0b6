"""Loading a Hugging Face target and decoding many requests through the shared engine.

:func:`generate_batch` is the Python API behind ``bastion generate``: continuous batching over
:meth:`bastion.engine.SpecEngine.step` — up to ``batch_size`` requests decode together, one
``step`` call per batched step (one drafter pass and one target pass for the whole batch); a
request that finishes (EOS or ``max_new_tokens``) leaves the batch at once and the next prompt
joins after its own prefill. Policies: ``ar`` (target-only autoregressive: root-only trees, the
drafter not called), ``chain`` (DFlash), ``fixed:N``, ``beam:WxD``, ``eagle``, ``bastion``
(adaptive, priced by a ``CostModel``; at batch > 1 one joint budget per step). There is no
second decode loop: the step is the engine's. :func:`generate` is one prompt at batch 1.

Timing: ``warmup`` untimed runs (a few tokens of the first batch) come first, then ``repeats``
timed runs of the whole workload; the report carries every repeat's time per output token and
throughput (median and spread) and the records of the first timed run. All prompts are submitted
at the start, so a request's time to first token includes its wait for a free slot.

What this module does not do: tokenise (the CLI does) or calibrate the roofline model
(``bastion calibrate --target``); without a record the adaptive policy gets an
:class:`~.timing.AffineCostModel` fitted on the spot, and its T_draft is the drafter's measured
pass (:func:`~.calibrate.drafter_timing`).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
import warnings
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from bastion.batch import BatchMarginals, StepRequests
from bastion.engine import SpecEngine, StepRecord
from bastion.errors import BackendError, BudgetError, CheckpointError, ConfigError
from bastion.guard import has, public
from bastion.interfaces import (
    BatchDrafter,
    CostModel,
    DraftContext,
    Drafter,
    RequestLoad,
    StepLoad,
    TreePolicy,
)
from bastion.policies import make_policy, policy_label
from bastion.records import RENAMED, acceptance_stats, delivered_counts
from bastion.stepcosts import PrefillSample, StepSample
from bastion.trace import Trace, TraceStep, write_trace
from bastion.tree import DraftMarginals

from .drafter import DFlashDrafter
from .sampling import SamplingParams
from .timing import Clock, device_clock, fit_affine_cost_model, verify_timer, with_draft_timing
from .verifier import TorchVerifier, VerifyTiming

__all__ = [
    "BatchGenerationReport",
    "GenerationReport",
    "RunTiming",
    "generate",
    "generate_batch",
    "load_target",
    "resolve_cost_model",
    "resolve_device",
]

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8  # new tokens per request of a warm-up run
_T = TypeVar("_T")


@public
def resolve_device(device: str | torch.device) -> torch.device:
    """A torch device; CUDA asked for but absent is an error, not a silent CPU fallback."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BackendError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError("CUDA was asked for but no CUDA device is available; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise BackendError(f"device {device!r} is not supported; accepted: cpu, cuda, cuda:N")
    return dev


@public
def load_target(
    path: str | os.PathLike[str], device: str = "cpu", dtype: torch.dtype | None = None
) -> Any:
    """A Hugging Face causal LM from a local directory, with SDPA attention (tree masks)."""
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    root = Path(path)
    if not (root / "config.json").is_file():
        raise CheckpointError(f"target {root} lacks config.json (a Hugging Face model directory)")
    from bastion.cost.models import read_config_json

    read_config_json(root, "target config")  # a binary, deeply nested or non-object file: refused
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(root), dtype=dtype, attn_implementation="sdpa"
        )
    except Exception as exc:  # transformers and safetensors raise many types on bad files
        raise CheckpointError(f"cannot load target {root}: {exc}") from exc
    return model.to(dev).eval()  # type: ignore[arg-type]  # transformers' to() stub is narrow


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


@dataclass
class GenerationReport:
    """One request's result, with the record vocabulary's fields (:mod:`bastion.records`;
    times in seconds). The previous release's names (``time_to_first_token``,
    ``time_per_output_token``, ``acceptance_lengths``, ``num_input_tokens``,
    ``num_output_tokens``) still read, with a ``DeprecationWarning``."""

    output_ids: list[int]
    prompt_len: int
    output_len: int
    ttft_s: float  # submission (the run's start) to the first token
    tpot_s: float  # decode time after the first token ÷ (output_len − 1); 0 for one token
    # tokens received per step, bonus included; a step cut by max_new_tokens or EOS counts only
    # what it delivered (bastion.records)
    committed_per_step: list[int]
    stage_times: dict[str, float]  # draft, build, mask, verify, commit (its steps, shared)
    trees: list[dict[str, Any]] = field(default_factory=list)  # per step
    policy: str = ""
    prefill_s: float = 0.0  # its own prefill
    queue_s: float = 0.0  # waiting for a free slot before the prefill
    accepted_per_step: list[int] = field(default_factory=list)  # draft tokens delivered
    policy_spec: str = ""  # the spec the policy was made from
    e2e_s: float = 0.0  # submission to the last token

    @property
    def tau(self) -> float:
        lens = self.committed_per_step
        return sum(lens) / len(lens) if lens else 0.0

    @property
    def mean_tree_size(self) -> float:
        return float(np.mean([t["size"] for t in self.trees])) if self.trees else 1.0

    def acceptance(self) -> dict[str, Any]:
        """``acceptance_rate`` and ``acceptance_by_position`` of its steps."""
        return acceptance_stats(self.accepted_per_step, [t["size"] for t in self.trees])

    # the previous release's names, readable for one more release
    @property
    def time_to_first_token(self) -> float:
        _renamed("time_to_first_token")
        return self.ttft_s

    @property
    def time_per_output_token(self) -> float:
        _renamed("time_per_output_token")
        return self.tpot_s

    @property
    def acceptance_lengths(self) -> list[int]:
        _renamed("acceptance_lengths")
        return self.committed_per_step

    @property
    def num_input_tokens(self) -> int:
        _renamed("num_input_tokens")
        return self.prompt_len

    @property
    def num_output_tokens(self) -> int:
        _renamed("num_output_tokens")
        return self.output_len

    def to_dict(self, with_trees: bool = True) -> dict[str, Any]:
        d = {
            "policy": self.policy,
            "policy_spec": self.policy_spec or self.policy,
            "output_ids": self.output_ids,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "prefill_s": self.prefill_s,
            "queue_s": self.queue_s,
            "committed_per_step": self.committed_per_step,
            "accepted_per_step": self.accepted_per_step,
            "tau": self.tau,
            **self.acceptance(),
            "mean_tree_size": self.mean_tree_size,
            "steps": len(self.committed_per_step),
            "stage_times": self.stage_times,
        }
        if with_trees:
            d["trees"] = self.trees
        return d


def _renamed(old: str) -> None:
    warnings.warn(
        f"GenerationReport.{old} is renamed {RENAMED[old]} (bastion.records); the old name is "
        "read for one release more",
        DeprecationWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class RunTiming:
    """One timed run of the whole workload."""

    wall_s: float  # first submission to last token, prefills included
    output_tokens: int
    tpot_s: float  # mean over requests of their time per output token
    request_tpots: tuple[float, ...] = ()  # each request's, prompt order (0.0: one token)

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
    }


@dataclass
class BatchGenerationReport:
    """Every request's :class:`GenerationReport` (prompt order) and the run's aggregates.

    ``records``, ``steps``, ``stage_times`` and ``cycle`` are those of the first timed run;
    ``runs`` has every timed run's wall time, tokens and mean TPOT.
    """

    records: list[GenerationReport]
    policy: str
    batch_size: int
    runs: list[RunTiming]
    steps: int  # batched steps of the first run
    mean_batch: float  # requests per step
    stage_times: dict[str, float]  # per stage, summed over the batched steps (not per request)
    cycle: dict[str, float] = field(default_factory=dict)  # predicted vs measured, see below
    warmup: int = 0

    # ``cycle`` (when a cost model priced the run): mean over steps of the measured cycle
    # (draft + build + verify, seconds) and of the cost model's Ĉ for the step's trees and
    # batch, with its T_draft and T_verify parts next to the measured draft and verify times.

    policy_spec: str = ""  # the spec the policy was made from
    repeats_agree: bool = True  # every timed run decoded what the first did
    # every timed run's steps and prefills, stage by stage (bastion.stepcosts), in order
    samples: tuple[StepSample, ...] = ()
    prefills: tuple[PrefillSample, ...] = ()

    @property
    def tokens(self) -> int:
        """Output tokens of the first timed run, over all requests."""
        return sum(r.output_len for r in self.records)

    @property
    def num_output_tokens(self) -> int:
        _renamed("num_output_tokens")
        return self.tokens

    @property
    def throughput_tok_s(self) -> float:
        """Median over timed runs of output tokens per second (wall, prefills included)."""
        return float(statistics.median(r.throughput_tok_s for r in self.runs))

    @property
    def tpot_s(self) -> float:
        """Median over timed runs of the requests' mean TPOT."""
        return float(statistics.median(r.tpot_s for r in self.runs))

    @property
    def time_per_output_token(self) -> float:
        _renamed("time_per_output_token")
        return self.tpot_s

    @property
    def tau(self) -> float:
        """Committed tokens per step over every request's steps, bonus included."""
        lens = [n for r in self.records for n in r.committed_per_step]
        return sum(lens) / len(lens) if lens else 0.0

    def acceptance(self) -> dict[str, Any]:
        """``acceptance_rate`` and ``acceptance_by_position`` over every request's steps."""
        return acceptance_stats(
            [a for r in self.records for a in r.accepted_per_step],
            [t["size"] for r in self.records for t in r.trees],
        )

    def latency(self) -> dict[str, float]:
        """Mean and p50 / p99 of TTFT and end-to-end over the requests of the first timed run,
        p50 / p99 of TPOT over the requests of every timed run (pooled: a stall of the machine,
        hundreds of ms on a shared CPU, moves one request's TPOT, not the median)."""
        ttft = [r.ttft_s for r in self.records]
        pooled = [t for run in self.runs for t in run.request_tpots if t > 0]
        tpot = pooled or [r.tpot_s for r in self.records if r.output_len > 1]
        e2e = [r.e2e_s for r in self.records]
        out = {"ttft_mean_s": float(np.mean(ttft)), "e2e_mean_s": float(np.mean(e2e))}
        for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            p50, p99 = np.percentile(values, [50.0, 99.0]) if values else (0.0, 0.0)
            out[f"{name}_p50_s"], out[f"{name}_p99_s"] = float(p50), float(p99)
        return out

    @property
    def mean_tree_size(self) -> float:
        sizes = [t["size"] for r in self.records for t in r.trees]
        return float(np.mean(sizes)) if sizes else 1.0

    def to_dict(self, with_trees: bool = False) -> dict[str, Any]:
        return {
            "records": [r.to_dict(with_trees) for r in self.records],
            "policy": self.policy,
            "policy_spec": self.policy_spec or self.policy,
            "batch_size": self.batch_size,
            "tokens": self.tokens,
            "throughput_tok_s": self.throughput_tok_s,
            "tpot_s": self.tpot_s,
            **self.latency(),
            "tau": self.tau,
            **self.acceptance(),
            "mean_tree_size": self.mean_tree_size,
            "steps": self.steps,
            "mean_batch": self.mean_batch,
            "stage_times": self.stage_times,
            "cycle": self.cycle,
            "warmup": self.warmup,
            "repeats": {
                "runs": len(self.runs),
                "wall_s": [r.wall_s for r in self.runs],
                "tpot_s": _spread([r.tpot_s for r in self.runs]),
                "throughput_tok_s": _spread([r.throughput_tok_s for r in self.runs]),
            },
        }


# --------------------------------------------------------------------------------------------
# Drafter wrappers
# --------------------------------------------------------------------------------------------


class _NoDrafter:
    """The AR baseline's drafter: never consulted by the root-only policy."""

    def draft(self, context: DraftContext) -> DraftMarginals:
        return DraftMarginals([[0]], [[0.0]])


class _RecordingDrafter:
    """Drafts a batch through ``inner`` and keeps every request's marginals (for traces)."""

    def __init__(self, inner: Drafter | BatchDrafter) -> None:
        self.inner = inner
        self.marginals: dict[int, list[DraftMarginals]] = {}

    def draft_batch(self, requests: StepRequests) -> BatchMarginals:
        ids = requests.request_ids.tolist()
        if isinstance(self.inner, BatchDrafter):
            batch = self.inner.draft_batch(requests)
            rows = [batch.row(j) for j in range(len(ids))]
        else:
            feedback = requests.feedback or (None,) * len(ids)
            committed = requests.committed or ((),) * len(ids)
            rows = [
                self.inner.draft(DraftContext(rid, tuple(c), int(b), fb))
                for rid, c, b, fb in zip(
                    ids, committed, requests.bonus_tokens.tolist(), feedback, strict=True
                )
            ]
            batch = BatchMarginals.from_rows(rows)
        for rid, m in zip(ids, rows, strict=True):
            self.marginals.setdefault(rid, []).append(m)
        return batch


def _release(part: object, request_id: int) -> None:
    release = getattr(part, "release", None)
    if release is not None:
        release(request_id)


# --------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------


@public
def resolve_cost_model(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: TreePolicy,
    cost_model: CostModel | None,
    context_len: int,
    batch_size: int = 1,
) -> CostModel | None:
    """The cost model of a policy that declares ``uses_cost_model = True``: ``cost_model`` if
    given; else the cached calibrated roofline (``bastion calibrate --target``) or an
    :class:`AffineCostModel` fitted now, with T_draft from the drafter's timing record (measured
    now and cached if there is none). Other policies get ``cost_model`` as it is (``None`` is
    fine)."""
    if cost_model is not None or not getattr(policy, "uses_cost_model", False):
        return cost_model
    from .calibrate import cached_cost_model, drafter_timing

    inner: CostModel | None = cached_cost_model(target)
    if inner is not None:
        log.info("adaptive policy: calibrated roofline from the cached record")
    else:
        inner = fit_affine_cost_model(verify_timer(target), max(context_len, 1))
        log.info(
            "adaptive policy: no calibration record (run `bastion calibrate --target`); fitted %s",
            inner,
        )
    if isinstance(drafter, DFlashDrafter):
        timing = drafter_timing(target, drafter, batch_sizes=sorted({1, batch_size}))
        log.info("adaptive policy: T_draft from the drafter's timing %s", timing)
        return with_draft_timing(inner, timing)
    return inner


# --------------------------------------------------------------------------------------------
# The decode loop over SpecEngine.step
# --------------------------------------------------------------------------------------------


@dataclass
class _Live:
    """A request in the batch."""

    index: int  # position in the prompt list (and request id)
    committed: list[int]  # prompt + output so far
    out: list[int]
    feedback: object | None
    queue_s: float
    prefill_s: float
    first_at: float
    steps: list[StepRecord] = field(default_factory=list)
    previous: int = 0
    expected: float = 0.0
    end_at: float = 0.0
    timings: list[VerifyTiming] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)  # per step: tokens it received
    accepted: list[int] = field(default_factory=list)  # per step: draft tokens among them


# sizes, contexts, draft, build, verify, whether the step drafted, and the controller's own
# predicted cycle (a learning controller's diagnostics; NaN for any other policy)
_Cycle = tuple[list[int], list[int], float, float, float, bool, float]


@dataclass
class _Run:
    lives: list[_Live]
    wall_s: float
    steps: int
    step_sizes: list[int]
    stage_times: dict[str, float]
    # per step: (tree sizes, contexts, measured draft, build, verify) for the cycle report
    cycles: list[_Cycle]
    samples: list[StepSample] = field(default_factory=list)  # every step, stage by stage
    prefills: list[PrefillSample] = field(default_factory=list)


def _done(live: _Live, max_new_tokens: int, eos: frozenset[int]) -> bool:
    return len(live.out) >= max_new_tokens or (bool(live.out) and live.out[-1] in eos)


def _finish(decoding: Generator[Any, None, _T]) -> _T:
    """Run a generator (a decoding, a session) to its end; its return value."""
    while True:
        try:
            next(decoding)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def _decoding(
    engine: SpecEngine,
    verifier: TorchVerifier,
    drafter: object,
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    max_new_tokens: int,
    eos: frozenset[int],
    clock: Clock,
    run: int = 0,
) -> Generator[bool, None, _Run]:
    """Decode every prompt, at most ``batch_size`` at a time, one ``engine.step`` per step;
    yields after every step (the caller may run others' steps in between: :mod:`.lockstep`;
    :func:`_finish` runs it through) and returns the run (``run``: its index among the timed
    runs, recorded in its step samples)."""
    for part in (verifier, drafter):
        release_all = getattr(part, "release_all", None)
        if release_all is not None:
            release_all()
    pending = deque(range(len(prompts)))
    active: list[_Live] = []
    finished: dict[int, _Live] = {}
    steps = 0
    step_sizes: list[int] = []
    stages = {"draft": 0.0, "build": 0.0, "verify": 0.0}
    cycles: list[_Cycle] = []
    samples: list[StepSample] = []
    prefills: list[PrefillSample] = []
    learns = bool(getattr(engine.policy, "learns", False))  # it may skip drafting some steps
    decides = bool(getattr(engine.policy, "uses_cost_model", False))
    builder = str(getattr(engine.policy, "tree_builder", ""))

    def finish(live: _Live, at: float) -> None:
        live.end_at = at
        live.timings = list(verifier.timings(live.index))
        finished[live.index] = live
        _release(verifier, live.index)
        _release(drafter, live.index)

    start = clock()
    while pending or active:
        while pending and len(active) < batch_size:
            i = pending.popleft()
            admitted = clock()
            first, feedback = verifier.prefill(i, prompts[i])
            now = clock()
            prefills.append(PrefillSample(len(prompts[i]), now - admitted))
            live = _Live(
                i,
                [*map(int, prompts[i]), int(first)],
                [int(first)],
                feedback,
                admitted - start,
                now - admitted,
                now,
            )
            if _done(live, max_new_tokens, eos):
                finish(live, now)
            else:
                active.append(live)
        if not active:
            continue
        begin = clock()
        at = time.perf_counter()  # the machine's time (the turn clock counts only its turns)
        requests = StepRequests.of(
            [live.index for live in active],
            [len(live.committed) - 1 for live in active],
            [live.committed[-1] for live in active],
            [live.previous for live in active],
            [live.expected for live in active],
            feedback=[live.feedback for live in active],
            committed=[live.committed for live in active],
        )
        step = engine.step(requests)
        now = clock()
        steps += 1
        step_sizes.append(len(active))
        stages["draft"] += step.draft_s
        stages["build"] += step.build_s
        stages["verify"] += step.verify_s
        sizes = step.trees.sizes.tolist()
        predicted = getattr(step.diagnostics, "predicted_cycle_s", math.nan)
        cycles.append(
            (
                sizes,
                requests.context_lens.tolist(),
                step.draft_s,
                step.build_s,
                step.verify_s,
                step.kind != "ar",
                float(predicted) if isinstance(predicted, (int, float)) else math.nan,
            )
        )
        expected = step.trees.expected_tokens().tolist()
        still = []
        for j, live in enumerate(active):
            rec = step.record(j)
            live.steps.append(rec)
            live.previous, live.expected = sizes[j], expected[j]
            new = [*rec.result.accepted_tokens, rec.result.bonus_token]
            stop = next((k for k, t in enumerate(new) if t in eos), None)
            if stop is not None:
                new = new[: stop + 1]
            new = new[: max_new_tokens - len(live.out)]
            live.out.extend(new)
            live.committed.extend(new)
            delivered, accepted = delivered_counts(rec.committed_len, len(new))
            live.delivered.append(delivered)
            live.accepted.append(accepted)
            if step.kind == "ar" and learns and hasattr(live.feedback, "then"):
                live.feedback = live.feedback.then(rec.result.feedback)  # not drafted: keep
            else:
                live.feedback = rec.result.feedback
            if _done(live, max_new_tokens, eos):
                finish(live, now)
            else:
                still.append(live)
        active = still
        diag = step.diagnostics
        diag = diag[0] if isinstance(diag, (list, tuple)) and diag else diag
        split = _stages(getattr(verifier, "last_timing", None), step.verify_s)
        control = (
            "repeat" if getattr(diag, "repeated", False) else "decide" if decides else "static"
        )
        samples.append(
            StepSample(
                step.kind,
                step.preparation,
                control,
                tuple(sizes),
                tuple(requests.context_lens.tolist()),
                step.draft_s,
                step.build_s,
                step.verify_s,
                max(clock() - begin - step.draft_s - step.build_s - step.verify_s, 0.0),
                builder if step.kind == "tree" else "",
                *split,
                run,
                at,
            )
        )
        yield False  # a step done (not the start of timing: see _session)
    wall = clock() - start
    lives = [finished[i] for i in range(len(prompts))]
    return _Run(lives, wall, steps, step_sizes, stages, cycles, samples, prefills)


def _stages(timing: VerifyTiming | None, verify_s: float) -> tuple[float, float, float, float]:
    """(mask, forward, accept, commit) of a step's verifier call, commit taking the rest of the
    call (its bookkeeping) so that they add up to ``verify_s``; zeros without a timing."""
    if timing is None:
        return 0.0, 0.0, 0.0, 0.0
    rest = verify_s - timing.mask_s - timing.forward_s - timing.accept_s
    if rest < 0:  # the engine's and the verifier's clocks read apart: scale to the call
        scale = verify_s / (timing.mask_s + timing.forward_s + timing.accept_s)
        return timing.mask_s * scale, timing.forward_s * scale, timing.accept_s * scale, 0.0
    return timing.mask_s, timing.forward_s, timing.accept_s, rest


def _cycle_report(
    cost_model: CostModel | None, cycles: Sequence[_Cycle], drafts: bool
) -> dict[str, float]:
    """Mean predicted vs measured cycle over the steps (after the run: never timed).

    A step is priced by ``cost_model`` as the step it was (an AR step, one the policy did not
    draft for, without the draft pass), except that a learning controller's step counts what
    the controller itself predicted for its choice (``predicted_cycle_s``), when it did."""
    if cost_model is None or not cycles:
        return {}
    pred_draft, pred_verify, pred_total = [], [], []
    for sizes, contexts, _, _, _, drafted, own in cycles:
        others = tuple(RequestLoad(s, c) for s, c in zip(sizes[1:], contexts[1:], strict=True))
        cost = cost_model.step_cost(sizes[0], StepLoad(contexts[0], others))
        draft = cost.draft_s if drafts and drafted else 0.0
        pred_draft.append(draft)
        pred_verify.append(cost.verify_s)
        pred_total.append(own if math.isfinite(own) else draft + cost.prep_s + cost.verify_s)
    measured = [c[2] + c[3] + c[4] for c in cycles]
    return {
        "predicted_s": float(np.mean(pred_total)),
        "measured_s": float(np.mean(measured)),
        "predicted_draft_s": float(np.mean(pred_draft)),
        "measured_draft_s": float(np.mean([c[2] for c in cycles])),
        "predicted_verify_s": float(np.mean(pred_verify)),
        "measured_verify_s": float(np.mean([c[4] for c in cycles])),
        "measured_build_s": float(np.mean([c[3] for c in cycles])),
    }


def _eos_set(target: Any, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id == -1:
        gen = getattr(target, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(target.config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({int(eos_token_id)})
    return frozenset(int(e) for e in eos_token_id)


def _check_prompts(target: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    if not prompts:
        raise BudgetError("no prompts: give at least one")
    limit = getattr(target.config, "max_position_embeddings", None)
    vocab = int(target.config.vocab_size)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise BudgetError(f"prompt {i} is empty; give at least one token id")
        if min(p) < 0 or max(p) >= vocab:
            raise BudgetError(f"prompt {i}: token ids must be in [0, {vocab})")
        if limit is not None and len(p) + max_new_tokens > int(limit):
            raise BudgetError(
                f"prompt {i} ({len(p)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"target's context of {limit} tokens (max_position_embeddings)"
            )


@public(target=has("config", "parameters"))
def generate_batch(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: str | TreePolicy,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 1,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = -1,
    cost_model: CostModel | None = None,
    record_traces: Sequence[str | os.PathLike[str]] | None = None,
    trace_metadata: Mapping[str, Any] | None = None,
    dense_trace: bool = False,
    verifier: TorchVerifier | None = None,
    repeats: int = 1,
    warmup: int = 0,
    predict_cycles: CostModel | None = None,
    policy_spec: str | None = None,
) -> BatchGenerationReport:
    """Generate up to ``max_new_tokens`` tokens after each prompt, ``batch_size`` at a time.

    ``eos_token_id=-1`` uses the target's (every id of a list); ``None`` disables stopping at
    EOS. ``drafter`` may be ``None`` only for the ``ar`` policy. ``record_traces`` gives one
    trace path per prompt, written after a successful run (never a partial one).
    ``predict_cycles`` prices the run's steps with that cost model for the report's ``cycle``
    when the policy's own cost model is not one (e.g. to compare static policies).
    ``policy_spec`` is the spec the records name (default: ``policy`` when it is a string, else
    :func:`~bastion.policies.policy_label` of the object).
    """
    return _finish(
        _session(
            target,
            drafter,
            policy,
            prompts,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            seed=seed,
            eos_token_id=eos_token_id,
            cost_model=cost_model,
            record_traces=record_traces,
            trace_metadata=trace_metadata,
            dense_trace=dense_trace,
            verifier=verifier,
            repeats=repeats,
            warmup=warmup,
            predict_cycles=predict_cycles,
            policy_spec=policy_spec,
            clock=None,
        )
    )


def _session(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: str | TreePolicy,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_new_tokens: int,
    sampling: SamplingParams | None,
    seed: int,
    eos_token_id: int | Sequence[int] | None,
    cost_model: CostModel | None,
    record_traces: Sequence[str | os.PathLike[str]] | None,
    trace_metadata: Mapping[str, Any] | None,
    dense_trace: bool,
    verifier: TorchVerifier | None,
    repeats: int,
    warmup: int,
    predict_cycles: CostModel | None,
    policy_spec: str | None,
    clock: Clock | None,
    on_run: Callable[[int], None] | None = None,
) -> Generator[bool, None, BatchGenerationReport]:
    """:func:`generate_batch` as a generator: checks and sets up (raising before the first
    yield), runs the warm-ups, yields ``True`` once timing begins and ``False`` after every
    timed step (so that :mod:`.lockstep` can run other sessions' steps in between), and
    returns the report; ``on_run(k)`` after its k-th timed run. ``clock`` None: the target's
    device clock."""
    pol = make_policy(policy)  # a spec string (built-in or plug-in) or a policy object
    is_ar = not getattr(pol, "uses_drafter", True)
    if drafter is None and not is_ar:
        raise BudgetError(f"policy {pol.name} needs a drafter; only 'ar' runs without one")
    if max_new_tokens < 1:
        raise BudgetError(f"max_new_tokens must be ≥ 1; got {max_new_tokens}")
    if batch_size < 1:
        raise BudgetError(f"batch_size must be ≥ 1; got {batch_size}")
    if repeats < 1:
        raise BudgetError(f"repeats must be ≥ 1; got {repeats}")
    if warmup < 0:
        raise BudgetError(f"warmup must be ≥ 0; got {warmup}")
    _check_prompts(target, prompts, max_new_tokens)
    if record_traces is not None and len(record_traces) != len(prompts):
        raise BudgetError(
            f"{len(record_traces)} trace paths for {len(prompts)} prompts; give one per prompt"
        )
    sampling = sampling or SamplingParams()
    device = next(target.parameters()).device
    clock = clock or device_clock(device)
    taps = () if is_ar or not isinstance(drafter, DFlashDrafter) else drafter.cfg.target_layer_ids
    if verifier is None:
        gen = torch.Generator(device=device).manual_seed(seed)
        verifier = TorchVerifier(target, tap_layer_ids=taps, sampling=sampling, generator=gen)
    elif taps and tuple(verifier.tap_layer_ids) != tuple(taps):
        raise ConfigError(
            f"the verifier taps target layers {tuple(verifier.tap_layer_ids)}; the DFlash "
            f"drafter reads {tuple(taps)}: pass TorchVerifier(..., tap_layer_ids="
            "drafter.cfg.target_layer_ids)"
        )
    eos = _eos_set(target, eos_token_id)
    used: Drafter | BatchDrafter = _NoDrafter() if is_ar or drafter is None else drafter
    cost_model = resolve_cost_model(
        target, drafter, pol, cost_model, max(len(p) for p in prompts), batch_size
    )
    if getattr(pol, "learns", False) and cost_model is not None:
        from bastion.learned import LearnedCostModel

        if not isinstance(cost_model, LearnedCostModel):  # one learner for warm-up and repeats
            cost_model = LearnedCostModel(cost_model)
        if record_traces is not None:  # a trace holds the drafter's view of every step
            cost_model.always_draft = True
    rng_state = verifier.generator.get_state()
    for _ in range(warmup):
        engine = SpecEngine(used, pol, verifier, cost_model, clock)
        first = [list(p) for p in prompts[:batch_size]]
        tokens = min(WARMUP_TOKENS, max_new_tokens)
        _finish(_decoding(engine, verifier, used, first, batch_size, tokens, eos, clock))
    runs: list[_Run] = []
    recorder = _RecordingDrafter(used) if record_traces is not None else None
    yield True  # timing begins
    for r in range(repeats):
        verifier.generator.set_state(rng_state)
        part = recorder if (recorder is not None and r == 0) else used
        engine = SpecEngine(part, pol, verifier, cost_model, clock)
        decoding = _decoding(
            engine, verifier, used, prompts, batch_size, max_new_tokens, eos, clock, r
        )
        runs.append((yield from decoding))  # yields False after every step
        if on_run is not None:
            on_run(len(runs))
    first_run = runs[0]
    agree = all(
        [x.out for x in other.lives] == [x.out for x in first_run.lives] for other in runs[1:]
    )
    if not agree:
        log.warning("repeats of the same seeded run produced different outputs")
    spec = policy_spec or (policy if isinstance(policy, str) else policy_label(pol))
    records = [_report(x, pol.name, spec, len(prompts[x.index])) for x in first_run.lives]
    timings = [
        RunTiming(
            run.wall_s,
            sum(len(x.out) for x in run.lives),
            float(np.mean(tpots)),
            tuple(tpots),
        )
        for run in runs
        for tpots in [[_tpot(x) for x in run.lives]]
    ]
    pricer = cost_model if cost_model is not None else predict_cycles
    report = BatchGenerationReport(
        records=records,
        policy=pol.name,
        batch_size=batch_size,
        runs=timings,
        steps=first_run.steps,
        mean_batch=float(np.mean(first_run.step_sizes)) if first_run.step_sizes else 0.0,
        stage_times=first_run.stage_times,
        cycle=_cycle_report(pricer, first_run.cycles, not is_ar),
        warmup=warmup,
        policy_spec=spec,
        repeats_agree=agree,
        samples=tuple(x for run in runs for x in run.samples),
        prefills=tuple(x for run in runs for x in run.prefills),
    )
    if recorder is not None and record_traces is not None:
        _write_traces(
            target,
            drafter,
            pol.name,
            prompts,
            report,
            recorder,
            record_traces,
            sampling,
            seed,
            trace_metadata,
            dense_trace,
        )
    return report


def _tpot(live: _Live) -> float:
    """Decode time after the first token ÷ the tokens after it (the serving benchmarks' TPOT)."""
    return (live.end_at - live.first_at) / (len(live.out) - 1) if len(live.out) > 1 else 0.0


def _report(live: _Live, policy: str, spec: str, n_in: int) -> GenerationReport:
    steps = live.steps
    timings = live.timings
    stage_times = {
        "draft": sum(s.draft_s for s in steps),
        "build": sum(s.build_s for s in steps),
        "mask": sum(t.mask_s for t in timings),
        "verify": sum(t.forward_s + t.accept_s for t in timings),
        "commit": sum(t.commit_s for t in timings),
    }
    ttft = live.queue_s + live.prefill_s
    return GenerationReport(
        output_ids=list(live.out),
        prompt_len=n_in,
        output_len=len(live.out),
        ttft_s=ttft,
        tpot_s=_tpot(live),
        e2e_s=ttft + (live.end_at - live.first_at),
        committed_per_step=list(live.delivered),
        accepted_per_step=list(live.accepted),
        policy_spec=spec,
        stage_times=stage_times,
        trees=[
            {
                "size": s.tree.size,
                "parents": s.tree.parents.tolist(),
                "tokens": s.tree.tokens.tolist(),
                "accepted_path": list(s.result.accepted_nodes),
            }
            for s in steps
        ],
        policy=policy,
        prefill_s=live.prefill_s,
        queue_s=live.queue_s,
    )


def _write_traces(
    target: Any,
    drafter: object,
    policy: str,
    prompts: Sequence[Sequence[int]],
    report: BatchGenerationReport,
    recorder: _RecordingDrafter,
    paths: Sequence[str | os.PathLike[str]],
    sampling: SamplingParams,
    seed: int,
    trace_metadata: Mapping[str, Any] | None,
    dense_trace: bool,
) -> None:
    for i, (prompt, rec, path) in enumerate(zip(prompts, report.records, paths, strict=True)):
        position = len(prompt)  # sequence index of the first step's root (the first token)
        steps = []
        # target-only AR never drafts (the engine skips the drafter): its trace has no steps
        drafted = recorder.marginals.get(i, [])
        for size, committed, marg in zip(
            [t["size"] for t in rec.trees] if drafted else [],
            rec.committed_per_step if drafted else [],
            drafted,
            strict=True,
        ):
            steps.append(TraceStep(position, marg, size, committed))
            position += committed
        meta = {
            "policy": policy,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": seed,
            "batch_size": report.batch_size,
            "target": getattr(target.config, "_name_or_path", "") or type(target).__name__,
            "prompt_id": i,
            **(trace_metadata or {}),
        }
        dense = {}
        if dense_trace and isinstance(drafter, DFlashDrafter):
            from .record import dense_marginals

            sequence = [*prompt, *rec.output_ids]
            dense = dense_marginals(target, drafter, sequence, len(prompt))
            meta["vocab_size"] = int(getattr(target.config, "vocab_size"))  # noqa: B009
        write_trace(path, Trace(tuple(prompt), tuple(rec.output_ids), tuple(steps), meta, dense))


@public(target=has("config", "parameters"))
def generate(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: str | TreePolicy,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = -1,
    cost_model: CostModel | None = None,
    record_trace: str | os.PathLike[str] | None = None,
    trace_metadata: Mapping[str, Any] | None = None,
    dense_trace: bool = False,
    verifier: TorchVerifier | None = None,
) -> GenerationReport:
    """One prompt at batch 1 (:func:`generate_batch` with one prompt); see there."""
    report = generate_batch(
        target,
        drafter,
        policy,
        [prompt_ids],
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        eos_token_id=eos_token_id,
        cost_model=cost_model,
        record_traces=None if record_trace is None else [record_trace],
        trace_metadata=trace_metadata,
        dense_trace=dense_trace,
        verifier=verifier,
    )
    return report.records[0]
