"""The learning controller's standing chain: a chain decision that stands is planned before
drafting, so the step needs only the drafter's top-1 (the chain policy's argmax preparation,
no decision), and only such steps price the chain in the learned table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.batch import BatchMarginals, StepRequests, TreeBatch
from bastion.controller import LearningPolicy
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.engine import SpecEngine
from bastion.errors import ConfigError
from bastion.interfaces import (
    BatchPolicyContext,
    CostCurve,
    DraftContext,
    PolicyContext,
    StepCost,
    StepLoad,
    VerifyResult,
)
from bastion.learned import LearnedCostModel
from bastion.observed import (
    AcceptanceCalibration,
    SizeCalibration,
    chain_shadow,
    learn_step,
    shadow_of,
)
from bastion.policies import ChainPolicy, make_policy
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.truth import get_truth
from bastion.tree import DraftMarginals, DraftTree, best_first_tree
from tests.strategies import batches


class FlatPrior:
    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        return CostCurve(0.0, 0.0, 10e-3 + 10e-6 * n, 8e-3)

    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        return StepCost(0.0, 0.0, 10e-3 + 10e-6 * tree_size)

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        pass


class SureDrafter:
    """Three positions, the top-1 almost certain: the chain is what a controller should pick
    when trees cost more per node."""

    def draft(self, context: DraftContext) -> DraftMarginals:
        base = 10 * context.request_id
        ids = [[base + 1, base + 2], [base + 3, base + 4], [base + 5, base + 6]]
        return DraftMarginals(ids, [[0.99, 0.005]] * 3)


class TopChainVerifier:
    """Accepts the first child at every depth (the drafter's top-1 path)."""

    def verify(self, request_id: int, tree: DraftTree) -> VerifyResult:
        path = [0]
        while True:
            children = np.flatnonzero(np.asarray(tree.parents) == path[-1])
            if children.size == 0:
                break
            path.append(int(children[0]))
        accepted = tuple(int(tree.tokens[i]) for i in path[1:])
        return VerifyResult(tuple(path), accepted, 100 + request_id)


def _requests(b: int) -> StepRequests:
    return StepRequests.of(np.arange(b), np.full(b, 50), np.zeros(b, np.int64))


def test_a_standing_chain_is_planned_before_drafting() -> None:
    learner = LearnedCostModel(FlatPrior(), explore_every=0)
    policy = LearningPolicy(64, decide_every=8)
    req = _requests(4)
    assert policy.plan_step(req, learner) == "tree"  # nothing decided yet: top-K, decide
    learner.pending_plan = None
    for _ in range(2):  # two agreeing chain decisions: the second stands for a step
        learner.decided("chain", 4, 16, 0.01, 8)
    assert policy.plan_step(req, learner) == "chain"
    marginals = BatchMarginals(
        np.broadcast_to(np.arange(3)[None, :, None] * 2 + np.arange(2), (4, 3, 2)).copy(),
        np.broadcast_to(np.array([0.9, 0.05]), (4, 3, 2)).copy(),
    )
    choice = policy.choose_batch(marginals, BatchPolicyContext(req, learner))
    assert choice.kind == "chain" and choice.diagnostics.repeated
    assert choice.trees.sizes.tolist() == [4, 4, 4, 4]
    # the plan was consumed: the next step plans afresh (the decision's interval is spent)
    assert learner.pending_plan is None
    assert policy.plan_step(req, learner) == "tree"


def test_the_engine_records_the_preparation_each_step_needed() -> None:
    learner = LearnedCostModel(FlatPrior(), explore_every=0)
    policy = LearningPolicy(64, decide_every=8)
    engine = SpecEngine(SureDrafter(), policy, TopChainVerifier(), cost_model=learner)
    for _ in range(2):
        learner.decided("chain", 3, 12, 0.01, 8)
    step = engine.step(_requests(3))
    assert (step.kind, step.preparation) == ("chain", "argmax")
    step = engine.step(_requests(3))  # the interval is spent: a decision, on top-K marginals
    assert step.preparation == "topk"
    fixed = SpecEngine(SureDrafter(), make_policy("fixed:4"), TopChainVerifier())
    assert fixed.step(_requests(2)).preparation == "topk"
    chain = SpecEngine(SureDrafter(), make_policy("chain"), TopChainVerifier())
    assert chain.step(_requests(2)).preparation == "argmax"
    ar = SpecEngine(SureDrafter(), make_policy("ar"), TopChainVerifier())
    assert ar.step(_requests(2)).preparation == "none"


def test_only_a_standing_chain_prices_the_chain() -> None:
    """A chain chosen by a decision step paid top-K preparation and the decision: its cycle
    would overstate what choosing the chain costs, so it teaches acceptance, not the cycle."""
    learner = LearnedCostModel(FlatPrior(), explore_every=0)
    ctx = np.full(2, 50)
    trees = TreeBatch.from_trees([_chain_tree(3), _chain_tree(3)])
    committed, nodes = np.full(2, 4, np.int64), np.array([1, 2, 3, 1, 2, 3])
    before = learner.table.count("chain", 2).copy()
    learner.observe_step("chain", ctx, trees, committed, nodes, 0.05, preparation="topk")
    assert np.array_equal(learner.table.count("chain", 2), before)
    assert learner.chain_ratio() != 1.0 or learner._chain[2] > 0  # its acceptance counted
    learner.observe_step("chain", ctx, trees, committed, nodes, 0.02, preparation="argmax")
    assert int(learner.table.count("chain", 2).sum()) == int(before.sum()) + 1


def _chain_tree(depth: int) -> DraftTree:
    m = DraftMarginals([[1, 2]] * depth, [[0.9, 0.05]] * depth)
    return make_policy("chain").choose(m, PolicyContext(StepLoad(10))).tree


def test_the_simulator_charges_a_standing_chain_the_argmax_preparation() -> None:
    model = get_model("qwen3-8b")
    truth = get_truth("hf-eager")
    gpu = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model), truth)
    sizes, ctx = np.full(8, 16), np.full(8, 512)
    argmax = gpu.prep_truth(sizes, topk=False, contexts=ctx)
    standing = gpu.prep_truth(sizes, topk=False, contexts=ctx, controller="repeat")
    decided = gpu.prep_truth(sizes, topk=True, contexts=ctx, controller=True)
    assert argmax < standing < decided  # the controller's repeat is charged, top-K is not


