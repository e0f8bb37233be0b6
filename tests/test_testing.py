"""bastion.testing: its oracles agree, catch wrong policies, and refuse inputs too big."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings

from bastion.errors import BudgetError
from bastion.interfaces import CostCurve
from bastion.joint import choose_joint
from bastion.policies import ChainPolicy, make_policy
from bastion.testing import (
    batches,
    best_joint_acceptance,
    best_joint_speedup,
    check_tree,
    cost_curves,
    marginals,
    optimal_acceptance,
    optimal_acceptance_enumerated,
)
from bastion.tree import DraftMarginals, DraftTree, best_first_tree


@given(marginals(max_depth=3, max_k=2))
def test_dp_oracle_equals_enumeration(m: DraftMarginals) -> None:
    dp = optimal_acceptance(m)
    for n, value in optimal_acceptance_enumerated(m).items():
        assert dp[n] == pytest.approx(value, rel=1e-12)


@given(marginals(max_depth=4, max_k=3))
def test_check_tree_accepts_best_first_trees(m: DraftMarginals) -> None:
    check_tree(best_first_tree(m, 20), m)


def chain_is_optimal(m: DraftMarginals) -> bool:
    """Whether the chain policy's tree has the oracle's Â for its size."""
    tree = ChainPolicy().choose(m, None).tree  # type: ignore[arg-type]
    return bool(tree.scores.sum() >= optimal_acceptance(m)[tree.size] - 1e-12)


def test_oracle_catches_a_suboptimal_policy() -> None:
    """Negative control: the chain is not the best tree of its size; Hypothesis finds marginals
    that show it, and best-first at the same size is optimal there."""
    m = find(
        marginals(max_depth=3, max_k=3),
        lambda m: not chain_is_optimal(m),
        settings=settings(database=None),
    )
    chain = ChainPolicy().choose(m, None).tree  # type: ignore[arg-type]
    best = best_first_tree(m, chain.size)
    assert best.scores.sum() == pytest.approx(optimal_acceptance(m)[chain.size], rel=1e-12)
    assert chain.scores.sum() < best.scores.sum()


def test_check_tree_rejects_broken_trees() -> None:
    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.3], [0.5, 0.2]])
    good = best_first_tree(m, 5)
    check_tree(good, m)
    wrong_token = DraftTree(
        good.parents,
        np.where(np.arange(5) == 2, 9, good.tokens),
        good.depths,
        good.scores,
        good.ranks,
    )
    with pytest.raises(AssertionError, match="candidates"):
        check_tree(wrong_token, m)
    wrong_score = DraftTree(
        good.parents,
        good.tokens,
        good.depths,
        np.where(np.arange(5) == 3, 0.29, good.scores),
        good.ranks,
    )
    with pytest.raises(AssertionError, match="ρ"):
        check_tree(wrong_score, m)


@given(batches(), cost_curves(40))
def test_joint_controller_meets_the_joint_oracles(
    batch: list[DraftMarginals], curve: CostCurve
) -> None:
    """The joint controller's exhaustive mode attains the oracle's best Σ Â at its total and the
    best Ŝ over every allocation when Ĉ depends on the total alone."""
    costs = np.concatenate((curve.verify_s, np.full(200, curve.verify_s[-1])))
    n_max = 8
    trees, _ = choose_joint(
        batch, lambda grow: CostCurve(0.0, 0.0, costs[: grow.size + 1], 1.0), n_max, "exhaustive"
    )
    total = sum(t.size for t in trees)
    a_hat = sum(float(t.scores.sum()) for t in trees)
    assert a_hat == pytest.approx(best_joint_acceptance(batch, n_max)[total - len(batch)], rel=1e-9)
    assert a_hat / costs[total - len(batch)] == pytest.approx(
        best_joint_speedup(batch, costs, n_max), rel=1e-9
    )


def test_oracles_refuse_inputs_too_big_to_enumerate() -> None:
    big = DraftMarginals(np.tile(np.arange(8), (8, 1)), np.full((8, 8), 0.1))
    with pytest.raises(BudgetError, match="lattice"):
        optimal_acceptance(big)
    with pytest.raises(BudgetError, match="lattice"):
        optimal_acceptance_enumerated(DraftMarginals([[1, 2, 3]] * 4, [[0.5, 0.2, 0.1]] * 4))


def test_plugin_policy_property_test_example() -> None:
    """The docs' recipe, run: best-first at N is optimal at N (property holds) for a plug-in-
    style policy built by make_policy."""
    policy = make_policy("fixed:7")

    @settings(max_examples=50)
    @given(marginals(max_depth=4, max_k=3))
    def prop(m: DraftMarginals) -> None:
        tree = policy.choose(m, None).tree
        check_tree(tree, m)
        assert tree.scores.sum() >= optimal_acceptance(m)[tree.size] - 1e-12

    prop()
