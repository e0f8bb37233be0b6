"""The learning step's merge hint: the compiled forest's merged order spares ``learn`` its merge.

``bastion._bestfirst.learn`` ranks a batch's nodes in merged order (score descending, then
request, then each tree's own order). The compiled forest and joint budget grow the trees in
that very order and hand it on (the request of each added node in turn); ``learn`` takes it
only where it is that order exactly, so what it learns never depends on the hint: a right one
and a wrong one (or none) must leave the two calibrations bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest

import bastion.observed as observed
from bastion import controller
from bastion.batch import BatchMarginals, TreeBatch
from bastion.joint import forest_and_order
from bastion.observed import AcceptanceCalibration, SizeCalibration, learn_step

pytestmark = pytest.mark.skipif(observed._kernel is None, reason="no compiled kernel")


def _marginals(rng: np.random.Generator, b: int, depth: int, k: int) -> BatchMarginals:
    p = np.sort(rng.dirichlet(np.ones(k + 2), size=(b, depth))[..., :k], axis=-1)[..., ::-1]
    if rng.random() < 0.5:  # exact ties across requests (the merge breaks them by request)
        p[1:] = p[0]
    ids = np.broadcast_to(np.arange(k) + 10 * np.arange(depth)[:, None], (b, depth, k))
    return BatchMarginals(np.ascontiguousarray(ids), np.ascontiguousarray(p))


def _merged_requests(trees: TreeBatch) -> np.ndarray:
    """The merged order's requests in numpy: non-root nodes by score descending, then request,
    then position in the tree (what the size calibration ranks by)."""
    offsets = trees.offsets
    request = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    position = np.arange(offsets[-1]) - offsets[request]
    keep = position > 0
    order = np.lexsort((position[keep], request[keep], -trees.scores[keep]))
    return request[keep][order]


def _path(trees: TreeBatch, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's accepted nodes against ``target`` [B, depth] and its committed count."""
    nodes, committed = [], []
    for i in range(trees.offsets.shape[0] - 1):
        a, e = int(trees.offsets[i]), int(trees.offsets[i + 1])
        on = np.zeros(e - a, bool)
        on[0] = True
        for j in range(1, e - a):
            d = int(trees.depths[a + j])
            on[j] = on[trees.parents[a + j]] and trees.tokens[a + j] == target[i, d - 1]
        hit = np.flatnonzero(on[1:]) + 1
        nodes.append(hit)
        committed.append(hit.size + 1)
    return np.concatenate(nodes).astype(np.int64), np.asarray(committed, np.int64)


def _learn(steps, hints) -> tuple[AcceptanceCalibration, SizeCalibration, list]:  # type: ignore[no-untyped-def]
    """Every step learned with its hint (one per step); the calibrations and each step's
    (run, deepest)."""
    acc, sizes = AcceptanceCalibration(depth=4, ranks=3), SizeCalibration()
    shadows = []
    for (marginals, total, target), hint in zip(steps, hints, strict=True):
        cal = acc.calibrate(marginals)
        trees, _ = forest_and_order(cal, 64, total)
        nodes, committed = _path(trees, target)
        out = learn_step(acc, sizes, trees, nodes, committed, hint(trees, cal))
        assert out is not None
        shadows.append([x.tolist() for x in out])
    return acc, sizes, shadows