def test_a_chain_chosen_after_top_k_drafting_pays_the_top_k_pass_but_no_tree_work() -> None:
    """A decision that chose the chain paid the top-K pass and its own host time, but its
    chains are verified causally: no mask, no upload, no KV compaction — the chain policy's
    preparation with the top-K pass for the argmax and the decision on top (so a costlier
    mask, a dearer host ancestor matrix or more compaction kernels leave it unchanged)."""
    model = get_model("qwen3-8b")
    hw = get_profile("h100-sxm")
    sizes, ctx = np.full(8, 16), np.full(8, 512)

    def gpu(**truth: Any) -> SimulatedGPU:
        base = {"controller_step_s": 300e-6, "controller_request_s": 2e-6, "noise": 0.0}
        return SimulatedGPU(
            hw, model, DrafterSpec.dflash_for(model), GroundTruth("t", **(base | truth))
        )

    plain = gpu()
    chain = plain.prep_truth(sizes, topk=True, contexts=ctx, controller=True, path=True)
    tree = plain.prep_truth(sizes, topk=True, contexts=ctx, controller=True)
    argmax = plain.prep_truth(sizes, topk=False, contexts=ctx)
    assert argmax < chain < tree
    t = plain.truth
    logits = 8 * plain.prep.depth * model.vocab
    swap = logits * (t.prep_topk_bytes - t.prep_argmax_bytes) / plain.prep.byte_rate
    swap += (t.prep_tree_kernels - t.prep_chain_kernels) * (
        t.host_kernel_s + plain.device.launch_overhead_s
    )
    assert chain == pytest.approx(argmax + swap + 300e-6 + 8 * 2e-6, rel=1e-9)
    dear = gpu(mask_host_request_s=1e-3, mask_bytes=30.0, compaction_kernels_per_layer=2.0)
    assert dear.prep_truth(sizes, True, ctx, True, path=True) == pytest.approx(chain, rel=1e-12)
    assert dear.prep_truth(sizes, True, ctx, True) > tree + 8 * 1e-3 * 0.99
    # the engine's step: a "chain" step takes this path, a "tree" step the tree's
    assert plain.step_s("chain", sizes, ctx, True, True)[1] == pytest.approx(chain, rel=1e-12)
    assert plain.step_s("tree", sizes, ctx, True, True)[1] == pytest.approx(tree, rel=1e-12)


