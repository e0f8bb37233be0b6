"""The joint budget across a batch: merged order optimality, the controller, the batched curve.

Brute force enumerates every allocation (N_1, …, N_B) of small batches (B ≤ 3, depth ≤ 3,
K ≤ 3): each N_i ranges over 1 … the number of request i's nodes with ρ > 0 (root included),
capped by N_max, and Â_i(N_i) is the cumulative sum of its best-first scores.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from bastion.batch import BatchMarginals
from bastion.bestfirst import best_first, best_first_forest
from bastion.budget import ControllerMode, choose_tree
from bastion.cost.calibration import Branch, LinearCalibration
from bastion.cost.costmodel import CostMode, RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BastionError, BudgetError, CostModelError
from bastion.interfaces import CostCurve, RequestLoad, StepCost, StepLoad
from bastion.joint import (
    JointCostModel,
    choose_joint,
    choose_joint_batch,
    joint_curve_from_cost_model,
    merge_order,
)
from bastion.learned import LearnedCostModel
from bastion.tree import DraftMarginals, best_first_tree
from tests.strategies import convex_costs, marginals
from tests.test_learned import FlatPrior

Merge = Callable[[Sequence[np.ndarray]], np.ndarray]  # scores → request of each added node
Batch = list[DraftMarginals]

small_batches = st.lists(marginals(max_depth=3, max_k=3), min_size=1, max_size=3)


# --------------------------------------------------------------------------------------------
# Brute force
# --------------------------------------------------------------------------------------------


def all_scores(batch: Batch) -> list[np.ndarray]:
    """Each request's complete best-first ρ array (every node with ρ > 0, root first)."""
    return [best_first(m.probs, int((m.k ** np.arange(m.depth + 1)).sum()))[3] for m in batch]


def allocation_table(
    scores: Sequence[np.ndarray], n_max: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Σ_i Â_i(N_i) and M = Σ_i N_i over every allocation, as flat arrays."""
    a_hat = [np.cumsum(s[: n_max or s.size]) for s in scores]
    grids = np.meshgrid(*a_hat, indexing="ij")
    sizes = np.meshgrid(*[np.arange(1, a.size + 1) for a in a_hat], indexing="ij")
    return np.sum([g.ravel() for g in grids], axis=0), np.sum([s.ravel() for s in sizes], axis=0)


def best_sum_per_total(scores: Sequence[np.ndarray], n_max: int | None = None) -> np.ndarray:
    """max Σ_i Â_i(N_i) over allocations with Σ N_i = M, for M = B … (entry M − B)."""
    totals, ms = allocation_table(scores, n_max)
    best = np.full(int(ms.max()) + 1, -np.inf)
    np.maximum.at(best, ms, totals)
    return best[len(scores) :]


def merged_sums(scores: Sequence[np.ndarray], merge: Merge) -> np.ndarray:
    """Σ_i Â_i(N_i) of the allocation that the first m merged nodes give, m = 0 … all."""
    req = merge(scores)
    sums = np.empty(req.size + 1)
    counts = np.zeros(len(scores), dtype=int)
    sums[0] = len(scores)
    for m, i in enumerate(req, start=1):
        counts[i] += 1
        sums[m] = sum(float(np.cumsum(s)[c]) for s, c in zip(scores, counts, strict=True))
    return sums


def merge_is_optimal(scores: Sequence[np.ndarray], merge: Merge) -> bool:
    """Property (a): every prefix of the merge attains the best Σ Â for its total."""
    return bool(
        np.allclose(merged_sums(scores, merge), best_sum_per_total(scores), rtol=1e-12, atol=0)
    )


def by_rho(scores: Sequence[np.ndarray]) -> np.ndarray:
    return merge_order(scores)[0]


def round_robin(scores: Sequence[np.ndarray]) -> np.ndarray:
    """A merge that ignores ρ: one node per request in turn (each request's order kept)."""
    queues = [[i] * (s.size - 1) for i, s in enumerate(scores)]
    return np.array(
        [i for turn in itertools.zip_longest(*queues) for i in turn if i is not None], dtype=int
    )


def total_only_curve(costs: np.ndarray, ar_step_s: float = 1.0) -> Callable[..., CostCurve]:
    """A joint curve whose Ĉ depends on the total alone: verify_s[m] = costs[m]."""

    def curve(grow: np.ndarray) -> CostCurve:
        return CostCurve(0.0, 0.0, np.asarray(costs[: grow.size + 1]), ar_step_s)

    return curve


def best_speedup(
    scores: Sequence[np.ndarray], costs: np.ndarray, n_max: int, ar_step_s: float = 1.0
) -> float:
    """max over every allocation (N_i ≤ n_max) of Σ Â · L_AR / Ĉ(M)."""
    totals, ms = allocation_table(scores, n_max)
    return float(np.max(totals * ar_step_s / costs[ms - len(scores)]))


def speedup_of(
    sizes: Sequence[int], scores: Sequence[np.ndarray], costs: np.ndarray, ar: float = 1.0
) -> float:
    total = sum(float(np.cumsum(s)[n - 1]) for s, n in zip(scores, sizes, strict=True))
    return total * ar / float(costs[sum(sizes) - len(sizes)])


@st.composite
def monotone_costs(draw: st.DrawFn, n: int) -> np.ndarray:
    """Positive non-decreasing costs, convex or not: random increments with some large steps."""
    steps = np.array(draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n)))
    jumps = draw(st.lists(st.integers(0, n - 1), max_size=4))
    steps[np.array(jumps, dtype=int)] += draw(st.floats(0.0, 2.0))
    return draw(st.floats(0.1, 2.0)) + np.cumsum(steps)