def _steps(seed: int, count: int = 25):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        b, depth, k = int(rng.integers(2, 7)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
        marginals = _marginals(rng, b, depth, k)
        target = rng.integers(0, k + 1, size=(b, depth)) + 10 * np.arange(depth)
        out.append((marginals, int(b + rng.integers(1, 12 * b)), target))
    return out


def _same(run1, run2) -> None:  # type: ignore[no-untyped-def]
    (a1, s1, sh1), (a2, s2, sh2) = run1, run2
    assert a1.steps == a2.steps and s1.version == s2.version
    assert sh1 == sh2
    for x, y in ((a1._pred, a2._pred), (a1._real, a2._real)):
        assert x.tobytes() == y.tobytes()
    for name in ("_da", "_dt", "_weight"):
        x, y = getattr(s1, name), getattr(s2, name)
        assert x.tobytes() == y.tobytes()
    assert s1._weight[1:].sum() > 0  # batched buckets were learned


def _forest_hint(trees: TreeBatch, cal: BatchMarginals) -> bytes:
    return forest_and_order(cal, 64, int(trees.offsets[-1]))[1]


def _none(trees: TreeBatch, cal: BatchMarginals) -> bytes:
    return b""


@pytest.mark.parametrize("seed", range(6))
def test_the_forest_hint_is_the_merged_order_and_learns_what_the_merge_learns(seed: int) -> None:
    steps = _steps(seed)
    for marginals, total, _ in steps:  # the hint is the order the kernel checks for
        trees, hint = forest_and_order(marginals, 64, total)
        assert np.array_equal(np.frombuffer(hint, np.int64), _merged_requests(trees))
    _same(_learn(steps, [_forest_hint] * len(steps)), _learn(steps, [_none] * len(steps)))


def _shuffled_runs(trees: TreeBatch, cal: BatchMarginals) -> bytes:
    """Every request's nodes in its tree's order, the requests one after another: a hint that
    takes each node once, in order within its tree, but not in merged order."""
    req = np.repeat(np.arange(trees.offsets.shape[0] - 1), np.diff(trees.offsets) - 1)
    return req.astype(np.int64).tobytes()


def _out_of_range(trees: TreeBatch, cal: BatchMarginals) -> bytes:
    hint = np.frombuffer(_forest_hint(trees, cal), np.int64).copy()
    hint[-1] = trees.offsets.shape[0] - 1  # a request past the batch
    return hint.tobytes()


def _one_too_many(trees: TreeBatch, cal: BatchMarginals) -> bytes:
    hint = np.frombuffer(_forest_hint(trees, cal), np.int64).copy()
    hint[-1] = hint[0]  # the first request once more than its tree holds (or a swap)
    return hint.tobytes()


def _short(trees: TreeBatch, cal: BatchMarginals) -> bytes:
    return _forest_hint(trees, cal)[:-8]


@pytest.mark.parametrize("wrong", [_shuffled_runs, _out_of_range, _one_too_many, _short])
@pytest.mark.parametrize("seed", range(3))
def test_a_hint_that_is_not_the_merged_order_changes_nothing(wrong, seed: int) -> None:  # type: ignore[no-untyped-def]
    steps = _steps(100 + seed)
    _same(_learn(steps, [wrong] * len(steps)), _learn(steps, [_none] * len(steps)))


def test_a_shuffled_hint_is_a_different_order() -> None:
    """The wrong hints above are wrong: taken as given they would rank the nodes otherwise."""
    steps = _steps(100)
    differs = 0
    for marginals, total, _ in steps:
        trees, hint = forest_and_order(marginals, 64, total)
        differs += _shuffled_runs(trees, marginals) != hint
    assert differs > len(steps) // 2


def test_the_joint_budget_hands_on_its_chosen_nodes_merged_order() -> None:
    """joint()'s eighth answer: the merged order of the nodes it chose, the forest's for
    that total (the same trees)."""
    rng = np.random.default_rng(7)
    kernel = controller._kernel
    for _ in range(20):
        b, depth, k = int(rng.integers(2, 6)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
        m = _marginals(rng, b, depth, k)
        top = b * depth * k + b
        cells = np.arange(top - b + 1, dtype=np.int64)
        cost = 1.0 + 0.02 * np.arange(top - b + 1) ** 1.5  # a cost that rises ever faster
        out = kernel.joint(m.probs, m.token_ids, depth, k, 64, 2 * b, b * 63, b"", cells, cost, 1.0)
        assert out[0] == 0
        trees, hint = forest_and_order(m, 64, b + out[1])
        assert out[7] == hint
        assert np.frombuffer(out[4], np.int64)[: b + 1].tolist() == trees.offsets.tolist()
    bad = kernel.joint(m.probs, m.token_ids, depth, k, 64, 2 * b, b * 63, b"", cells, -cost, 1.0)
    assert bad[0] == -1 and bad[7] == b""
