"""Serving on the simulated GPU: closed- or open-loop continuous batching with chunked prefill.

One server process owns the GPU. Requests arrive — in a *closed loop* (``concurrency`` clients,
each sending its next request the moment its last one finishes, as SGLang's and DFlash's batch
benchmarks do) or in an *open loop* (arrival times given: a Poisson process or a file) — and wait
until fewer than ``concurrency`` requests are in service. An admitted request is first
*prefilled*: its prompt is processed in chunks of at most ``prefill_chunk`` tokens per step
(first come, first served), each chunk riding in the same forward pass as the decoding requests'
verification (chunked prefill mixed into decode, as Sarathi-Serve and vLLM do), or in a
prefill-only pass when nothing is decoding. The pass that finishes a prompt produces the
request's first token (its time to first token); from the next step on it decodes.

Each decode step is one call of the shared engine's :meth:`bastion.engine.SpecEngine.step` for
every decoding request at once: the drafter drafts the batch, the policy chooses all trees
together (the adaptive controller under one joint budget), the verifier accepts and commits.
The step's time — the batched drafter pass, preparation and the batched verification
pass, each priced on the simulated GPU — is then charged as one SimPy timeout (nothing can
happen between passes that run back to back on the one GPU). Target-only AR
steps have no draft and a one-token pass per request. What a policy costs besides its trees'
sizes comes from two declared attributes: ``uses_topk`` (False for the chain: top-1
preparation and a causal verification pass instead of top-K, tree building and a tree mask) and
``uses_cost_model`` (the adaptive controller's host time is charged in preparation); a step
whose record says ``preparation == "argmax"`` (the learning controller's chain decision that
stood, planned before drafting) is prepared as the chain's.

A request stops at its output length, as the real backend does: a step that would commit past
it delivers only the tokens still wanted (its bonus token first to go, then the deepest accepted
draft tokens), and only delivered tokens are counted — in τ (the cut step counts what it
delivered, at least 1), in the accepted draft tokens behind the acceptance rate and in throughput.

Measured per request: arrival, first token, finish, tokens, steps, delivered lengths (τ),
accepted draft tokens and tree sizes; TTFT = first token − arrival, TPOT = (finish − first
token) / (tokens − 1), end-to-end = finish − arrival. Per step: draft, preparation and
verification seconds, and the batch size.

What this module does not do: decide trees (the engine and its policy do), price passes (the
simulated GPU does), or compare policies (see :mod:`bastion.sim.simulate`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import simpy

from bastion.batch import KVRoom, StepRequests
from bastion.engine import SpecEngine, batch_policy, observed_load
from bastion.errors import ConfigError, MemoryLimitError
from bastion.fastinit import trusted_init
from bastion.guard import public
from bastion.interfaces import BatchTreePolicy, CostModel, TreePolicy
from bastion.sim.arrivals import Arrival
from bastion.sim.backend import DraftSource, SimBatch
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.memory import KVCache, MemoryPlan, lookahead_tokens, within_lookahead
from bastion.sim.prefill import DEFAULT_PREFILL_CHUNK
from bastion.sim.serving_records import RequestStats, ServingResult, attach_steps

try:  # a serving step's gathers and closing bookkeeping, compiled (numpy's without them)
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the build without the extension
    _kernel = None
_gather = getattr(_kernel, "gather", None)
_settle = getattr(_kernel, "settle", None)
IntArray = npt.NDArray[np.int64]

_step_requests = trusted_init(StepRequests)  # every step's, built without __init__
# … and its KV room: the server's room is int64 already (what KVRoom's post-init makes of it)
_kv_room = trusted_init(KVRoom, normalised=True)

__all__ = ["RequestStats", "ServingResult", "serve"]

log = logging.getLogger(__name__)


class LengthSource(DraftSource, Protocol):
    """A draft source that also starts requests (synthetic or replayed)."""

    def admit(self, slot: int, index: int) -> object: ...

    def lengths(self, index: int, requested: tuple[int, int] | None = None) -> tuple[int, int]:
        """(prompt_len, output_len) of request ``index``; ``requested`` is an arrival's (a
        replayed request keeps its recording's)."""
        ...