def room(batch: Batch) -> int:
    """Entries a total-only curve needs: every added node of every request, plus m = 0."""
    return sum(s.size - 1 for s in all_scores(batch)) + 1


# --------------------------------------------------------------------------------------------
# (a) the merged order
# --------------------------------------------------------------------------------------------


@given(small_batches)
def test_merged_order_maximises_the_surrogate_for_every_total(batch: Batch) -> None:
    """(a) For every M, the first M − B merged nodes give max Σ Â_i over Σ N_i = M."""
    assert merge_is_optimal(all_scores(batch), by_rho)


@given(small_batches, st.integers(1, 12))
def test_controller_chain_attains_the_best_surrogate_under_a_cap(batch: Batch, n_max: int) -> None:
    """(a) through choose_joint: its Σ Â along the chain is the brute-force best for each M,
    with every tree capped at N_max."""
    curve = total_only_curve(np.ones(room(batch)))
    _, diag = choose_joint(batch, curve, n_max, mode="exhaustive")
    best = best_sum_per_total(all_scores(batch), n_max)
    np.testing.assert_allclose(diag.a_hat_total, best, rtol=1e-12)


def test_round_robin_merge_fails_the_optimality_property() -> None:
    """Negative control: a merge that ignores ρ (round-robin) breaks (a); Hypothesis finds a
    batch where it does, and on that batch the ρ-ordered merge still holds."""
    found = find(
        small_batches,
        lambda batch: not merge_is_optimal(all_scores(batch), round_robin),
        settings=settings(database=None, max_examples=2000),
    )
    assert not merge_is_optimal(all_scores(found), round_robin)
    assert merge_is_optimal(all_scores(found), by_rho)


def test_round_robin_fixed_counterexample() -> None:
    """Negative control, explicit: a confident request and an unsure one. Round-robin gives the
    unsure one a node at M = B + 2 where the confident one's second node is worth more."""
    batch = [
        DraftMarginals([[0], [1]], [[0.9], [0.9]]),
        DraftMarginals([[2], [3]], [[0.1], [0.1]]),
    ]
    scores = all_scores(batch)
    assert not merge_is_optimal(scores, round_robin)
    assert merge_is_optimal(scores, by_rho)
    assert by_rho(scores).tolist() == [0, 0, 1, 1]


def test_merge_breaks_ties_by_request_index() -> None:
    """Equal ρ: the lower request index first; each request's own order kept."""
    scores = [np.array([1.0, 0.5, 0.25]), np.array([1.0, 0.5, 0.5])]
    req, rho = merge_order(scores)
    assert req.tolist() == [0, 1, 1, 0]
    assert rho.tolist() == [0.5, 0.5, 0.5, 0.25]


# --------------------------------------------------------------------------------------------
# (b) the chosen allocation maximises Ŝ when Ĉ depends on M alone
# --------------------------------------------------------------------------------------------


@given(small_batches, st.data())
def test_exhaustive_and_auto_maximise_speedup_over_every_allocation(
    batch: Batch, data: st.DataObject
) -> None:
    """(b) Ĉ = f(M), non-decreasing: exhaustive and auto pick an allocation whose Ŝ is the
    brute-force max over every allocation (any initial chunk size)."""
    n_max = data.draw(st.integers(1, 30))
    costs = data.draw(monotone_costs(room(batch)))
    initial = data.draw(st.integers(1, 8))
    scores = all_scores(batch)
    best = best_speedup(scores, costs, n_max)
    for mode in ("exhaustive", "auto"):
        trees, diag = choose_joint(
            batch, total_only_curve(costs), n_max, mode, initial_budget=initial
        )
        sizes = [t.size for t in trees]
        assert tuple(sizes) == diag.tree_sizes and max(sizes) <= n_max
        assert speedup_of(sizes, scores, costs) == pytest.approx(best, rel=1e-12)
        assert diag.predicted_speedup == pytest.approx(best, rel=1e-12)


