"""The batched step: its values, the policies' batched choices, the engine's adapters, and the
simulator's vectorised acceptance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.acceptance import walk
from bastion.batch import BatchMarginals, BatchVerifyResult, StepRequests, TreeBatch
from bastion.engine import PerRequestPolicy, SpecEngine
from bastion.errors import MarginalsError
from bastion.interfaces import (
    BatchPolicyContext,
    DraftContext,
    PolicyContext,
    StepLoad,
    TreeChoice,
    VerifyResult,
)
from bastion.policies import make_policy
from bastion.sim.backend import accepted_counts, accepted_counts_numpy
from bastion.tree import DraftMarginals, DraftTree, best_first_tree
from tests.strategies import marginals

BATCHED = [
    "ar",
    "chain",
    "chain:3",
    "fixed:1",
    "fixed:7",
    "fixed:40",
    "beam:1x3",
    "beam:4x15",
    "eagle",
    "eagle:3,4,9",
]


@st.composite
def batches(draw: st.DrawFn, max_batch: int = 4) -> list[DraftMarginals]:
    """1 … max_batch requests' marginals of one shape (a drafter's block)."""
    first = draw(marginals(max_depth=5, max_k=4))
    rows = [first]
    for _ in range(draw(st.integers(0, max_batch - 1))):
        m = draw(
            marginals(min_depth=first.depth, max_depth=first.depth, min_k=first.k, max_k=first.k)
        )
        rows.append(m)
    return rows


def context(n: int) -> BatchPolicyContext:
    return BatchPolicyContext(StepRequests.of(np.arange(n), np.full(n, 100), np.zeros(n)))


@pytest.mark.parametrize("spec", BATCHED)
@given(rows=batches())
def test_batched_choice_equals_each_request_alone(spec: str, rows: list[DraftMarginals]) -> None:
    """Invariant: a vectorised ``choose_batch`` returns, request by request, exactly the tree
    that ``choose`` returns for that request alone (the engine's adapter)."""
    policy = make_policy(spec)
    batch = BatchMarginals.from_rows(rows)
    ours = policy.choose_batch(batch, context(len(rows))).trees  # type: ignore[attr-defined]
    ref = PerRequestPolicy(policy).choose_batch(batch, context(len(rows))).trees
    assert ours.size == ref.size == len(rows)
    for i in range(len(rows)):
        assert ours.tree(i) == ref.tree(i)


@pytest.mark.parametrize("accept", [accepted_counts, accepted_counts_numpy])
@given(rows=batches(max_batch=3), data=st.data())
def test_vectorised_acceptance_is_the_greedy_walk(
    accept: object, rows: list[DraftMarginals], data: st.DataObject
) -> None:
    """Invariant: acceptance over a whole batch of trees (compiled, or numpy pointer jumping)
    gives, for each tree, the path of the core's sequential walk against its target tokens."""
    trees, targets = [], []
    for m in rows:
        trees.append(best_first_tree(m, data.draw(st.integers(1, 50))))
        pick = data.draw(st.lists(st.integers(0, 4), min_size=m.depth, max_size=m.depth))
        target = [int(m.token_ids[d, r]) if r < m.k else 10**9 for d, r in enumerate(pick)]
        targets.append([*target, -1])
    batch = TreeBatch.from_trees(trees)
    counts, on_path = accept(batch, np.array(targets))  # type: ignore[operator]
    for i, tree in enumerate(trees):
        t = targets[i]
        ref = walk(tree, lambda node, t=t, tree=tree: t[tree.depths[node]])
        a, e = batch.offsets[i], batch.offsets[i + 1]
        assert [0, *np.flatnonzero(on_path[a:e]).tolist()] == list(ref.path)
        assert counts[i] == len(ref.path) - 1


def test_acceptance_negative_control() -> None:
    """A target that matches a node whose parent does not match accepts nothing there."""
    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.4], [0.9, 0.1]])
    tree = best_first_tree(m, 5)
    counts, _ = accepted_counts(TreeBatch.from_trees([tree]), np.array([[7, 3, -1]]))
    assert counts.tolist() == [0]
    counts, _ = accepted_counts(TreeBatch.from_trees([tree]), np.array([[2, 3, -1]]))
    assert counts.tolist() == [2]


def test_tree_batch_round_trip() -> None:
    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.4], [0.9, 0.1]])
    trees = [best_first_tree(m, n) for n in (1, 3, 5)]
    batch = TreeBatch.from_trees(trees)
    assert batch.sizes.tolist() == [1, 3, 5] and batch.total_nodes == 9
    assert batch.trees() == trees
    np.testing.assert_allclose(batch.expected_tokens(), [t.scores.sum() for t in trees])
    rooted = batch.with_root_tokens([7, 8, 9])
    assert [rooted.tree(i).tokens[0] for i in range(3)] == [7, 8, 9]
    assert batch.tree(1).tokens[0] == -1  # the original is untouched
    assert TreeBatch.roots(3).sizes.tolist() == [1, 1, 1]
    with pytest.raises(MarginalsError):
        TreeBatch.from_trees([])


