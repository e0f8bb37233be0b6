"""The learning controller's compiled hot paths give exactly what their numpy forms give.

``bastion._bestfirst.calibrate`` (the calibrated marginals) and ``learn`` (a tree step
folded into both calibrations) must be bit-identical to ``AcceptanceCalibration.calibrate`` /
``.observe`` and ``SizeCalibration.observe`` run with the kernel switched off; and the batch-1
prior the controller prices with (interpolated in the context) must stay close to the prior
priced at each context.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.observed as observed
from bastion.batch import BatchMarginals, TreeBatch
from bastion.bestfirst import best_first
from bastion.interfaces import StepLoad
from bastion.learned import LearnedCostModel
from bastion.observed import AcceptanceCalibration, SizeCalibration, observe_tree_step
from bastion.testing import marginals
from bastion.tree import DraftMarginals, DraftTree, tree_from_arrays

needs_kernel = pytest.mark.skipif(observed._kernel is None, reason="no compiled kernel")


def _numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observed, "_kernel", None)


def _calibrated_both(
    batch: BatchMarginals, g: np.ndarray, depth: int, k: int
) -> list[tuple[BatchMarginals, np.ndarray | None]]:
    """``batch`` calibrated by factors ``g`` with the compiled kernel, then with numpy: each
    result and the order the calibration kept for the learning step."""
    outs = []
    for kernel in (observed._kernel, None):
        cal = AcceptanceCalibration(depth=depth, ranks=k)
        cal._g[:, :] = g
        cal.steps = 1
        saved = observed._kernel
        observed._kernel = kernel
        try:
            out = cal.calibrate(batch)
            last = cal._last
        finally:
            observed._kernel = saved
        assert last is not None
        outs.append((out, last[1]))
    return outs


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(marginals(max_depth=5, max_k=6, min_k=2), min_size=1, max_size=4), st.data())
def test_calibrate_kernel_equals_numpy(rows: list[DraftMarginals], data) -> None:  # type: ignore[no-untyped-def]
    shapes = {r.probs.shape for r in rows}
    depth, k = rows[0].probs.shape
    if len(shapes) > 1:
        rows = [rows[0]]
    batch = BatchMarginals.from_rows(rows)
    g = np.asarray(
        data.draw(
            st.lists(
                st.sampled_from([0.5, 1.0, 2.0]) | st.floats(0.05, 3.0),
                min_size=depth * k,
                max_size=depth * k,
            )
        )
    ).reshape(depth, k)
    (a, order_a), (b, order_b) = _calibrated_both(batch, g, depth, k)
    assert np.array_equal(a.probs, b.probs)
    assert np.array_equal(a.token_ids, b.token_ids)
    assert (order_a is None) == (order_b is None)
    if order_a is not None:
        assert np.array_equal(order_a, order_b)


@needs_kernel
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("other", ["none", "sorted", "unsorted"])
def test_calibrate_kernel_on_rank_ids_equals_numpy(seed: int, other: str) -> None:
    """Token ids that are every row's ranks 0 … K − 1 (the simulator's drafters): the kernel
    returns one array as both the sorted ids and the order, still numpy's; and where a single
    row's ids are not its ranks (a row that stays sorted or one that is re-sorted) the ids
    are gathered as for any ids."""
    rng = np.random.default_rng(seed)
    b, depth, k = 3, 4, 5
    probs = np.sort(rng.dirichlet(np.ones(k + 1), size=(b, depth))[..., :k], axis=-1)[..., ::-1]
    g = rng.uniform(0.5, 2.0, size=(depth, k))
    g[depth - 1] = 1.0  # the last row of every request stays sorted
    g[0, k - 1] = 50.0  # the first row of every request is re-sorted
    ids = np.tile(np.arange(k), (b, depth, 1))
    if other != "none":  # the last request's last (sorted) or first (re-sorted) row
        ids[b - 1, depth - 1 if other == "sorted" else 0] = 100 + rng.permutation(k)
    batch = BatchMarginals(ids, np.ascontiguousarray(probs))
    (a, order_a), (b_, order_b) = _calibrated_both(batch, g, depth, k)
    assert order_a is not None and order_b is not None
    assert np.array_equal(a.probs, b_.probs)
    assert np.array_equal(a.token_ids, b_.token_ids)
    assert np.array_equal(order_a, order_b)
    assert (a.token_ids is order_a) == (other == "none")


def _steps(seed: int, count: int) -> list[tuple[DraftMarginals, int, np.ndarray]]:
    """Random batch-1 steps: marginals, a tree budget and the target's tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        depth, k = int(rng.integers(1, 7)), int(rng.integers(1, 6))
        p = np.sort(rng.dirichlet(np.ones(k + 2), size=depth)[:, :k], axis=1)[:, ::-1]
        ids = np.tile(np.arange(k), (depth, 1)) + 10 * np.arange(depth)[:, None]
        target = ids[np.arange(depth), rng.integers(0, k + 1, size=depth) % k].copy()
        target[rng.random(depth) < 0.2] = -5  # a token the drafter did not propose
        out.append((DraftMarginals(ids, np.ascontiguousarray(p)), int(rng.integers(1, 80)), target))
    return out


