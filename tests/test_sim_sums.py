"""The simulator's compiled sums over a step's requests are numpy's.

``KVCache.blocks_of``'s compiled count (``bastion._bestfirst.blocks``) is the numpy sum.

The simulated server counts its KV-cache blocks several times a step: Σ ⌈(c + add) / block⌉
over the decoding requests, and with a step's trees Σ ⌈(c + max(s, add)) / block⌉. The compiled
call must give the whole number numpy's expression gives, and arrays it does not take (not
int64, not contiguous) must fall back to numpy. The ground truth's pass sums
(``bastion._bestfirst.sums``: ``BatchSums.decode_sums``, ``ar_sums``, ``bucket_sum`` and the
preparation's tree sums) must be numpy's to the bit, and what numpy refuses still refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.sim.batching as batching
import bastion.sim.memory as memory
import bastion.sim.prep as prep
from bastion.errors import ConfigError
from bastion.sim.batching import BatchSums
from bastion.sim.memory import KVCache

needs_kernel = pytest.mark.skipif(memory._blocks is None, reason="no compiled kernel")
needs_sums = pytest.mark.skipif(batching._sums is None, reason="no compiled kernel")


def _numpy(tokens: np.ndarray, add: int, bt: int, sizes: np.ndarray | None) -> int:
    extra = np.maximum(sizes, add) if sizes is not None else add
    return int(np.add.reduce((tokens + extra + (bt - 1)) // bt))


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 1 << 40), min_size=0, max_size=80),
    st.integers(0, 64),
    st.integers(1, 64),
    st.data(),
)
def test_blocks_kernel_equals_numpy(tokens: list[int], add: int, bt: int, data) -> None:  # type: ignore[no-untyped-def]
    t = np.array(tokens, np.int64)
    sizes = np.array(data.draw(st.lists(st.integers(1, 1024), min_size=len(t), max_size=len(t))))
    sizes = sizes.astype(np.int64)
    kv = KVCache(None)
    kv.block_tokens = bt
    assert kv.blocks_of(t, add) == _numpy(t, add, bt, None)
    assert kv.blocks_of(t, add, sizes) == _numpy(t, add, bt, sizes)
    assert memory._blocks(t, add, bt, None, add) == _numpy(t, add, bt, None)
    committed = np.array(data.draw(st.lists(st.integers(0, 64), min_size=len(t), max_size=len(t))))
    committed = committed.astype(np.int64)  # blocks_two: both counts of one call
    both = (_numpy(t, add, bt, sizes), _numpy(t, 0, bt, committed))
    assert kv.blocks_two(t, add, sizes, committed) == both
    if len(t):
        assert memory._blocks(t, add, bt, sizes, add, committed, 0) == both


@needs_kernel
def test_blocks_kernel_declines_other_arrays() -> None:
    t = np.arange(40, dtype=np.int64) * 7
    assert memory._blocks(t.astype(np.int32), 0, 16, None, 0) is None
    assert memory._blocks(t[::2], 0, 16, None, 0) is None
    assert memory._blocks(t, 0, 16, t.astype(np.float64), 0) is None
    kv = KVCache(None)
    for arr in (t.astype(np.int32), t[::2]):  # the numpy path answers instead
        assert kv.blocks_of(arr, 3) == _numpy(arr.astype(np.int64), 3, kv.block_tokens, None)
    assert memory._blocks(t, 0, 16, t, 0, t.astype(np.int32), 0) is None
    wide = np.repeat(t % 5, 2)[::2]  # not contiguous: the two numpy counts answer
    assert kv.blocks_two(t, 3, t, wide) == (
        _numpy(t, 3, kv.block_tokens, t),
        _numpy(t, 0, kv.block_tokens, wide),
    )
    with pytest.raises(ValueError):
        memory._blocks(t, 0, 16, t[:5].copy(), 0)
    with pytest.raises(ValueError):
        memory._blocks(t, 0, 16, t, 0, t[:5].copy(), 0)
    with pytest.raises(ValueError):
        memory._blocks(t, 0, 16, None, 0, t, 0)


def test_blocks_without_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_blocks", None)
    kv = KVCache(None)
    for n in (3, 40):
        t = np.arange(n, dtype=np.int64) * 13
        s = (np.arange(n, dtype=np.int64) % 9) + 1
        assert kv.blocks_of(t, 4) == _numpy(t, 4, kv.block_tokens, None)
        assert kv.blocks_of(t, 4, s) == _numpy(t, 4, kv.block_tokens, s)
        assert kv.blocks_two(t, 4, s, s - 1) == (
            _numpy(t, 4, kv.block_tokens, s),
            _numpy(t, 0, kv.block_tokens, s - 1),
        )


# -- the ground truth's pass sums (bastion._bestfirst.sums) ----------------------------------


def _both(monkeypatch: pytest.MonkeyPatch, fn):  # type: ignore[no-untyped-def]
    """``fn()`` with the compiled sums and with numpy's."""
    fast = fn()
    with monkeypatch.context() as m:
        m.setattr(batching, "_sums", None)
        slow = fn()
    return fast, slow


