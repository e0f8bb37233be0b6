"""The simulated verifier's compiled step (``verify``: the acceptance walk and the counts in one
call) against the separate walk (``accept``) and numpy's count updates."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.bestfirst import verified_paths
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.policies import make_policy
from bastion.sim import backend
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.serving import serve
from bastion.sim.simulate import SimSpec, calibrated_cost_model, request_source


def _verify():  # type: ignore[no-untyped-def]
    if backend._verify is None:
        pytest.skip("built without the compiled kernel")
    return backend._verify


def _trees(rng: np.random.Generator, b: int) -> tuple[np.ndarray, ...]:
    """(parents, tokens, depths, offsets) of b random trees (parents before children)."""
    parents, tokens, depths, offsets = [], [], [], [0]
    for _ in range(b):
        n = int(rng.integers(1, 12))
        par, dep = [-1], [0]
        for j in range(1, n):
            p = int(rng.integers(0, j))
            par.append(p)
            dep.append(dep[p] + 1)
        parents += par
        depths += dep
        tokens += rng.integers(0, 3, n).tolist()
        offsets.append(offsets[-1] + n)
    return tuple(np.array(a, np.int64) for a in (parents, tokens, depths, offsets))


def _pool(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ctx = rng.integers(0, 5000, n).astype(np.int64)
    gen = rng.integers(0, 300, n).astype(np.int64)
    return ctx, gen, gen + rng.integers(0, 20, n).astype(np.int64)


def test_verify_is_the_walk_then_the_numpy_update() -> None:
    """Lengths, committed tokens and accepted nodes as accept()'s, and the counts updated as
    numpy's fancy-indexed updates with those lengths, on random trees (nodes deeper than the
    target's width included) and targets of widths 1 … 6."""
    verify = _verify()
    rng = np.random.default_rng(11)
    for _ in range(300):
        b = int(rng.integers(1, 9))
        parents, tokens, depths, offsets = _trees(rng, b)
        target = rng.integers(0, 3, (b, int(rng.integers(1, 7)))).astype(np.int64)
        n = b + int(rng.integers(0, 5))
        ctx, gen, out = _pool(rng, n)
        slots = rng.permutation(n)[:b].astype(np.int64)
        want = verified_paths(parents, tokens, depths, offsets, target)
        assert want is not None
        want_ctx, want_gen = ctx.copy(), gen.copy()
        want_ctx[slots] += want[0]
        want_gen[slots] = np.minimum(want_gen[slots] + want[0], out[slots])
        made = verify(parents, tokens, depths, offsets, target, ctx, gen, out, slots)
        assert made is not None
        for got, expected in zip(made, want, strict=True):
            assert np.array_equal(np.frombuffer(got, np.int64), expected)
        assert np.array_equal(ctx, want_ctx) and np.array_equal(gen, want_gen)


def test_verify_takes_root_only_trees() -> None:
    """Root-only trees (what a drafted step may still choose): each request commits its
    target's first token, one a request, and no accepted node (the root-only path's values)."""
    verify = _verify()
    rng = np.random.default_rng(13)
    for b in (1, 2, 7):
        minus, zeros = np.full(b, -1, np.int64), np.zeros(b, np.int64)
        target = rng.integers(0, 3, (b, 3)).astype(np.int64)
        ctx, gen, out = _pool(rng, b + 2)
        slots = rng.permutation(b + 2)[:b].astype(np.int64)
        want_ctx, want_gen = ctx.copy(), gen.copy()
        want_ctx[slots] += 1
        want_gen[slots] = np.minimum(want_gen[slots] + 1, out[slots])
        made = verify(minus, minus, zeros, np.arange(b + 1), target, ctx, gen, out, slots)
        assert made is not None
        lengths, committed, nodes = (np.frombuffer(m, np.int64) for m in made)
        assert np.array_equal(lengths, np.ones(b)) and np.array_equal(committed, target[:, 0])
        assert nodes.shape == (0,)
        assert np.array_equal(ctx, want_ctx) and np.array_equal(gen, want_gen)


