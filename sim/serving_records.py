"""What a simulated serve measured: each request's stats and the run's result.

:class:`RequestStats` holds one request's times, tokens and per-step delivered lengths,
accepted draft tokens and tree sizes; :class:`ServingResult` one policy's run over its requests
(simulated time, per-step sums, batch sizes, the KV cache's peak) and the means it reports.
:func:`attach_steps` folds the server's per-step logs into the requests' stats once the run
ends (:mod:`bastion.sim.serving` is the server that fills them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bastion.sim.latency import RequestLatency

__all__ = ["RequestStats", "ServingResult"]  # (attach_steps: the server's own)


@dataclass
class RequestStats:
    """What one request did (times in simulated seconds)."""

    request_id: int
    tokens: int = 0  # generated tokens (prefill's first token included)
    # per step: tokens delivered (bonus included), cut at the output length (see the module doc)
    committed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # per step: draft tokens among them
    tree_sizes: list[int] = field(default_factory=list)
    arrival_s: float = 0.0
    start_s: float = 0.0  # its first token (end of its prefill)
    end_s: float = 0.0  # its last commit
    prompt_len: int = 0
    queue_s: float = 0.0  # waiting for admission, summed over its admissions (preemptions)
    preempted: int = 0  # times it was preempted (its KV dropped, recomputed on readmission)

    @property
    def tau(self) -> float:
        return float(np.mean(self.committed)) if self.committed else 0.0

    @property
    def ttft_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        decoded = self.tokens - 1
        return (self.end_s - self.start_s) / decoded if decoded > 0 else 0.0

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.arrival_s

    def latency(self) -> RequestLatency:
        return RequestLatency(
            self.request_id,
            self.arrival_s,
            self.start_s,
            self.end_s,
            self.prompt_len,
            self.tokens,
            len(self.committed),
            sum(self.committed),
        )


@dataclass
class ServingResult:
    """One policy served over a set of requests."""

    policy: str
    concurrency: int
    requests: list[RequestStats]
    elapsed_s: float  # simulated time from the first arrival to the last commit
    draft_s: float = 0.0  # summed over steps
    prep_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0  # prefill-only passes
    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    # a learning controller's predicted cycle beside the simulated one, summed over the steps
    # it learned from (no prefill chunk in the pass)
    cycle_predicted_s: float = 0.0
    cycle_observed_s: float = 0.0
    cycles_compared: int = 0
    step_kinds: dict[str, int] = field(default_factory=dict)  # decode steps by kind (ar, tree …)
    # the KV cache (bastion.sim.memory): its capacity (None: memory not limited), the most
    # token slots held at once, the most requests admitted at once, preemptions
    kv_capacity_tokens: int | None = None
    kv_peak_tokens: int = 0
    max_running: int = 0
    preemptions: int = 0

    @property
    def tau(self) -> float:
        """τ macro-averaged over requests (each request's mean committed per step)."""
        return float(np.mean([r.tau for r in self.requests]))

    @property
    def mean_tree_size(self) -> float:
        sizes = [s for r in self.requests for s in r.tree_sizes]
        return float(np.mean(sizes)) if sizes else 0.0

    @property
    def tpot_s(self) -> float:
        """Mean over requests of each request's time per output token."""
        return float(np.mean([r.tpot_s for r in self.requests]))

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def throughput(self) -> float:
        """Generated tokens per simulated second."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0


def attach_steps(
    stats: dict[int, RequestStats],
    logs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> None:
    """Per-request delivered lengths, accepted draft tokens and tree sizes, from the per-step
    logs (in step order: each step's request ids, committed lengths, lengths still wanted
    before the step and tree sizes)."""
    if not logs:
        return
    columns = tuple(zip(*logs, strict=True))  # the steps' ids, committed, wanted, sizes
    ids = np.concatenate(columns[0])
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    bounds = np.flatnonzero(np.diff(ids)) + 1
    made, wanted, nodes = (np.concatenate(columns[k])[order] for k in (1, 2, 3))
    delivered = np.minimum(made, wanted)  # nothing past a request's output length counts
    # each request's run of the sorted steps, as slices of three Python lists (one tolist per
    # array: the same ints as splitting the arrays and listing every piece, which cost a
    # serve ≈ 2 µs a step at C = 32)
    committed, accepted, sizes = (
        x.tolist() for x in (delivered, np.minimum(made - 1, delivered), nodes)
    )
    edges = [0, *bounds.tolist(), ids.shape[0]]
    for k, i in enumerate(ids[edges[:-1]].tolist()):
        a, e = edges[k], edges[k + 1]
        st = stats[i]
        st.committed = committed[a:e]
        st.accepted = accepted[a:e]
        st.tree_sizes = sizes[a:e]