@given(small_batches, st.data())
def test_first_decrease_maximises_speedup_for_convex_costs(
    batch: Batch, data: st.DataObject
) -> None:
    """(b) Ĉ = f(M) convex: the first decrease of Ŝ along the chain is the brute-force max."""
    n_max = data.draw(st.integers(1, 30))
    costs = data.draw(convex_costs(room(batch)))
    initial = data.draw(st.integers(1, 8))
    scores = all_scores(batch)
    trees, diag = choose_joint(
        batch, total_only_curve(costs), n_max, "first-decrease", initial_budget=initial
    )
    assert diag.mode == "first-decrease"
    sizes = [t.size for t in trees]
    assert speedup_of(sizes, scores, costs) == pytest.approx(
        best_speedup(scores, costs, n_max), rel=1e-12
    )


def test_auto_notices_a_non_convex_step() -> None:
    """A step in Ĉ(M) makes Ŝ bimodal along the chain: first-decrease stops at the first peak,
    auto finds the exhaustive maximum."""
    batch = [DraftMarginals(np.arange(20).reshape(10, 2), np.tile([0.95, 0.04], (10, 1)))] * 2
    m = np.arange(2000)
    costs = np.where(m < 4, 1.0, 1.6)
    _, d_fd = choose_joint(batch, total_only_curve(costs), 64, "first-decrease")
    ex, d_ex = choose_joint(batch, total_only_curve(costs), 64, "exhaustive")
    auto, d_auto = choose_joint(batch, total_only_curve(costs), 64, "auto", initial_budget=4)
    assert d_fd.total_size == 2 + 3
    assert d_ex.predicted_speedup > d_fd.predicted_speedup * 1.2
    assert d_auto.mode == "bounded"
    assert [t.size for t in auto] == [t.size for t in ex]


# --------------------------------------------------------------------------------------------
# (c) the trees, (d) batch 1
# --------------------------------------------------------------------------------------------


@given(small_batches, st.data())
def test_trees_are_best_first_prefixes(batch: Batch, data: st.DataObject) -> None:
    """(c) Each returned tree is its request's best-first tree of the chosen size, with its
    root token."""
    mode: ControllerMode = data.draw(st.sampled_from(["first-decrease", "exhaustive", "auto"]))
    costs = data.draw(monotone_costs(room(batch)))
    roots = data.draw(st.lists(st.integers(0, 99), min_size=len(batch), max_size=len(batch)))
    trees, diag = choose_joint(
        batch, total_only_curve(costs), 30, mode, initial_budget=2, root_tokens=roots
    )
    assert len(trees) == len(batch)
    for tree, m, root in zip(trees, batch, roots, strict=True):
        assert tree == best_first_tree(m, tree.size, root_token=root)
    assert diag.total_size == sum(t.size for t in trees)


def test_trees_with_different_marginal_shapes() -> None:
    """(c) Requests with different [depth, K] go through the per-request builder."""
    batch = [
        DraftMarginals([[0, 1], [2, 3]], [[0.6, 0.3], [0.5, 0.4]]),
        DraftMarginals([[4], [5], [6]], [[0.9], [0.8], [0.7]]),
    ]
    trees, diag = choose_joint(batch, total_only_curve(1.0 + 0.01 * np.arange(20)), 8)
    for tree, m in zip(trees, batch, strict=True):
        assert tree == best_first_tree(m, tree.size)
    assert diag.tree_sizes == tuple(t.size for t in trees)


@given(marginals(max_depth=8, max_k=4), st.data())
def test_batch_of_one_matches_choose_tree(m: DraftMarginals, data: st.DataObject) -> None:
    """(d) B = 1: the same tree as choose_tree with the equivalent curve, in every mode (auto
    and exhaustive on non-decreasing costs, first-decrease on any)."""
    n_max = data.draw(st.integers(1, 150))
    costs = data.draw(monotone_costs(n_max))
    initial = data.draw(st.integers(1, 64))
    single = CostCurve(0.0, 0.0, costs, 1.0)
    for mode in ("first-decrease", "exhaustive", "auto"):
        (tree,), diag = choose_joint(
            [m], total_only_curve(costs), n_max, mode, initial_budget=initial, root_tokens=[7]
        )
        expect, d_one = choose_tree(m, single, n_max, mode, initial_budget=initial, root_token=7)
        assert tree == expect
        assert diag.predicted_speedup == d_one.predicted_speedup


# --------------------------------------------------------------------------------------------
# The controller's bookkeeping and bad input
# --------------------------------------------------------------------------------------------


