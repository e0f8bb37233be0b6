"""``bastion:every=K``: the learning controller decides every K drafted steps and repeats the
decision between (its host time is the price of deciding); the simulator charges each path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.batch import BatchMarginals, StepRequests, TreeBatch
from bastion.controller import LearningPolicy
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BudgetError, ConfigError
from bastion.interfaces import BatchPolicyContext, CostCurve, StepLoad
from bastion.joint import forest_batch
from bastion.learned import LearnedCostModel
from bastion.policies import make_policy
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.tree import DraftMarginals
from tests.strategies import batches


class FlatPrior:
    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        return CostCurve(0.0, 0.0, 10e-3 + 10e-6 * n, 8e-3)

    def step_cost(self, tree_size: int, load: StepLoad):  # type: ignore[no-untyped-def]
        from bastion.interfaces import StepCost

        return StepCost(0.0, 0.0, 10e-3 + 10e-6 * tree_size)

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        pass


def _marginals(b: int, seed: int) -> BatchMarginals:
    rng = np.random.default_rng(seed)
    p = np.sort(rng.dirichlet(np.ones(6), size=(b, 5))[..., :4], axis=-1)[..., ::-1]
    ids = np.broadcast_to(np.arange(4), (b, 5, 4)) + 10 * np.arange(5)[None, :, None]
    return BatchMarginals(np.ascontiguousarray(ids), np.ascontiguousarray(p))


def _steps(policy: LearningPolicy, learner: LearnedCostModel, batches: list[int]):  # type: ignore[no-untyped-def]
    out = []
    for i, b in enumerate(batches):
        req = StepRequests.of(np.arange(b), np.full(b, 100 + i), np.zeros(b, np.int64))
        m = _marginals(b, i)
        choice = policy.choose_batch(m, BatchPolicyContext(req, learner))
        out.append((choice, m))
        trees = choice.trees
        learner.observe_step(
            choice.kind, req.context_lens, trees, np.ones(b, np.int64), np.zeros(0, np.int64), 0.01
        )
    return out


def test_agreeing_decisions_stand_longer_up_to_every() -> None:
    learner = LearnedCostModel(FlatPrior())

    def stands() -> int:  # steps the last decision is repeated for before a new one
        n = 0
        while learner.repeat_decision(1) is not None:
            n += 1
        return n

    learner.decided("tree", 1, 64, 0.01, 8)
    assert stands() == 0  # a first decision stands for its own step only
    learner.decided("tree", 1, 70, 0.01, 8)  # agrees (within ±25 %): twice as long
    assert stands() == 1
    learner.decided("tree", 1, 64, 0.01, 8)
    assert stands() == 3
    learner.decided("tree", 1, 64, 0.01, 8)
    assert stands() == 7
    learner.decided("tree", 1, 64, 0.01, 8)  # capped at every = 8
    assert stands() == 7
    learner.decided("tree", 1, 96, 0.01, 8)  # differs: decide again next step
    assert stands() == 0
    learner.decided("chain", 1, 96, 0.01, 8)  # another kind differs too
    assert stands() == 0
    learner.decided("chain", 1, 96, 0.01, 8)
    assert learner.repeat_decision(1) == ("chain", 96, 0.01)
    assert learner.repeat_decision(2) is None  # another batch size decides afresh


def test_decisions_repeat_only_with_every_above_one() -> None:
    runs = {}
    for every in (1, 8):
        learner = LearnedCostModel(FlatPrior(), explore_every=0)
        runs[every] = _steps(LearningPolicy(64, decide_every=every), learner, [2] * 12)
    assert not any(c.diagnostics.repeated for c, _ in runs[1])  # negative control
    assert sum(c.diagnostics.repeated for c, _ in runs[8]) >= 4
    decided = None
    for choice, _ in runs[8]:  # a repeated step keeps the decided kind and size
        if choice.diagnostics.repeated:
            assert (choice.kind, int(choice.trees.offsets[-1])) == decided
        else:
            decided = (choice.kind, int(choice.trees.offsets[-1]))


def test_batch_one_decides_every_step() -> None:
    """At batch 1 the decision is cheap and the step's own Â matters most: no repeats."""
    learner = LearnedCostModel(FlatPrior(), explore_every=0)
    steps = _steps(LearningPolicy(64, decide_every=8), learner, [1] * 10)
    assert not any(c.diagnostics.repeated for c, _ in steps)
    learner = LearnedCostModel(FlatPrior(), explore_every=0)  # the same marginals at batch 2
    steps = _steps(LearningPolicy(64, decide_every=8), learner, [2] * 10)
    assert any(c.diagnostics.repeated for c, _ in steps)


def test_batch_size_change_and_ar_step_force_a_decision() -> None:
    learner = LearnedCostModel(FlatPrior(), explore_every=0)
    steps = _steps(LearningPolicy(64, decide_every=4), learner, [2, 2, 2, 3, 3])
    repeated = [bool(c.diagnostics.repeated) for c, _ in steps]
    assert repeated[3] is False  # the batch grew: a fresh decision
    assert repeated[2] is True  # agreeing decisions at steps 0 and 1
    b2 = steps[2][0]
    total = int(steps[1][0].trees.offsets[-1])
    cal = learner.acceptance.calibrate(steps[2][1])  # g unchanged within 8 steps
    ref = forest_batch(cal, 64, total)
    for name in ("offsets", "parents", "depths", "ranks", "scores", "tokens"):
        assert np.array_equal(getattr(b2.trees, name), getattr(ref, name)), name
    learner.observe_step(
        "ar",
        np.array([5, 5, 5]),
        TreeBatch.roots(3),
        np.ones(3, np.int64),
        np.zeros(0, np.int64),
        0.01,
    )
    assert learner.repeat_decision(3) is None  # an AR step came between


