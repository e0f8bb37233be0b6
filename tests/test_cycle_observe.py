"""CycleTable.observe writes its rings and counts through flat views of the arrays: what it
stores must be what indexing the [bucket, cell, slot] arrays stores, in every kind and bucket,
in a deep copy too (whose views must be of its own arrays)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from bastion.cycles import LATTICE, CycleTable, batch_bucket


def _reference_observe(
    ring: dict, count: dict, window: int, kind: str, b: int, tokens: int, ratio: float
) -> None:  # type: ignore[type-arg]
    """observe()'s write, by numpy indexing (its form before the flat views)."""
    if not (math.isfinite(ratio) and ratio > 0):
        return
    bucket = batch_bucket(b)
    cell = int(np.searchsorted(LATTICE, tokens)) if kind == "tree" else 0
    seen = int(count[kind][bucket, cell])
    ring[kind][bucket, cell, seen % window] = ratio
    count[kind][bucket, cell] = seen + 1


@pytest.mark.parametrize("seed", range(4))
def test_observe_stores_what_indexing_the_arrays_stores(seed: int) -> None:
    rng = np.random.default_rng(seed)
    window = int(rng.integers(1, 6))
    table = CycleTable(window=window)
    ring = {k: np.array(v) for k, v in table._ring.items()}
    count = {k: np.array(v) for k, v in table._count.items()}
    copied = None
    for step in range(400):
        kind = ("tree", "chain", "ar")[int(rng.integers(0, 3))]
        b = int(rng.integers(1, 300))
        tokens = int(rng.integers(b, 20 * b + 2))
        ratio = float(rng.choice([rng.uniform(0.5, 2.0), math.nan, -1.0, math.inf, 0.0]))
        batch = np.int64(b) if step % 7 == 0 else b  # a numpy batch size: the general path
        table.observe(kind, batch, tokens, ratio)  # type: ignore[arg-type]
        _reference_observe(ring, count, window, kind, b, tokens, ratio)
        if step == 200:  # a deep copy goes on on its own arrays
            copied = copy.deepcopy(table)
            ref_copy = (
                {k: v.copy() for k, v in ring.items()},
                {k: v.copy() for k, v in count.items()},
            )
        elif copied is not None:
            copied.observe("tree", 64, 300, 1.5)
            _reference_observe(*ref_copy, window, "tree", 64, 300, 1.5)
    assert copied is not None
    for t, (r, c) in ((table, (ring, count)), (copied, ref_copy)):
        for k in ("tree", "chain", "ar"):
            assert np.array_equal(t._ring[k], r[k], equal_nan=True)
            assert np.array_equal(t._count[k], c[k])
    assert table._count["tree"].sum() > 10 and table._count["ar"].sum() > 10


def test_tokens_beyond_the_lattice_are_refused() -> None:
    table = CycleTable()
    with pytest.raises(IndexError):
        table.observe("tree", 4, int(LATTICE[-1]) + 1, 1.0)
    assert table._count["tree"].sum() == 0