def test_lazy_growth_prices_only_part_of_the_chain() -> None:
    """With a steep cost, the chain is priced far short of B·N_max."""
    batch = [DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.6, 0.3], (15, 1)))] * 4
    asked: list[int] = []
    costs = 1.0 + 0.05 * np.arange(4 * 1024)

    def curve(grow: np.ndarray) -> CostCurve:
        asked.append(grow.size)
        return total_only_curve(costs)(grow)

    _, diag = choose_joint(batch, curve, 1024, "auto", initial_budget=8)
    _, full = choose_joint(batch, total_only_curve(costs), 1024, "exhaustive")
    assert max(asked) < 200
    assert diag.tree_sizes == full.tree_sizes
    assert not diag.exhausted and not diag.capped


def test_diagnostics_flags() -> None:
    """exhausted: every lattice ran out; capped: a tree is N_max itself."""
    batch = [DraftMarginals([[0, 1]], [[0.5, 0.4]]), DraftMarginals([[2]], [[0.9]])]
    flat = total_only_curve(np.ones(10))
    trees, diag = choose_joint(batch, flat, 10, "exhaustive")
    assert diag.exhausted and not diag.capped and [t.size for t in trees] == [3, 2]
    trees, diag = choose_joint(batch, flat, 2, "exhaustive")
    assert diag.capped and [t.size for t in trees] == [2, 2]
    assert diag.batch_size == 2 and diag.a_hat_total.size == diag.c_hat.size == diag.s_hat.size


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_max": 0},
        {"n_max": 2.5},
        {"n_max": True},
        {"mode": "greedy"},
        {"initial_budget": 0},
        {"root_tokens": [1, 2, 3]},
    ],
)
def test_bad_controller_arguments(kwargs: dict[str, object]) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    args: dict[str, object] = {"n_max": 3, **kwargs}
    with pytest.raises(BudgetError):
        choose_joint([m, m], total_only_curve(np.ones(10)), **args)  # type: ignore[arg-type]


def test_empty_batch() -> None:
    with pytest.raises(BudgetError, match="at least one request"):
        choose_joint([], total_only_curve(np.ones(3)), 3)


@pytest.mark.parametrize(
    "curve",
    [
        CostCurve(0.0, 0.0, np.array([1.0, 0.0, 1.0, 1.0, 1.0]), 1.0),
        CostCurve(0.0, 0.0, np.array([1.0, -1.0, 1.0, 1.0, 1.0]), 1.0),
        CostCurve(0.0, 0.0, np.array([1.0, np.nan, 1.0, 1.0, 1.0]), 1.0),
        CostCurve(0.0, 0.0, np.array([1.0, np.inf, 1.0, 1.0, 1.0]), 1.0),
        CostCurve(0.0, 0.0, np.array([1.0, 1.0]), 1.0),  # too short: 4 added nodes
        CostCurve(0.0, 0.0, np.ones(5), 0.0),
        CostCurve(0.0, 0.0, np.ones(5), float("nan")),
        CostCurve(-1.0, 0.0, np.ones(5), 1.0),
    ],
)
def test_bad_cost_curves_are_named(curve: CostCurve) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    with pytest.raises(CostModelError) as err:
        choose_joint([m, m], lambda _g: curve, 3, "exhaustive")
    assert isinstance(err.value, BastionError)


# --------------------------------------------------------------------------------------------
# RooflineCostModel.joint_cost_curve
# --------------------------------------------------------------------------------------------

HW = get_profile("a100-sxm-80gb")
MODEL = get_model("qwen3-8b")
CAL = LinearCalibration(Branch(1.2, 1e-3), Branch(1.1, 5e-4))
CAL_TILED = LinearCalibration(Branch(1.2, 1e-3), Branch(1.1, 5e-4), tile_tokens=64)
MODES: list[tuple[CostMode, LinearCalibration | None]] = [
    ("bare", None),
    ("static", CAL),
    ("static", CAL_TILED),
    ("ema", None),
    ("ema+calib", CAL),
]


def roofline(mode: CostMode, cal: LinearCalibration | None) -> RooflineCostModel:
    cm = RooflineCostModel(
        HW, MODEL, DrafterSpec.dflash_for(MODEL), calibration=cal, mode=mode, prep_s=1e-4
    )
    cm.ema.gamma = 1.3
    return cm


def test_roofline_implements_the_joint_protocol() -> None:
    assert isinstance(roofline("bare", None), JointCostModel)


@pytest.mark.parametrize(("mode", "cal"), MODES)
@pytest.mark.parametrize("context", [0, 1, 500, 4097])
def test_joint_curve_of_one_request_is_the_cost_curve(
    mode: CostMode, cal: LinearCalibration | None, context: int
) -> None:
    """B = 1: every entry, T_draft, T_aux and L_AR equal ``cost_curve`` to 1e-12."""
    cm = roofline(mode, cal)
    joint = cm.joint_cost_curve(np.array([context]), np.zeros(299, dtype=np.int64))
    single = cm.cost_curve(300, StepLoad(context))
    np.testing.assert_allclose(joint.verify_s, single.verify_s, rtol=1e-12, atol=0)
    assert joint.ar_step_s == pytest.approx(single.ar_step_s, rel=1e-12)
    assert joint.draft_s == pytest.approx(single.draft_s, rel=1e-12)
    assert joint.prep_s == single.prep_s


