"""The controller: self-verification (Prop. 3.2), first-decrease optimality (Prop. 3.4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.budget import choose_tree, first_decrease, is_convex, speedup_curve
from bastion.errors import BastionError, BudgetError, CostModelError
from bastion.interfaces import CostCurve
from bastion.tree import DraftMarginals, DraftTree, best_first_tree, surrogate_acceptance
from tests.strategies import convex_costs, marginals


def self_verified_lengths(tree: DraftTree, m: DraftMarginals, n: int, seed: int) -> np.ndarray:
    """Committed length when the drafter verifies itself: X_k ~ q_k independently (Prop. 3.2).

    Each position draws a rank in 0 … K−1, or K for the mass outside the top-K (never in a
    tree); a node is covered iff X_{1:d} equals its path, and the committed length is the size
    of the covered chain, root included.
    """
    rng = np.random.default_rng(seed)
    tail = np.clip(1.0 - m.probs.sum(axis=1, keepdims=True), 0.0, None)
    full = np.concatenate((m.probs, tail), axis=1)
    full = full / full.sum(axis=1, keepdims=True)
    cdf = np.cumsum(full, axis=1)
    draws = (rng.random((n, m.depth, 1)) > cdf[None, :, :]).sum(axis=2)  # [n, depth] ranks
    covered = np.ones((n, tree.size), dtype=bool)
    for i in range(1, tree.size):
        covered[:, i] = covered[:, tree.parents[i]] & (
            draws[:, tree.depths[i] - 1] == tree.ranks[i]
        )
    return covered.sum(axis=1)


def self_verified_variance(tree: DraftTree) -> float:
    """Exact Var[A_self]: two nodes are both covered only when one is the other's ancestor, so
    E[A²] = Σ_i ρ(i)·(1 + 2·depth(i)) and Var = E[A²] − Â²."""
    a_hat = surrogate_acceptance(tree)
    return float(np.sum(tree.scores * (1 + 2 * tree.depths)) - a_hat**2)


def agrees_within(samples: np.ndarray, expected: float, variance: float, z: float = 6.0) -> bool:
    """Mean of ``samples`` within z exact standard errors of ``expected`` (plus float slack)."""
    se = np.sqrt(max(variance, 0.0) / samples.size)
    return bool(abs(samples.mean() - expected) <= z * se + 1e-9)


@settings(derandomize=True)  # a statistical test: fixed examples, so CI cannot flake
@given(marginals(max_depth=8, max_k=4), st.integers(1, 40), st.integers(0, 2**31))
def test_surrogate_is_expected_self_verified_length(
    m: DraftMarginals, budget: int, seed: int
) -> None:
    """Prop. 3.2: E[A_self(T)] = Â(T); Monte-Carlo mean within 5 standard errors."""
    tree = best_first_tree(m, budget)
    lengths = self_verified_lengths(tree, m, 4000, seed)
    assert agrees_within(lengths, surrogate_acceptance(tree), self_verified_variance(tree))


def test_self_verification_check_rejects_a_wrong_surrogate() -> None:
    """Negative control: Σ of per-node marginals (no path product) is not E[A_self]."""
    m = DraftMarginals([[0, 1], [2, 3], [4, 5]], [[0.6, 0.3], [0.6, 0.3], [0.6, 0.3]])
    tree = best_first_tree(m, 10)
    lengths = self_verified_lengths(tree, m, 4000, seed=1)
    wrong = 1.0 + float(m.probs[tree.depths[1:] - 1, tree.ranks[1:]].sum())
    var = self_verified_variance(tree)
    assert agrees_within(lengths, surrogate_acceptance(tree), var)
    assert not agrees_within(lengths, wrong, var)


def curve_from(costs: np.ndarray, ar_step_s: float = 1.0) -> CostCurve:
    return CostCurve(draft_s=0.0, prep_s=0.0, verify_s=np.asarray(costs), ar_step_s=ar_step_s)


@given(marginals(max_depth=10, max_k=6), st.data())
def test_first_decrease_is_global_argmax_for_convex_cost(
    m: DraftMarginals, data: st.DataObject
) -> None:
    """Prop. 3.4: concave Â and convex positive Ĉ make the first decrease of Ŝ its maximum."""
    n_max = data.draw(st.integers(1, 120))
    costs = data.draw(convex_costs(n_max))
    assert is_convex(costs)
    tree_fd, diag_fd = choose_tree(m, curve_from(costs), n_max, mode="first-decrease")
    _, diag_ex = choose_tree(m, curve_from(costs), n_max, mode="exhaustive")
    best = float(diag_ex.s_hat.max())
    assert diag_fd.s_hat[tree_fd.size - 1] == pytest.approx(best, rel=1e-12)
    assert tree_fd == best_first_tree(m, tree_fd.size)


@given(marginals(max_depth=10, max_k=6), st.integers(1, 200), st.integers(1, 64))
def test_chunked_growth_equals_node_by_node_scan(
    m: DraftMarginals, n_max: int, initial: int
) -> None:
    """Growing in doubling chunks stops where a node-by-node first-decrease scan would."""
    n = np.arange(1, n_max + 1)
    costs = 1.0 + 0.02 * n + 1e-4 * n**2
    tree, _ = choose_tree(m, curve_from(costs), n_max, "first-decrease", initial_budget=initial)
    full = best_first_tree(m, n_max)
    s_hat = speedup_curve(np.cumsum(full.scores), costs[: full.size], 1.0)
    expect = first_decrease(s_hat) or full.size
    assert tree.size == expect


def test_non_convex_cost_fools_first_decrease_but_not_exhaustive() -> None:
    """A step in Ĉ (tile quantisation, MoE saturation) makes Ŝ bimodal: first-decrease stops
    at the first local peak, the exhaustive scan finds the better one, and auto mode notices."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.95, 0.04], (15, 1)))
    n_max = 64
    costs = np.where(np.arange(1, n_max + 1) <= 4, 1.0, 1.6)  # flat, a jump, flat: not convex
    assert not is_convex(costs)
    early, d_fd = choose_tree(m, curve_from(costs), n_max, mode="first-decrease")
    best, d_ex = choose_tree(m, curve_from(costs), n_max, mode="exhaustive")
    auto, d_auto = choose_tree(m, curve_from(costs), n_max, mode="auto")
    assert early.size == 4
    assert best.size > 4
    assert d_ex.predicted_speedup > d_fd.predicted_speedup * 1.5
    assert d_auto.mode == "bounded" and auto.size == best.size


