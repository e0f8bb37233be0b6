"""One policy's row of a simulation: what :func:`bastion.sim.simulate.simulate` reports of each
served run — speedup over AR, τ, the step's parts, latency percentiles, draft acceptance, the
learning controller's predicted against simulated cycle, KV memory and admission, and SLOs.

:class:`PolicyResult` is built from a :class:`bastion.sim.serving.ServingResult` and AR's mean
TPOT (:meth:`PolicyResult.of`); its fields, in order, are the records' metric columns
(:data:`bastion.sim.results.METRIC_COLUMNS`).

What this module does not do: serve anything (:mod:`bastion.sim.serving`) or compare policies
(:mod:`bastion.sim.simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bastion.guard import number, public
from bastion.records import acceptance_stats
from bastion.sim.latency import latency_summary
from bastion.sim.serving_records import ServingResult
from bastion.sim.slo import check_slo, memory_fields, slo_fields

__all__ = ["PolicyResult"]


@dataclass(frozen=True)
class PolicyResult:
    """One row of the comparison."""

    policy: str
    policy_spec: str  # the spec it was made from (bastion.policies.policy_label)
    speedup: float  # AR TPOT / this TPOT
    tau: float
    mean_tree_size: float
    tpot_s: float
    throughput_tok_s: float
    draft_s: float
    prep_s: float
    verify_s: float
    steps: int
    mean_batch: float
    simulated_s: float  # simulated time of this policy's run
    wall_s: float  # wall time of its serving loop
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    ttft_mean_s: float  # means beside the percentiles (tpot_s is TPOT's mean)
    e2e_mean_s: float
    acceptance_rate: float  # accepted draft tokens / drafted tree nodes (nan without a draft)
    acceptance_by_position: tuple[float, ...]  # [d-1]: share of steps accepting ≥ d drafts
    tokens: int  # output tokens generated over all requests
    # a learning controller's mean predicted cycle beside the mean simulated one, over the
    # steps it learned from (nan for other policies)
    cycle_predicted_s: float = float("nan")
    cycle_observed_s: float = float("nan")
    # the KV cache (bastion.sim.memory; capacity None: memory not limited) and admission
    kv_capacity_tokens: int | None = None
    kv_peak_tokens: int = 0
    max_running: int = 0
    preemptions: int = 0
    queue_delay_p50_s: float = 0.0
    queue_delay_p99_s: float = 0.0
    # the SLOs given (nan without one): the share of requests meeting them, and per second
    slo_attainment: float = float("nan")
    goodput_rps: float = float("nan")

    @classmethod
    @public(ar_tpot_s=number(positive=True), wall_s=number(lo=0.0))
    def of(
        cls,
        r: ServingResult,
        ar_tpot_s: float,
        wall_s: float,
        spec: str | None = None,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
    ) -> PolicyResult:
        check_slo("slo_ttft_s", slo_ttft_s)
        check_slo("slo_tpot_s", slo_tpot_s)
        slo = slo_fields(
            [q.ttft_s for q in r.requests],
            [q.tpot_s for q in r.requests],
            r.elapsed_s,
            slo_ttft_s,
            slo_tpot_s,
        )
        return cls(
            policy=r.policy,
            policy_spec=r.policy if spec is None else spec,
            speedup=ar_tpot_s / r.tpot_s if r.tpot_s > 0 else float("nan"),
            tau=r.tau,
            mean_tree_size=r.mean_tree_size,
            tpot_s=r.tpot_s,
            throughput_tok_s=r.throughput,
            draft_s=r.draft_s,
            prep_s=r.prep_s,
            verify_s=r.verify_s,
            steps=r.steps,
            mean_batch=r.mean_batch,
            simulated_s=r.elapsed_s,
            wall_s=wall_s,
            **latency_summary(q.latency() for q in r.requests),  # type: ignore[arg-type]
            ttft_mean_s=float(np.mean([q.ttft_s for q in r.requests])),
            e2e_mean_s=float(np.mean([q.e2e_s for q in r.requests])),
            **acceptance(r),
            tokens=r.tokens,
            cycle_predicted_s=(
                r.cycle_predicted_s / r.cycles_compared if r.cycles_compared else float("nan")
            ),
            cycle_observed_s=(
                r.cycle_observed_s / r.cycles_compared if r.cycles_compared else float("nan")
            ),
            **memory_fields(r),
            **slo,
        )


def acceptance(r: ServingResult) -> dict[str, Any]:
    """Draft acceptance of a run (:func:`bastion.records.acceptance_stats` over every request's
    steps: accepted draft tokens delivered, tree sizes)."""
    return acceptance_stats(
        [a for q in r.requests for a in q.accepted], [s for q in r.requests for s in q.tree_sizes]
    )
