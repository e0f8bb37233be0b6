"""``KVCache.blocks_of``'s compiled count (``bastion._bestfirst.blocks``) is the numpy sum.

The simulated server counts its KV-cache blocks several times a step: Σ ⌈(c + add) / block⌉
over the decoding requests, and with a step's trees Σ ⌈(c + max(s, add)) / block⌉. The compiled
call must give the whole number numpy's expression gives, and arrays it does not take (not
int64, not contiguous) must fall back to numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.sim.memory as memory
from bastion.sim.memory import KVCache

needs_kernel = pytest.mark.skipif(memory._blocks is None, reason="no compiled kernel")


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


@needs_kernel
def test_blocks_kernel_declines_other_arrays() -> None:
    t = np.arange(40, dtype=np.int64) * 7
    assert memory._blocks(t.astype(np.int32), 0, 16, None, 0) is None
    assert memory._blocks(t[::2], 0, 16, None, 0) is None
    assert memory._blocks(t, 0, 16, t.astype(np.float64), 0) is None
    kv = KVCache(None)
    for arr in (t.astype(np.int32), t[::2]):  # the numpy path answers instead
        assert kv.blocks_of(arr, 3) == _numpy(arr.astype(np.int64), 3, kv.block_tokens, None)
    with pytest.raises(ValueError):
        memory._blocks(t, 0, 16, t[:5].copy(), 0)


def test_blocks_without_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_blocks", None)
    kv = KVCache(None)
    for n in (3, 40):
        t = np.arange(n, dtype=np.int64) * 13
        s = (np.arange(n, dtype=np.int64) % 9) + 1
        assert kv.blocks_of(t, 4) == _numpy(t, 4, kv.block_tokens, None)
        assert kv.blocks_of(t, 4, s) == _numpy(t, 4, kv.block_tokens, s)