def _run(steps: list[tuple[DraftMarginals, int, np.ndarray]], compiled: bool):  # type: ignore[no-untyped-def]
    acc, sizes = AcceptanceCalibration(depth=4, ranks=3), SizeCalibration()
    for m, budget, target in steps:
        cal = acc.calibrate(BatchMarginals(m.token_ids[None], m.probs[None])).row(0)
        tree = tree_from_arrays(best_first(cal.probs, budget), cal)
        on = np.zeros(tree.size, bool)
        on[0] = True
        for j in range(1, tree.size):  # the target's accepted path
            on[j] = on[tree.parents[j]] and tree.tokens[j] == target[tree.depths[j] - 1]
        nodes = np.flatnonzero(on[1:]) + 1
        trees = TreeBatch.from_trees([tree])
        committed = np.array([nodes.size + 1])
        if not (compiled and observe_tree_step(acc, sizes, trees, nodes, committed)):
            acc.observe(trees, nodes, committed)
            sizes.observe(trees, nodes, committed)
    return acc, sizes


def _assert_same_state(a1, s1, a2, s2) -> None:  # type: ignore[no-untyped-def]
    """Both calibrations' learned arrays, bit for bit."""
    for x, y in ((a1._pred, a2._pred), (a1._real, a2._real), (a1._g, a2._g)):
        assert np.array_equal(x, y)
    for x, y in ((s1._da, s2._da), (s1._dt, s2._dt), (s1._weight, s2._weight)):
        assert np.array_equal(x, y)


@needs_kernel
@pytest.mark.parametrize("seed", range(6))
def test_learn_kernel_equals_the_two_observe_methods_batch_1(seed: int) -> None:
    steps = _steps(seed, 40)
    a1, s1 = _run(steps, compiled=True)
    a2, s2 = _run(steps, compiled=False)
    assert a1.steps == a2.steps > 30 and s1.version == s2.version
    _assert_same_state(a1, s1, a2, s2)
    assert a1._real.sum() > 0 and s1._weight.sum() > 0  # something was learned


@needs_kernel
def test_learn_refuses_inconsistent_input() -> None:
    acc, sizes = AcceptanceCalibration(), SizeCalibration()
    m = DraftMarginals(np.arange(6).reshape(2, 3), np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]]))
    acc.calibrate(BatchMarginals(m.token_ids[None], m.probs[None]))
    tree = tree_from_arrays(best_first(m.probs, 5), m)
    with pytest.raises(ValueError, match="accepted node out of range"):
        observe_tree_step(acc, sizes, TreeBatch.from_trees([tree]), np.array([7]), np.array([2]))


