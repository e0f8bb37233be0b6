"""The cycle table's gap filling: the fast form (never-measured buckets skipped without a look,
the tree cells' median as :func:`small_median`) reads exactly as the numpy form it replaced."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.cycles import _NEAREST, LATTICE, CycleKind, CycleTable, small_median, sorted_median


def _reference_fill(table: CycleTable, kind: CycleKind, b: int) -> np.ndarray:
    """CycleTable._fill as it was: every bucket looked at, np.median of the tree cells."""
    med = table._medians(kind)
    order = _NEAREST[b]
    for bb in order:
        row = med[bb]
        ok = np.isfinite(row)
        if ok.any():
            if ok.all():
                return np.array(row, dtype=np.float64)
            x = np.flatnonzero(ok)
            return np.asarray(np.interp(np.arange(row.shape[0]), x, row[x]), np.float64)
    if kind != "tree":
        tree = table._medians("tree")
        for bb in order:
            vals = tree[bb][np.isfinite(tree[bb])]
            if vals.size:
                return np.full(1, float(np.median(vals)))
    return np.ones(med.shape[1])


def test_small_median_is_numpys_median_bit_for_bit() -> None:
    rng = np.random.default_rng(11)
    for n in [*range(1, 60), 301, 600, 1001]:
        for scale in (1e-300, 1e-3, 1.0, 7.3, 1e300):
            values = rng.lognormal(0.0, 2.0, n) * scale
            if n % 7 == 0:  # ties
                values = np.round(values / scale, 1) * scale
            assert small_median(values.tolist()) == float(np.median(values))
            assert sorted_median(values) == float(np.median(values))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("compiled", [True, False])
def test_fill_reads_as_the_numpy_form(
    seed: int, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gaps filled (compiled, fill_row() and finite_median(), or in numpy) as np.interp
    fills them, the tree cells' typical ratio as np.median takes it."""
    import bastion.cycles as cycles

    if compiled and cycles._fill_row is None:
        pytest.skip("no compiled kernel")
    if not compiled:
        monkeypatch.setattr(cycles, "_fill_row", None)
        monkeypatch.setattr(cycles, "_finite_median", None)
    rng = np.random.default_rng(seed)
    table = CycleTable(window=int(rng.integers(1, 10)))
    kinds: tuple[CycleKind, ...] = ("tree", "ar", "chain")
    for step in range(400):
        kind = kinds[int(rng.choice(3, p=[0.8, 0.1, 0.1]))] if step > 40 else "tree"
        b = int(rng.choice([1, 2, 3, 5, 8, 17, 32, 64, 700]))
        tokens = int(rng.choice(LATTICE[:60])) + int(rng.integers(0, 3))
        table.observe(kind, b, tokens, float(rng.lognormal(0.0, 0.3)))
        if step % 7 == 0:
            for k in kinds:
                for bucket in range(11):
                    got = table._fill(k, bucket)
                    assert np.array_equal(got, _reference_fill(table, k, bucket))


@pytest.mark.parametrize("seed", range(6))
def test_ratio_epoch_moves_whenever_a_ratio_may_read_differently(seed: int) -> None:
    """CycleTable.ratio_epoch is what the learned mode cycles are cached on: while it stands,
    every kind's ratios in every bucket read the same."""
    rng = np.random.default_rng(seed)
    table = CycleTable(window=int(rng.integers(1, 10)))
    kinds: tuple[CycleKind, ...] = ("tree", "ar", "chain")
    seen: dict[int, dict[tuple[str, int], bytes]] = {}
    moved = 0
    for _ in range(400):
        kind = kinds[int(rng.choice(3, p=[0.6, 0.2, 0.2]))]
        batch = int(rng.choice([1, 2, 3, 8, 30, 64]))
        table.observe(kind, batch, int(rng.integers(batch, 300)), float(rng.lognormal(0, 0.3)))
        now = {(k, b): table.ratios(k, b).tobytes() for k in kinds for b in (1, 2, 8, 32, 64)}
        before = seen.setdefault(table.ratio_epoch, now)
        assert before == now, f"epoch {table.ratio_epoch} stood while a ratio moved"
        moved = len(seen)
    assert moved > 10  # the epoch did move, and the check compared many states


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("reads", [1, 3, 50])
@pytest.mark.parametrize("compiled", [True, False])
def test_medians_taken_when_read_are_each_rings_median(
    seed: int, reads: int, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cells observed between reads get their medians when read (one at a time or many):
    each is np.median of its ring's ratios, whatever was observed in between — compiled
    (medians()) or not."""
    import bastion.cycles as cycles

    if compiled and cycles._medians_kernel is None:
        pytest.skip("no compiled kernel")
    if not compiled:
        monkeypatch.setattr(cycles, "_medians_kernel", None)
    rng = np.random.default_rng(seed)
    table = CycleTable(window=int(rng.integers(1, 12)))
    kinds: tuple[CycleKind, ...] = ("tree", "ar", "chain")
    for step in range(300):
        kind = kinds[int(rng.integers(3))]
        tokens = int(rng.choice([1, 5, 40, 200]))  # a few cells, observed again and again
        table.observe(kind, int(rng.choice([1, 32])), tokens, float(rng.lognormal(0, 0.5)))
        if step % reads == 0 or step == 299:
            for k in kinds:
                med, ring, count = table._medians(k), table._ring[k], table._count[k]
                for b, cell in zip(*np.nonzero(count), strict=True):
                    seen = min(int(count[b, cell]), table.window)
                    assert med[b, cell] == float(np.median(ring[b, cell, :seen])), (k, b, cell)


@pytest.mark.parametrize("seed", range(4))
def test_an_unmeasured_kind_reads_the_tree_cells_as_they_are_now(seed: int) -> None:
    """Before AR or the chain is measured, its row is the tree cells' typical ratio as of the
    last tree observation: the AR and the chain row read in turn (they share one value) after
    every observation, however few came since the last refresh, and after a kind is measured
    its own cells instead."""
    rng = np.random.default_rng(seed)
    table = CycleTable(window=int(rng.integers(1, 10)))
    for step in range(120):
        kind: CycleKind = "tree" if step < 100 else ("ar", "chain")[step % 2]
        b = int(rng.choice([1, 2, 5, 32, 700]))
        table.observe(kind, b, int(rng.choice(LATTICE[:40])), float(rng.lognormal(0.0, 0.3)))
        for bucket in (int(rng.integers(11)), 5, 0):
            for k in ("ar", "chain", "ar"):
                got = table._fill(k, bucket)  # type: ignore[arg-type]
                assert np.array_equal(got, _reference_fill(table, k, bucket)), (step, k)  # type: ignore[arg-type]
