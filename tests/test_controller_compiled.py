"""The compiled batch-1 size choice (``bastion._bestfirst.choose``) is the Python loop of
:func:`bastion.controller.choose_size`, bit for bit: same tree, same candidates, same Â-credited
expectations, Ŝ and choice, on any marginals, cost table, gain ratios and start."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.controller as controller
from bastion.batch import BatchMarginals
from bastion.cycles import token_lattice
from bastion.interfaces import CostCurve
from bastion.joint import choose_joint_batch
from bastion.learned import LearnedCostModel
from bastion.tree import DraftMarginals
from tests.test_learned import FlatPrior

IntArray = npt.NDArray[np.int64]

pytestmark = pytest.mark.skipif(controller._kernel is None, reason="no compiled kernel")


@st.composite
def _cases(draw: st.DrawFn) -> tuple[DraftMarginals, LearnedCostModel, int, int, int]:
    depth = draw(st.integers(1, 8))
    k = draw(st.integers(1, 4))
    raw = draw(
        st.lists(
            st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.9, 1.0]), min_size=depth * k, max_size=depth * k
        )
    )
    probs = -np.sort(-np.asarray(raw, np.float64).reshape(depth, k), axis=1)
    probs /= np.maximum(probs.sum(axis=1, keepdims=True), 1.0)
    ids = np.arange(depth * k, dtype=np.int64).reshape(depth, k) + 7
    learner = LearnedCostModel(FlatPrior(slope=draw(st.sampled_from([0.0, 1e-6, 2e-5]))))
    context = draw(st.integers(0, 4096))
    for n in draw(st.lists(st.sampled_from(token_lattice(1024).tolist()), max_size=12)):
        step = draw(st.sampled_from([0.5, 1.0, 1.3, 3.0]))
        learner.observe_cycle("tree", np.array([context]), np.array([n]), 10e-3 * step)
    cells = token_lattice(1024).shape[0]
    h = np.asarray(
        draw(st.lists(st.sampled_from([0.0, 0.3, 0.9, 1.0, 1.7]), min_size=cells, max_size=cells)),
        np.float64,
    )
    h.flags.writeable = False
    learner.sizes.gain_ratios = lambda _b: h  # type: ignore[method-assign]
    n_max = draw(st.sampled_from([1, 5, 8, 64, 100, 256, 1024]))
    start = draw(st.integers(1, 600))
    return DraftMarginals(ids, probs), learner, context, n_max, start


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_compiled_choice_is_the_python_loop(
    case: tuple[DraftMarginals, LearnedCostModel, int, int, int],
) -> None:
    marginals, learner, context, n_max, start = case
    tree, diag = controller.choose_size(marginals, learner, context, n_max, start)
    kernel, controller._kernel = controller._kernel, None
    try:
        ref_tree, ref = controller.choose_size(marginals, learner, context, n_max, start)
    finally:
        controller._kernel = kernel
    assert diag.tree_size == ref.tree_size and diag.best == ref.best
    for name in ("parents", "tokens", "depths", "scores", "ranks"):
        assert np.array_equal(getattr(tree, name), getattr(ref_tree, name)), name
    for name in ("sizes", "a_hat", "c_hat", "s_hat"):
        assert np.array_equal(getattr(diag, name), getattr(ref, name)), name
    assert diag.ar_step_s == ref.ar_step_s


@settings(max_examples=100, deadline=None)
@given(_cases(), st.sampled_from([0, 5, 40]))
def test_the_batch_1_policy_step_is_choose_size(
    case: tuple[DraftMarginals, LearnedCostModel, int, int, int], previous: int
) -> None:
    """LearningPolicy's batch-1 step (compiled, or the Python loop) verifies choose_size's tree
    on the calibrated marginals, from the start the previous tree gives; both price the chain
    alike and leave the same cut of it for the chain's shadow."""
    from bastion.batch import StepRequests
    from bastion.interfaces import BatchPolicyContext

    marginals, learner, context, n_max, _ = case
    learner.explore_every = 0
    batch = BatchMarginals(marginals.token_ids[None], marginals.probs[None])
    req = StepRequests.of(np.array([0]), np.array([context]), np.array([0]), np.array([previous]))
    start = max(32, 2 * previous) if previous else 64
    chains = []
    for compiled in (True, False):
        kernel = controller._kernel
        if not compiled:
            controller._kernel = None
        try:
            policy = controller.LearningPolicy(n_max)
            choice = policy.choose_batch(batch, BatchPolicyContext(req, learner))
            cal = learner.acceptance.calibrate(batch).row(0)
            ref, _ = controller.choose_size(cal, learner, context, n_max, start)
        finally:
            controller._kernel = kernel
        chains.append((choice.diagnostics.chain_speedup, learner.last_chain))
        if choice.kind == "tree":
            got = choice.trees
            assert np.array_equal(got.offsets, [0, ref.size])
            for name in ("parents", "tokens", "depths", "scores", "ranks"):
                assert np.array_equal(getattr(got, name), getattr(ref, name)), name
    (s_compiled, cut_compiled), (s_python, cut_python) = chains
    assert np.array_equal([s_compiled], [s_python], equal_nan=True)
    if cut_compiled is None:  # nothing to draft: an AR step
        assert cut_python is None and not marginals.probs[:, 0].any()
        return
    assert cut_compiled.shape == cut_python.shape == (1, marginals.probs.shape[0])
    assert np.array_equal(cut_compiled, cut_python)