def test_every_spec_and_its_errors() -> None:
    assert make_policy("bastion:every=4").decide_every == 4
    assert make_policy("bastion:256,every=2") == LearningPolicy(256, 2)
    for bad in (
        "bastion:every=0",
        "bastion:every=x",
        "bastion:paper,every=2",
        "bastion:every=2,every=3",
        "bastion:every=99999999999999999999",
    ):
        with pytest.raises(BudgetError):
            make_policy(bad)
    with pytest.raises(BudgetError):
        LearningPolicy(64, decide_every=0)


def test_the_simulator_charges_the_path_taken() -> None:
    model = get_model("qwen3-8b")
    hw = get_profile("h100-sxm")
    truth = GroundTruth(
        "t",
        controller_single_s=400e-6,
        controller_step_s=500e-6,
        controller_request_s=1e-6,
        controller_repeat_single_s=50e-6,
        controller_repeat_step_s=60e-6,
        controller_repeat_request_s=2e-6,
        noise=0.0,
    )
    gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), truth)
    assert gpu.prep_truth([64], True, [100], True) > gpu.prep_truth([64], True, [100], "repeat")
    decide_1 = gpu.prep_truth([64], True, [100], True) - gpu.prep_truth([64], True, [100], "repeat")
    assert decide_1 == pytest.approx(350e-6, rel=1e-6)
    d4 = gpu.prep_truth([8] * 4, True, [100] * 4, True)
    r4 = gpu.prep_truth([8] * 4, True, [100] * 4, "repeat")
    assert d4 - r4 == pytest.approx((500e-6 - 60e-6) + 4 * (1e-6 - 2e-6), rel=1e-6)
    # not measured (−1, the default): a repeat is charged as a decision
    plain = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), GroundTruth("u", noise=0.0))
    assert plain.prep_truth([64], True, [100], "repeat") == plain.prep_truth(
        [64], True, [100], True
    )
    with pytest.raises(ConfigError, match="controller_repeat"):
        GroundTruth("v", controller_repeat_single_s=-2.0)


@settings(max_examples=40, deadline=None)
@given(
    rows=batches(max_requests=4, max_depth=5), n_max=st.integers(1, 12), extra=st.integers(0, 40)
)
def test_the_compiled_forest_batch_equals_the_python_lookup(
    rows: list[DraftMarginals], n_max: int, extra: int
) -> None:
    """A standing joint decision's trees: the kernel looks up the tokens itself, exactly as the
    Python wrapping does from the forest's arrays (roots' token −1)."""
    import bastion.joint as joint

    if joint._compiled is None:
        pytest.skip("the compiled kernel is not built")
    cal = BatchMarginals.from_rows(rows)
    total = len(rows) + extra
    fast = forest_batch(cal, n_max, total)
    saved, joint._compiled = joint._compiled, None
    try:
        slow = forest_batch(cal, n_max, total)
    finally:
        joint._compiled = saved
    for name in ("offsets", "parents", "depths", "ranks", "scores", "tokens"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name


def _flat_until(added: int):  # type: ignore[no-untyped-def]
    """A joint curve under which every total up to ``added`` nodes beyond the roots is equally
    cheap and anything beyond prohibitive: the joint budget then takes exactly that total."""

    def curve(grow: np.ndarray) -> CostCurve:
        m = np.arange(grow.shape[0] + 1)
        return CostCurve(0.0, 0.0, np.where(m <= added, 1.0, 1e9), 1.0)

    return curve


@settings(max_examples=60, deadline=None)
@given(b=st.integers(2, 5), seed=st.integers(0, 10_000), n_max=st.sampled_from([4, 16, 64]))
def test_a_batched_exploring_step_verifies_the_joint_allocation_of_the_dearer_total(
    b: int, seed: int, n_max: int
) -> None:
    """An exploring batched step verifies the largest total at most EXPLORE_COST times as dear
    as the decision's, allocated as the joint budget allocates a total (the forest grown in
    merged order: the joint budget on a curve flat up to that total)."""
    from bastion.controller import EXPLORE_COST
    from bastion.joint import choose_joint_batch

    learner = LearnedCostModel(FlatPrior(), explore_every=2)  # the first drafted step explores
    req = StepRequests.of(np.arange(b), np.full(b, 300), np.zeros(b, np.int64))
    m = _marginals(b, seed)
    cal = learner.acceptance.calibrate(m)
    decision = LearningPolicy(n_max).choose_batch(m, BatchPolicyContext(req, learner))
    learner.explore_every = 0
    plain = LearningPolicy(n_max).choose_batch(m, BatchPolicyContext(req, learner))
    total = int(plain.diagnostics.tree_diagnostics.total_size)  # the joint tree's (even where
    target = learner.affordable_total(req.context_lens, total, n_max, EXPLORE_COST)  # … the
    if target > total:  # decision then picked the chain: an exploring step keeps its tree)
        ref = choose_joint_batch(cal, _flat_until(target - b), n_max, "auto", 64)[0]
    else:
        contexts = req.context_lens
        ref = choose_joint_batch(
            cal, lambda g: learner.joint_decision_curve(contexts, g, n_max), n_max, "auto", 64
        )[0]
    assert decision.kind == "tree"
    for name in ("offsets", "parents", "depths", "ranks", "scores", "tokens"):
        assert np.array_equal(getattr(decision.trees, name), getattr(ref, name)), name