def explicit(cm: RooflineCostModel, sizes: Sequence[int], ctx: Sequence[int]) -> float:
    """The batch (sizes, contexts) priced through ``_base`` with the others as co_batched."""
    load = StepLoad(
        ctx[0], tuple(RequestLoad(s, c) for s, c in zip(sizes[1:], ctx[1:], strict=True))
    )
    bare_s, cal_s = cm._base(np.array([float(sizes[0])]), load)
    return float(cm._correct(bare_s, cal_s)[0])


@pytest.mark.parametrize(("mode", "cal"), MODES)
@given(
    ctx=st.lists(st.integers(0, 5000), min_size=1, max_size=5),
    picks=st.lists(st.integers(0, 4), max_size=40),
)
@settings(max_examples=25, deadline=None)
def test_joint_curve_prices_each_allocation_like_the_batched_base(
    mode: CostMode, cal: LinearCalibration | None, ctx: list[int], picks: list[int]
) -> None:
    """Every entry m is the pass over the allocation that the first m additions make, priced
    by ``_base`` with the other requests in ``co_batched``; L_AR is a step of B tokens."""
    cm = roofline(mode, cal)
    grow = np.array([p % len(ctx) for p in picks], dtype=np.int64)
    curve = cm.joint_cost_curve(np.array(ctx), grow)
    assert curve.verify_s.shape == (grow.size + 1,)
    sizes = [1] * len(ctx)
    for m in range(grow.size + 1):
        if m:
            sizes[grow[m - 1]] += 1
        assert curve.verify_s[m] == pytest.approx(explicit(cm, sizes, ctx), rel=1e-12)
    ones = StepLoad(ctx[0], tuple(RequestLoad(1, c) for c in ctx[1:]))
    assert curve.ar_step_s == pytest.approx(cm.cost_curve(1, ones).ar_step_s, rel=1e-12)
    assert curve.draft_s == pytest.approx(cm.draft_s(ones), rel=1e-12)


class StepCostOnly:
    """A CostModel without joint_cost_curve (delegates to a roofline)."""

    def __init__(self, inner: RooflineCostModel) -> None:
        self.inner = inner

    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        return self.inner.step_cost(tree_size, load)

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        return self.inner.cost_curve(max_tree_size, load)

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        return None


def test_curve_from_cost_model_and_its_step_cost_fallback_agree() -> None:
    """The vectorised joint curve and the per-allocation fallback price the same chain."""
    cm = roofline("static", CAL)
    ctx = [100, 700, 3000]
    grow = np.array([0, 1, 1, 2, 0, 0, 2, 1, 1], dtype=np.int64)
    fast = joint_curve_from_cost_model(cm, ctx)(grow)
    slow = joint_curve_from_cost_model(StepCostOnly(cm), ctx)(grow)
    np.testing.assert_allclose(fast.verify_s, slow.verify_s, rtol=1e-12)
    assert fast.ar_step_s == pytest.approx(slow.ar_step_s, rel=1e-12)
    assert fast.draft_s == pytest.approx(slow.draft_s, rel=1e-12)


def test_controller_with_the_roofline() -> None:
    """End to end: a larger batch gives each request a smaller tree (the pass is shared)."""
    cm = roofline("static", CAL)
    m = DraftMarginals(np.arange(60).reshape(15, 4), np.tile([0.8, 0.1, 0.05, 0.02], (15, 1)))
    (alone,), _ = choose_joint([m], joint_curve_from_cost_model(cm, [512]), 512)
    many, diag = choose_joint([m] * 16, joint_curve_from_cost_model(cm, [512] * 16), 512)
    assert max(t.size for t in many) <= alone.size
    assert diag.predicted_speedup > 1.0


def test_bad_joint_curve_input() -> None:
    cm = roofline("bare", None)
    for ctx, grow in [
        (np.array([], dtype=np.int64), np.zeros(0, dtype=np.int64)),
        (np.array([-1]), np.zeros(0, dtype=np.int64)),
        (np.array([1.5]), np.zeros(0, dtype=np.int64)),
        (np.array([10, 10]), np.array([0, 2])),
        (np.array([10, 10]), np.array([-1])),
        (np.array([10, 10]), np.array([[0]])),
    ]:
        with pytest.raises(BudgetError):
            cm.joint_cost_curve(ctx, grow)
    with pytest.raises(BudgetError):
        joint_curve_from_cost_model(cm, [-3])
    with pytest.raises(CostModelError):
        joint_curve_from_cost_model(object(), [3])  # type: ignore[arg-type]