def test_a_standing_chain_is_charged_its_own_measured_host_time() -> None:
    """controller_chain_*: a standing chain's step (the argmax path) is charged its own
    measured host time; without it (−1), the repeated decision's; other values are refused."""
    model = get_model("qwen3-8b")
    hw = get_profile("h100-sxm")
    base = {"controller_repeat_single_s": 50e-6, "controller_repeat_step_s": 60e-6}
    base |= {"controller_repeat_request_s": 2e-6, "noise": 0.0}
    own = GroundTruth(
        "own",
        controller_chain_single_s=20e-6,
        controller_chain_step_s=30e-6,
        controller_chain_request_s=1e-6,
        **base,
    )
    gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), own)
    plain = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), GroundTruth("plain", **base))
    for b, repeat_s, chain_s in ((1, 50e-6, 20e-6), (4, 60e-6 + 4 * 2e-6, 30e-6 + 4e-6)):
        sizes, ctx = np.full(b, 16), np.full(b, 300)
        bare = gpu.prep_truth(sizes, topk=False, contexts=ctx)
        standing = gpu.prep_truth(sizes, topk=False, contexts=ctx, controller="repeat")
        assert standing - bare == pytest.approx(chain_s, rel=1e-9)
        unmeasured = plain.prep_truth(sizes, topk=False, contexts=ctx, controller="repeat")
        assert unmeasured - bare == pytest.approx(repeat_s, rel=1e-9)
    with pytest.raises(ConfigError, match="controller_chain"):
        GroundTruth("bad", controller_chain_step_s=-0.5)


def test_size_factors_shrink_a_few_steps_towards_one() -> None:
    """The joint budget divides its cost by the size calibration's factors: three steps that
    realised far from their surrogate must not move a size's price as much as many such steps
    do (negative control: the shrinkage is not a cap)."""
    from bastion.cycles import LATTICE

    def factor(steps: int) -> float:
        cal = SizeCalibration()
        n = 32
        tree = TreeBatch(  # a root and 31 children of score 0.2: Â = 7.2
            np.array([0, n]),
            np.r_[-1, np.zeros(n - 1, np.int64)],
            np.arange(n),
            np.r_[0, np.ones(n - 1, np.int64)],
            np.r_[1.0, np.full(n - 1, 0.2)],
            np.r_[-1, np.arange(n - 1)],
        )
        for _ in range(steps):  # each step commits 2 (the sixth child, then the bonus)
            cal.observe(tree, np.array([5]), np.array([2]))
        return float(cal.factors(1)[int(np.searchsorted(LATTICE, n))])

    few, many = factor(3), factor(400)
    assert (few - 1.0) * (many - 1.0) > 0  # the same direction
    assert abs(few - 1.0) < 0.5 * abs(many - 1.0)