def test_compiled_choice_refuses_bad_buffers() -> None:
    p = np.full((2, 2), 0.5)
    ids = np.zeros((2, 2), np.int64)
    sizes = np.array([1, 2, 4], np.int64)
    ones = np.ones(3)
    kernel = controller._kernel
    with pytest.raises(ValueError, match="depth"):
        kernel.choose(p, ids, 3, 2, 4, sizes, ones, ones, 1.0)
    with pytest.raises(ValueError, match="m >= 1"):
        kernel.choose(p, ids, 2, 2, 4, sizes, ones[:2], ones, 1.0)
    with pytest.raises(ValueError, match="start at 1"):
        kernel.choose(p, ids, 2, 2, 4, sizes + 1, ones, ones, 1.0)
    with pytest.raises(ValueError, match="ascending"):
        kernel.choose(p, ids, 2, 2, 4, sizes[[0, 2, 1]], ones, ones, 1.0)


@st.composite
def _joint_cases(draw: st.DrawFn) -> tuple[BatchMarginals, LearnedCostModel, IntArray, int, int]:
    b = draw(st.integers(2, 6))
    depth = draw(st.integers(1, 5))
    k = draw(st.integers(1, 3))
    raw = draw(
        st.lists(
            st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.9, 1.0]),
            min_size=b * depth * k,
            max_size=b * depth * k,
        )
    )
    probs = -np.sort(-np.asarray(raw, np.float64).reshape(b, depth, k), axis=2)
    probs /= np.maximum(probs.sum(axis=2, keepdims=True), 1.0)
    ids = np.arange(b * depth * k, dtype=np.int64).reshape(b, depth, k) + 3
    learner = LearnedCostModel(FlatPrior(slope=draw(st.sampled_from([0.0, 1e-6, 2e-5]))))
    contexts = np.asarray(draw(st.lists(st.integers(0, 3000), min_size=b, max_size=b)), np.int64)
    for total in draw(st.lists(st.integers(b, 40 * b), max_size=10)):
        step = draw(st.sampled_from([0.5, 1.0, 1.3, 3.0]))
        sizes = np.full(b, total // b, np.int64)
        sizes[: total % b] += 1
        learner.observe_cycle("tree", contexts, sizes, 10e-3 * step)
    n_max = draw(st.sampled_from([1, 2, 5, 16, 64, 1024]))
    start = draw(st.one_of(st.integers(1, 3), st.integers(1, 200)))  # small: the bounds decide
    return BatchMarginals(ids, probs), learner, contexts, n_max, start


@settings(max_examples=300, deadline=None)
@given(case=_joint_cases(), riding=st.sampled_from([0, 0, 1, 37, 512]))
def test_compiled_joint_budget_is_the_python_loop(
    case: tuple[BatchMarginals, LearnedCostModel, IntArray, int, int], riding: int
) -> None:
    """The compiled joint budget is choose_joint_batch on the learned decision curve: same
    allocation, trees and chosen Ŝ, and the same chain grown, so both stop bounds (the
    unbuilt mass and the decision curve's floor) stop where the Python loop does (the mass
    bound's sums are sequential in C, pairwise in numpy, within its 1e-12 slack); with a
    prefill chunk of ``riding`` tokens in the pass too."""
    marginals, learner, contexts, n_max, start = case
    fast = controller._choose_joint_compiled(marginals, learner, contexts, n_max, start, riding)
    trees, ref = choose_joint_batch(
        marginals,
        lambda grow: learner.joint_decision_curve(contexts, grow, n_max, riding),
        n_max,
        "auto",
        min(start, n_max),
    )
    assert fast is not None
    got, diag = fast
    assert diag.tree_sizes == ref.tree_sizes and diag.total_size == ref.total_size
    for name in ("offsets", "parents", "tokens", "depths", "scores", "ranks"):
        assert np.array_equal(getattr(got, name), getattr(trees, name)), name
    assert diag.predicted_speedup == ref.predicted_speedup
    assert (diag.exhausted, diag.capped, diag.ar_step_s) == (
        ref.exhausted,
        ref.capped,
        ref.ar_step_s,
    )
    assert diag.s_hat.shape == ref.s_hat.shape  # the same stop: the chain grown as far
    for name in ("a_hat_total", "c_hat", "s_hat"):
        assert np.array_equal(getattr(diag, name), getattr(ref, name)), name


def test_compiled_joint_budget_answers_when_the_lattice_ends_first() -> None:
    """B·(N_max − 1) beyond the priced totals, but a lattice too small to reach them: the
    chain ends before the horizon, so the compiled loop answers (it used to hand such a batch
    back unasked, found by the property test above)."""
    b, depth, k = 5, 5, 3
    probs = np.zeros((b, depth, k))
    probs[3:] = 0.05
    ids = np.arange(b * depth * k, dtype=np.int64).reshape(b, depth, k) + 3
    marginals = BatchMarginals(ids, probs)
    learner = LearnedCostModel(FlatPrior(slope=0.0))
    contexts = np.zeros(b, np.int64)
    n_max, start = 1024, 3
    cells, _, _ = learner.joint_decision_arrays(contexts, n_max)
    assert b * (n_max - 1) > cells.shape[0] - 1  # the request asks past the priced totals
    fast = controller._choose_joint_compiled(marginals, learner, contexts, n_max, start)
    trees, ref = choose_joint_batch(
        marginals,
        lambda grow: learner.joint_decision_curve(contexts, grow, n_max),
        n_max,
        "auto",
        start,
    )
    assert fast is not None
    assert fast[1].tree_sizes == ref.tree_sizes and fast[1].exhausted == ref.exhausted
    assert np.array_equal(fast[0].offsets, trees.offsets)


def test_compiled_joint_budget_hands_back_what_it_cannot_price() -> None:
    """A chain beyond the priced totals, or a cost that is not finite and > 0: status, not an
    answer (the caller's Python loop prices further or raises)."""
    kernel = controller._kernel
    probs = np.full((2, 3, 2), 0.5)
    ids = np.zeros((2, 3, 2), np.int64)
    mass = np.full(2, 8.0)
    cells = np.arange(3, dtype=np.int64)
    ones = np.ones(3)
    out = kernel.joint(probs, ids, 3, 2, 8, 4, 14, mass, cells, ones, 1.0)
    assert out[0] == -2  # 4 added nodes, 2 priced
    out = kernel.joint(probs, ids, 3, 2, 8, 1, 14, mass, cells, ones * -1.0, 1.0)
    assert out[0] == -1
    with pytest.raises(ValueError, match="inconsistent"):
        kernel.joint(probs, ids, 3, 2, 8, 1, 15, mass, cells, ones, 1.0)
    with pytest.raises(ValueError, match="out of range"):
        kernel.joint(probs, ids, 3, 2, 8, 1, 14, mass, cells + 1, ones, 1.0)
    for low in (-1, np.iinfo(np.int64).min):  # below 0 too (the check is branch-free)
        with pytest.raises(ValueError, match="out of range"):
            kernel.joint(probs, ids, 3, 2, 8, 1, 14, mass, cells + low, ones, 1.0)


@settings(max_examples=200, deadline=None)
@given(case=_joint_cases(), slope=st.sampled_from([1e-3, 1e-2, 0.1, 1.0]))
def test_the_joint_kernel_computes_the_lattice_masses_it_is_not_given(
    case: tuple[BatchMarginals, LearnedCostModel, IntArray, int, int], slope: float
) -> None:
    """Given no masses, the kernel computes bastion.joint._lattice_mass itself: the same
    answer and the same chain grown. On a rising cost (every total its own cell) the stop
    bound, which reads the masses, decides how far the chain grows."""
    from bastion.joint import _lattice_mass

    marginals, _, _, n_max, start = case
    b, depth, k = marginals.probs.shape
    most = b * (n_max - 1)
    start = start % (2 * b) + 1
    totals = most + 1
    cells = np.arange(totals, dtype=np.int64)
    even = 1.0 + slope * np.arange(totals)
    runs = []
    for mass in (b"", _lattice_mass(marginals.probs)):
        out = controller._kernel.joint(
            np.ascontiguousarray(marginals.probs),
            np.ascontiguousarray(marginals.token_ids),
            depth,
            k,
            n_max,
            min(start, most),  # a small first round: the bound decides how far it grows
            most,
            mass,
            cells,
            even,  # the cheapest cost at or above each cell: the rising cost itself
            1.0,
        )
        runs.append(out)
    assert runs[0] == runs[1]


def test_compiled_joint_budget_stops_where_the_floor_says() -> None:
    """On drafter-like marginals and a rising, stepped learned cost (where the decision
    curve's floor, not the unbuilt mass, ends the growth), the compiled joint budget grows the
    same chain as the Python loop; and the floor does end it early in several of the cases
    (the Python loop without the floor grows further there, to the same choice)."""
    import dataclasses

    from bastion.sim.synthetic import SyntheticSource
    from bastion.sim.workloads import get_workload

    decided = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        b = int(rng.integers(2, 12))
        source = SyntheticSource(get_workload(("math", "code", "chat")[seed % 3]), seed)
        for i in range(b):
            source.admit(i, i)
        contexts = np.full(b, 300, np.int64)
        marginals = source.draft(np.arange(b), contexts)[0]
        learner = LearnedCostModel(FlatPrior(slope=float(rng.choice([3e-5, 1e-4, 3e-4]))))
        for _ in range(int(rng.integers(0, 12))):
            total = int(rng.integers(b, 64 * b))
            sizes = np.full(b, total // b, np.int64)
            sizes[: total % b] += 1
            learner.observe_cycle("tree", contexts, sizes, 10e-3 * float(rng.choice([0.5, 1, 3])))
        # small first rounds: the bounds are checked at many chain lengths
        n_max, start = int(rng.choice([64, 256, 1024])), int(rng.integers(1, 4))

        def curve(grow: IntArray, floor: bool = True) -> CostCurve:
            cc = learner.joint_decision_curve(contexts, grow, n_max)  # noqa: B023
            return cc if floor else dataclasses.replace(cc, floor_s=None)

        _, ref = choose_joint_batch(marginals, curve, n_max, "auto", start)
        fast = controller._choose_joint_compiled(marginals, learner, contexts, n_max, start)
        if fast is None:  # the chain outgrew the priced totals: the Python loop's answer
            assert ref.s_hat.shape[0] > learner.joint_decision_arrays(contexts, n_max)[0].shape[0]
            continue
        assert fast[1].total_size == ref.total_size
        assert np.array_equal(fast[1].s_hat, ref.s_hat)  # the same chain, grown as far
        _, bare = choose_joint_batch(
            marginals, lambda g: curve(g, floor=False), n_max, "auto", start
        )
        assert bare.total_size == ref.total_size  # stopping earlier lost nothing
        assert bare.predicted_speedup == ref.predicted_speedup
        decided += bare.s_hat.shape[0] > ref.s_hat.shape[0]
    assert decided >= 5


def test_compiled_joint_budget_regrows_by_the_fractional_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between bounded rounds the chain is regrown by ``_growth``'s factor, 1.25–8×, not a
    whole one: the compiled loop grows the same chain as the Python loop where that factor is
    below 2 (the learned curve's steps make it rare: the cases below, small first rounds on
    cycles rising at several rates, reach it a few times; tests/test_joint_compiled.py checks
    the paper controller's loop, which shares the compiled regrowth, on many more)."""
    import bastion.joint as joint
    from bastion.sim.synthetic import SyntheticSource
    from bastion.sim.workloads import get_workload

    factors: list[float] = []
    growth = joint._growth

    def recorded(c_hat: npt.NDArray[np.float64], c_needed: float) -> float:
        factors.append(growth(c_hat, c_needed))
        return factors[-1]

    monkeypatch.setattr(joint, "_growth", recorded)
    fractional = 0
    for seed in range(80):
        rng = np.random.default_rng(100 + seed)
        b = int(rng.integers(2, 24))
        source = SyntheticSource(get_workload(("math", "code", "chat")[seed % 3]), seed)
        for i in range(b):
            source.admit(i, i)
        contexts = np.full(b, int(rng.integers(100, 4000)), np.int64)
        marginals = source.draft(np.arange(b), contexts)[0]
        learner = LearnedCostModel(FlatPrior(slope=float(rng.choice([1e-5, 3e-5, 1e-4]))))
        n_max, start = int(rng.choice([64, 256, 1024])), int(rng.integers(2, 6))
        del factors[:]
        _, ref = choose_joint_batch(
            marginals,
            lambda g: learner.joint_decision_curve(contexts, g, n_max),  # noqa: B023
            n_max,
            "auto",
            start,
        )
        fast = controller._choose_joint_compiled(marginals, learner, contexts, n_max, start)
        if fast is None:
            continue
        assert fast[1].s_hat.shape == ref.s_hat.shape  # grown as far as the Python loop
        assert np.array_equal(fast[1].s_hat, ref.s_hat)
        fractional += any(joint.GROWTH_MIN <= f < 2.0 for f in factors)
    assert fractional >= 3