@given(
    st.lists(marginals(max_depth=8, max_k=5), min_size=1, max_size=5),
    st.lists(st.integers(0, 8000), min_size=5, max_size=5),
    st.integers(1, 200),
    st.integers(1, 32),
)
@settings(max_examples=30, deadline=None)
def test_auto_equals_exhaustive_with_the_roofline(
    batch: Batch, ctx: list[int], n_max: int, initial: int
) -> None:
    """auto's pruned scan returns the exhaustive argmax along the chain for the roofline Ĉ
    (non-decreasing along any chain: every added node adds work)."""
    curve = joint_curve_from_cost_model(roofline("static", CAL), ctx[: len(batch)])
    _, d_auto = choose_joint(batch, curve, n_max, "auto", initial_budget=initial)
    _, d_ex = choose_joint(batch, curve, n_max, "exhaustive")
    assert d_auto.predicted_speedup == pytest.approx(float(d_ex.s_hat.max()), rel=1e-12)
    assert d_auto.tree_sizes == d_ex.tree_sizes


# --------------------------------------------------------------------------------------------
# The forest: the chain the controller actually grows
# --------------------------------------------------------------------------------------------


@given(small_batches, st.integers(0, 80), st.integers(1, 30))
def test_forest_grows_the_merged_order(batch: Batch, total: int, n_max: int) -> None:
    """Invariant: growing the B trees together (one heap over every frontier) adds nodes in
    exactly the merged order of :func:`merge_order`, restricted to trees of ≤ N_max nodes,
    and each request's nodes form its own best-first tree."""
    from bastion.batch import BatchMarginals
    from bastion.bestfirst import best_first_forest, best_first_forest_heap

    probs = BatchMarginals.from_rows(batch).probs
    full = all_scores(batch)
    capped = [s[:n_max] for s in full]
    req, rho = merge_order(capped)
    for grow in (best_first_forest, best_first_forest_heap):
        par, dep, rnk, sco, off, order, order_rho, more = grow(probs, n_max, total)
        m = min(total, req.size)
        assert order.tolist() == req[:m].tolist() and order_rho.tolist() == rho[:m].tolist()
        assert more == (m < req.size)
        for i, m_i in enumerate(batch):
            a, e = int(off[i]), int(off[i + 1])
            ref = best_first(m_i.probs, e - a)
            ours = [par[a:e], dep[a:e], rnk[a:e], sco[a:e]]
            assert [x.tolist() for x in ours] == [x.tolist() for x in ref]


# --------------------------------------------------------------------------------------------
# The marginal-cost bound that lets auto stop early
# --------------------------------------------------------------------------------------------

MOE = get_model("qwen3-coder-30b-a3b")


@pytest.mark.parametrize(("mode", "cal"), MODES)
@pytest.mark.parametrize("model", [MODEL, MOE], ids=["dense", "moe"])
@given(
    ctx=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 5), min_size=1, max_size=300),
    more=st.lists(st.integers(0, 5), min_size=1, max_size=300),
)
def test_growth_is_a_lower_bound_beyond_the_chain(
    mode: CostMode,
    cal: LinearCalibration | None,
    model: object,
    ctx: list[int],
    picks: list[int],
    more: list[int],
) -> None:
    """Invariant: a joint curve's ``growth_s`` bounds from below how much Ĉ grows per node
    added after its last entry, whatever requests the later nodes go to: Ĉ(M + k) ≥ Ĉ(M) +
    k·growth_s, in every cost mode, dense and MoE."""
    cm = RooflineCostModel(HW, model, calibration=cal, mode=mode, prep_s=1e-4)  # type: ignore[arg-type]
    cm.ema.gamma = 1.3
    contexts = np.array(ctx, dtype=np.int64)
    chain = np.array([p % len(ctx) for p in picks], dtype=np.int64)
    longer = np.concatenate((chain, [p % len(ctx) for p in more])).astype(np.int64)
    part = cm.joint_cost_curve(contexts, chain)
    full = cm.joint_cost_curve(contexts, longer).verify_s
    m = chain.size
    assert full[m] == pytest.approx(part.verify_s[m], rel=1e-12)
    k = np.arange(1, longer.size - m + 1)
    assert part.growth_s > 0.0
    assert np.all(full[m + k] - full[m] >= k * part.growth_s * (1.0 - 1e-9))


def test_growth_negative_control() -> None:
    """The check above has teeth: ten times the proved growth is not a lower bound."""
    cm = roofline("static", CAL)
    contexts = np.array([300, 900], dtype=np.int64)
    part = cm.joint_cost_curve(contexts, np.array([0, 1] * 20))
    full = cm.joint_cost_curve(contexts, np.array([0, 1] * 60)).verify_s
    k = np.arange(1, 81)

    def holds(growth: float) -> bool:
        return bool(np.all(full[40 + k] - full[40] >= k * growth * (1.0 - 1e-9)))

    assert holds(part.growth_s)
    assert not holds(10.0 * part.growth_s)


