"""The reports of a real decoding run, per request and per run, and the traces recorded from it.

:class:`GenerationReport` is one request's result in the record vocabulary
(:mod:`bastion.records`); :class:`BatchGenerationReport` holds every request's and the run's
aggregates: throughput, TPOT and latency over the timed runs, the cost model's predicted cycle
beside the measured one, every step's and prefill's stage times. :func:`_batch_report` makes it
from a session's timed runs, after them (never timed). When traces are asked for,
:func:`_write_traces` writes one trace per prompt (:mod:`bastion.trace`) from the marginals the
first timed run's drafter kept (:class:`.prepare._RecordingDrafter`).

What this module does not do: decode (:mod:`.decode`) or time anything.
"""

from __future__ import annotations

import math
import os
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bastion.interfaces import CostModel, RequestLoad, StepLoad
from bastion.records import RENAMED, acceptance_stats
from bastion.stepcosts import PrefillSample, StepSample
from bastion.trace import Trace, TraceStep, write_trace
from bastion.tree import DraftMarginals

from .decode import _Cycle, _Live, _Run
from .drafter import DFlashDrafter
from .sampling import SamplingParams

__all__ = ["BatchGenerationReport", "GenerationReport", "RunTiming"]


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


def _batch_report(
    runs: Sequence[_Run],
    policy: str,
    spec: str,
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    pricer: CostModel | None,
    drafts: bool,
    warmup: int,
    agree: bool,
) -> BatchGenerationReport:
    """A session's report from its timed runs (the first one's records; every run's timing and
    samples); ``pricer`` prices the first run's steps for the ``cycle`` (see
    :func:`_cycle_report`, ``drafts``: the policy calls the drafter)."""
    first_run = runs[0]
    records = [_report(x, policy, spec, len(prompts[x.index])) for x in first_run.lives]
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
    return BatchGenerationReport(
        records=records,
        policy=policy,
        batch_size=batch_size,
        runs=timings,
        steps=first_run.steps,
        mean_batch=float(np.mean(first_run.step_sizes)) if first_run.step_sizes else 0.0,
        stage_times=first_run.stage_times,
        cycle=_cycle_report(pricer, first_run.cycles, drafts),
        warmup=warmup,
        policy_spec=spec,
        repeats_agree=agree,
        samples=tuple(x for run in runs for x in run.samples),
        prefills=tuple(x for run in runs for x in run.prefills),
    )


# --------------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------------


def _write_traces(
    target: Any,
    drafter: object,
    policy: str,
    prompts: Sequence[Sequence[int]],
    report: BatchGenerationReport,
    marginals: Mapping[int, Sequence[DraftMarginals]],
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
        drafted = marginals.get(i, [])
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