def test_diagnostics_report_the_curves() -> None:
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.9, 0.05], (15, 1)))
    n = np.arange(1, 257)
    curve = CostCurve(draft_s=1e-3, prep_s=1e-4, verify_s=8e-3 + 2e-5 * n, ar_step_s=8e-3)
    tree, diag = choose_tree(m, curve, 256, mode="first-decrease")
    assert diag.mode == "first-decrease" and diag.tree_size == tree.size
    np.testing.assert_allclose(diag.c_hat, curve.total_s()[: diag.c_hat.size])
    np.testing.assert_allclose(diag.a_hat[tree.size - 1], surrogate_acceptance(tree))
    assert diag.predicted_speedup == pytest.approx(diag.s_hat.max())


def test_is_convex_on_a_range() -> None:
    f = np.array([5.0, 3.0, 2.0, 2.5, 2.4, 4.0])
    assert is_convex(f, 1, 4)
    assert not is_convex(f)
    assert is_convex(f, 5, 6)
    with pytest.raises(BudgetError):
        is_convex(f, 0, 3)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1.0, 0.0, 1.0]),
        np.array([1.0, -1.0, 1.0]),
        np.array([1.0, np.nan, 1.0]),
        np.array([1.0, np.inf, 1.0]),
        np.array([1.0, 1.0]),  # too short for n_max = 3
    ],
)
def test_bad_cost_curves_are_named(bad: np.ndarray) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    with pytest.raises(CostModelError) as err:
        choose_tree(m, curve_from(bad), 3)
    assert isinstance(err.value, BastionError)