@settings(max_examples=30)
@given(
    batch=st.lists(marginals(max_depth=6, max_k=4), min_size=1, max_size=4),
    ctx=st.lists(st.integers(0, 3000), min_size=4, max_size=4),
    n_max=st.integers(1, 200),
    initial=st.integers(1, 40),
)
def test_auto_with_the_marginal_bound_equals_exhaustive(
    batch: Batch, ctx: list[int], n_max: int, initial: int
) -> None:
    """auto pruned with the curve's growth bound, Ĉ(M + k) ≥ Ĉ(M) + k·δ, still returns the
    exhaustive argmax."""
    from bastion.batch import BatchMarginals

    cm = roofline("static", CAL)
    contexts = np.array(ctx[: len(batch)], dtype=np.int64)
    curve = joint_curve_from_cost_model(cm, contexts)
    stacked = BatchMarginals.from_rows(batch)
    _, d_auto = choose_joint_batch(stacked, curve, n_max, "auto", initial)
    _, d_ex = choose_joint_batch(stacked, curve, n_max, "exhaustive")
    assert d_auto.tree_sizes == d_ex.tree_sizes
    assert d_auto.predicted_speedup == pytest.approx(float(d_ex.s_hat.max()), rel=1e-12)


# --- the floor of the learned decision curve (CostCurve.floor_s): a stop bound, never a miss ---


def _best_beyond(
    marginals: BatchMarginals,
    curve: Callable[[npt.NDArray[np.int64]], CostCurve],
    n_max: int,
    m: int,
) -> float:
    """The best Ŝ any chain longer than ``m`` added nodes reaches beyond ``m``, each chain
    priced by ``curve`` as the loop would price it (every length up to the lattices' end)."""
    b = marginals.probs.shape[0]
    order, rho = best_first_forest(marginals.probs, n_max, b * (n_max - 1))[5:7]
    best = 0.0
    for length in range(m + 1, order.shape[0] + 1):
        cc = curve(order[:length])
        cost = cc.draft_s + cc.prep_s + cc.verify_s[: length + 1]
        a_hat = b + np.concatenate(([0.0], np.cumsum(rho[:length])))
        best = max(best, float((a_hat * cc.ar_step_s / cost)[m + 1 :].max()))
    return best


