"""The synthetic drafter's compiled steps (``_bestfirst_draws.c``, each step computed from its
block's draws when it is drafted) are its numpy reference (the whole block computed when drawn)
array for array, for the shipped workloads and for parameters that exercise every branch
(K = 1, 2, 3, forks and branches everywhere, rows out of order), at batch 1 and in batches whose
requests cross their blocks' ends at different steps."""

from __future__ import annotations

import numpy as np
import pytest

import bastion.sim.synthetic as synthetic
from bastion.sim.workloads import get_workload

needs_kernel = pytest.mark.skipif(synthetic._draws is None, reason="compiled kernel not built")

VARIANTS = [
    {},
    {"k": 1},
    {"k": 2},
    {"k": 3},
    {"fork_rate": 0.5, "branch_rate": 0.9},
    {"k": 2, "fork_rate": 0.9, "branch_rate": 0.9},
    {"k": 1, "fork_rate": 0.9, "branch_rate": 0.9},
    {"depth": 3, "k": 5, "branch_rate": 1.0},
    {"difficulty_sd": 3.0, "step_sd": 2.0},  # low confidence: runners-up above the head
    {"step_sd": 40.0},  # log-odds far beyond ±27.6: head masses held below 1 − 1e-12
]


@needs_kernel
@pytest.mark.parametrize("workload", ["math", "chat", "qwen3-coder-30b-a3b-code"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_steps_are_the_numpy_block(
    workload: str, variant: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    w = get_workload(workload).with_(**variant)
    for temperature in (0.0, 1.0):
        compiled = synthetic.SyntheticSource(w, 3, temperature, block_steps=16)
        with monkeypatch.context() as patch:  # the numpy path: chosen when a source is made
            patch.setattr(synthetic, "_draws", None)
            reference = synthetic.SyntheticSource(w, 3, temperature, block_steps=16)
        assert compiled._compiled and not reference._compiled
        for source in (compiled, reference):
            for slot in range(3):
                source.admit(slot, slot)
        ctx = np.zeros(3, np.int64)
        # batch 1 for a while (slot 0 crosses two block ends), then batches of every slot
        # (each slot at its own step), then slots 2 and 1 (out of order)
        plan = [np.array([0])] * 40 + [np.arange(3)] * 20 + [np.array([2, 1])] * 20
        for step, slots in enumerate(plan):
            if step == 50:  # a slot re-admitted mid-run starts a fresh block
                for source in (compiled, reference):
                    source.admit(1, 7)
            (got, got_target), (want, want_target) = (
                compiled.draft(slots, ctx[: slots.shape[0]]),
                reference.draft(slots, ctx[: slots.shape[0]]),
            )
            assert np.array_equal(got.probs, want.probs), (workload, variant, step)
            assert np.array_equal(got.token_ids, want.token_ids)
            assert np.array_equal(got_target, want_target), (workload, variant, step)


@needs_kernel
def test_weights_below_zero_turn_the_shortcut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel stops forming a row's cumulative weights at the target's rank only
    where every weight is ≥ 0 (the sums then only rise). A law with negative entries (no
    validated workload has one) must be computed in full, as numpy does: the same targets."""
    w = get_workload("math").with_(fork_rate=0.5, branch_rate=0.5)
    law = w.rank_alignment(0.0).copy()
    law[:, 1] = -0.5  # the second rank's weight below zero: the sums fall there
    monkeypatch.setattr(type(w), "rank_alignment", lambda self, temperature=0.0: law)
    compiled = synthetic.SyntheticSource(w, 5, block_steps=16)
    with monkeypatch.context() as patch:
        patch.setattr(synthetic, "_draws", None)
        reference = synthetic.SyntheticSource(w, 5, block_steps=16)
    assert np.all(np.isinf(compiled._law_max))
    for source in (compiled, reference):
        for slot in range(4):
            source.admit(slot, slot)
    slots, ctx = np.arange(4), np.zeros(4, np.int64)
    for step in range(40):
        (_, got), (_, want) = compiled.draft(slots, ctx), reference.draft(slots, ctx)
        assert np.array_equal(got, want), step


@pytest.mark.parametrize("size", [1, 2, 3, 1000, 1024, 4096, 4097, 2**20, 2**31, 2**32, 2**33])
@pytest.mark.parametrize("shape", [(64, 15), (7, 3), (1, 1)])
def test_bank_rows_are_the_generators_integers(size: int, shape: tuple[int, int]) -> None:
    """The synthetic source's bank rows drawn from raw words (sizes a power of two from 2 to
    2^32) are rng.integers' values, and the generator goes on from the same state; the same
    written into a given block (``out``, a slot's of the stored blocks)."""
    from bastion.sim.synthetic import bank_rows

    for seed in range(20):
        ours, numpys = np.random.default_rng([seed, 7]), np.random.default_rng([seed, 7])
        into = np.random.default_rng([seed, 7])
        for rng in (ours, numpys, into):
            rng.standard_normal(5)
        got, want = bank_rows(ours, size, shape), numpys.integers(0, size, size=shape)
        assert got.dtype == np.int64 and got.shape == shape
        assert np.array_equal(got, want), (seed, size, shape)
        block = np.full((3, *shape), -1, np.int64)
        assert bank_rows(into, size, shape, block[1]) is not None
        assert np.array_equal(block[1], want) and (block[::2] == -1).all(), (seed, size, shape)
        assert ours.random() == numpys.random() == into.random()  # the same state after


@pytest.mark.skipif(synthetic._advance is None, reason="compiled kernel not built")
def test_the_compiled_advance_is_the_numpy_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's rows and cursors moved on in one compiled call are numpy's, also where some
    of the batch's blocks are spent (drawn anew first) and with slots out of order."""
    w = get_workload("math")
    compiled, reference = (synthetic.SyntheticSource(w, 5, block_steps=3) for _ in range(2))
    for source in (compiled, reference):
        for slot in range(4):
            source.admit(slot, slot)
    plan = [np.array([0, 1, 2, 3])] * 5 + [np.array([3, 1])] * 4 + [np.array([2, 0, 1])] * 7
    for step, slots in enumerate(plan):
        got = compiled._advance(slots)
        with monkeypatch.context() as patch:
            patch.setattr(synthetic, "_advance", None)
            want = reference._advance(slots)
        assert got.dtype == np.int64 and got.tolist() == want.tolist(), step
        assert compiled._cursor.tolist() == reference._cursor.tolist(), step
        assert np.array_equal(compiled._u[:4], reference._u[:4])  # the same blocks drawn
    with pytest.raises(ValueError, match="out of range"):
        synthetic._advance(compiled._cursor, np.array([0, 99]), 3)


def test_rank_ids_are_shared_read_only_ranks() -> None:
    """A step's token ids are every row's ranks 0 … K − 1, one read-only array per batch shape
    shared by every source (a write through one source's marginals would reach the others')."""
    w = get_workload("math")
    ids = []
    for seed in (0, 1):
        src = synthetic.SyntheticSource(w, seed)
        for s in range(3):
            src.admit(s, s)
        ids.append(src.draft(np.arange(3), np.zeros(3, np.int64))[0].token_ids)
    a, b = ids
    assert a is b and not a.flags.writeable and a.flags.c_contiguous
    assert np.array_equal(a, np.broadcast_to(np.arange(w.k), (3, w.depth, w.k)))


@needs_kernel
def test_a_source_that_grows_draws_from_its_new_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """draws() reads the blocks pinned when the source last grew: a slot admitted past the
    room (the blocks reallocated, the kept slots copied) gives the numpy path's steps."""
    w = get_workload("math").with_(fork_rate=0.3, branch_rate=0.5)
    compiled = synthetic.SyntheticSource(w, 9, block_steps=8)
    with monkeypatch.context() as patch:
        patch.setattr(synthetic, "_draws", None)
        reference = synthetic.SyntheticSource(w, 9, block_steps=8)
    ctx = np.zeros(0, np.int64)
    for source in (compiled, reference):
        for slot in range(3):
            source.admit(slot, slot)
    slots = np.arange(3)
    for grown in (11, 40, None):  # room for 8 slots first, then 22, then 44
        for _ in range(12):  # past a block's end
            (got, got_target), (want, want_target) = (
                compiled.draft(slots, ctx),
                reference.draft(slots, ctx),
            )
            assert np.array_equal(got.probs, want.probs)
            assert np.array_equal(got_target, want_target)
        if grown is not None:
            room = compiled._slots
            for source in (compiled, reference):
                source.admit(grown, grown + 100)
            assert compiled._slots > room
            slots = np.append(slots, grown)


@needs_kernel
def test_the_pin_checks_its_arrays() -> None:
    source = synthetic.SyntheticSource(get_workload("math"), 1, block_steps=4)
    source.admit(0, 0)
    w = source.workload
    blocks = [
        source._bank,
        source._bank_sum,
        source._pick,
        source._fall,
        source._u,
        source._log_u,
        source._law_rows,
        source._law_max,
        source._tu,
        source._cursor,
    ]
    consts = (w.depth, w.k, source._bank_size, 4, 0.1, 0.1, 0.5, -1.0)
    kernel = synthetic._kernel
    assert kernel.draws_pin(*blocks, *consts) is not None
    with pytest.raises(ValueError):
        kernel.draws_pin(*blocks[:8], blocks[8][:1], blocks[9], *consts)  # one slot's uniforms
    with pytest.raises(ValueError):
        kernel.draws_pin(*blocks[:9], blocks[9][:1], *consts)  # a cursor for one slot
    with pytest.raises(ValueError):
        kernel.draws_pin(*blocks, *consts[:3], 5, *consts[4:])  # another block length
    with pytest.raises(ValueError):
        kernel.draws_pin(*blocks, w.depth + 1, *consts[1:])
    probs, target = np.empty((1, w.depth, w.k)), np.empty((1, w.depth + 1), np.int64)
    rows = np.zeros(1, np.int64)
    with pytest.raises((ValueError, TypeError)):
        kernel.draws(object(), rows, probs, target)  # not a pin
    with pytest.raises(ValueError):
        kernel.draws(source._draw_pin, rows, probs[:, :1], target)  # outputs of another shape
    with pytest.raises(ValueError):
        kernel.draws(source._draw_pin, np.array([10**6]), probs, target)  # a step out of range
    with pytest.raises(ValueError):  # advancing: a slot out of range
        kernel.draws(source._draw_pin, np.array([source._slots]), probs, target, True)
    # advancing: slot 0's cursor moves on, until its block is spent (returned, nothing changed)
    for step in range(4):
        assert kernel.draws(source._draw_pin, rows, probs, target, True) is None
        assert source._cursor[0] == step + 1
    assert kernel.draws(source._draw_pin, rows, probs, target, True) == (0,)
    assert source._cursor[0] == 4


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_source_draws_on_as_the_original(how: str) -> None:
    """A source copied mid-run (its pin and views made anew for the copy's own blocks) and the
    original draw the same steps from there on, each from its own blocks."""
    import copy
    import pickle

    w = get_workload("math").with_(fork_rate=0.3, branch_rate=0.5)
    source = synthetic.SyntheticSource(w, 4, block_steps=8)
    for slot in range(3):
        source.admit(slot, slot)
    slots, ctx = np.arange(3), np.zeros(0, np.int64)
    for _ in range(5):
        source.draft(slots, ctx)
    twin = copy.deepcopy(source) if how == "deepcopy" else pickle.loads(pickle.dumps(source))
    for _ in range(20):  # past the blocks' ends: refilled through each one's own views
        (a, ta), (b, tb) = source.draft(slots, ctx), twin.draft(slots, ctx)
        assert np.array_equal(a.probs, b.probs) and np.array_equal(ta, tb)