@pytest.mark.parametrize("ar", [0.0, -1.0, float("nan")])
def test_bad_ar_step_is_named(ar: float) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    with pytest.raises(CostModelError, match="ar_step_s"):
        choose_tree(m, curve_from(np.ones(3), ar_step_s=ar), 3)


@pytest.mark.parametrize("kwargs", [{"n_max": 0}, {"mode": "greedy"}, {"initial_budget": 0}])
def test_bad_controller_arguments(kwargs: dict[str, object]) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    args: dict[str, object] = {"n_max": 3, **kwargs}
    with pytest.raises(BudgetError):
        choose_tree(m, curve_from(np.ones(3)), **args)  # type: ignore[arg-type]


@st.composite
def monotone_costs(draw: st.DrawFn, n_max: int) -> np.ndarray:
    """Non-decreasing Ĉ(N), convex or not: random non-negative increments, some large steps."""
    steps = np.array(draw(st.lists(st.floats(0.0, 0.05), min_size=n_max, max_size=n_max)))
    jumps = draw(st.lists(st.integers(1, n_max), max_size=4))
    steps[np.array(jumps, dtype=int) - 1] += draw(st.floats(0.0, 2.0))
    return draw(st.floats(0.1, 2.0)) + np.cumsum(steps)


@given(marginals(max_depth=12, max_k=6), st.data())
def test_auto_is_the_exact_argmax_for_monotone_costs(
    m: DraftMarginals, data: st.DataObject
) -> None:
    """auto prunes its scan with a bound but returns the exhaustive maximum of Ŝ."""
    n_max = data.draw(st.integers(1, 300))
    costs = data.draw(monotone_costs(n_max))
    base = data.draw(st.floats(0.0, 50.0))
    initial = data.draw(st.integers(1, 64))
    auto, d_auto = choose_tree(m, curve_from(costs), n_max, "auto", initial, base_tokens=base)
    _, d_ex = choose_tree(m, curve_from(costs), n_max, "exhaustive", base_tokens=base)
    assert d_auto.s_hat[auto.size - 1] == pytest.approx(float(d_ex.s_hat.max()), rel=1e-12)


@given(marginals(max_depth=10, max_k=6), st.data())
def test_auto_agrees_with_first_decrease_on_convex_costs(
    m: DraftMarginals, data: st.DataObject
) -> None:
    n_max = data.draw(st.integers(1, 200))
    costs = data.draw(convex_costs(n_max))
    a, d_a = choose_tree(m, curve_from(costs), n_max, "auto")
    f, d_f = choose_tree(m, curve_from(costs), n_max, "first-decrease")
    assert d_a.s_hat[a.size - 1] == pytest.approx(d_f.s_hat[f.size - 1], rel=1e-12)


def test_lazy_curve_is_priced_only_as_far_as_needed() -> None:
    """Given a callable, the controller asks for short curves when the peak comes early."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.6, 0.3], (15, 1)))
    asked: list[int] = []

    def source(n: int) -> CostCurve:
        asked.append(n)
        return curve_from(1.0 + 0.05 * np.arange(1, n + 1))

    tree, _ = choose_tree(m, source, 1024, "auto", initial_budget=16)
    assert tree.size < 16 and max(asked) < 1024
    full, _ = choose_tree(m, curve_from(1.0 + 0.05 * np.arange(1, 1025)), 1024, "exhaustive")
    assert full.size == tree.size


def test_pruning_relies_on_a_non_decreasing_cost() -> None:
    """Negative control for auto's premise: a cost that drops after the scanned prefix hides a
    better tree from the pruned scan, while the exhaustive scan finds it."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.6, 0.3], (15, 1)))
    n = np.arange(1, 257)
    costs = np.where(n <= 40, 1.0 + 10.0 * n, 0.05)  # far cheaper beyond 40 nodes: not monotone
    pruned, _ = choose_tree(m, curve_from(costs), 256, "auto", initial_budget=16)
    full, _ = choose_tree(m, curve_from(costs), 256, "exhaustive")
    assert full.size > 40 and pruned.size <= 32