@st.composite
def _learned_joint_cases(
    draw: st.DrawFn,
) -> tuple[BatchMarginals, LearnedCostModel, npt.NDArray[np.int64], int, int]:
    b = draw(st.integers(2, 4))
    depth, k = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    raw = draw(
        st.lists(
            st.sampled_from([0.0, 0.05, 0.3, 0.6, 1.0]),
            min_size=b * depth * k,
            max_size=b * depth * k,
        )
    )
    probs = -np.sort(-np.asarray(raw, np.float64).reshape(b, depth, k), axis=2)
    probs /= np.maximum(probs.sum(axis=2, keepdims=True), 1.0)
    ids = np.arange(b * depth * k, dtype=np.int64).reshape(b, depth, k)
    learner = LearnedCostModel(FlatPrior(slope=draw(st.sampled_from([0.0, 1e-5, 1e-4, 1e-3]))))
    contexts = np.full(b, draw(st.integers(0, 2000)), np.int64)
    for total in draw(st.lists(st.integers(b, 16 * b), max_size=8)):  # steps, dips, cliffs
        sizes = np.full(b, total // b, np.int64)
        sizes[: total % b] += 1
        learner.observe_cycle(
            "tree", contexts, sizes, 10e-3 * draw(st.sampled_from([0.4, 1.0, 2.5]))
        )
    n_max = draw(st.sampled_from([2, 4, 8, 16]))
    return BatchMarginals(ids, probs), learner, contexts, n_max, draw(st.integers(1, 16))


@settings(max_examples=150, deadline=None)
@given(case=_learned_joint_cases())
def test_the_decision_floor_never_stops_before_a_better_chain(
    case: tuple[BatchMarginals, LearnedCostModel, npt.NDArray[np.int64], int, int],
) -> None:
    """Wherever the joint budget stops growing on the learned decision curve (its floor
    bound, or the others), no longer chain reaches a higher Ŝ beyond where it stopped: the
    floor is a true lower bound on what any longer chain prices ahead."""
    marginals, learner, contexts, n_max, start = case

    def curve(grow: npt.NDArray[np.int64]) -> CostCurve:
        return learner.joint_decision_curve(contexts, grow, n_max)

    _, diag = choose_joint_batch(marginals, curve, n_max, "auto", min(start, n_max))
    m = diag.s_hat.shape[0] - 1
    s_best = float(diag.s_hat[diag.total_size - marginals.probs.shape[0]])
    assert _best_beyond(marginals, curve, n_max, m) <= s_best * (1.0 + 1e-9)


def test_an_overstated_floor_stops_too_early() -> None:
    """Negative control: on a flat cost (the best chain is the longest), a floor three times
    the cost lets the bound stop early, and the check above catches the better chain."""
    b, depth, k, n_max = 3, 4, 2, 8
    probs = np.tile(np.array([0.6, 0.3]), (b, depth, 1))
    marginals = BatchMarginals(np.zeros((b, depth, k), np.int64), probs)
    learner = LearnedCostModel(FlatPrior(slope=0.0))
    contexts = np.full(b, 100, np.int64)

    def overstated(grow: npt.NDArray[np.int64]) -> CostCurve:
        cc = learner.joint_decision_curve(contexts, grow, n_max)
        assert cc.floor_s is not None
        return dataclasses.replace(cc, floor_s=3.0 * cc.floor_s)

    _, diag = choose_joint_batch(marginals, overstated, n_max, "auto", 2)
    m = diag.s_hat.shape[0] - 1
    s_best = float(diag.s_hat[diag.total_size - b])
    assert m < b * (n_max - 1)  # it stopped before the lattices ran out …
    assert _best_beyond(marginals, overstated, n_max, m) > s_best * 1.01  # … and missed
    _, honest = choose_joint_batch(
        marginals, lambda g: learner.joint_decision_curve(contexts, g, n_max), n_max, "auto", 2
    )
    assert honest.total_size == b * n_max  # the honest floor grows to the best, the longest


@settings(max_examples=150, deadline=None)
@given(case=_learned_joint_cases())
def test_the_decision_floor_is_below_every_chains_curve(
    case: tuple[BatchMarginals, LearnedCostModel, npt.NDArray[np.int64], int, int],
) -> None:
    """floor_s[j] ≤ the decision cost at j of every chain that reaches j, whatever its length:
    a total costs what its cell's cheapest lattice point at or above costs, never what the
    chain's own end would (so the curve is its own floor, and it never falls)."""
    marginals, learner, contexts, n_max, _ = case
    b = marginals.probs.shape[0]
    order = best_first_forest(marginals.probs, n_max, b * (n_max - 1))[5]
    floors = []
    for length in range(order.shape[0] + 1):
        cc = learner.joint_decision_curve(contexts, order[:length], n_max)
        assert cc.floor_s is not None
        assert np.all(cc.verify_s[: length + 1] >= cc.floor_s[: length + 1])
        assert np.array_equal(cc.verify_s, cc.floor_s[: length + 1])
        assert np.all(np.diff(cc.floor_s) >= 0)
        floors.append(cc.floor_s)
    assert all(np.array_equal(f, floors[0]) for f in floors)  # the same for every chain


@pytest.mark.parametrize(
    "floor", [[1.0, 2.0], np.zeros((2, 2)), np.zeros(0), np.array([1, 2]), "cheap"]
)
def test_a_curve_refuses_a_floor_that_is_not_a_float_vector(floor: object) -> None:
    with pytest.raises(CostModelError, match="floor_s"):
        CostCurve(0.0, 0.0, np.ones(3), 1.0, floor_s=floor)  # type: ignore[arg-type]


def test_growth_factor_reaches_the_extrapolated_length_within_its_bounds() -> None:
    """_growth: the factor taking the chain to where Ĉ, extrapolated from its last half, reaches
    c_needed — a fraction, at least GROWTH_MIN (NaN too), at most 8; 2 for a chain too short to
    extrapolate, 8 where Ĉ does not rise; _regrown: that factor of the total, rounded up, at
    least B more, at most the cap."""
    from bastion.joint import GROWTH_MIN, _growth, _regrown

    c_hat = 1.0 + 0.01 * np.arange(101)  # Ĉ rises by 0.01 a node: 2.0 at 100 nodes
    assert _growth(c_hat, 2.7) == pytest.approx(1.7)  # 170 nodes: 1.7×, not rounded to 2
    assert _growth(c_hat, 2.1) == GROWTH_MIN  # 110 nodes: at least the least factor
    assert _growth(c_hat, 50.0) == 8.0
    assert _growth(c_hat, float("nan")) == GROWTH_MIN
    assert _growth(np.ones(101), 3.0) == 8.0  # flat: no extrapolation
    assert _growth(np.array([1.0, 2.0]), 3.0) == 2.0
    assert _regrown(100, 1.7, 4, 10_000) == 170
    assert _regrown(100, 1.7000001, 4, 10_000) == 171  # rounded up
    assert _regrown(10, 1.25, 8, 10_000) == 18  # at least B more
    assert _regrown(100, 8.0, 4, 500) == 500  # at most the cap