@public
def serve(
    policy: TreePolicy | BatchTreePolicy,
    gpu: SimulatedGPU,
    source: LengthSource,
    n_requests: int | None = None,
    concurrency: int = 1,
    cost_model: CostModel | None = None,
    progress: Callable[[int, int], None] | None = None,
    arrivals: Sequence[Arrival] | None = None,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    max_steps: int | None = None,
    prefill_alone: bool = False,
    memory: MemoryPlan | None = None,
) -> ServingResult:
    """Serve requests with ``policy``, at most ``concurrency`` in service at once.

    Closed loop: ``n_requests`` requests, ``concurrency`` at a time, each replaced when it
    finishes. Open loop: ``arrivals`` (sorted by time) give each request's arrival and lengths.
    ``prefill_chunk`` = 0 skips prefill (a request's first token comes at its admission).
    ``max_steps`` stops after that many decode steps, finished or not (a learning policy's
    warm-up); the result then holds only the requests that finished.
    ``prefill_alone``: as the real backend's loop (``bastion twin`` replays it), every admitted
    prompt is prefilled whole in a pass of its own, one after another, and joins the very next
    decode step; ``prefill_chunk`` is then unused.
    ``memory``: the GPU's memory plan (:func:`bastion.sim.memory.plan_memory`): requests are
    admitted only when their KV blocks fit, and preempted when the running ones cannot grow
    (see the module doc); None: memory never limits (its use is still counted).
    """
    if arrivals is not None:
        n = len(arrivals)
        if n_requests is not None and n_requests != n:
            raise ConfigError(f"{n_requests} requests asked for but {n} arrivals given")
    elif n_requests is None:
        raise ConfigError("serve needs n_requests (closed loop) or arrivals (open loop)")
    else:
        n = n_requests
    if n < 1:
        raise ConfigError(f"a simulation needs at least one request; got {n}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an integer ≥ 1; got {concurrency!r}")
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 0:
        raise ConfigError(f"prefill_chunk must be an integer ≥ 0; got {prefill_chunk!r}")
    if not isinstance(prefill_alone, bool):
        raise ConfigError(f"prefill_alone must be true or false; got {prefill_alone!r}")
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0
    ):
        raise ConfigError(f"max_steps must be an integer ≥ 0 or None; got {max_steps!r}")

    env = simpy.Environment()
    pool = SimBatch(source, n)
    reserve = getattr(source, "reserve", None)
    if reserve is not None:
        reserve(min(concurrency, n))
    engine = SpecEngine(
        pool,
        policy,
        pool,
        cost_model=cost_model,
        clock=lambda: env.now,
        observe_costs=False,  # the server reports the true batched pass time instead
    )
    batched = batch_policy(policy)
    is_ar = not getattr(batched, "uses_drafter", True)
    # a policy that needs only the drafter's top-1 (the chain) verifies one path: causal mask,
    # argmax preparation; every other drafting policy verifies trees (tree mask, top-K)
    topk = bool(getattr(policy, "uses_topk", True))
    controller = bool(getattr(batched, "uses_cost_model", False))  # host time of the controller
    builder = str(getattr(policy, "tree_builder", ""))  # its own tree builder (beam, eagle)
    # a cost model learns from measured passes unless it says it does not (static, bare)
    learns = getattr(cost_model, "mode", "ema") in ("ema", "ema+calib")
    observe = cost_model is not None and not is_ar and learns
    learning = bool(getattr(batched, "learns", False)) and cost_model is not None
    history = bool(getattr(batched, "uses_cost_model", False))  # last step's N and Â per request
    # (Â only for a policy that reads it: the learning controller declares it does not)
    expected_history = history and bool(getattr(batched, "uses_previous_expected", True))
    result = ServingResult(policy.name, concurrency, [], 0.0)
    stats: dict[int, RequestStats] = {}
    output_len = np.zeros(n, np.int64)
    prev_size = np.zeros(n, np.int64)  # by request id: last tree size, Â
    prev_expected = np.zeros(n)
    # a measured truth prices the drafter's intake: by request id, the target features its
    # drafter has not taken yet (the prompt's, then every step's committed tokens, until the
    # next drafted step takes them); not kept under a roofline truth
    feeds = gpu.truth.measured is not None and not is_ar
    unfed = np.zeros(n, np.int64)
    # per step: ids, delivered, accepted draft tokens delivered, N
    logs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    waiting: deque[int] = deque()
    prefilling: list[list[int]] = []  # [request, tokens done, tokens to prefill]
    decoding: list[int] = []  # request ids in service, decode phase
    next_arrival = 0  # open loop: index of the next arrival
    # the KV cache: blocks held (a request's ⌈tokens / block⌉), reserved per step for each
    # decoding request's lookahead (its largest tree; 1, the root, for a policy whose trees the
    # engine fits to the room), preemption of the newest admitted request when they do not fit
    kv = KVCache(memory)
    limited = kv.limited
    look = lookahead_tokens(policy, max(1, gpu.drafter.block_size - 1)) if not is_ar else 1
    # trees that may outgrow the lookahead are handed the KV room (the engine cuts them) and
    # their slots counted; the others' slots are all reserved before the step
    roomy = not (is_ar or within_lookahead(policy))
    most_grow = -(-look // kv.block_tokens)  # new blocks one request's lookahead takes at most
    admitted_at = np.zeros(n, np.int64)  # admission order (the newest is preempted first)
    queued_at = np.zeros(n)  # when it last joined the waiting queue
    resumed: set[int] = set()  # preempted after decoding: its KV is recomputed on readmission
    admissions = 0

    def arrive(index: int) -> None:
        requested, arrival = None, env.now  # closed loop: a request arrives when admitted
        if arrivals is not None:  # the server notices arrivals between steps; record the truth
            a = arrivals[index]
            requested, arrival = (int(a.prompt_len), int(a.output_len)), float(a.time_s)
        prompt, out = source.lengths(index, requested)
        stats[index] = RequestStats(index, arrival_s=arrival, prompt_len=prompt)
        output_len[index] = out
        queued_at[index] = arrival
        waiting.append(index)

    def start_decoding(index: int) -> None:
        """The request's prompt is in the KV cache and its first token exists (or, preempted
        before, its recomputed cache is back: it decodes on)."""
        if index in resumed:
            resumed.discard(index)
            decoding.append(index)
            return
        st = stats[index]
        st.start_s = env.now
        st.tokens = 1
        unfed[index] = st.prompt_len
        slot = pool.admit(index, st.prompt_len, int(output_len[index]))
        source.admit(slot, index)
        if output_len[index] <= 1:
            finish(index)
        else:
            decoding.append(index)

    def finish(index: int) -> None:
        st = stats[index]
        st.end_s = env.now
        slot = pool.slot_of[index]
        st.tokens = int(min(pool.generated[slot], output_len[index]))
        kv.hold(-kv.blocks(int(pool.context_len[slot])))
        result.requests.append(st)
        pool.release(index)
        if progress is not None:
            progress(len(result.requests), n)
        if arrivals is None and len(stats) < n:
            arrive(len(stats))  # closed loop: the client sends its next request

    def to_prefill(index: int) -> int:
        """Tokens the request's admission prefills: its prompt, or its whole cache again."""
        if index in resumed:
            return int(pool.context_len[pool.slot_of[index]])
        return stats[index].prompt_len

    def growth() -> int:
        """New blocks the decoding requests' lookahead takes this step."""
        if not decoding:
            return 0
        contexts = pool.context_len[pool.slot_of[np.array(decoding, np.int64)]]
        return kv.blocks_of(contexts, look) - kv.blocks_of(contexts)

    def admit_waiting(bound: int) -> None:
        """Admit the head of the queue while its prompt's blocks fit beside the decoding
        requests' lookahead this step (at most ``bound`` blocks; counted when it matters)."""
        nonlocal admissions
        kept, exact = bound, False
        while waiting and len(decoding) + len(prefilling) < concurrency:
            index = waiting[0]
            tokens = to_prefill(index)
            # without prefill it decodes this very step: its lookahead too
            total = tokens + (look if prefill_chunk == 0 else 0)
            need = kv.blocks(total)
            if not exact and not kv.fits(need + kept):
                kept, exact = growth(), True
            if not kv.fits(need + kept):  # first come, first served: the head waits for room
                if not decoding and not prefilling:
                    raise MemoryLimitError(_too_long(index, total, kv))
                break
            waiting.popleft()
            stats[index].queue_s += env.now - queued_at[index]
            admissions += 1
            admitted_at[index] = admissions
            held = kv.blocks(tokens)
            kv.hold(held)
            if prefill_chunk == 0:
                start_decoding(index)
                kept += need - held
            else:
                prefilling.append([index, 0, tokens])
        kv.running(len(decoding) + len(prefilling))

    def preempt() -> None:
        """The newest admitted request leaves (vLLM's recompute preemption): its blocks are
        freed and it waits at the head of the queue; readmitted, it prefills its cache again."""
        running = [e[0] for e in prefilling] + decoding
        victim = max(running, key=lambda i: int(admitted_at[i]))
        for entry in prefilling:
            if entry[0] == victim:
                prefilling.remove(entry)
                kv.hold(-kv.blocks(entry[2]))
                break
        else:
            decoding.remove(victim)
            kv.hold(-kv.blocks(int(pool.context_len[pool.slot_of[victim]])))
            resumed.add(victim)
        waiting.appendleft(victim)
        queued_at[victim] = env.now
        stats[victim].preempted += 1
        kv.preemptions += 1

    def plan_prefill() -> tuple[list[int], list[int]]:
        """This step's prompt chunks (tokens, context before them), first come first served."""
        budget, tokens, contexts = prefill_chunk, [], []
        for entry in prefilling:
            if budget == 0:
                break
            take = min(budget, entry[2] - entry[1])
            tokens.append(take)
            contexts.append(entry[1])
            budget -= take
        return tokens, contexts

    def advance_prefill(tokens: list[int]) -> None:
        finished = []
        for entry, take in zip(prefilling, tokens, strict=False):
            entry[1] += take
            if entry[1] >= entry[2]:
                finished.append(entry)
        for entry in finished:
            prefilling.remove(entry)
            start_decoding(entry[0])

    def server() -> Generator[simpy.Event, object, None]:
        nonlocal next_arrival
        ids: np.ndarray | None = None  # the decoding batch's ids, slots: rebuilt when it changes
        slots = zeros = np.zeros(0, np.int64)
        held = -1  # blocks the decoding batch holds (-1: count them)
        nothing = np.zeros(0)
        if arrivals is None:
            for i in range(min(concurrency, n)):
                arrive(i)
        while len(result.requests) < n and (max_steps is None or result.steps < max_steps):
            if arrivals is not None:
                while next_arrival < n and arrivals[next_arrival].time_s <= env.now:
                    arrive(next_arrival)
                    next_arrival += 1
            preempted, grow = kv.preemptions, len(decoding) * most_grow  # at most
            while limited and decoding and not kv.fits(grow):  # each lookahead must fit
                grow = growth()
                if kv.fits(grow):
                    break
                if len(decoding) + len(prefilling) == 1:
                    index = decoding[0]
                    context = int(pool.context_len[pool.slot_of[index]])
                    raise MemoryLimitError(_too_long(index, context + look, kv))
                preempt()
                ids, grow = None, len(decoding) * most_grow
            if kv.preemptions == preempted:  # vLLM admits nothing in a step that preempted
                admit_waiting(grow)
            if not decoding and not prefilling:
                if arrivals is None or next_arrival >= n:  # pragma: no cover - guarded above
                    raise ConfigError("internal error: nothing to serve and nothing to come")
                yield env.timeout(arrivals[next_arrival].time_s - env.now)
                continue
            if prefill_alone and prefilling:  # the real loop: each prompt alone, then the step
                for entry in list(prefilling):
                    t = gpu.prefill_s([entry[2]], [0])
                    yield env.timeout(t)
                    result.prefill_s += t
                    prefilling.remove(entry)
                    start_decoding(entry[0])
                continue
            chunk_tokens, chunk_contexts = plan_prefill()
            if not decoding:
                t = gpu.prefill_s(chunk_tokens, chunk_contexts)
                yield env.timeout(t)
                result.prefill_s += t
                advance_prefill(chunk_tokens)
                continue
            if ids is None or ids.shape[0] != len(decoding):  # the batch changed (joins only
                # grow it; leaves and preemptions reset ``ids``): gather its arrays once
                ids = np.array(decoding, np.int64)
                slots = pool.slot_of[ids]
                zeros, nothing = np.zeros(ids.shape[0], np.int64), np.zeros(ids.shape[0])
                held = -1
            b = ids.shape[0]
            need_room = limited and roomy
            contexts, wanted, left, last_n, want = _step_inputs(
                pool, slots, ids, look, kv.block_tokens, need_room, prev_size if history else None
            )
            contexts.setflags(write=False)  # the step's contexts (its own array): read-only, so
            # the learning controller may remember what it derives from them (mean_context)
            # the step's KV: each request's lookahead reserved (it fits: checked above); the
            # blocks the batch holds are last step's count while the batch is the same
            if held < 0:
                held = kv.blocks_of(contexts)
            if want is None:  # (gather() counts them at batch > 1)
                want = kv.blocks_of(contexts, look)
            kv.hold(want - held)
            room = None
            if need_room:
                free = kv.free()
                assert free is not None and left is not None
                room = _kv_room(left, free, kv.block_tokens)
            riding = sum(chunk_tokens)  # a prefill chunk in the same pass (the policy may
            # price it: the learning controller does)
            # static policies ignore last step's trees
            last_a = nothing
            if last_n is None:
                last_n = zeros
            elif expected_history:
                last_a = prev_expected[ids]
            requests = _step_requests(
                ids, contexts, zeros, last_n, last_a, riding_tokens=riding, kv=room
            )
            rec = engine.step(requests)
            sizes = rec.trees.sizes
            committed = rec.result.committed_lens
            # the accepted tokens stay in the cache, the rest of the trees' slots are freed
            # (an AR step commits one token per request, its lookahead: nothing to count); the
            # pool's contexts are now contexts + committed (≥ 1 each): Σ ⌈(c + max(n, 0)) / bt⌉
            # counts them without gathering them again (with the trees' count: one call)
            if roomy:  # the trees' slots beyond the lookahead, held while they are verified
                tree_blocks, held = kv.blocks_two(contexts, look, sizes, committed)
                kv.touch(tree_blocks - want)
            else:
                held = want if is_ar else kv.blocks_of(contexts, 0, committed)
            charge: bool | str = controller
            if controller and getattr(rec.diagnostics, "repeated", False):
                charge = "repeat"  # the learning controller repeated its last decision
            intake = None  # (an AR step drafts nothing: its intake is not priced)
            if feeds:
                if rec.kind != "ar":
                    intake = int(unfed[ids].sum())
                    unfed[ids] = 0
                unfed[ids] += rec.result.committed_lens
            t_draft, t_prep, t_verify = gpu.step_s(  # a chain decision that stood: argmax
                rec.kind,
                sizes,
                contexts,
                topk and rec.preparation != "argmax",
                charge,
                chunk_tokens,
                chunk_contexts,
                builder,
                intake,
            )
            # the passes run back to back on the one GPU and nothing can happen between them
            yield env.timeout(t_draft + t_prep + t_verify)
            if learning and not chunk_tokens:  # a prefill chunk in the pass is not the tree's
                # what the engine's clock shows: the step less the loop after it (0 under a
                # roofline truth; a measured truth's learning update and bookkeeping)
                engine.report(rec, t_draft + t_prep + t_verify - gpu.unobserved_s)
                predicted = getattr(rec.diagnostics, "predicted_cycle_s", None)
                if predicted is not None:
                    result.cycle_predicted_s += float(predicted)
                    result.cycle_observed_s += t_draft + t_prep + t_verify
                    result.cycles_compared += 1
            result.steps += 1
            result.step_kinds[rec.kind] = result.step_kinds.get(rec.kind, 0) + 1
            result.draft_s += t_draft
            result.prep_s += t_prep
            result.verify_s += t_verify
            result.batch_sizes.append(b)
            if observe:
                assert cost_model is not None
                cost_model.observe(*observed_load(requests, rec.trees), t_verify)
            kv.hold(held - want)  # (held: counted above)
            # what the step delivered (nothing past the output length counts) and accepted
            # are formed from these at the end, for every step at once (_attach_steps)
            logs.append((ids, committed, wanted, sizes))
            # the last tree sizes kept; the requests whose pool count reached their output
            done = _step_settled(prev_size if history else None, ids, sizes, committed, wanted)
            if expected_history:
                prev_expected[ids] = rec.trees.expected_tokens()
            if done:
                for index in done:
                    decoding.remove(index)
                    finish(index)
                ids = None
            if chunk_tokens:
                advance_prefill(chunk_tokens)
        result.elapsed_s = env.now
        result.kv_capacity_tokens = kv.capacity_tokens
        result.kv_peak_tokens = kv.peak_tokens
        result.max_running = kv.max_running
        result.preemptions = kv.preemptions

    env.process(server())
    env.run()
    attach_steps(stats, logs)
    result.requests.sort(key=lambda r: r.request_id)
    return result


def _step_inputs(
    pool: SimBatch,
    slots: IntArray,
    ids: IntArray,
    look: int,
    bt: int,
    need_room: bool,
    prev_size: IntArray | None,
) -> tuple[IntArray, IntArray, IntArray | None, IntArray | None, int | None]:
    """A decode step's per-request inputs, each a new array: the contexts, the tokens each
    request still wants (≥ 1 while decoding), with ``need_room`` its KV room — its lookahead
    and the rest of its last block, ⌈(c + look) / bt⌉ · bt − c = (−(c + look) mod bt) + look —
    and with ``prev_size`` its last tree size (by request id); last, the step's lookahead
    blocks Σ ⌈(c + look) / bt⌉ (``KVCache.blocks_of(contexts, look)``) where the compiled call
    counted them, else None. One compiled call at batch > 1 (``gather()``: the same whole
    numbers), Python ints at batch 1, numpy otherwise."""
    b = slots.shape[0]
    left = last = None
    if b == 1:  # (batch 1: the gathers numpy's cheapest, the sums on Python ints)
        slot = int(slots[0])
        contexts = pool.context_len[slots]
        wanted = np.array([int(pool.output_len[slot]) - int(pool.generated[slot])], np.int64)
        if need_room:
            left = np.array([(-look - int(contexts[0])) % bt + look], np.int64)
        if prev_size is not None:
            last = prev_size[ids]
        return contexts, wanted, left, last, None
    if _gather is not None:
        contexts, wanted = np.empty(b, np.int64), np.empty(b, np.int64)
        left = np.empty(b, np.int64) if need_room else None
        last = np.empty(b, np.int64) if prev_size is not None else None
        want = _gather(
            pool.context_len,
            pool.output_len,
            pool.generated,
            slots,
            contexts,
            wanted,
            left,
            look,
            bt,
            prev_size if last is not None else None,
            ids,
            last,
            pool.pin,  # (the three count arrays' held buffers)
        )
        if want >= 0:
            return contexts, wanted, left, last, want
    contexts = pool.context_len[slots]
    wanted = pool.output_len[slots] - pool.generated[slots]
    if need_room:
        left = (-look - contexts) % bt + look
    if prev_size is not None:
        last = prev_size[ids]
    return contexts, wanted, left, last, None


def _step_settled(
    prev_size: IntArray | None,
    ids: IntArray,
    sizes: IntArray,
    committed: IntArray,
    wanted: IntArray,
) -> list[int]:
    """A served step's close: each request's tree size kept by request id (``prev_size``
    given) and the ids of the requests whose committed tokens reached what they wanted. One
    compiled call at batch > 1 (``settle()``), one comparison at batch 1, numpy otherwise."""
    if ids.shape[0] == 1:  # (batch 1: one comparison, no mask)
        if prev_size is not None:
            prev_size[int(ids[0])] = int(sizes[0])
        return [int(ids[0])] if committed[0] >= wanted[0] else []
    count = -1 if _settle is None else _settle(prev_size, ids, sizes, committed, wanted)
    if count < 0:
        if prev_size is not None:
            prev_size[ids] = sizes
        mask = committed >= wanted
        return ids[mask].tolist() if np.count_nonzero(mask) else []
    return ids[committed >= wanted].tolist() if count else []


def _too_long(index: int, tokens: int, kv: KVCache) -> str:
    """The message of a request that does not fit the whole KV cache."""
    return (
        f"request {index} needs {tokens} tokens of KV cache ({kv.blocks(tokens)} blocks of "
        f"{kv.block_tokens}), more than the cache holds with nothing else running: "
        f"{kv.capacity_tokens} tokens ({kv.plan.describe() if kv.plan is not None else ''}); "
        "shorten its prompt or output, or give the server more memory"
    )