def _size_state(seed: int) -> SizeCalibration:
    """A size calibration whose rows hold every case the gain ratios and factors branch on:
    cells seen and never seen (also the first ones), tiny and zero sums, a row never seen."""
    rng = np.random.default_rng(seed)
    sizes = SizeCalibration(prior_weight=float(rng.uniform(0.5, 16.0)))
    n = sizes._da.shape[1]
    for b in range(11):
        seen = rng.random(n) < [0.0, 1.0, 0.5, 0.1, 0.9][b % 5]
        sizes._weight[b] = np.where(seen, rng.uniform(1e-9, 30.0, n), rng.uniform(0, 1e-9, n))
        scale = 10.0 ** rng.integers(-14, 2, n)  # some cells' sums near the 1e-12 floor
        sizes._da[b] = np.where(rng.random(n) < 0.1, 0.0, rng.random(n) * scale)
        sizes._dt[b] = sizes._da[b] * rng.uniform(0.0, 2.0, n)
    return sizes


@needs_kernel
@pytest.mark.parametrize("seed", range(12))
def test_gain_ratios_and_factors_kernels_equal_numpy(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SizeCalibration.gain_ratios and .factors, compiled, bit for bit as numpy's."""
    compiled, reference = _size_state(seed), _size_state(seed)
    for batch in (1, 2, 3, 5, 8, 16, 32, 100, 1000):
        h, f = compiled.gain_ratios(batch), compiled.factors(batch)
        with monkeypatch.context() as m:
            _numpy(m)
            h_ref, f_ref = reference.gain_ratios(batch), reference.factors(batch)
        assert h.tobytes() == h_ref.tobytes(), batch
        assert f.tobytes() == f_ref.tobytes(), batch
        assert not h.flags.writeable and not f.flags.writeable


class _ContextPrior:
    """A prior whose cycle grows with N and, non-linearly, with the context."""

    def cost_curve(self, max_tree_size: int, load: StepLoad):  # type: ignore[no-untyped-def]
        from bastion.interfaces import CostCurve

        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        c = float(load.context_len)
        return CostCurve(1e-3, 0.0, 8e-3 + 2e-6 * n + 1e-9 * c * n + 1e-13 * c**2, 8e-3)

    def step_cost(self, tree_size: int, load: StepLoad):  # type: ignore[no-untyped-def]
        raise NotImplementedError


@pytest.mark.parametrize("context", [0, 100, 700, 3000, 9000])
def test_interpolated_batch1_prior_stays_close_to_the_prior(context: int) -> None:
    prior = _ContextPrior()
    learner = LearnedCostModel(prior)  # type: ignore[arg-type]
    cycle, ar = learner.priced.single(context, 300)
    mid = context // 128 * 128 + 64
    cc = prior.cost_curve(300, StepLoad(mid))
    exact = cc.draft_s + cc.prep_s + cc.verify_s
    err = np.max(np.abs(cycle[:300] / exact - 1.0))
    assert err < 0.01
    assert ar == pytest.approx(cc.ar_step_s)
    # negative control: the prior at the context step's start instead of its middle is
    # further off than the interpolation, so the test would see a wrong anchor
    cc0 = prior.cost_curve(300, StepLoad(context // 128 * 128))
    assert np.max(np.abs((cc0.draft_s + cc0.verify_s) / exact - 1.0)) >= err


def _batch_steps(seed: int, count: int):  # type: ignore[no-untyped-def]
    """Random batched steps: B requests' marginals of one shape, budgets and targets."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        b, depth, k = int(rng.integers(2, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 5))
        p = np.sort(rng.dirichlet(np.ones(k + 2), size=(b, depth))[..., :k], axis=-1)[..., ::-1]
        p[rng.random((b, depth, k)) < 0.1] *= 0.5  # ties and unsorted rows after calibration
        p = np.sort(p, axis=-1)[..., ::-1]
        ids = np.broadcast_to(np.arange(k) + 10 * np.arange(depth)[:, None], (b, depth, k))
        target = ids[0][np.arange(depth), rng.integers(0, k + 1, size=(b, depth)) % k].copy()
        target[rng.random((b, depth)) < 0.2] = -5
        budgets = rng.integers(1, 40, size=b)
        out.append((np.ascontiguousarray(ids), np.ascontiguousarray(p), budgets, target))
    return out


def _fold(acc, sizes, trees, nodes, committed, compiled: bool) -> None:  # type: ignore[no-untyped-def]
    """One verified batched step into both calibrations: the compiled call where it applies
    (``compiled``), else the two ``observe`` methods."""
    batch = TreeBatch.from_trees(trees)
    flat, done = np.concatenate(nodes).astype(np.int64), np.asarray(committed)
    if not (compiled and observe_tree_step(acc, sizes, batch, flat, done)):
        acc.observe(batch, flat, done)
        sizes.observe(batch, flat, done)


def accepted_path(tree: DraftTree, target: np.ndarray) -> np.ndarray:
    """The nodes (root excluded) of ``tree`` on the path the target's tokens ``target``
    (position d + 1 at index d) accept, in node order."""
    on = np.zeros(tree.size, bool)
    on[0] = True
    for j in range(1, tree.size):
        on[j] = on[tree.parents[j]] and tree.tokens[j] == target[tree.depths[j] - 1]
    return np.flatnonzero(on[1:]) + 1


def _run_batched(steps, compiled: bool):  # type: ignore[no-untyped-def]
    acc, sizes = AcceptanceCalibration(depth=3, ranks=3), SizeCalibration()
    for ids, p, budgets, target in steps:
        cal = acc.calibrate(BatchMarginals(ids, p))
        trees, nodes, committed = [], [], []
        for i, budget in enumerate(budgets):
            row = cal.row(i)
            tree = tree_from_arrays(best_first(row.probs, int(budget)), row)
            path = accepted_path(tree, target[i])
            trees.append(tree)
            nodes.append(path)
            committed.append(path.size + 1)
        _fold(acc, sizes, trees, nodes, committed, compiled)
    return acc, sizes


@needs_kernel
@pytest.mark.parametrize("seed", range(6))
def test_learn_kernel_equals_the_two_observe_methods_batched(seed: int) -> None:
    steps = _batch_steps(seed, 30)
    a1, s1 = _run_batched(steps, compiled=True)
    a2, s2 = _run_batched(steps, compiled=False)
    assert a1.steps == a2.steps > 20 and s1.version == s2.version
    _assert_same_state(a1, s1, a2, s2)
    assert s1._weight[1:].sum() > 0  # batched buckets were learned


def _unordered_steps(seed: int, count: int):  # type: ignore[no-untyped-def]
    """Batched steps whose trees are not in best-first order: each request's root with its
    depth-1 candidates in ascending probability (valid trees, scores rising along the order)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        b, k = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        p = np.sort(rng.dirichlet(np.ones(k + 1), size=(b, 1))[..., :k], axis=-1)[..., ::-1]
        ids = np.broadcast_to(np.arange(k), (b, 1, k)).copy()
        target = rng.integers(0, k + 1, size=b)  # k: a token never drafted
        out.append((ids, np.ascontiguousarray(p), target))
    return out


def _run_unordered(steps, compiled: bool):  # type: ignore[no-untyped-def]
    acc, sizes = AcceptanceCalibration(depth=2, ranks=3), SizeCalibration()
    for ids, p, target in steps:
        b, _, k = p.shape
        cal = acc.calibrate(BatchMarginals(ids, p))
        ranks = np.arange(k - 1, -1, -1)  # the least likely candidate first
        trees, nodes = [], []
        for i in range(b):
            trees.append(
                tree_from_arrays(
                    (
                        np.r_[-1, np.zeros(k, np.int64)],
                        np.r_[0, np.ones(k, np.int64)],
                        np.r_[-1, ranks],
                        np.r_[1.0, cal.probs[i, 0, ranks]],
                    ),
                    cal.row(i),
                )
            )
            hit = np.flatnonzero(trees[-1].tokens[1:] == target[i]) + 1
            nodes.append(hit)
        _fold(acc, sizes, trees, nodes, [n.size + 1 for n in nodes], compiled)
    return acc, sizes


@needs_kernel
@pytest.mark.parametrize("seed", range(4))
def test_learn_kernel_equals_numpy_on_trees_not_in_best_first_order(seed: int) -> None:
    """The kernel merges each tree's run of non-increasing scores; a tree that is not sorted
    so must take the general sort (the merged order the numpy form's lexsort gives)."""
    steps = _unordered_steps(seed, 30)
    a1, s1 = _run_unordered(steps, compiled=True)
    a2, s2 = _run_unordered(steps, compiled=False)
    assert s1.version == s2.version > 20
    _assert_same_state(a1, s1, a2, s2)
    assert s1._dt[1:].sum() > 0  # accepted nodes were ranked


@needs_kernel
@pytest.mark.parametrize("seed", range(4))
def test_a_chain_step_teaches_the_acceptance_calibration_only(seed: int) -> None:
    """learn_step without a size calibration (a chain step) is AcceptanceCalibration.observe
    bit for bit, and returns each request's leading rank-0 run and its chain's depth."""
    from bastion.batch import chain_batch
    from bastion.observed import learn_step

    states, accepted = [], 0
    for compiled in (True, False):
        acc = AcceptanceCalibration(depth=3, ranks=3)
        for ids, p, _, target in _batch_steps(seed, 30):
            cal = acc.calibrate(BatchMarginals(ids, p))
            trees = chain_batch(cal)
            counts = np.zeros(trees.size, np.int64)
            for i in range(trees.size):  # the chain's accepted run against the target
                for d in range(p.shape[1]):
                    if cal.token_ids[i, d, 0] != target[i, d]:
                        break
                    counts[i] += 1
            flat = np.concatenate([np.arange(1, c + 1) for c in counts]).astype(np.int64)
            learned = learn_step(acc, None, trees, flat, counts + 1) if compiled else None
            if learned is None:
                acc.observe(trees, flat, counts + 1)
            else:
                assert np.array_equal(learned[0], counts)
                assert np.array_equal(learned[1], np.diff(trees.offsets) - 1)
                accepted += int(counts.sum())
        states.append(acc)
    a1, a2 = states
    assert a1.steps == a2.steps > 20
    for x, y in ((a1._pred, a2._pred), (a1._real, a2._real), (a1._g, a2._g)):
        assert np.array_equal(x, y)
    assert accepted > 0  # some chains accepted tokens


@pytest.mark.parametrize("seed", range(5))
def test_a_lerp_reads_what_the_whole_interpolation_holds(seed: int) -> None:
    """The even-spread prior formed where read (Lerp) gives, at an index, an index array or a
    slice, the very doubles of (1 - w)·lo + w·hi formed whole."""
    from bastion.learned_prior import Lerp

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    lo, hi = rng.lognormal(-5, 2, n), rng.lognormal(-5, 2, n)
    w = float(rng.choice([0.0, 0.25, 0.5, 0.75, rng.random()]))
    lerp, whole = Lerp(lo, hi, w), (1.0 - w) * lo + w * hi
    assert len(lerp) == n and np.asarray(lerp).tobytes() == whole.tobytes()
    for i in rng.integers(0, n, 20).tolist():
        got, at_numpy_int = lerp[i], lerp[np.int64(i)]
        assert type(got) is float and got == whole[i] and at_numpy_int == got
    idx = rng.integers(0, n, 50)
    assert lerp[idx].tobytes() == whole[idx].tobytes()
    assert lerp[n // 3 : n // 2 + 1].tobytes() == whole[n // 3 : n // 2 + 1].tobytes()


def test_the_even_prior_at_one_total_is_the_curve_s_value_cached_or_not() -> None:
    """PricedPrior.even_at (every batched step's observation) reads even(ctx, top)[total − B]:
    on a step not priced yet (it prices it) and on one cached, at every total from B to top."""
    from bastion.cost.costmodel import RooflineCostModel
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model
    from bastion.learned import LearnedCostModel

    model = get_model("qwen3-8b")
    prior = RooflineCostModel(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model))
    rng = np.random.default_rng(3)
    for b, top in ((2, 64), (5, 300), (32, 4096)):
        ctx = rng.integers(100, 9000, b).astype(np.int64)
        totals = [b, top, *rng.integers(b, top + 1, 10).tolist()]
        fresh = [LearnedCostModel(prior).priced.even_at(ctx, top, t) for t in totals]
        priced = LearnedCostModel(prior).priced
        curve = np.asarray(priced.even(ctx, top))
        cached = [priced.even_at(ctx, top, t) for t in totals]
        want = [float(curve[t - b]) for t in totals]
        assert fresh == want and cached == want and all(type(v) is float for v in cached)
