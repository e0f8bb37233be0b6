"""DraftMarginals/DraftTree validation and helpers (masks, positions, paths, networkx)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.errors import BastionError, BudgetError, MarginalsError
from bastion.tree import (
    DraftMarginals,
    DraftTree,
    ancestor_matrix,
    attention_mask,
    best_first_tree,
    best_first_trees,
    path_to,
    position_ids,
    to_networkx,
)
from tests.strategies import marginals

IDS = [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("ids", "probs", "match"),
    [
        (np.zeros((0, 2)), np.zeros((0, 2)), "empty"),
        (np.zeros((2, 0)), np.zeros((2, 0)), "empty"),
        (IDS, [[0.5, np.nan], [0.5, 0.1]], "NaN"),
        (IDS, [[0.5, -0.1], [0.5, 0.1]], r"\[0, 1\]"),
        (IDS, [[0.1, 0.5], [0.5, 0.1]], "descending"),
        (IDS, [[0.7, 0.6], [0.5, 0.1]], "sums to"),
        (IDS, [[0.5, 0.1]], "does not match"),
        ([[1, 1], [3, 4]], [[0.5, 0.1], [0.5, 0.1]], "repeats"),
        ([1, 2], [0.5, 0.1], "2-D"),
        ([[1.5, 2], [3, 4]], [[0.5, 0.1], [0.5, 0.1]], "integers"),
        ([[-1, 2], [3, 4]], [[0.5, 0.1], [0.5, 0.1]], "non-negative"),
        (IDS, [["a", "b"], ["c", "d"]], "numeric"),
    ],
)
def test_bad_marginals_are_named(ids: object, probs: object, match: str) -> None:
    with pytest.raises(MarginalsError, match=match) as err:
        DraftMarginals(ids, probs)  # type: ignore[arg-type]
    assert isinstance(err.value, BastionError)


@pytest.mark.parametrize("budget", [0, -3, 2.5, True, "8"])
def test_bad_budgets_are_named(budget: object) -> None:
    m = DraftMarginals(IDS, [[0.5, 0.1], [0.5, 0.1]])
    with pytest.raises(BudgetError, match="budget"):
        best_first_tree(m, budget)  # type: ignore[arg-type]


def test_mismatched_batch_shapes_and_budgets() -> None:
    a = DraftMarginals(IDS, [[0.5, 0.1], [0.5, 0.1]])
    b = DraftMarginals([[1, 2]], [[0.5, 0.1]])
    with pytest.raises(MarginalsError, match="shape"):
        best_first_trees([a, b], 4)
    with pytest.raises(BudgetError, match="budgets"):
        best_first_trees([a, a], [4])


def test_rows_summing_to_one_within_tolerance_are_accepted() -> None:
    p = np.array([[0.7, 0.3 + 5e-7]])
    assert DraftMarginals([[0, 1]], p).probs.sum() > 1.0


def test_marginals_are_read_only() -> None:
    m = DraftMarginals(IDS, [[0.5, 0.1], [0.5, 0.1]])
    with pytest.raises(ValueError):
        m.probs[0, 0] = 0.9


def test_from_distributions_takes_top_k() -> None:
    dist = np.array([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    m = DraftMarginals.from_distributions(dist, 2)
    assert m.token_ids.tolist() == [[1, 2], [2, 0]]
    np.testing.assert_allclose(m.probs, [[0.6, 0.3], [0.6, 0.2]])


@pytest.mark.parametrize(
    ("parents", "depths", "match"),
    [
        ([0, 0], [0, 1], "root"),
        ([-1, 1], [0, 1], "before"),
        ([-1, 0, 0], [0, 1, 2], "depth"),
    ],
)
def test_malformed_trees_are_rejected(parents: list[int], depths: list[int], match: str) -> None:
    n = len(parents)
    with pytest.raises(MarginalsError, match=match):
        DraftTree(parents, [0] * n, depths, [1.0] * n)


@given(marginals(max_depth=8, max_k=4), st.integers(1, 60))
def test_ancestor_matrix_matches_paths(m: DraftMarginals, budget: int) -> None:
    tree = best_first_tree(m, budget)
    vis = ancestor_matrix(tree)
    for i in range(tree.size):
        assert set(np.flatnonzero(vis[i]).tolist()) == set(path_to(tree, i))


@given(st.integers(1, 20), st.integers(0, 19), st.booleans())
def test_ancestor_matrix_of_a_chain_and_of_a_chain_with_a_branch(
    n: int, fork: int, branch: bool
) -> None:
    """A chain (each node the child of the one before) is causal; one extra branch off it is
    not, and both match their paths (the chain's fast path and the general one)."""
    parents = [-1, *range(n - 1)]
    depths = list(range(n))
    if branch:  # one more node, a second child of node ``fork``
        fork = fork % n
        parents.append(fork)
        depths.append(depths[fork] + 1)
    size = len(parents)
    tree = DraftTree(parents, list(range(size)), depths, [1.0] * size)
    vis = ancestor_matrix(tree)
    for i in range(size):
        assert set(np.flatnonzero(vis[i]).tolist()) == set(path_to(tree, i))
    # causal unless the branch leaves the chain before its last node (there it extends it)
    assert np.array_equal(vis, np.tri(size, dtype=bool)) == (not branch or fork == n - 1)


def test_mask_positions_and_graph() -> None:
    m = DraftMarginals([[10, 11], [12, 13]], [[0.6, 0.3], [0.9, 0.05]])
    tree = best_first_tree(m, 4, root_token=7)
    # order: root, 10 (0.6), 10→12 (0.54), 11 (0.3)
    assert tree.tokens.tolist() == [7, 10, 12, 11]
    assert tree.parents.tolist() == [-1, 0, 1, 0]
    mask = attention_mask(tree, past_len=3)
    assert mask.shape == (4, 7)
    visible = mask == 0
    assert visible[:, :3].all()
    assert visible[3, 3:].tolist() == [True, False, False, True]  # node 3 sees root and itself
    assert visible[2, 3:].tolist() == [True, True, True, False]
    assert position_ids(tree, 5).tolist() == [5, 6, 7, 6]
    g = to_networkx(tree)
    assert sorted(g.edges) == [(0, 1), (0, 3), (1, 2)]
    assert g.nodes[2]["token"] == 12


def test_importing_bastion_does_not_import_torch() -> None:
    modules = "bastion, bastion.tree, bastion.policies, bastion.budget, bastion.engine, bastion.cli"
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