@settings(max_examples=60, deadline=None)
@given(rows=batches(max_requests=3, max_depth=5), data=st.data())
def test_the_chain_shadow_is_what_the_chain_cut_at_the_tree_depth_commits(
    rows: list[DraftMarginals], data: st.DataObject
) -> None:
    """Invariant (T = 0): on a verified best-first tree step, the chain's shadow equals the
    chain policy's own tree, cut at each tree's depth, verified against the same target —
    committed tokens and Â alike."""
    from bastion.bestfirst import COMPILED, accepted_paths

    if not COMPILED:
        pytest.skip("the compiled kernel is not built")
    depth = max(m.depth for m in rows)
    trees = [best_first_tree(m, data.draw(st.integers(1, 40))) for m in rows]
    batch = TreeBatch.from_trees(trees)
    target = np.array(  # the drafter's rank 0 or 1 at each depth, or a token it never drafts
        [
            [
                int(m.token_ids[d, data.draw(st.integers(0, 2)) % m.token_ids.shape[1]])
                if d < m.depth and data.draw(st.booleans())
                else 10**6
                for d in range(depth)
            ]
            for m in rows
        ],
        np.int64,
    )
    walked = accepted_paths(batch.parents, batch.tokens, batch.depths, batch.offsets, target)
    assert walked is not None
    counts, _, _, nodes = walked
    top1 = np.zeros((len(rows), depth))
    for i, m in enumerate(rows):
        top1[i, : m.depth] = m.probs[:, 0]
    realised, predicted = chain_shadow(batch, nodes, counts + 1, top1)
    # the learner's hot path: the compiled step's leading runs and depths, the cut chain's Â
    acceptance = AcceptanceCalibration()
    acceptance.calibrate(BatchMarginals.from_rows(rows))
    learned = learn_step(acceptance, SizeCalibration(), batch, nodes, counts + 1)
    if learned is not None:  # None where every tree is a root alone
        chain_cut = np.cumsum(np.cumprod(top1, axis=1), axis=1)
        fast = shadow_of(*learned, chain_cut)
        assert fast[0] == realised
        assert fast[1] == pytest.approx(predicted, rel=1e-12)
    chains = []
    for m, t in zip(rows, trees, strict=True):
        cut = int(np.max(t.depths))
        chains.append(ChainPolicy(cut).choose(m, PolicyContext(StepLoad(10))).tree if cut else t)
    chain_batch = TreeBatch.from_trees(chains)
    walked = accepted_paths(
        chain_batch.parents, chain_batch.tokens, chain_batch.depths, chain_batch.offsets, target
    )
    assert walked is not None
    assert realised == float(np.sum(walked[0] + 1))
    assert predicted == pytest.approx(float(chain_batch.scores.sum()), rel=1e-12)


class CountingPrior(FlatPrior):
    """A FlatPrior that counts the verify-only observations the engine hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.observed = 0

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        self.observed += 1


class CountingLearner(LearnedCostModel):
    """A LearnedCostModel that counts the verify-only observations the engine hands it."""

    observed = 0
    steps = 0

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        self.observed += 1

    def observe_step(self, *args: Any, **kwargs: Any) -> None:
        self.steps += 1
        super().observe_step(*args, **kwargs)


def test_the_engine_hands_verify_passes_only_to_a_model_that_learns_from_them() -> None:
    """A plain cost model sees every step's verify pass; a learning one (which learns whole
    steps through observe_step and ignores verify passes) is not handed them: the engine
    builds no load for it."""
    prior = CountingPrior()
    engine = SpecEngine(SureDrafter(), make_policy("fixed:4"), TopChainVerifier(), cost_model=prior)
    for _ in range(3):
        engine.step(_requests(2))
    assert prior.observed == 3
    learner = CountingLearner(FlatPrior(), explore_every=0)
    engine = SpecEngine(SureDrafter(), LearningPolicy(64), TopChainVerifier(), cost_model=learner)
    for _ in range(3):
        engine.step(_requests(2))
    assert learner.observed == 0
    assert learner.steps == 3  # it learned the three steps instead
