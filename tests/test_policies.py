"""Every policy respects its budget and returns prefix-closed trees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.controller import LearningPolicy
from bastion.errors import BastionError, BudgetError, UnknownNameError
from bastion.interfaces import CostCurve, PolicyContext, StepCost, StepLoad, TreePolicy
from bastion.policies import (
    AdaptivePolicy,
    BeamPolicy,
    ChainPolicy,
    EaglePolicy,
    FixedPolicy,
    make_policy,
)
from bastion.tree import DraftMarginals, DraftTree, best_first_tree, surrogate_acceptance
from tests.strategies import marginals


class LinearCost:
    """A plain fake CostModel: Ĉ(N) = a + b·N, L_AR = a."""

    def __init__(self, a: float = 10e-3, b: float = 5e-5) -> None:
        self.a, self.b = a, b
        self.observed: list[tuple[int, float]] = []

    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        return StepCost(draft_s=0.0, prep_s=0.0, verify_s=self.a + self.b * tree_size)

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        n = np.arange(1, max_tree_size + 1)
        return CostCurve(0.0, 0.0, self.a + self.b * n, self.a)

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        self.observed.append((tree_size, verify_s))


CTX = PolicyContext(StepLoad(context_len=128), LinearCost())


def assert_well_formed(tree: DraftTree, m: DraftMarginals) -> None:
    """Prefix-closed, consistent depths, tokens and scores taken from the marginals."""
    assert tree.parents[0] == -1 and tree.depths[0] == 0 and tree.scores[0] == 1.0
    assert np.all(tree.parents[1:] < np.arange(1, tree.size))
    assert np.all(tree.depths[1:] == tree.depths[tree.parents[1:]] + 1)
    assert np.all(tree.depths <= m.depth)
    d, r = tree.depths[1:] - 1, tree.ranks[1:]
    np.testing.assert_array_equal(tree.tokens[1:], m.token_ids[d, r])
    np.testing.assert_allclose(tree.scores[1:], tree.scores[tree.parents[1:]] * m.probs[d, r])
    siblings = set(zip(tree.parents.tolist(), tree.tokens.tolist(), strict=True))
    assert len(siblings) == tree.size, "two children of one node carry the same token"


policies = st.one_of(
    st.builds(ChainPolicy, st.none() | st.integers(1, 20)),
    st.builds(FixedPolicy, st.integers(1, 200)),
    st.builds(BeamPolicy, st.integers(1, 6), st.integers(1, 16)),
    st.builds(EaglePolicy, st.integers(1, 10), st.integers(1, 8), st.integers(1, 80)),
    st.builds(AdaptivePolicy, st.integers(1, 300), st.sampled_from(["auto", "exhaustive"])),
)


def budget_of(policy: TreePolicy, m: DraftMarginals) -> int:
    match policy:
        case ChainPolicy(depth=d):
            return 1 + (m.depth if d is None else d)
        case FixedPolicy(tree_size=n):
            return n
        case BeamPolicy(width=w, depth=d):
            return 1 + w * d
        case EaglePolicy(total=n):
            return n
        case AdaptivePolicy(n_max=n):
            return n
    raise AssertionError(policy)


@given(policies, marginals(max_depth=15, max_k=8))
def test_every_policy_respects_budget_and_prefix_closure(
    policy: TreePolicy, m: DraftMarginals
) -> None:
    tree = policy.choose(m, CTX).tree
    assert 1 <= tree.size <= budget_of(policy, m)
    assert_well_formed(tree, m)


@given(marginals(max_depth=15, min_k=1, max_k=1))
def test_chain_equals_best_first_when_k_is_one(m: DraftMarginals) -> None:
    chain = ChainPolicy().choose(m, CTX).tree
    assert chain == best_first_tree(m, m.depth + 1)


@given(marginals(max_depth=15, max_k=8), st.integers(1, 5), st.integers(1, 15))
def test_best_first_never_loses_to_beam_at_matched_budget(
    m: DraftMarginals, width: int, depth: int
) -> None:
    """Prop. 3.3 against §4.3's rectangle: same number of nodes, never a lower Â."""
    beam = BeamPolicy(width, depth).choose(m, CTX).tree
    assert surrogate_acceptance(best_first_tree(m, beam.size)) >= surrogate_acceptance(beam) - 1e-12


