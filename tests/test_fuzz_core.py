"""Fuzzing the core's public API: any input gives a result or a BastionError, never another
exception, a hang or an allocation sized by the request instead of by what can be built."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.bestfirst import MAX_TREE_SIZE, best_first_many, buildable_nodes
from bastion.budget import choose_tree
from bastion.errors import BastionError, BudgetError
from bastion.interfaces import CostCurve
from bastion.joint import choose_joint
from bastion.policies import make_policy
from bastion.testing import check_tree, marginals
from bastion.tree import DraftMarginals, DraftTree, best_first_tree, best_first_trees

# anything a caller might pass where a number or an array is expected
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.lists(st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=2)), max_size=4),
    st.lists(st.lists(st.integers(-(2**64), 2**64), max_size=3), max_size=3),
)


def only_bastion_errors(call) -> object:  # type: ignore[no-untyped-def]
    try:
        return call()
    except BastionError:
        return None


@given(marginals(max_depth=4, max_k=3), st.one_of(junk, st.integers(-5, 10**30)))
def test_best_first_tree_takes_any_budget(m: DraftMarginals, budget: object) -> None:
    tree = only_bastion_errors(lambda: best_first_tree(m, budget))  # type: ignore[arg-type]
    if tree is not None:
        assert isinstance(tree, DraftTree)
        check_tree(tree, m)
        assert tree.size <= min(int(budget), int(buildable_nodes(m.probs)))  # type: ignore[call-overload]


@given(
    st.lists(marginals(max_depth=3, max_k=3, min_depth=3, min_k=3), max_size=3),
    st.one_of(st.integers(1, 20), junk),
    st.one_of(st.lists(st.integers(-1, 50), max_size=4), junk),
)
def test_best_first_trees_takes_any_budgets(
    batch: list[DraftMarginals], budgets: object, root_tokens: object
) -> None:
    """Any budgets and any root tokens (one per request or not) for a well-formed batch."""
    trees = only_bastion_errors(lambda: best_first_trees(batch, budgets, root_tokens))  # type: ignore[arg-type]
    if trees is not None:
        assert len(trees) == len(batch)  # type: ignore[arg-type]


# what a callback may answer: nothing, a number, junk, a curve too short or not a curve at all
answers = st.one_of(
    junk,
    st.builds(lambda n: CostCurve(0.0, 0.0, np.linspace(1.0, 2.0, n), 1.0), st.integers(1, 4)),
    st.just(DraftMarginals([[1]], [[0.5]])),
)


@given(marginals(max_depth=3, max_k=3), answers, st.sampled_from(["exhaustive", "auto"]))
def test_choose_tree_takes_a_curve_source_that_answers_anything(
    m: DraftMarginals, answer: object, mode: str
) -> None:
    """A curve source that returns no CostCurve (None, a number, a short curve) is the cost
    model's error (CostModelError), never an AttributeError from reading it."""
    only_bastion_errors(lambda: choose_tree(m, lambda n: answer, 16, mode))  # type: ignore[arg-type,return-value]


@given(
    st.lists(marginals(max_depth=3, max_k=3, min_depth=3, min_k=3), min_size=1, max_size=3), answers
)
def test_choose_joint_takes_a_curve_that_answers_anything(
    batch: list[DraftMarginals], answer: object
) -> None:
    only_bastion_errors(lambda: choose_joint(batch, lambda grow: answer, 8))  # type: ignore[arg-type,return-value]


@given(junk, junk)
def test_marginals_from_anything(ids: object, probs: object) -> None:
    m = only_bastion_errors(lambda: DraftMarginals(ids, probs))  # type: ignore[arg-type]
    if m is not None:
        assert isinstance(m, DraftMarginals) and m.token_ids.dtype == np.int64
        assert np.all(m.token_ids >= 0)  # no id wrapped around to a negative one