@needs_sums
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 1 << 22)), min_size=1, max_size=70),
    st.sampled_from([1, 3, 16, 64]),
)
def test_sums_equal_numpy(rows: list[tuple[int, int]], quantum: int) -> None:
    mp = pytest.MonkeyPatch()
    s = np.array([r[0] for r in rows], np.int64)
    c = np.array([r[1] for r in rows], np.int64)
    sums = BatchSums(quantum)
    fast, slow = _both(mp, lambda: sums.decode_sums(s, c))
    assert fast == slow and all(type(a) is type(b) for a, b in zip(fast, slow, strict=True))
    fast_a, slow_a = _both(mp, lambda: sums.ar_sums(c))
    assert fast_a == slow_a
    fast_b, slow_b = _both(mp, lambda: sums.bucket_sum(c))
    assert fast_b == slow_b and type(fast_b[1]) is float
    f = s.astype(np.float64)
    fast_t, slow_t = _both(mp, lambda: prep._tree_sums(f, c, quantum, s))
    assert fast_t == slow_t == prep._tree_sums(f, c, quantum)


@needs_sums
def test_sums_decline_and_raise_as_numpy() -> None:
    c = np.arange(5, dtype=np.int64) * 100
    s = np.arange(1, 6, dtype=np.int64)
    assert batching._sums(s, c.astype(np.int32), 16) is None
    assert batching._sums(s[:4], c, 16) is None
    assert batching._sums(s - 1, c, 16) is None  # a size below 1: numpy's path raises
    assert batching._sums(s, c - 200, 16) is None  # a negative context: likewise
    sums = BatchSums(16)
    with pytest.raises(ConfigError):
        sums.decode_sums(s - 1, c)
    with pytest.raises(ConfigError):
        sums.ar_sums(c - 200)
    with pytest.raises(ConfigError):
        sums.decode_sums(s, c[:4])
    assert sums.decode_sums(s[:0], c[:0]) == (0, 0.0, 0.0, 0.0, 0.0)
    # k = ⌈c / 16⌉ = 0, 7, 13, 19, 25
    assert batching._sums(s, c, 16) == (5, 15, 55, 64, 0 + 14 + 39 + 76 + 125)


# -- a batched step priced from one call's sums (gpu._batch_step) ----------------------------


def _gpu(seed: int = 3):  # type: ignore[no-untyped-def]
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model
    from bastion.sim.gpu import SimulatedGPU

    model = get_model("qwen3-8b")
    return SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model), seed=seed)


def _per_pass(g, kind, s, c, topk, controller, new, ctx):  # type: ignore[no-untyped-def]
    """step_s's three passes, each priced on its own path (what it does without the sums)."""
    draft = g.draft_s(c)
    prep_s = g.prep_s(s, topk, c, controller, kind == "chain")
    return draft, prep_s, g.verify_s(s, c, new, ctx, kind == "tree")


@needs_sums
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(0, 40_000)), min_size=1, max_size=40),
    st.sampled_from(["tree", "chain"]),
    st.booleans(),
    st.sampled_from([False, True, "repeat"]),
    st.sampled_from([((), ()), ([512], [0]), ([300, 77], [1024, 0])]),
)
def test_batched_step_equals_its_passes(rows, kind, topk, controller, chunks) -> None:  # type: ignore[no-untyped-def]
    s = np.array([r[0] for r in rows], np.int64)
    c = np.array([r[1] for r in rows], np.int64)
    c.setflags(write=False)  # (the server's contexts are read-only)
    one, other = _gpu(), _gpu()  # the same seed: the same noise, drawn in the same order
    for _ in range(3):
        fast = one.step_s(kind, s, c, topk, controller, *chunks)
        slow = _per_pass(other, kind, s, c, topk, controller, *chunks)
        assert fast == slow and all(type(x) is float for x in fast)


def test_batched_step_declines_what_its_sums_do_not_take() -> None:
    from bastion.sim import gpu as gpu_module

    g = _gpu()
    c = np.arange(1, 6, dtype=np.int64) * 100
    s = np.arange(1, 6, dtype=np.int64)
    args = ("tree", True, False, (), ())
    assert gpu_module._batch_step(g, args[0], s[:1], c[:1], *args[1:]) is None  # batch 1
    assert gpu_module._batch_step(g, args[0], s.tolist(), c, *args[1:]) is None  # a list
    assert gpu_module._batch_step(g, args[0], s[::2], c[:3], *args[1:]) is None  # strided
    with pytest.raises(ConfigError):  # a size below 1: the passes' own path refuses it
        g.step_s("tree", s - 1, c)
    with pytest.raises(ConfigError):
        g.prep.from_sums(5, None, True, False, False)  # a tree step needs its sums