def test_beam_is_a_rectangle() -> None:
    m = DraftMarginals(
        np.arange(15 * 8).reshape(15, 8), np.tile(np.linspace(0.2, 0.01, 8), (15, 1))
    )
    tree = BeamPolicy(4, 15).choose(m, CTX).tree
    assert tree.size == 61
    assert np.bincount(tree.depths).tolist() == [1] + [4] * 15


def test_eagle_keeps_total_nodes_and_reranks_globally() -> None:
    m = DraftMarginals(
        np.arange(15 * 10).reshape(15, 10), np.tile(np.linspace(0.15, 0.01, 10), (15, 1))
    )
    tree = EaglePolicy(top_k=10, depth=7, total=60).choose(m, CTX).tree
    assert tree.size == 60 and tree.max_depth <= 7
    assert np.all(np.diff(tree.scores) <= 0)  # reranked by ρ, parents first


def test_adaptive_uses_the_cost_model_and_reports_why() -> None:
    m = DraftMarginals(np.arange(15 * 4).reshape(15, 4), np.tile([0.8, 0.1, 0.05, 0.02], (15, 1)))
    cheap = AdaptivePolicy().choose(m, PolicyContext(StepLoad(0), LinearCost(b=1e-6)))
    dear = AdaptivePolicy().choose(m, PolicyContext(StepLoad(0), LinearCost(b=1e-3)))
    assert cheap.tree.size > dear.tree.size >= 1
    assert cheap.diagnostics is not None


def test_adaptive_without_cost_model_is_an_error() -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    with pytest.raises(BudgetError, match="cost model"):
        AdaptivePolicy().choose(m, PolicyContext(StepLoad(0)))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("chain", ChainPolicy()),
        ("chain:8", ChainPolicy(8)),
        ("fixed:64", FixedPolicy(64)),
        ("beam:4x15", BeamPolicy(4, 15)),
        ("eagle", EaglePolicy()),
        ("eagle:10,5,60", EaglePolicy(10, 5, 60)),
        ("bastion", LearningPolicy()),
        ("bastion:512", LearningPolicy(512)),
        ("bastion:paper", AdaptivePolicy()),
        ("bastion:paper,512", AdaptivePolicy(512)),
    ],
)
def test_make_policy(spec: str, expected: TreePolicy) -> None:
    assert make_policy(spec) == expected
    assert make_policy(spec).name.split(":")[0] == spec.split(":")[0]


@pytest.mark.parametrize(
    "spec", ["fixed", "fixed:0", "fixed:x", "beam:4", "eagle:1,2", "bastion:-3"]
)
def test_bad_policy_specs(spec: str) -> None:
    with pytest.raises(BudgetError):
        make_policy(spec)


def test_unknown_policy_lists_known() -> None:
    with pytest.raises(UnknownNameError, match="fixed:N") as err:
        make_policy("medusa")
    assert isinstance(err.value, BastionError)


@given(
    marginals(max_depth=15, max_k=8),
    st.integers(1, 600),
    st.sampled_from(["auto", "first-decrease"]),
)
def test_previous_size_hint_never_changes_the_tree(
    m: DraftMarginals, previous: int, mode: str
) -> None:
    """The engine's hint only moves where the search starts, not what it finds."""
    policy = AdaptivePolicy(n_max=512, mode=mode)  # type: ignore[arg-type]
    cold = policy.choose(m, CTX).tree
    warm = policy.choose(
        m, PolicyContext(CTX.load, CTX.cost_model, previous_tree_size=previous)
    ).tree
    assert warm == cold
