"""A simulated pool's pinned count arrays (``pool_pin``): verify() and gather() give the same
numbers with the pin as without, a pin of arrays since replaced (the pool grew) is not used, and
copies and pickles of the pool carry their own pin."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import bastion.sim.backend as backend
import bastion.sim.serving as serving

needs_kernel = pytest.mark.skipif(
    backend._pool_pin is None or serving._gather is None, reason="no compiled kernel"
)


def _gathered(ctx, out, gen, slots, look, bt, pin):  # type: ignore[no-untyped-def]
    b = slots.shape[0]
    got = [np.full(b, -7, np.int64) for _ in range(3)]
    want = serving._gather(ctx, out, gen, slots, *got, look, bt, None, None, None, pin)
    return want, got


@needs_kernel
def test_gather_with_the_pin_is_gather_without() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        ctx = rng.integers(0, 1 << 30, n).astype(np.int64)
        out = rng.integers(0, 5000, n).astype(np.int64)
        gen = rng.integers(0, 5000, n).astype(np.int64)
        slots = rng.permutation(n)[: int(rng.integers(1, n + 1))].astype(np.int64)
        look, bt = int(rng.integers(0, 300)), int(rng.choice([1, 7, 16]))
        pin = backend._pool_pin(ctx, gen, out)
        plain = _gathered(ctx, out, gen, slots, look, bt, None)
        pinned = _gathered(ctx, out, gen, slots, look, bt, pin)
        assert plain[0] == pinned[0] >= 0
        assert all(np.array_equal(a, b) for a, b in zip(plain[1], pinned[1], strict=True))
        # a stale pin (other arrays of the same shape): the arrays given are read, not the pin's
        stale = backend._pool_pin(ctx * 0 + 5, gen * 0, out * 0)
        assert _gathered(ctx, out, gen, slots, look, bt, stale)[0] == plain[0]


@needs_kernel
def test_pool_pin_declines_what_it_does_not_hold() -> None:
    a = np.zeros(4, np.int64)
    assert backend._pool_pin(a, a.astype(np.int32), a) is None
    assert backend._pool_pin(a, a[::2], a) is None


class _Source:  # (a pool's draft source: not read here; module level, so it pickles)
    pass


@needs_kernel
def test_the_pool_repins_when_it_grows_and_copies_carry_their_own_pin() -> None:
    pool = backend.SimBatch(_Source(), 8)  # type: ignore[arg-type]
    first = pool.pin
    for r in range(5):
        pool.admit(r, 100 + r, 50)
    assert pool.pin is not first  # grown: pinned again
    for twin in (copy.deepcopy(pool), pickle.loads(pickle.dumps(pool))):
        assert twin.pin is not None and twin.pin is not pool.pin
        slots = twin.slot_of[np.arange(5)]
        got = _gathered(twin.context_len, twin.output_len, twin.generated, slots, 3, 16, twin.pin)
        assert np.array_equal(got[1][0], np.arange(100, 105))
    # the pool's stale first pin (arrays since replaced) is not used: the current arrays' numbers
    slots = pool.slot_of[np.arange(5)]
    got = _gathered(pool.context_len, pool.output_len, pool.generated, slots, 3, 16, first)
    assert np.array_equal(got[1][0], np.arange(100, 105))
    assert got[0] == sum((c + 3 + 15) // 16 for c in range(100, 105))