def test_lm_head_one_is_lm_heads() -> None:
    from bastion.sim import pass_pricing

    p = _gpu().pricer
    for rows in (1.0, 7.0, 513.0, 4096.0):
        hx = np.array([[1.0, rows, 64.0 * np.ceil(rows / 64.0), 0.0, 0.0, 0.0, 0.0]])
        want = float(pass_pricing._lm_head(p, hx, np.array([rows]))[0])
        assert pass_pricing._lm_head_one(p, hx, rows) == want


def test_single_step_equals_its_passes() -> None:
    """Batch 1 (every decode step at C = 1): the drafter's and the verification's cached
    prices and the preparation's float sums, equal to the passes' own paths, noise in order —
    also where a price is not cached yet, or the size is beyond the curves (their paths run)."""
    one, other = _gpu(5), _gpu(5)
    for c0 in (0, 1, 15, 16, 17, 700, 700, 4097, 30_000):
        for s0 in (1, 2, 23, 1024, 1025, 23):
            s, c = np.array([s0], np.int64), np.array([c0], np.int64)
            for kind, topk, controller in (
                ("tree", True, True),
                ("tree", True, "repeat"),
                ("tree", True, False),
                ("chain", False, False),
                ("chain", True, True),
                ("chain", False, "repeat"),
            ):
                fast = one.step_s(kind, s, c, topk, controller)
                slow = _per_pass(other, kind, s, c, topk, controller, (), ())
                assert fast == slow and all(type(x) is float for x in fast)
    from bastion.sim import gpu as gpu_module

    args = ("tree", True, False)  # others decline: floats, a chunk, two requests
    s, c = np.array([5], np.int64), np.array([700], np.int64)
    assert gpu_module._single_step(one, args[0], s, c, *args[1:], (), ()) is not None
    assert gpu_module._single_step(one, args[0], s * 1.0, c, *args[1:], (), ()) is None
    assert gpu_module._single_step(one, args[0], s, c, *args[1:], [64], [0]) is None
    assert gpu_module._single_step(one, args[0], s, c.repeat(2), *args[1:], (), ()) is None


def test_noisy_step_draws_as_three_noisy_calls() -> None:
    from bastion.sim import gpu as gpu_module

    """_noisy_step takes a step's three factors from the noise block's iterator at once: the
    same factors as three _noisy calls, in the same order, where a block runs out before the
    first, the second or the third of them (1024 = 3·341 + 1), and none without noise."""
    from dataclasses import replace

    one, other = _gpu(11), _gpu(11)
    for i in range(1100):  # 3300 draws: every offset of a block's end within a step
        x = (1e-3 * (i + 1), 2e-4, 5e-3 / (i + 1))
        assert gpu_module._noisy_step(one, *x) == tuple(other._noisy(v) for v in x)
    quiet = _gpu(11)
    quiet.truth = replace(quiet.truth, noise=0.0)
    assert gpu_module._noisy_step(quiet, 1.0, 2.0, 3.0) == (1.0, 2.0, 3.0)


def test_prep_caches_the_controller_host_time_per_batch_and_kind() -> None:
    """from_sums keeps the controller's host seconds of a tree step per (B, repeated or
    not): each step priced as by a fresh HostPrep (nothing cached), repeats and decisions of
    the same B apart, under a truth whose measured repeats differ from its decisions."""
    from dataclasses import replace

    from bastion.sim.prep import HostPrep

    g = _gpu()
    truth = replace(
        g.prep.truth,
        controller_single_s=3e-4,
        controller_step_s=5e-4,
        controller_request_s=2e-5,
        controller_repeat_single_s=7e-5,
        controller_repeat_step_s=9e-5,
        controller_repeat_request_s=3e-6,
    )
    args = (truth, g.model, g.drafter, g.prep.device, g.prep.options, g.prep.byte_rate)
    kept = HostPrep(*args)
    rng = np.random.default_rng(4)
    for _ in range(200):
        b = int(rng.integers(1, 6))
        controller = [True, "repeat", False][int(rng.integers(0, 3))]
        sums = (8.0 * b, 64.0 * b, 64.0 * b + 8.0 * 4096 * b)
        want = HostPrep(*args).from_sums(b, sums, True, controller)
        assert kept.from_sums(b, sums, True, controller) == want