def test_marginals_of_different_shapes_are_padded_with_zero_probability() -> None:
    small = DraftMarginals([[5, 6]], [[0.5, 0.25]])
    big = DraftMarginals([[1, 2, 9], [3, 4, 8]], [[0.6, 0.3, 0.1], [0.9, 0.1, 0.0]])
    batch = BatchMarginals.from_rows([small, big])
    assert batch.probs.shape == (2, 2, 3)
    assert best_first_tree(batch.row(0), 10) == best_first_tree(small, 10)
    DraftMarginals(batch.row(0).token_ids, batch.row(0).probs)  # still valid marginals
    with pytest.raises(MarginalsError):
        BatchMarginals.from_rows([])


def test_verify_result_round_trip() -> None:
    results = [
        VerifyResult((0, 2, 5), (11, 12), 13, "a"),
        VerifyResult((0,), (), 21, None),
        VerifyResult((0, 1), (31,), 32, "c"),
    ]
    batch = BatchVerifyResult.from_results(results)
    assert batch.committed_lens.tolist() == [3, 1, 2]
    assert [batch.result(i) for i in range(3)] == results


class CountingPolicy:
    """A single-request policy (no ``choose_batch``) that records what it was given."""

    name = "counting"
    uses_cost_model = True

    def __init__(self) -> None:
        self.loads: list[StepLoad] = []

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        self.loads.append(context.load)
        return TreeChoice(best_first_tree(marginals, 3))


class EchoDrafter:
    def draft(self, context: DraftContext) -> DraftMarginals:
        base = 10 * context.request_id
        return DraftMarginals([[base + 1, base + 2], [base + 3, base + 4]], [[0.5, 0.3]] * 2)


class FirstChildVerifier:
    """Accepts the first child of the root whenever there is one."""

    def verify(self, request_id: int, tree: DraftTree) -> VerifyResult:
        if tree.size > 1:
            return VerifyResult((0, 1), (int(tree.tokens[1]),), 100 + request_id)
        return VerifyResult((0,), (), 100 + request_id)


def test_engine_adapts_single_request_parts_to_a_batch() -> None:
    """A plain ``choose`` policy, ``draft`` drafter and ``verify`` verifier run through the
    batched step; a policy declaring ``uses_cost_model`` sees the other requests' trees."""
    policy = CountingPolicy()
    engine = SpecEngine(EchoDrafter(), policy, FirstChildVerifier())
    requests = StepRequests.of([0, 1, 2], [10, 20, 30], [5, 6, 7], [4, 0, 4], [2.0, 0.0, 2.0])
    step = engine.step(requests)
    assert step.trees.sizes.tolist() == [3, 3, 3]
    assert [step.trees.tree(i).tokens[0] for i in range(3)] == [5, 6, 7]  # roots = bonus
    assert [step.record(i).result.accepted_tokens for i in range(3)] == [(1,), (11,), (21,)]
    assert step.result.committed_lens.tolist() == [2, 2, 2]
    first, second = policy.loads[0], policy.loads[1]
    assert first.batch_size == 3 and first.context_len == 10
    # request 1 has no tree yet: it is assumed to take the batch's typical one (4 nodes)
    assert [r.tree_size for r in first.co_batched] == [4, 4]
    # request 1 sees request 0's tree as chosen this step
    assert [r.tree_size for r in second.co_batched] == [3, 4]


def test_engine_generate_is_the_batched_step_with_one_request() -> None:
    engine = SpecEngine(EchoDrafter(), make_policy("chain"), FirstChildVerifier())
    result = engine.generate(0, [1, 2, 3], first_token=9, max_new_tokens=7)
    assert result.output_ids == [9, 1, 100, 1, 100, 1, 100]
    assert result.committed_per_step == [2, 2, 2]


@given(rows=batches(max_batch=3), data=st.data())
def test_compiled_commit_equals_the_numpy_form(
    rows: list[DraftMarginals], data: st.DataObject
) -> None:
    """Invariant: the compiled walk's committed tokens (accepted, then the bonus) and accepted
    nodes equal the numpy form's, request by request."""
    from bastion.bestfirst import COMPILED, accepted_paths, verified_paths
    from bastion.sim.backend import _committed_numpy

    if not COMPILED:
        pytest.skip("the compiled kernel is not built")
    trees, targets = [], []
    for m in rows:
        trees.append(best_first_tree(m, data.draw(st.integers(1, 50))))
        pick = data.draw(st.lists(st.integers(0, 4), min_size=m.depth, max_size=m.depth))
        bonus = data.draw(st.integers(0, 99))
        targets.append(
            [*(int(m.token_ids[d, r]) if r < m.k else 10**9 for d, r in enumerate(pick)), bonus]
        )
    batch = TreeBatch.from_trees(trees)
    target = np.array(targets)
    walked = accepted_paths(batch.parents, batch.tokens, batch.depths, batch.offsets, target)
    assert walked is not None
    counts, _, tokens, nodes = walked
    ref = _committed_numpy(batch, target)
    assert [counts.tolist(), tokens.tolist(), nodes.tolist()] == [x.tolist() for x in ref]
    # … and the verifier's form: each request's committed length (accepted + the bonus)
    verified = verified_paths(batch.parents, batch.tokens, batch.depths, batch.offsets, target)
    assert verified is not None
    lengths, tokens, nodes = verified
    assert lengths.tolist() == (ref[0] + 1).tolist()
    assert [tokens.tolist(), nodes.tolist()] == [x.tolist() for x in ref[1:]]
