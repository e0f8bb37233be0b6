"""Best-first construction: optimality (Prop. 3.3), nestedness, and builder agreement."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.bestfirst import COMPILED, best_first, best_first_heap, best_first_many
from bastion.testing import lattice, marginals, optimal_acceptance, optimal_acceptance_enumerated
from bastion.tree import DraftMarginals, best_first_tree, best_first_trees, surrogate_acceptance


@given(marginals(max_depth=3, max_k=2))
def test_best_first_matches_enumeration_of_every_tree(m: DraftMarginals) -> None:
    """Prop. 3.3 by brute force: Â(T_N) = max Â over every prefix-closed tree of size N."""
    nodes, _ = lattice(m)
    best = optimal_acceptance_enumerated(m)
    full = best_first_tree(m, len(nodes))
    for n, value in best.items():
        if n <= full.size:  # beyond, only ρ = 0 nodes remain; their Â is T_full's
            assert surrogate_acceptance(full.prefix(n)) == pytest.approx(value, rel=1e-12)
        else:
            assert value == pytest.approx(surrogate_acceptance(full), rel=1e-12)


@given(marginals(max_depth=4, max_k=3))
def test_best_first_is_optimal_for_every_size(m: DraftMarginals) -> None:
    """Prop. 3.3 on depth ≤ 4, K ≤ 3: best-first equals an exact knapsack optimum at every N."""
    dp = optimal_acceptance(m)
    n_lattice = dp.size - 1
    full = best_first_tree(m, n_lattice)
    a_hat = np.cumsum(full.scores)
    np.testing.assert_allclose(a_hat, dp[1 : full.size + 1], rtol=1e-12, atol=0)


@given(marginals(), st.integers(1, 80))
def test_prefixes_are_nested_optimal_trees(m: DraftMarginals, budget: int) -> None:
    """Nestedness: the first n nodes of T_N are exactly T_n for every n ≤ N."""
    big = best_first_tree(m, budget)
    for n in range(1, big.size + 1):
        assert best_first_tree(m, n) == big.prefix(n)


@given(marginals(), st.integers(1, 80))
def test_tree_is_prefix_closed_with_concave_surrogate(m: DraftMarginals, budget: int) -> None:
    """Parents precede children, depths are consistent, and Â(N) is non-decreasing and concave."""
    tree = best_first_tree(m, budget)
    assert tree.size <= budget
    assert np.all(tree.parents[1:] < np.arange(1, tree.size))
    assert np.all(tree.depths[1:] == tree.depths[tree.parents[1:]] + 1)
    assert np.all(tree.scores > 0)
    # ρ at each node is the product of marginals along its path
    expect = tree.scores[tree.parents[1:]] * m.probs[tree.depths[1:] - 1, tree.ranks[1:]]
    np.testing.assert_array_equal(tree.scores[1:], expect)
    gains = tree.scores  # ΔÂ(N) = ρ(i_{N+1})
    assert np.all(np.diff(gains) <= 0), "Â must be concave: gains non-increasing"
    # no two nodes share (parent, rank): the tree is a set of distinct lattice nodes
    pairs = set(zip(tree.parents.tolist(), tree.ranks.tolist(), strict=True))
    assert len(pairs) == tree.size


@given(marginals(max_depth=5, max_k=4), st.integers(1, 400))
def test_size_is_budget_unless_lattice_runs_out(m: DraftMarginals, budget: int) -> None:
    positive = sum(1 for s in lattice(m)[1].values() if s > 0)
    assert best_first_tree(m, budget).size == min(budget, positive)


needs_kernel = pytest.mark.skipif(not COMPILED, reason="compiled kernel not built")


@needs_kernel
@given(marginals(max_depth=15, max_k=12), st.integers(1, 300))
def test_compiled_builder_equals_heap(m: DraftMarginals, budget: int) -> None:
    """The compiled kernel reproduces the reference heap node for node, ties included."""
    for a, b in zip(best_first_heap(m.probs, budget), best_first(m.probs, budget), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI promises a C compiler")
def test_compiled_kernel_is_built_in_ci() -> None:
    """CI installs with a compiler: the fast path must be the one under test there."""
    assert COMPILED


@given(
    st.lists(marginals(min_depth=4, max_depth=4, min_k=3, max_k=3), min_size=1, max_size=6),
    st.data(),
)
def test_batched_builder_equals_single(batch: list[DraftMarginals], data: st.DataObject) -> None:
    """best_first_trees over a batch equals best_first_tree per request, with mixed budgets."""
    budgets = data.draw(st.lists(st.integers(1, 60), min_size=len(batch), max_size=len(batch)))
    trees = best_first_trees(batch, budgets)
    for m, n, tree in zip(batch, budgets, trees, strict=True):
        assert tree == best_first_tree(m, n)


@given(marginals(max_depth=15, max_k=12), st.integers(1, 200), st.integers(1, 200))
def test_larger_budget_never_lowers_surrogate(m: DraftMarginals, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert surrogate_acceptance(best_first_tree(m, hi)) >= surrogate_acceptance(
        best_first_tree(m, lo)
    )


def test_builders_agree_on_large_random_inputs() -> None:
    """Depth 15, K up to 1024, N up to 1024: the regime of the benchmarks."""
    rng = np.random.default_rng(7)
    for k, n in [(8, 1024), (1024, 1024), (64, 256), (2, 1024)]:
        raw = rng.dirichlet(np.full(k + 1, 0.3), size=15)[:, :k]
        probs = -np.sort(-raw, axis=1)
        ref = best_first_heap(probs, n)
        for got in (best_first(probs, n), best_first_many(probs[None], n)[0]):
            for x, y in zip(ref, got, strict=True):
                np.testing.assert_array_equal(x, y)


def test_optimality_check_rejects_a_suboptimal_builder() -> None:
    """Negative control: the exact optimum the properties compare against catches beam search."""
    from bastion.interfaces import PolicyContext, StepLoad
    from bastion.policies import BeamPolicy

    m = DraftMarginals(
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]], [[0.9, 0.05, 0.01], [0.5, 0.3, 0.1], [0.9, 0.05, 0.02]]
    )
    beam = BeamPolicy(width=2, depth=3).choose(m, PolicyContext(StepLoad(0))).tree
    dp = optimal_acceptance(m)
    assert surrogate_acceptance(beam) < dp[beam.size] - 1e-6
    assert surrogate_acceptance(best_first_tree(m, beam.size)) == pytest.approx(dp[beam.size])
