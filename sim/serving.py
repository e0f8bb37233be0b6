"""Serving on the simulated GPU: batch 1 and closed-loop continuous batching, in SimPy.

One server process owns the GPU. Each serving step takes every runnable request (at most C in
flight; a finished request is replaced at once while requests remain — a closed loop, as in
SGLang's continuous batching), and for each request calls the shared engine's
:meth:`bastion.engine.SpecEngine.step`: draft → the policy (the adaptive controller sees the
batch through ``StepLoad.co_batched``) → verify and commit. The step's time is then charged on
the simulated GPU as SimPy timeouts, one per pass: the batched drafter pass plus host
preparation (top-K normalisation, tree building, masks), then the batched verification pass.
Target-only AR steps have no draft and an unmasked one-token pass per request.

Measured per request: tokens, steps, committed lengths (τ), tree sizes, and TPOT (decode time
from its first step to its last commit, over the tokens generated after prefill's first token).
Prefill is not simulated. Per step: draft, preparation and verification seconds, batch size.

What this module does not do: decide trees (the engine and its policy do), price passes (the
simulated GPU does), or compare policies (see :mod:`sim.simulate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import numpy as np
import simpy

from bastion.engine import SpecEngine
from bastion.interfaces import CostModel, RequestLoad, StepLoad, TreePolicy
from bastion.policies import AutoregressivePolicy, ChainPolicy
from sim.backend import SimDrafter, SimRequest, SimVerifier
from sim.gpu import SimulatedGPU

__all__ = ["RequestStats", "ServingResult", "serve"]

log = logging.getLogger(__name__)

RequestFactory = Callable[[int], SimRequest]  # request index → a fresh request


@dataclass
class RequestStats:
    """What one request did."""

    request_id: int
    tokens: int = 0  # generated tokens (prefill's first token included)
    committed: list[int] = field(default_factory=list)  # per step, bonus included
    tree_sizes: list[int] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def tau(self) -> float:
        return float(np.mean(self.committed)) if self.committed else 0.0

    @property
    def tpot_s(self) -> float:
        decoded = self.tokens - 1
        return (self.end_s - self.start_s) / decoded if decoded > 0 else 0.0


@dataclass
class ServingResult:
    """One policy served over a set of requests at one concurrency."""

    policy: str
    concurrency: int
    requests: list[RequestStats]
    elapsed_s: float  # simulated time from the first step to the last commit
    draft_s: float = 0.0  # summed over steps
    prep_s: float = 0.0
    verify_s: float = 0.0
    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)

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


def serve(
    policy: TreePolicy,
    gpu: SimulatedGPU,
    new_request: RequestFactory,
    n_requests: int,
    concurrency: int = 1,
    cost_model: CostModel | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ServingResult:
    """Serve ``n_requests`` requests with ``policy``, at most ``concurrency`` in flight."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be ≥ 1; got {concurrency}")
    env = simpy.Environment()
    table: dict[int, SimRequest] = {}
    engine = SpecEngine(
        SimDrafter(table),
        policy,
        SimVerifier(table),
        cost_model=cost_model,
        clock=lambda: env.now,
        observe_costs=False,  # the server reports the true batched pass time instead
    )
    is_ar = isinstance(policy, AutoregressivePolicy)
    topk = not isinstance(policy, ChainPolicy)
    result = ServingResult(policy.name, concurrency, [], 0.0)
    stats: dict[int, RequestStats] = {}
    gpu_lock = simpy.Resource(env, capacity=1)

    def admit(index: int) -> None:
        req = new_request(index)
        table[req.request_id] = req
        stats[req.request_id] = RequestStats(req.request_id, tokens=1, start_s=env.now)

    def server() -> Generator[simpy.Event, object, None]:
        admitted = 0
        last_size: dict[int, int] = {}
        last_accept: dict[int, float] = {}  # each request's Â in its previous step
        while admitted < min(concurrency, n_requests):
            admit(admitted)
            admitted += 1
        done = 0
        while table:
            ids = list(table)
            contexts = [table[i].context_len for i in ids]
            sizes = [last_size.get(i, 0) for i in ids]
            accepts = [last_accept.get(i, 0.0) for i in ids]
            if 0 in sizes:  # new requests: assume the batch's typical tree until they choose
                guess = max(1, int(np.mean(list(last_size.values())))) if last_size else 1
                typical = float(np.mean(list(last_accept.values()))) if last_accept else 1.0
                accepts = [a if s else typical for a, s in zip(accepts, sizes, strict=True)]
                sizes = [s or guess for s in sizes]
            records = []
            loads = [RequestLoad(s, c, a) for s, c, a in zip(sizes, contexts, accepts, strict=True)]
            for j, rid in enumerate(ids):
                load = StepLoad(contexts[j], (*loads[:j], *loads[j + 1 :]))
                rec = engine.step(rid, [0], None, load, last_size.get(rid))
                sizes[j] = rec.tree.size
                accepts[j] = float(rec.tree.scores.sum())
                loads[j] = RequestLoad(sizes[j], contexts[j], accepts[j])
                records.append((rid, rec, load))
            with gpu_lock.request() as turn:
                yield turn
                if is_ar:
                    t_draft, t_prep = 0.0, 0.0
                    t_verify = gpu.ar_s(contexts)
                else:
                    t_draft = gpu.draft_s(contexts)
                    t_prep = gpu.prep_s(sizes, topk)
                    yield env.timeout(t_draft + t_prep)
                    t_verify = gpu.verify_s(sizes, contexts)
                yield env.timeout(t_verify)
            result.steps += 1
            result.draft_s += t_draft
            result.prep_s += t_prep
            result.verify_s += t_verify
            result.batch_sizes.append(len(ids))
            for rid, rec, load in records:
                if cost_model is not None and not is_ar:
                    cost_model.observe(rec.tree.size, load, t_verify)
                req, st = table[rid], stats[rid]
                last_size[rid] = rec.tree.size
                last_accept[rid] = float(rec.tree.scores.sum())
                st.committed.append(rec.committed_len)
                st.tree_sizes.append(rec.tree.size)
                st.tokens = min(req.generated, req.output_len)
                if req.generated >= req.output_len:
                    st.end_s = env.now
                    result.requests.append(st)
                    del table[rid]
                    last_size.pop(rid, None)
                    last_accept.pop(rid, None)
                    done += 1
                    if progress is not None:
                        progress(done, n_requests)
                    if admitted < n_requests:
                        admit(admitted)
                        admitted += 1
        result.elapsed_s = env.now

    env.process(server())
    env.run()
    result.requests.sort(key=lambda r: r.request_id)
    return result