@given(
    st.one_of(
        st.integers(1, 4).flatmap(
            lambda v: st.lists(st.lists(st.floats(0, 1), min_size=v, max_size=v), max_size=3)
        ),
        junk,
    ),
    st.one_of(st.integers(-1, 5), st.floats(-1, 5), junk),
)
def test_marginals_from_distributions_take_any_k(dists: object, k: object) -> None:
    """Any distributions and any k (a fraction, a float, a string): marginals or a
    BastionError, never a TypeError from slicing with it."""
    m = only_bastion_errors(lambda: DraftMarginals.from_distributions(dists, k))  # type: ignore[arg-type]
    if m is not None:
        assert isinstance(m, DraftMarginals) and m.k == k


@given(junk, junk, junk, junk)
def test_draft_tree_from_anything(
    parents: object, tokens: object, depths: object, scores: object
) -> None:
    only_bastion_errors(lambda: DraftTree(parents, tokens, depths, scores))  # type: ignore[arg-type]


@given(junk, junk, junk, junk)
def test_cost_curve_from_anything(draft: object, prep: object, verify: object, ar: object) -> None:
    only_bastion_errors(lambda: CostCurve(draft, prep, verify, ar))  # type: ignore[arg-type]


@given(marginals(max_depth=3, max_k=3), st.one_of(junk, st.integers(1, 10**18)))
def test_controller_takes_any_cap_without_pricing_beyond_the_lattice(
    m: DraftMarginals, n_max: object
) -> None:
    asked: list[int] = []

    def curve(n: int) -> CostCurve:
        asked.append(n)
        return CostCurve(0.0, 0.0, np.linspace(1.0, 2.0, n), 1.0)

    for mode in ("exhaustive", "auto", "first-decrease"):
        only_bastion_errors(lambda mode=mode: choose_tree(m, curve, n_max, mode))  # type: ignore[misc]
    assert max(asked, default=0) <= MAX_TREE_SIZE


@given(st.one_of(junk, st.text(max_size=30)))
def test_make_policy_from_anything(spec: object) -> None:
    policy = only_bastion_errors(lambda: make_policy(spec))  # type: ignore[arg-type]
    if policy is not None:
        assert isinstance(policy.name, str)


def test_huge_budgets_are_cut_to_the_lattice_not_allocated() -> None:
    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.3], [0.5, 0.2]])
    for budget in (10**9, 2**30, 2**31, 10**20):
        assert best_first_tree(m, budget).size == 7
    assert [t.size for t in best_first_trees([m, m], 10**9)] == [7, 7]


def test_a_tree_beyond_the_documented_limit_is_refused_before_allocating() -> None:
    wide = np.full((1, 15, 16), 1.0 / 16)  # 16^15 buildable nodes
    assert int(buildable_nodes(wide)[0]) == MAX_TREE_SIZE + 1  # counted up to the limit only
    with pytest.raises(BudgetError, match="MAX_TREE_SIZE"):
        best_first_many(wide, 2**30)
    assert best_first_many(wide, 1000)[0][0].size == 1000


def test_kernel_buffers_are_checked_without_overflow() -> None:
    """The compiled kernel's own size checks hold for sizes whose byte counts overflow."""
    from bastion.bestfirst import COMPILED

    if not COMPILED:
        pytest.skip("the C kernel is not built here")
    from bastion import _bestfirst  # type: ignore[attr-defined]

    probs = np.zeros(4)
    budgets = np.array([3], dtype=np.int64)
    for depth, k in ((2**62, 4), (2**40, 2**40), (-1, 4), (4, 2**61 + 1)):
        with pytest.raises(ValueError):
            _bestfirst.build(probs, depth, k, budgets)
    ints, floats = np.zeros(8, np.int64), np.zeros(8)
    args = (probs, np.zeros(4, np.int64), 2, 2, 1)
    for ahead in (2**62, 2**61 + 1):  # verify holds 4 doubles; the byte count would overflow
        with pytest.raises(ValueError):
            _bestfirst.chunk(
                *args, ahead, ahead, 0, -1, np.ones(4), 0.0, 0.0, 0.0, 1.0, 0.0, 3.0, ints, floats
            )
