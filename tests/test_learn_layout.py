"""The compiled ``learn`` takes the learner's arrays as they are, and only those.

``bastion.observed.learn_step`` hands ``bastion._bestfirst.learn`` the trees, the accepted paths,
the committed counts and the drafter's rows unconverted: the kernel takes each where it is a
C-contiguous buffer of its type (int64; float64 scores and rows) and otherwise answers None,
having changed nothing, and ``learn_step`` then converts them and calls again. A step handed in
other layouts (int32, strided, a list) must therefore fold in exactly what the same step in the
kernel's layout does — and what the two ``observe`` methods do, the kernel switched off.
"""

from __future__ import annotations

import numpy as np
import pytest

import bastion.observed as observed
from bastion.batch import BatchMarginals, TreeBatch
from bastion.bestfirst import best_first
from bastion.observed import AcceptanceCalibration, SizeCalibration, learn_step
from bastion.tree import tree_from_arrays
from tests.test_learned_kernels import accepted_path

needs_kernel = pytest.mark.skipif(observed._kernel is None, reason="no compiled kernel")


def _strided(a: np.ndarray) -> np.ndarray:
    """The same values in a view that is not C-contiguous."""
    return np.repeat(a, 2)[::2]


def _rows_strided(probs: np.ndarray) -> np.ndarray:
    """[B, D, k] rows (B ≥ 2) in a view that is not C-contiguous."""
    return np.repeat(probs, 2, axis=0)[::2]


def _foreign(trees: TreeBatch, nodes: np.ndarray, committed: np.ndarray, how: int):  # type: ignore[no-untyped-def]
    """The step's arrays in a layout the kernel does not take (one kind of foreign per ``how``)."""
    if how == 0:  # other integer widths
        i4 = np.int32
        trees = TreeBatch(
            trees.offsets.astype(i4),
            trees.parents.astype(i4),
            trees.tokens,
            trees.depths.astype(i4),
            trees.scores.astype(np.longdouble),  # (float64 values, held exactly)
            trees.ranks.astype(i4),
        )
        return trees, nodes.astype(i4), committed.astype(i4)
    if how == 1:  # strided views
        trees = TreeBatch(
            _strided(trees.offsets),
            _strided(trees.parents),
            trees.tokens,
            _strided(trees.depths),
            _strided(trees.scores),
            _strided(trees.ranks),
        )
        return trees, _strided(nodes), _strided(committed)
    return trees, nodes.tolist(), committed.tolist()  # Python lists


def _step(rng: np.random.Generator, acc: AcceptanceCalibration, how: int | None):  # type: ignore[no-untyped-def]
    """One random batched step calibrated by ``acc``: (trees, accepted nodes, committed), in
    the kernel's layout (``how`` None) or a foreign one; the drafter's rows strided too where
    ``how`` is 1."""
    b, depth, k = int(rng.integers(2, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 5))
    p = np.sort(rng.dirichlet(np.ones(k + 2), size=(b, depth))[..., :k], axis=-1)[..., ::-1]
    ids = np.broadcast_to(np.arange(k) + 10 * np.arange(depth)[:, None], (b, depth, k)).copy()
    target = ids[0][np.arange(depth), rng.integers(0, k + 1, size=(b, depth)) % k]
    probs = np.ascontiguousarray(p)
    if how == 1:
        probs = _rows_strided(probs)
    cal = acc.calibrate(BatchMarginals(ids, probs))
    trees, nodes, committed = [], [], []
    for i in range(b):
        row = cal.row(i)
        tree = tree_from_arrays(best_first(row.probs, int(rng.integers(1, 30))), row)
        path = accepted_path(tree, target[i])
        trees.append(tree)
        nodes.append(path)
        committed.append(path.size + 1)
    batch = TreeBatch.from_trees(trees)
    flat, done = np.concatenate(nodes).astype(np.int64), np.asarray(committed, np.int64)
    return (batch, flat, done) if how is None else _foreign(batch, flat, done, how)


def _run(seed: int, how: int | None, compiled: bool):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    acc, sizes = AcceptanceCalibration(depth=3, ranks=3), SizeCalibration()
    shadows = []
    for _ in range(25):
        trees, nodes, committed = _step(rng, acc, how)
        out = learn_step(acc, sizes, trees, nodes, committed) if compiled else None
        if out is None:
            acc.observe(trees, np.asarray(nodes), np.asarray(committed))
            sizes.observe(trees, np.asarray(nodes), np.asarray(committed))
        else:
            shadows.append([x.tolist() for x in out])
    return acc, sizes, shadows


@needs_kernel
@pytest.mark.parametrize("how", [0, 1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_learn_step_on_foreign_layouts_folds_in_what_its_own_layout_does(
    seed: int, how: int
) -> None:
    a1, s1, shadows1 = _run(seed, how, compiled=True)
    a2, s2, shadows2 = _run(seed, None, compiled=True)
    a3, s3, _ = _run(seed, None, compiled=False)
    assert a1.steps == a2.steps == a3.steps == 25 and s1.version == s2.version == s3.version
    assert shadows1 == shadows2 and len(shadows1) > 15
    for a, s in ((a1, s1), (a3, s3)):
        for x, y in ((a._pred, a2._pred), (a._real, a2._real), (a._g, a2._g)):
            assert np.array_equal(x, y)
        for x, y in ((s._da, s2._da), (s._dt, s2._dt), (s._weight, s2._weight)):
            assert np.array_equal(x, y)


@needs_kernel
def test_the_kernel_declines_a_foreign_layout_changing_nothing() -> None:
    """Handed an array not in its layout, ``learn`` answers None and leaves the calibrations'
    sums as they were; the same step in its layout is taken."""
    rng = np.random.default_rng(5)
    acc, sizes = AcceptanceCalibration(depth=3, ranks=3), SizeCalibration()
    for _ in range(3):  # sums that are not all zero, so a decay would show
        trees, nodes, committed = _step(rng, acc, None)
        learn_step(acc, sizes, trees, nodes, committed)
    trees, nodes, committed = _step(rng, acc, None)
    last = acc._last
    assert last is not None
    raw, order = last
    before = [a.copy() for a in (acc._pred, acc._real, sizes._da, sizes._dt, sizes._weight)]
    bucket = 1 if trees.size < 3 else 2

    def call(offsets: object, scores: object, probs: object) -> object:
        return observed._kernel.learn(
            offsets,
            trees.parents,
            trees.depths,
            trees.ranks,
            scores,
            nodes,
            committed,
            b"" if order is None else order,
            probs,
            int(raw.probs.shape[2]),
            acc._pred,
            acc._real,
            acc.ranks,
            float(acc.decay),
            sizes._da[bucket],
            sizes._dt[bucket],
            sizes._weight[bucket],
            float(sizes.decay),
            observed.LATTICE,
        )

    foreign = [
        (trees.offsets.astype(np.int32), trees.scores, raw.probs),
        (trees.offsets.astype(np.float64), trees.scores, raw.probs),
        (trees.offsets, trees.scores.astype(np.int64), raw.probs),
        (trees.offsets, _strided(trees.scores), raw.probs),
        (trees.offsets, trees.scores, _rows_strided(raw.probs)),
        (trees.offsets.tolist(), trees.scores, raw.probs),
    ]
    for offsets, scores, probs in foreign:
        assert call(offsets, scores, probs) is None
        after = (acc._pred, acc._real, sizes._da, sizes._dt, sizes._weight)
        assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))
    assert call(trees.offsets, trees.scores, raw.probs) is not None
    assert not np.array_equal(before[0], acc._pred)