def test_verify_refuses_what_it_does_not_take_and_changes_nothing() -> None:
    """None, the counts untouched, for any array not C-contiguous int64, a read-only count, a
    slot out of range or a count that would overflow, mismatched lengths or a target of another
    batch; trees whose offsets do not increase raise accept()'s ValueError, nothing changed."""
    verify = _verify()
    rng = np.random.default_rng(12)
    parents, tokens, depths, offsets = _trees(rng, 3)
    target = rng.integers(0, 3, (3, 4)).astype(np.int64)
    ctx, gen, out = _pool(rng, 5)
    slots = np.array([4, 0, 2], np.int64)
    frozen = ctx.copy()
    frozen.flags.writeable = False
    wide = np.zeros(2 * tokens.shape[0], np.int64)
    wide[::2] = tokens
    full = np.full(5, np.iinfo(np.int64).max - 1, np.int64)
    args = [parents, tokens, depths, offsets, target, ctx, gen, out, slots]
    cases = [
        (0, parents.astype(np.int32)),
        (1, wide[::2]),  # not contiguous
        (2, depths[:-1]),
        (3, offsets[:-1]),
        (4, target[:2]),
        (4, target.astype(np.float64)),
        (5, frozen),
        (6, gen[:4]),
        (7, out.astype(np.uint64)),
        (8, np.array([4, 0, 5], np.int64)),
        (8, np.array([4, -1, 2], np.int64)),
        (8, slots[:2]),
        (5, full),  # context + committed beyond int64
    ]
    before = ctx.copy(), gen.copy()
    for at, bad in cases:
        call = list(args)
        call[at] = bad
        assert verify(*call) is None, at
        assert np.array_equal(ctx, before[0]) and np.array_equal(gen, before[1])
    unordered = offsets.copy()
    unordered[1], unordered[2] = unordered[2], unordered[1]
    with pytest.raises(ValueError, match="offsets must increase"):
        verify(parents, tokens, depths, unordered, target, ctx, gen, out, slots)
    assert np.array_equal(ctx, before[0]) and np.array_equal(gen, before[1])


@pytest.mark.parametrize("policy", ["bastion", "chain", "fixed:16"])
def test_a_serve_is_the_same_without_the_fused_verify(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole serve (per request and per step) with ``verify`` and with the separate walk
    and count updates, at batch 1 and above, with a KV cache counted."""
    _verify()
    model, hw = get_model("qwen3-8b"), get_profile("h100-sxm")
    drafter = DrafterSpec.dflash_for(model)
    cost_model, _ = calibrated_cost_model(SimulatedGPU(hw, model, drafter))

    def run(c: int) -> tuple[object, ...]:
        spec = SimSpec(model="qwen3-8b", concurrency=c, requests=6, gpu_memory_utilization=0.9)
        p = make_policy(policy)
        cm = cost_model if getattr(p, "uses_cost_model", False) else None
        memory = spec.memory_plan(getattr(p, "uses_drafter", True))
        r = serve(
            p, SimulatedGPU(hw, model, drafter), request_source(spec), 6, c, cm, memory=memory
        )
        return [(q.tokens, q.end_s) for q in r.requests], r.batch_sizes, r.elapsed_s

    fused = [run(c) for c in (1, 4)]
    monkeypatch.setattr(backend, "_verify", None)
    assert [run(c) for c in (1, 4)] == fused


@pytest.mark.parametrize("reads", [None, True, False])
def test_draft_batch_hands_contexts_to_a_source_that_reads_them(reads: bool | None) -> None:
    """A source is handed its slots' contexts unless its ``reads_context_lens`` is False (then
    an empty array); the synthetic source's is False, and its marginals do not depend on them."""
    from bastion.batch import StepRequests
    from bastion.sim.synthetic import SyntheticSource
    from bastion.sim.workloads import get_workload

    inner = SyntheticSource(get_workload("chat"), seed=2)
    assert inner.reads_context_lens is False
    seen: list[np.ndarray] = []

    class Source:
        def draft(self, slots, context_lens):  # type: ignore[no-untyped-def]
            seen.append(np.array(context_lens))
            inner.reserve(8)
            for s in slots.tolist():
                if inner._rngs[s] is None:
                    inner.admit(s, s)
            return inner.draft(slots, context_lens)

    if reads is not None:
        Source.reads_context_lens = reads  # type: ignore[attr-defined]
    sim = backend.SimBatch(Source(), 4)
    for rid, prompt in enumerate((30, 50, 70)):
        sim.admit(rid, prompt, 20)
    ids = np.array([2, 0], np.int64)
    sim.draft_batch(StepRequests.of(ids, [0, 0], [0, 0]))
    want = sim.context_len[sim.slot_of[ids]] if reads is not False else np.zeros(0)
    assert np.array_equal(seen[0], want)
