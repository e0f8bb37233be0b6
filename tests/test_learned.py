"""The learning controller's state (bastion.learned) and its choices (bastion.controller)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.batch import BatchMarginals, StepRequests, TreeBatch
from bastion.controller import LearningPolicy, choose_size
from bastion.errors import BudgetError, CostModelError
from bastion.interfaces import BatchPolicyContext, CostCurve, StepLoad
from bastion.learned import (
    LATTICE,
    AcceptanceCalibration,
    CycleTable,
    LearnedCostModel,
    SizeCalibration,
    lattice_index,
    token_lattice,
)
from bastion.learned_prior import PricedPrior
from bastion.policies import AdaptivePolicy, make_policy
from bastion.testing import lattice, marginals, optimal_acceptance
from bastion.tree import DraftMarginals, best_first_tree


class FlatPrior:
    """A cost model whose cycle is ``base + slope·N`` (no batch effects)."""

    def __init__(self, base: float = 10e-3, slope: float = 10e-6, ar: float = 8e-3) -> None:
        self.base, self.slope, self.ar = base, slope, ar

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        return CostCurve(0.0, 0.0, self.base + self.slope * n, self.ar)

    def step_cost(self, tree_size: int, load: StepLoad):  # type: ignore[no-untyped-def]
        from bastion.interfaces import StepCost

        return StepCost(0.0, 0.0, self.base + self.slope * tree_size)

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        pass


def test_token_lattice_is_dense_where_tiles_change() -> None:
    lat = token_lattice(1024)
    assert lat[0] == 1 and lat[-1] == 1024
    assert np.all(np.diff(lat) > 0)
    assert set(range(1, 9)) <= set(lat.tolist())
    assert set(range(8, 257, 8)) <= set(lat.tolist())
    assert token_lattice(100)[-1] == 100  # the cap itself is a candidate
    assert np.all(LATTICE[lattice_index([1, 9, 64, 65])] == [1, 16, 64, 72])


def test_cycle_table_median_ignores_one_outlier_and_fills_gaps() -> None:
    table = CycleTable(window=5)
    for r in (1.0, 1.02, 0.98, 5.0):  # one outlier among four
        table.observe("tree", 1, 64, r)
    table.observe("tree", 1, 256, 2.0)
    ratios = table.ratios("tree", 1)
    assert ratios[lattice_index(64)] == pytest.approx(1.01)
    assert 1.01 < ratios[lattice_index(128)] < 2.0  # interpolated between measured cells
    assert table.ratios("tree", 3)[lattice_index(64)] == pytest.approx(1.01)  # nearest bucket
    assert table.ratios("ar", 1)[0] == pytest.approx(1.5, rel=0.4)  # tree cells' typical
    table.observe("tree", 1, 64, float("nan"))  # a failed measurement teaches nothing
    assert table.count("tree", 1)[lattice_index(64)] == 4
    with pytest.raises(BudgetError):
        CycleTable(window=0)


@settings(max_examples=60, deadline=None)
@given(obs=st.lists(st.tuples(st.sampled_from([8, 64, 72, 256]), st.floats(0.5, 2.0)), max_size=40))
def test_cycle_table_noise_is_the_scaled_median_absolute_deviation(
    obs: list[tuple[int, float]],
) -> None:
    """noise() is 1.4826 × the median, over the stored ratios of every cell observed at least
    twice, of |ratio / the cell's median − 1| (0 with no such cell)."""
    table = CycleTable(window=5)
    stored: dict[int, list[float]] = {}
    for tokens, ratio in obs:
        table.observe("tree", 4, tokens, ratio)
        stored.setdefault(tokens, []).append(ratio)
    devs = [
        abs(r / float(np.median(kept)) - 1.0)
        for kept in (v[-5:] for v in stored.values())
        if len(kept) >= 2
        for r in kept
    ]
    expected = 1.4826 * float(np.median(devs)) if devs else 0.0
    assert table.noise("tree", 4) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 2.0), min_size=len(token_lattice(256)), max_size=80),
    st.lists(st.floats(0.0, 1.0), min_size=256, max_size=256),
)
def test_stepped_curve_argmax_is_the_best_lattice_point(
    ratios: list[float], gains: list[float]
) -> None:
    """On the stepped curve the argmax of Â/Ĉ over every N is the best lattice size."""
    sizes = token_lattice(256)
    cost = np.ones(256)
    for i, n in enumerate(sizes):  # each cell priced at its end, then at the lattice point
        lo = 0 if i == 0 else sizes[i - 1]
        cost[lo:n] = ratios[i]
    totals = np.arange(1, 257)
    stepped = LearnedCostModel.stepped(totals, cost)
    assert np.all(np.diff(stepped) >= 0)
    rho = np.r_[1.0, np.sort(np.asarray(gains))[::-1][:255]]
    a = np.cumsum(rho)  # Â(N): concave, non-decreasing
    best_any = float(np.max(a / stepped))
    best_lattice = float(np.max(a[sizes - 1] / cost[sizes - 1]))
    assert best_any == pytest.approx(best_lattice)


@settings(max_examples=80, deadline=None)
@given(marginals(max_depth=3, max_k=3), st.data())
def test_best_first_on_calibrated_marginals_is_optimal(m: DraftMarginals, data) -> None:  # type: ignore[no-untyped-def]
    """The calibrated objective Σ Π min(1, p·g) is maximised by best-first on the calibrated
    marginals, for any per-(depth, rank) factor g."""
    depth, k = m.probs.shape
    g = np.asarray(
        data.draw(st.lists(st.floats(0.05, 3.0), min_size=depth * k, max_size=depth * k))
    ).reshape(depth, k)
    cal = AcceptanceCalibration(depth=depth, ranks=k)
    cal._g[:, :] = g
    cal.steps = 1
    batch = BatchMarginals(m.token_ids[None], m.probs[None])
    q = cal.calibrate(batch).row(0)
    best = optimal_acceptance(q)
    for n in range(1, best.size):
        tree = best_first_tree(q, n)
        assert tree.size <= n  # nodes of ρ = 0 are never built: they add nothing
        assert float(tree.scores.sum()) == pytest.approx(best[n], rel=1e-9, abs=1e-12)


def _best_weighted(m: DraftMarginals, weight: np.ndarray, n: int) -> float:
    """max over prefix-closed trees of n nodes of Σ ρ·weight[depth] (brute force)."""
    nodes, score = lattice(m)
    others = [v for v in nodes if v]
    best = -1.0
    for combo in itertools.combinations(others, n - 1):
        chosen = set(combo) | {()}
        if all(v[:-1] in chosen for v in combo):
            best = max(best, sum(score[v] * weight[len(v)] for v in chosen))
    return best


def test_negative_control_a_growing_depth_factor_breaks_best_first() -> None:
    """With a factor that grows with depth (not what AcceptanceCalibration can produce: its
    values are clipped at 1), best-first on the raw marginals is no longer optimal."""
    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.4], [0.5, 0.45]])
    weight = np.array([1.0, 1.0, 3.0])  # deep nodes worth three times their ρ
    tree = best_first_tree(m, 3)
    got = float(sum(s * weight[d] for s, d in zip(tree.scores, tree.depths, strict=True)))
    assert got < _best_weighted(m, weight, 3) - 1e-9
    flat = np.ones(3)  # the positive side: with a constant factor best-first is optimal
    got_flat = float(tree.scores.sum())
    assert got_flat == pytest.approx(_best_weighted(m, flat, 3))


def _chain_tree(depth: int) -> TreeBatch:
    n = depth + 1
    return TreeBatch(
        np.array([0, n]),
        np.arange(-1, n - 1),
        np.zeros(n, np.int64),
        np.arange(n),
        np.cumprod(np.r_[1.0, np.full(depth, 0.5)]),
        np.r_[-1, np.zeros(depth, np.int64)],
    )


def test_acceptance_calibration_learns_an_overconfident_drafter() -> None:
    """The drafter says 0.9 at every position; the target accepts half of them."""
    cal = AcceptanceCalibration(depth=4, ranks=2)
    probs = np.tile([[0.9, 0.05]], (4, 1))[None]
    ids = np.tile([[1, 2]], (4, 1))[None]
    batch = BatchMarginals(ids, probs)
    rng = np.random.default_rng(0)
    for _ in range(400):
        q = cal.calibrate(batch)
        tree = TreeBatch(
            np.array([0, 5]),
            np.arange(-1, 4),
            np.zeros(5, np.int64),
            np.arange(5),
            np.cumprod(np.r_[1.0, q.probs[0, :, 0]]),
            np.r_[-1, np.zeros(4, np.int64)],
        )
        accepted = 0
        while accepted < 4 and rng.random() < 0.45:
            accepted += 1
        cal.observe(tree, np.arange(1, accepted + 1), np.array([accepted + 1]))
    g = cal.factors(4, 2)[:, 0]
    assert np.all(np.abs(g * 0.9 - 0.45) < 0.1), g  # corrected to the realised rate
    # negative control: a calibration that saw nothing stays at the drafter's word
    assert np.all(AcceptanceCalibration(depth=4, ranks=2).factors(4, 2) == 1.0)


def test_size_calibration_counts_prefix_counterfactuals() -> None:
    sc = SizeCalibration(prior_weight=1e-9)
    tree = _chain_tree(15)  # a path: its prefix of n nodes holds the first n − 1 drafts
    sc.observe(tree, np.arange(1, 6), np.array([6]))  # five drafts accepted
    cells = lattice_index(token_lattice(16))
    a_hat = np.cumsum(tree.scores)[token_lattice(16) - 1]
    realised = sc.expected(1, cells, a_hat)  # this step's own Â: the realised τ back
    want = np.minimum(token_lattice(16), 6)
    assert np.allclose(realised, want)
    h = sc.gain_ratios(1)
    assert h[lattice_index(16)] == pytest.approx(0.0, abs=1e-6)  # 8 → 16 gained nothing
    assert h[lattice_index(2)] == pytest.approx(1.0 / 0.5)  # one token for ρ = 0.5


def test_size_calibration_pairs_increments_within_steps() -> None:
    """Large cells seen only on easy steps must not look better than small ones: increments
    are paired within the steps that observed them (a negative control: the unpaired means
    would say the large size commits more than it does)."""
    sc = SizeCalibration(prior_weight=1e-9)
    hard = _chain_tree(7)  # 8 nodes: observes cells 1 … 8
    for _ in range(10):
        sc.observe(hard, np.arange(1, 2), np.array([2]))  # hard steps: one draft accepted
    easy = _chain_tree(15)  # 16 nodes: observes cells 1 … 16
    sc.observe(easy, np.arange(1, 16), np.array([16]))  # one easy step: everything accepted
    h = sc.gain_ratios(1)
    scores = np.cumsum(easy.scores)
    cells = lattice_index(token_lattice(16))
    exp = sc.expected(1, cells, scores[token_lattice(16) - 1])
    assert h[lattice_index(16)] > 1.0  # only the easy step saw 8 → 16, and it gained all
    assert exp[-2] < 3.0  # but the level at 8 is set by all eleven steps (mostly hard)


def test_choose_size_prefers_the_cheap_measured_step() -> None:
    """A cost table with a step at 72 tokens: the controller stays at 64, not just past it."""
    learner = LearnedCostModel(FlatPrior(slope=0.0))
    for n in token_lattice(1024):
        learner.observe_cycle(
            "tree", np.array([100]), np.array([n]), 10e-3 * (3.0 if n > 64 else 1.0)
        )
    probs = np.tile([[0.8, 0.1, 0.05]], (15, 1))
    m = DraftMarginals(np.tile([[1, 2, 3]], (15, 1)), probs)
    tree, diag = choose_size(m, learner, 100, 1024)
    assert tree.size == 64
    assert diag.tree_size == 64 and 64 in diag.sizes.tolist()


def test_learning_policy_and_paper_policy_names() -> None:
    assert isinstance(make_policy("bastion"), LearningPolicy)
    assert make_policy("bastion:256").n_max == 256
    paper = make_policy("bastion:paper")
    assert isinstance(paper, AdaptivePolicy) and paper.name == "bastion:paper"
    assert make_policy("bastion:per-request").name == "bastion:per-request"
    for bad in ("bastion:paper,per-request", "bastion:0", "bastion:99999999999999999999"):
        with pytest.raises(BudgetError):
            make_policy(bad)


def test_learning_policy_needs_a_learned_cost_model() -> None:
    req = StepRequests.of([0], [10], [1])
    m = BatchMarginals(np.ones((1, 2, 1), np.int64), np.full((1, 2, 1), 0.5))
    with pytest.raises(BudgetError, match="cost model"):
        LearningPolicy().choose_batch(m, BatchPolicyContext(req, None))
    with pytest.raises(BudgetError, match="LearnedCostModel"):
        LearningPolicy().choose_batch(m, BatchPolicyContext(req, FlatPrior()))  # type: ignore[arg-type]


def test_wants_draft_probes_while_ar_is_faster() -> None:
    learner = LearnedCostModel(FlatPrior(), probe_every=4)
    assert learner.wants_draft(1)  # untried: speculate
    learner.speedup = learner.speedup_upper = 0.5  # speculation measured slower than AR
    asked = [learner.wants_draft(1) for _ in range(3)]
    assert asked == [False, False, False]
    learner._since_draft = 3
    assert learner.wants_draft(1)  # the fourth step probes


def test_size_calibration_counts_the_batch_merged_order() -> None:
    """Batch 2: the prefix of M nodes is the roots plus the M − 2 best non-root nodes of both
    trees by ρ; what it would have committed counts the accepted nodes among them."""
    rho0, rho1 = [1.0, 0.9, 0.5, 0.2], [1.0, 0.8, 0.7, 0.1]
    trees = TreeBatch(
        np.array([0, 4, 8]),
        np.array([-1, 0, 1, 2, -1, 0, 1, 2]),
        np.zeros(8, np.int64),
        np.array([0, 1, 2, 3, 0, 1, 2, 3]),
        np.array(rho0 + rho1),
        np.array([-1, 0, 0, 0, -1, 0, 0, 0]),
    )
    sc = SizeCalibration(prior_weight=1e-9)
    sc.observe(trees, np.array([1, 2, 1]), np.array([3, 2]))  # request 0: 2 drafts, 1: one
    totals = np.arange(2, 9)
    gains = np.sort(np.array(rho0[1:] + rho1[1:]))[::-1]
    predicted = 2 + np.concatenate(([0.0], np.cumsum(gains)))
    got = sc.expected(2, lattice_index(totals), predicted)
    # merged order: r0·0.9 (on path), r1·0.8 (on path), r1·0.7, r0·0.5 (on path), r0·0.2, r1·0.1
    assert np.allclose(got, [2, 3, 4, 4, 5, 5, 5])


def test_new_inputs_are_checked() -> None:
    from bastion.cli import main
    from bastion.errors import ConfigError
    from bastion.learned import calibrate_cycles
    from bastion.sim.simulate import SimSpec

    for bad in (-1, True, 1.5, 2_000_000):
        with pytest.raises(ConfigError, match="warmup_steps"):
            SimSpec(warmup_steps=bad)  # type: ignore[arg-type]
    assert main(["simulate", "--warmup-steps", "-1"]) == 2
    for kwargs in ({"window": 0}, {"probe_every": 0}, {"margin": -1.0}, {"evidence": 1}):
        with pytest.raises(BudgetError):
            LearnedCostModel(FlatPrior(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(BudgetError):
        LearnedCostModel(FlatPrior(), explore_every=-1)
    with pytest.raises(CostModelError):
        LearnedCostModel(object())  # type: ignore[arg-type]
    with pytest.raises(BudgetError):
        AcceptanceCalibration(depth=0)
    with pytest.raises(BudgetError):
        SizeCalibration(decay=0.0)
    with pytest.raises(BudgetError):
        calibrate_cycles(LearnedCostModel(FlatPrior()), lambda k, c, s: 1.0, repeats=0)


def test_batch_bucket_is_the_nearest_power_of_two_in_log_scale() -> None:
    """The table fast path and the general form agree (numpy integers, B past 1024), and bad
    batch sizes are refused."""

    from bastion.cycles import batch_bucket

    for b in range(1, 3000):
        want = min(10, round(math.log2(b)))
        assert batch_bucket(b) == want
        assert batch_bucket(np.int64(b)) == want
    for bad in (0, -3, True, 2.0, "4"):
        with pytest.raises(BudgetError):
            batch_bucket(bad)  # type: ignore[arg-type]


class ContextPrior(FlatPrior):
    """A FlatPrior whose cycle also grows with the context (so an anchor priced at the wrong
    context reads differently)."""

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        extra = 1e-6 * load.context_len
        return CostCurve(0.0, 0.0, self.base + self.slope * n + extra, self.ar + extra)


def test_memoised_cycles_follow_the_table() -> None:
    """The batch-1 candidate cycles and the mode cycles are kept between steps, but not past a
    change of the table: after the AR and N = 64 cells are measured at twice the prior, both
    read twice the prior (the noise is 0, so no pessimism)."""
    learner = LearnedCostModel(FlatPrior(), explore_every=0)
    ctx, sixty_four = np.array([100]), np.array([64])
    learner.observe_cycle("ar", ctx, np.array([1]), 8e-3)
    learner.observe_cycle("tree", ctx, sixty_four, 10e-3 + 64 * 10e-6)
    before_ar = learner.mode_cycle("ar", ctx, 0)
    sizes, _, before, _ = learner.candidate_cycles(1024, 100)
    cell = int(np.searchsorted(sizes, 64))
    assert before_ar == pytest.approx(8e-3) and before[cell] == pytest.approx(10.64e-3)
    for _ in range(16):
        learner.observe_cycle("ar", ctx, np.array([1]), 16e-3)
        learner.observe_cycle("tree", ctx, sixty_four, 2 * (10e-3 + 64 * 10e-6))
    assert learner.mode_cycle("ar", ctx, 0) == pytest.approx(16e-3)
    assert learner.candidate_cycles(1024, 100)[2][cell] == pytest.approx(21.28e-3)


def test_prime_prices_the_batch_1_anchors_early_and_changes_nothing() -> None:
    """Start-up priming is a cache filled early: the candidate cycles a decode reads at any
    context are the same with or without it, and the anchors exist before the decode."""
    primed, lazy = LearnedCostModel(ContextPrior()), LearnedCostModel(ContextPrior())
    primed.prime(4096)
    assert len(primed.priced._anchors) == 4096 // 512 + 2 and not lazy.priced._anchors
    for context in (0, 700, 3000, 9000):
        a, b = primed.candidate_cycles(1024, context), lazy.candidate_cycles(1024, context)
        assert np.array_equal(a[2], b[2]) and a[3] == b[3]
    for bad in (-1, 1.5, True, "4096"):
        with pytest.raises(BudgetError):
            primed.prime(bad)  # type: ignore[arg-type]


def test_the_learned_model_prices_its_batched_prior_without_the_growth_proof() -> None:
    """A roofline prior's joint curve with growth=False is the same curve with growth_s 0,
    and the learned model asks for it that way (it never reads growth_s); a prior without the
    keyword is called as it is."""
    from bastion.cost.costmodel import RooflineCostModel
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import get_model

    prior = RooflineCostModel(get_profile("h100-sxm"), get_model("qwen3-8b"))
    ctx, grow = np.array([300, 700, 50]), np.array([0, 1, 1, 2, 0, 0, 2])
    full = prior.joint_cost_curve(ctx, grow)
    bare = prior.joint_cost_curve(ctx, grow, growth=False)
    assert np.array_equal(full.verify_s, bare.verify_s) and full.ar_step_s == bare.ar_step_s
    assert full.growth_s > 0.0 and bare.growth_s == 0.0
    learner = LearnedCostModel(prior)
    assert learner.priced.joint(ctx, grow).growth_s == 0.0
    assert np.array_equal(learner.priced.joint(ctx, grow).verify_s, full.verify_s)

    class Plain:  # a joint cost model without the keyword
        def joint_cost_curve(self, context_lens, grow):  # type: ignore[no-untyped-def]
            return full

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(prior, name)

    assert LearnedCostModel(Plain()).priced.joint(ctx, grow) is full  # type: ignore[arg-type]


def test_the_memoised_ar_prior_is_the_prior_priced_afresh() -> None:
    """The AR prior is memoised per (batch size, context step): at every context and batch
    size, revisited or not, a learner that has priced many others reads what a fresh one does
    (an AR cycle at exactly the fresh prior observes a ratio of 1)."""
    learner = LearnedCostModel(BatchPrior())
    fresh = {}
    for b in (1, 3, 1, 3):
        for context in (0, 130, 700, 3000, 130, 9000, 0):
            ctx = np.full(b, context, np.int64)
            fresh[b, context] = LearnedCostModel(BatchPrior()).mode_cycle("ar", ctx, 0)
            assert learner.mode_cycle("ar", ctx, 0) == fresh[b, context]
            assert learner.observe_cycle("ar", ctx, np.ones(b, np.int64), fresh[b, context]) == 1
            learner.table = LearnedCostModel(BatchPrior()).table  # keep the ratio at 1
    assert fresh[1, 0] < fresh[3, 0] and fresh[1, 0] < fresh[1, 3000]  # all of it matters


def test_the_one_value_priors_interpolate_as_the_array_priors_do() -> None:
    """The AR and chain priors of a batch (one value each) are interpolated on floats: exactly
    the value the array form (:meth:`PricedPrior._anchored`) gives for the same key, anchors and
    context step, at contexts on and between anchors, and a value between its two anchors."""

    def array_form(prior: PricedPrior, kind: str, b: int, context: int) -> tuple[float, list]:
        if kind == "ar":
            key: tuple = ("ar", b)
            price = lambda c: np.array([prior.joint(c, np.zeros(0, np.int64)).ar_step_s])  # noqa: E731
        else:
            key = ("chain", b, 6)
            price = lambda c: prior.cycle(c, np.full(b, 7, np.int64), 7 * b).cycle[-1:]  # noqa: E731
        value = float(prior._anchored(key, b, context, price)[0])
        return value, [float(v[0]) for (k, _), v in sorted(prior._anchors.items()) if k == key]

    between = 0
    for b in (2, 5):
        for context in (0, 64, 511, 512, 700, 1023, 3000, 9000):
            ctx = np.full(b, context, np.int64)
            for kind, depth in (("ar", 0), ("chain", 6)):
                got = PricedPrior(BatchPrior()).mode(kind, ctx, depth)  # type: ignore[arg-type]
                want, (lo, hi) = array_form(PricedPrior(BatchPrior()), kind, b, context)
                assert got == want
                assert min(lo, hi) <= got <= max(lo, hi)
                between += min(lo, hi) < got < max(lo, hi)
    assert between >= 8  # (the anchors differ: the interpolation is exercised)


class BatchPrior(ContextPrior):
    """A ContextPrior whose cycle also grows with the batch size."""

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        cc = super().cost_curve(max_tree_size, load)
        extra = 1e-3 * (load.batch_size - 1)
        return CostCurve(0.0, 0.0, cc.verify_s + extra, cc.ar_step_s + extra)


def test_memoised_mode_cycles_are_the_prior_times_the_current_ratio() -> None:
    """A mode cycle is the prior's cycle of its (kind, B, context step, depth) times the table's
    current ratio: exactly, however often the ratio moves in between, while the prior's cycle
    of a key is priced once (it never changes; only the ratio is read again)."""
    learner = LearnedCostModel(BatchPrior(), explore_every=0)
    calls: list[tuple[str, int, int]] = []
    mode = learner.priced.mode

    def counted(kind, ctx, depth):  # type: ignore[no-untyped-def]
        calls.append((kind, int(ctx.shape[0]), depth))
        return mode(kind, ctx, depth)

    learner.priced.mode = counted  # type: ignore[method-assign]
    fresh = LearnedCostModel(BatchPrior()).priced
    rng = np.random.default_rng(5)
    keys = [("ar", 1, 0), ("chain", 1, 6), ("ar", 4, 0), ("chain", 4, 6), ("chain", 4, 3)]
    for round_ in range(6):
        for kind, b, depth in keys:
            ctx = np.full(b, 700, np.int64)
            got = learner.mode_cycle(kind, ctx, depth)  # type: ignore[arg-type]
            ratio = float(learner.table.ratios(kind, b)[0])  # type: ignore[arg-type]
            assert got == fresh.mode(kind, ctx, depth) * ratio  # type: ignore[arg-type]
            # the table moves: the next round reads another ratio
            learner.observe_cycle(kind, ctx, np.full(b, depth + 1), got * (1.5 + rng.random()))  # type: ignore[arg-type]
        if round_ == 0:
            assert len(calls) == len(keys)
    assert len(calls) == len(keys)  # each key's prior priced once
    assert learner.mode_cycle("chain", np.full(4, 700), 6) != fresh.mode(
        "chain", np.full(4, 700, np.int64), 6
    )  # (the ratios did move)


def test_standing_ar_steps_reuse_one_choice_whose_cycle_stays_current() -> None:
    """While AR stands, each step's choice is an AR step over root-only trees whose predicted
    cycle is the learned AR cycle of that step; the choice object is reused while that cycle
    and the batch size stay the same, and replaced when either moves."""
    learner = LearnedCostModel(ContextPrior(), probe_every=10_000)
    learner.speedup = learner.speedup_upper = 0.5  # AR measured faster: it stands
    policy = LearningPolicy()
    seen = []
    for step in range(48):
        b = 2 if step >= 40 else 1
        if step == 40:  # the evidence is kept per batch bucket: AR stands at batch 2 too
            from bastion.learned_evidence import _evidence_for

            _evidence_for(learner, 1)  # the bucket of batch 2
            learner.speedup = learner.speedup_upper = 0.5
        ctx = np.full(b, 100 + 5 * step, np.int64)
        req = StepRequests.of(list(range(b)), ctx, np.zeros(b, np.int64), np.zeros(b, np.int64))
        assert policy.plan_step(req, learner) == "ar"
        choice = policy.choose_batch(BatchMarginals.empty(b), BatchPolicyContext(req, learner))
        assert choice.kind == "ar" and choice.trees.sizes.tolist() == [1] * b
        assert choice.diagnostics.predicted_cycle_s == learner.mode_cycle("ar", ctx, 0)
        seen.append(choice)
        cycle = 8e-3 if step < 20 else 16e-3  # AR measured slower from step 20 on
        learner.observe_step("ar", ctx, choice.trees, np.ones(b, np.int64), np.zeros(0), cycle)
    distinct = len({id(c) for c in seen})
    assert 3 <= distinct < 24  # reused, but not past a move of the cycle or the batch
    assert seen[-1] is not seen[39] and seen[-1].trees.size == 2
    two, three = (
        policy.choose_batch(
            BatchMarginals.empty(b),
            BatchPolicyContext(
                StepRequests.of(list(range(b)), np.full(b, 400), np.zeros(b), np.zeros(b)),
                learner,
            ),
        )
        for b in (2, 3)
    )
    # the same cycle (batch 3 reads batch 2's bucket), yet batch 3 gets three roots
    assert two.diagnostics.predicted_cycle_s == three.diagnostics.predicted_cycle_s
    assert three.trees.sizes.tolist() == [1, 1, 1]


@pytest.mark.parametrize("riding", [1, 37, 200, 512])
def test_a_riding_chunk_charges_what_each_total_adds_to_its_pass(riding: int) -> None:
    """With a prefill chunk of ``riding`` tokens in the pass, the batched decision curve
    charges a total T what it adds to the chunk's pass on top of a bare step:
    Ĉ(T + riding) − Ĉ(B + riding) + Ĉ(B), read off the curve without a chunk (on a rising
    prior, where no total past the chains' top is cheaper), in the Python curve and in the
    compiled arrays alike; positive and non-decreasing, so still its own floor."""
    learner = LearnedCostModel(BatchPrior())
    ctx = np.array([300, 500, 700], np.int64)
    b, n_max = 3, 256
    plain = learner.joint_decision_curve(ctx, np.zeros(b * n_max - b, np.int64), n_max).verify_s
    shifted = learner.joint_decision_curve(ctx, np.zeros(100, np.int64), n_max, riding)
    sunk = plain[riding] - plain[0]
    assert np.array_equal(shifted.verify_s, plain[riding : riding + 101] - sunk)
    assert np.all(shifted.verify_s > 0) and np.all(np.diff(shifted.floor_s) >= 0)
    cells, best, _ = learner.joint_decision_arrays(ctx, n_max, riding)
    cells0, best0, _ = learner.joint_decision_arrays(ctx, n_max)
    assert cells.shape == cells0.shape  # the same chains: totals B … B·n_max
    top = b * n_max - b - riding  # totals whose shifted pass is still below the chains' top
    assert np.array_equal(best[cells[:top]], best0[cells0[riding : riding + top]] - sunk)


class ConvexPrior(BatchPrior):
    """A BatchPrior whose cycle grows faster than linearly (so a chunk in the pass changes
    what further nodes cost)."""

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        cc = super().cost_curve(max_tree_size, load)
        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        return CostCurve(0.0, 0.0, cc.verify_s + 1e-7 * n**2, cc.ar_step_s)

    def step_cost(self, tree_size: int, load: StepLoad):  # type: ignore[no-untyped-def]
        from bastion.interfaces import StepCost

        total = tree_size + sum(r.tree_size for r in load.co_batched)
        return StepCost(0.0, 0.0, self.base + self.slope * total + 1e-7 * total**2)


def test_a_step_with_a_riding_chunk_decides_for_itself() -> None:
    """A batched step with a prefill chunk in its pass decides afresh although a decision
    stands, and leaves that decision standing for the next step without a chunk; its
    predicted cycle is the pass's, chunk included."""
    learner = LearnedCostModel(ConvexPrior(), explore_every=0)
    policy = LearningPolicy(n_max=64)
    b = 4
    ctx = np.full(b, 400, np.int64)
    rng = np.random.default_rng(0)
    probs = np.sort(rng.dirichlet(np.ones(4), size=(b, 6)), axis=-1)[..., ::-1].copy()
    m = BatchMarginals(np.tile(np.arange(4), (b, 6, 1)), probs)

    def step(riding: int):  # type: ignore[no-untyped-def]
        req = StepRequests.of(range(b), ctx, np.zeros(b), np.full(b, 8), riding_tokens=riding)
        plan = policy.plan_step(req, learner)
        return plan, policy.choose_batch(m, BatchPolicyContext(req, learner))

    for _ in range(2):  # two agreeing decisions: the next step would repeat them
        _, first = step(0)
        assert not first.diagnostics.repeated
    standing = learner._decision
    plan, mixed = step(512)
    assert plan == "tree" and not mixed.diagnostics.repeated
    assert learner._decision == standing  # still the one the next plain step repeats
    # the decision priced the totals it grew as passes with the chunk
    c_hat = mixed.diagnostics.tree_diagnostics.c_hat
    curve = learner.joint_decision_curve(ctx, np.zeros(c_hat.shape[0] - 1, np.int64), 64, 512)
    assert np.array_equal(c_hat, curve.verify_s)
    # … and the chain as it charges the trees: what its nodes add to the chunk's pass
    top1 = learner.acceptance.calibrate(m).probs[:, :, 0]
    a_chain = (b + float(top1.cumprod(axis=1).sum())) * learner.chain_ratio()
    jc = learner.joint_cycle
    added = jc(ctx, 7 * b + 512) - jc(ctx, b + 512) - (jc(ctx, 7 * b) - jc(ctx, b))
    c_chain = learner.mode_cycle("chain", ctx, 6) + added
    ar = mixed.diagnostics.tree_diagnostics.ar_step_s
    assert mixed.diagnostics.chain_speedup == pytest.approx(a_chain * ar / c_chain, rel=1e-12)
    total = int(mixed.trees.offsets[-1]) if mixed.kind == "tree" else b * 7
    if mixed.kind == "tree":
        assert mixed.diagnostics.predicted_cycle_s == learner.joint_cycle(ctx, total + 512)
    _, plain = step(0)
    assert plain.diagnostics.repeated
    with pytest.raises(BudgetError, match="riding_tokens"):
        StepRequests.of([0], [1], [0], riding_tokens=-1)
    for bad in (True, 1.5, "8"):
        with pytest.raises(BudgetError, match="riding_tokens"):
            StepRequests.of([0], [1], [0], riding_tokens=bad)  # type: ignore[arg-type]


def test_a_standing_chain_keeps_its_step_through_a_riding_chunk() -> None:
    """A chain decision that stands keeps its cheap step (argmax preparation, no decision) on
    a step with a prefill chunk; with a tree standing the same step decides afresh."""
    for kind, plan in (("chain", "chain"), ("tree", "tree")):
        learner = LearnedCostModel(BatchPrior(), explore_every=0)
        for _ in range(2):  # two agreeing decisions: the next step stands
            learner.decided(kind, 4, 4 * 16, 0.01, 8)
        req = StepRequests.of(range(4), np.full(4, 400), np.zeros(4), riding_tokens=256)
        assert LearningPolicy().plan_step(req, learner) == plan


def _ar_steps(learner: LearnedCostModel, n: int, cycle_s: float) -> list[bool]:
    """``n`` AR steps of ``cycle_s`` at context 100; what wants_draft said after each."""
    asked = []
    for _ in range(n):
        learner.observe_step(
            "ar", np.array([100]), TreeBatch.roots(1), np.ones(1, np.int64), np.zeros(0), cycle_s
        )
        asked.append(learner.wants_draft(1))
    return asked


def _drafted_steps(learner: LearnedCostModel, n: int, commit: int, cycle_s: float) -> list[bool]:
    """``n`` drafted steps (a 4-node chain) committing ``commit`` in ``cycle_s``; what
    wants_draft said after each."""
    asked = []
    for _ in range(n):
        learner.observe_step(
            "tree",
            np.array([100]),
            _chain_tree(4),
            np.full(1, commit, np.int64),
            np.zeros(0, np.int64),
            cycle_s,
        )
        asked.append(learner.wants_draft(1))
    return asked


def test_a_drafted_step_is_paired_with_the_last_ar_cycles() -> None:
    """A drafted step's realised speedup is measured against the AR cycle of the last AR steps
    (the median of the last three), not the table's slower-moving learned AR cycle: after
    AR cycles of 10 ms then three of 20 ms, a step committing 2 tokens in 20 ms realised 2."""
    learner = LearnedCostModel(FlatPrior(), probe_every=10_000)
    _ar_steps(learner, 30, 10e-3)
    _ar_steps(learner, 3, 20e-3)
    assert learner.mode_cycle("ar", np.array([100]), 0) == pytest.approx(10e-3, rel=1e-6)
    _drafted_steps(learner, 1, 2, 20e-3)
    assert learner._realised[-1] == pytest.approx(2.0, rel=1e-9)
    _ar_steps(learner, 2, 12e-3)  # two of the last three: the median moves
    _drafted_steps(learner, 1, 2, 20e-3)
    assert learner._realised[-1] == pytest.approx(2 * 12 / 20, rel=1e-9)


@pytest.mark.parametrize("noisy", [True, False])
def test_ar_stands_only_on_evidence_one_standard_error_below_1(noisy: bool) -> None:
    """Drafted steps realising 0.3 and 1.6 in turn (mean 0.95, standard error 0.17 over 16)
    do not make AR stand: a skewed, noisy mean below 1 is no evidence that AR is faster.
    Steady steps of the same mean do."""
    learner = LearnedCostModel(FlatPrior(), probe_every=10_000)
    _ar_steps(learner, 12, 10e-3)
    for i in range(16):
        if not noisy:
            _drafted_steps(learner, 1, 2, 2 * 10e-3 / 0.95)
        elif i % 2:
            _drafted_steps(learner, 1, 4, 4 * 10e-3 / 1.6)
        else:
            _drafted_steps(learner, 1, 1, 10e-3 / 0.3)
    assert learner.speedup == pytest.approx(0.95, rel=1e-9)
    assert learner.wants_draft(1) == noisy
    if noisy:
        sd = float(np.std([0.3, 1.6] * 8, ddof=1))
        assert learner.speedup_upper == pytest.approx(0.95 + sd / 4, rel=1e-9)


@pytest.mark.parametrize("busy", [True, False])
def test_a_probe_that_finds_speculation_faster_looks_again_sooner(busy: bool) -> None:
    """AR stands on evidence from a quiet machine (1 token in 20 ms against AR's 10 ms: 0.5).
    The machine gets busy: AR steps take 20 ms, a drafted step 2 tokens in 30 ms (1.33× AR).
    Each drafted step lost one AR step (20 ms for 1 token), so the first probe waits until
    that loss is PROBE_SHARE (1 %) of AR's time: 100 steps. A probe that finds speculation
    faster halves the interval to the next one (one that confirms AR doubles it), so
    speculation stands again within a few hundred steps, not thousands. On a machine that
    stays quiet the probes confirm AR and grow apart."""
    learner = LearnedCostModel(FlatPrior(), probe_every=16)
    _ar_steps(learner, 12, 10e-3)
    # a clear loss: AR stands after TURNOVER_EVIDENCE steps (not evidence/2)
    assert _drafted_steps(learner, 3, 1, 20e-3) == [True, True, False]
    assert not learner.wants_draft(1)
    ar_s, drafted = (20e-3, (2, 30e-3)) if busy else (10e-3, (1, 20e-3))
    gaps: list[int] = []
    ar_steps = 0
    while len(gaps) < 12 and ar_steps < 5000:
        ar_steps += 1
        if _ar_steps(learner, 1, ar_s)[-1]:  # the next step probes
            gaps.append(ar_steps - sum(gaps))
            if _drafted_steps(learner, 1, *drafted)[-1] and busy:
                break  # speculation stands again
    if busy:
        assert learner.speedup_upper > 1 and ar_steps < 300 and gaps == [99, 49]
    else:  # AR steps between probes, up to 64 × probe_every
        assert gaps[:7] == [99, 199, 399, 799, 1023, 1023, 1023]


@pytest.mark.parametrize(("cycle_ms", "first_gaps"), [(60.0, [499, 999]), (10.5, [15, 31])])
def test_probes_are_spaced_so_that_their_loss_stays_a_small_share(
    cycle_ms: float, first_gaps: list[int]
) -> None:
    """While AR stands, a probe that loses L AR steps (its cycle in AR steps less the tokens
    it commits per request) is followed by at least L / PROBE_SHARE AR steps. A drafted step
    that commits 1 token in 60 ms against AR's 10 ms (as a batch of 8 on the CPU demo pair,
    where the drafter takes in every skipped step's features) lost 5 AR steps: the next probe
    waits 500 steps, then 1000, not 16 then 32. A loss of 0.05 AR steps (10.5 ms) keeps
    the doubling from ``probe_every`` (negative control)."""
    from bastion.learned_evidence import PROBE_SHARE

    learner = LearnedCostModel(FlatPrior(), probe_every=16)
    _ar_steps(learner, 12, 10e-3)
    while learner.wants_draft(1):
        _drafted_steps(learner, 1, 1, cycle_ms * 1e-3)
    gaps: list[int] = []
    ar_steps = 0
    while len(gaps) < 2:
        ar_steps += 1
        if _ar_steps(learner, 1, 10e-3)[-1]:
            gaps.append(ar_steps - sum(gaps))
            assert not _drafted_steps(learner, 1, 1, cycle_ms * 1e-3)[-1]
    loss = cycle_ms / 10.0 - 1.0
    assert gaps == first_gaps
    assert gaps[0] + 1 >= min(loss / PROBE_SHARE, 1024)


def test_a_new_text_at_batch_one_restarts_the_evidence_for_ar() -> None:
    """AR stands on request 0's drafted steps (1 token in 20 ms against AR's 10 ms: 0.5). At
    batch 1 a step of another request drafts at once (the evidence came from a text that
    left), and TURNOVER_EVIDENCE of its drafted steps judge it: 3 more at 0.5 and AR stands
    again, 3 at 2 tokens in 8 ms (2.5×) and speculation stands. Request 0 itself, or any step
    of a larger batch, gets no such restart (negative controls: AR keeps standing)."""
    from bastion.learned_evidence import TURNOVER_EVIDENCE

    ids = np.array([0])

    def standing_ar() -> LearnedCostModel:
        learner = LearnedCostModel(FlatPrior(), probe_every=10_000)
        _ar_steps(learner, 12, 10e-3)
        assert learner.wants_draft_for(ids)  # untried speculation: drafts, for request 0
        _drafted_steps(learner, 8, 1, 20e-3)
        _ar_steps(learner, 2, 10e-3)
        assert not learner.wants_draft_for(ids)
        return learner

    learner = standing_ar()
    # a batch of 2 has evidence of its own (never seen: it starts from batch 1's, where AR
    # stands, so it does not draft at once), which leaves batch 1's
    assert not learner.wants_draft_for(np.array([0, 1]))
    assert not learner.wants_draft_for(ids)
    assert learner.wants_draft_for(np.array([1]))  # a new text at batch 1
    asked = _drafted_steps(learner, TURNOVER_EVIDENCE, 1, 20e-3)
    assert asked == [True] * (TURNOVER_EVIDENCE - 1) + [False]  # judged by its own 3 steps
    assert not learner.wants_draft_for(np.array([1]))  # … and the same text does not restart

    learner = standing_ar()
    assert learner.wants_draft_for(np.array([2]))
    assert all(_drafted_steps(learner, 20, 2, 8e-3))  # a text the drafter reads well: drafts


@pytest.mark.parametrize(("cycle_ms", "rechecks"), [(18.0, True), (8.0, False)])
def test_a_thin_margin_measures_ar_again_during_a_drafting_stretch(
    cycle_ms: float, rechecks: bool
) -> None:
    """While speculation stands on a thin margin (2 tokens in 18 ms against AR's 10 ms: 1.11×)
    a drafting stretch makes every 16th step since the last AR step two AR steps, then every
    32nd (the interval doubling); a clear margin (2.5×) never does."""
    learner = LearnedCostModel(FlatPrior(), probe_every=16)
    _ar_steps(learner, 12, 10e-3)
    asked = _drafted_steps(learner, 8, 2, cycle_ms * 1e-3)  # evidence enough
    assert all(asked)
    asked = _drafted_steps(learner, 7, 2, cycle_ms * 1e-3)
    assert all(asked[:-1]) and asked[-1] != rechecks  # after 15 drafted steps: AR
    if not rechecks:
        assert all(_drafted_steps(learner, 200, 2, cycle_ms * 1e-3))
        return
    assert _ar_steps(learner, 2, 10e-3) == [False, True]  # two AR steps, then drafting
    asked = _drafted_steps(learner, 32, 2, cycle_ms * 1e-3)
    assert asked.index(False) == 30  # the next re-measurement, 32 drafted steps on


def test_a_slow_spell_before_a_drafting_stretch_is_measured_again() -> None:
    """Speculation that stands only because the AR steps before it were a slow spell (AR 20 ms
    against its learned 10 ms; drafted 2 tokens in 18 ms: 2.2× the spell, 1.1× the learned
    cycle) takes AR steps; once they measure AR at 10 ms again the drafted steps paired with
    them are measured against it, and within the evidence window AR stands again (here 1
    token in 30 ms: 1/3 of AR)."""
    learner = LearnedCostModel(FlatPrior(), probe_every=16)
    _ar_steps(learner, 40, 10e-3)
    _ar_steps(learner, 3, 20e-3)
    assert all(_drafted_steps(learner, 14, 2, 18e-3))
    assert learner.speedup == pytest.approx(2 * 20 / 18, rel=1e-9)
    asked = _drafted_steps(learner, 1, 2, 18e-3)
    assert asked == [False]  # re-measure, although 2.2 is far from thin
    assert _ar_steps(learner, 2, 10e-3) == [False, True]
    _drafted_steps(learner, 16, 1, 30e-3)  # now paired with 10 ms: 1/3 each
    assert learner.speedup_upper < 1
    assert not learner.wants_draft(1)


@pytest.mark.parametrize("total", [64, 1024, 1500, 3000])
def test_a_batch_1_cycle_is_observed_against_the_prior_at_its_own_size(total: int) -> None:
    """The ratio a batch-1 cycle records is measured / the prior's cycle of its own size, also
    beyond the 1 … 1024 sizes the prior is first priced for (after those have been read)."""
    prior = FlatPrior()
    learner = LearnedCostModel(prior)
    ctx = np.array([300])
    learner.observe_cycle("tree", ctx, np.array([64]), 0.02)  # the first sizes, cached
    expected = prior.base + prior.slope * total
    ratio = learner.observe_cycle("tree", ctx, np.array([total]), 2 * expected)
    assert ratio == pytest.approx(2.0, rel=1e-9)


@pytest.mark.parametrize(("b", "total"), [(1, 1500), (1, 3000), (2, 3000), (4, 9000)])
def test_a_cycle_is_observed_alike_whatever_the_cache_holds(b: int, total: int) -> None:
    """A step's recorded ratio does not depend on which prior curves an earlier step cached
    (the hot path reads a cached curve first): beyond the default horizon as well."""
    ctx = np.full(b, 300)
    warm = LearnedCostModel(BatchPrior())
    warm.observe_cycle("tree", ctx, np.full(b, 32), 0.02)  # the default horizon's curve, cached
    fresh = LearnedCostModel(BatchPrior())
    sizes = np.full(b, total // b)
    assert warm.observe_cycle("tree", ctx, sizes, 0.05) == fresh.observe_cycle(
        "tree", ctx, sizes, 0.05
    )


def _steps_at(
    learner: LearnedCostModel, b: int, n: int, commit: int | None, cycle_s: float
) -> list[bool]:
    """``n`` steps of batch ``b`` at context 100: AR (``commit`` None) or drafted (a 4-node
    chain per request, each committing ``commit``) in ``cycle_s``; wants_draft after each."""
    chain = _chain_tree(4)
    n_nodes = int(chain.offsets[-1])
    trees = TreeBatch(
        np.arange(b + 1) * n_nodes,
        np.tile(chain.parents, b),
        np.tile(chain.tokens, b),
        np.tile(chain.depths, b),
        np.tile(chain.scores, b),
        np.tile(chain.ranks, b),
    )
    ctx = np.full(b, 100, np.int64)
    asked = []
    for _ in range(n):
        if commit is None:
            learner.observe_step("ar", ctx, TreeBatch.roots(b), np.ones(b, np.int64), [], cycle_s)
        else:
            committed = np.full(b, commit, np.int64)
            learner.observe_step("tree", ctx, trees, committed, np.zeros(0, np.int64), cycle_s)
        asked.append(learner.wants_draft(b))
    return asked


@pytest.mark.parametrize(
    ("cycles_ms", "drafted_before_ar"),
    [
        ((19.0, 20.0, 21.0), 3),  # ≈ 0.5× AR, three times: a clear loss, AR after 3 steps
        # 0.3×, 1×, 0.5×, …: a mean of 0.6× but too noisy to be clear: evidence/2 steps
        ((33.3, 10.0, 20.0, 33.3, 10.0, 20.0, 33.3, 10.0), 8),
    ],
)
def test_a_clear_loss_stands_by_ar_after_few_drafted_steps(
    cycles_ms: tuple[float, ...], drafted_before_ar: int
) -> None:
    """Drafted steps that each commit 1 token in about twice AR's cycle (≈ 0.5×) decide for AR
    after TURNOVER_EVIDENCE of them: their mean is CLEAR_LOSS_SE standard errors below the
    recheck level. A loss that is not clear (a mean of 0.6×, each step 0.3–1×) still waits for
    evidence/2 steps (the negative control: the early rule must not decide it)."""
    from bastion.learned_evidence import TURNOVER_EVIDENCE

    learner = LearnedCostModel(FlatPrior(), probe_every=10_000)
    _steps_at(learner, 1, 12, None, 10e-3)
    asked = [_steps_at(learner, 1, 1, 1, c * 1e-3)[0] for c in cycles_ms]
    assert asked == [True] * (drafted_before_ar - 1) + [False]
    assert (drafted_before_ar == TURNOVER_EVIDENCE) == (min(cycles_ms) > 15.0)


def test_the_evidence_is_kept_per_batch_bucket() -> None:
    """Speculation wins at batch 1 (2 tokens in 8 ms against AR's 10 ms) and loses at batch 8
    (1 token per request in 20 ms). Batch 8's untried evidence drafts, and its own clear loss
    decides for AR there after TURNOVER_EVIDENCE steps, while batch 1 keeps drafting; going
    back and forth keeps each bucket's verdict (without the per-bucket evidence, batch 1's 16
    winning steps would keep batch 8 drafting for 8 or more losing steps)."""
    learner = LearnedCostModel(FlatPrior(), probe_every=10_000)
    _steps_at(learner, 1, 12, None, 10e-3)
    assert all(_steps_at(learner, 1, 16, 2, 8e-3))  # speculation stands at batch 1
    _steps_at(learner, 8, 3, None, 10e-3)  # batch 8's AR cycle
    assert learner.wants_draft(8)  # untried at batch 8
    assert _steps_at(learner, 8, 3, 1, 20e-3) == [True, True, False]
    assert learner.wants_draft(1)  # batch 1's evidence is its own
    assert _steps_at(learner, 1, 2, 2, 8e-3) == [True, True]
    assert not learner.wants_draft(8) and not learner.wants_draft(6)  # bucket 8 (6 → 8)
    assert learner.wants_draft(1)


@pytest.mark.parametrize("ar_stands", [True, False])
def test_a_bucket_never_seen_starts_from_the_nearest_buckets_verdict(ar_stands: bool) -> None:
    """Batch 8 (bucket 3) has judged speculation: a clear loss (1 token per request in 20 ms
    against AR's 10 ms) or a clear win (3 in 8 ms). A request finishes early and the batch
    shrinks to 4 (bucket 2, never seen). Where AR stands at batch 8, batch 4 starts by AR and
    drafts first after probe_every steps (then its own drafted steps judge it, as an untried
    bucket's do); where speculation stands, batch 4 drafts at once (the control)."""
    learner = LearnedCostModel(FlatPrior(), probe_every=16)
    _steps_at(learner, 8, 12, None, 10e-3)
    _steps_at(learner, 8, 8, *((1, 20e-3) if ar_stands else (3, 8e-3)))
    assert learner.wants_draft(8) != ar_stands
    if not ar_stands:
        assert learner.wants_draft(4)
        return
    asked = [learner.wants_draft(4), *_steps_at(learner, 4, 15, None, 10e-3)]
    assert asked == [False] * 15 + [True]  # the 16th step since drafts
    assert _steps_at(learner, 4, 2, 3, 8e-3) == [True, True]  # untried there: it judges
    assert learner.wants_draft(8) is False  # batch 8's verdict is kept


def test_a_window_of_two_drafted_steps_judges_on_two() -> None:
    """``evidence=2`` is accepted, so two drafted steps must be enough to judge: two clear
    losses (1 token in 20 ms against AR's 10 ms) make AR stand (they used to keep it drafting
    for ever: the judgement waited for TURNOVER_EVIDENCE steps that a window of two never
    holds), and two wins keep it drafting (the negative control)."""
    for commit, cycle_s, drafts_after in ((1, 20e-3, False), (2, 8e-3, True)):
        learner = LearnedCostModel(FlatPrior(), evidence=2, probe_every=10**9)
        _steps_at(learner, 1, 12, None, 10e-3)
        assert _steps_at(learner, 1, 2, commit, cycle_s)[0]  # the first still drafts on
        assert learner.wants_draft(1) == drafts_after
        assert math.isfinite(learner.speedup)


@pytest.mark.parametrize("b", [1, 3])
def test_a_step_whose_drafter_proposed_nothing_is_an_ar_step(b: int) -> None:
    """Marginals whose every row is empty (top-1 zero) make an AR step; one non-empty row
    anywhere (not only the first request's first position) makes a drafted one."""
    learner = LearnedCostModel(FlatPrior())
    ctx = np.full(b, 100, np.int64)
    req = StepRequests.of(list(range(b)), ctx, np.zeros(b, np.int64), np.zeros(b, np.int64))
    probs = np.zeros((b, 3, 2))
    ids = np.arange(b * 6, dtype=np.int64).reshape(b, 3, 2)
    choice = LearningPolicy().choose_batch(
        BatchMarginals(ids, probs), BatchPolicyContext(req, learner)
    )
    assert choice.kind == "ar" and choice.trees.total_nodes == b
    probs[b - 1, 2] = (0.6, 0.3)  # only the last request's last position proposes
    choice = LearningPolicy().choose_batch(
        BatchMarginals(ids, probs), BatchPolicyContext(req, learner)
    )
    assert choice.kind != "ar"


def test_mean_context_is_the_floor_of_the_mean_and_never_stale() -> None:
    """The mean context (rounded down) of any int64 array, remembered only for a read-only
    array that owns its data: a writable array changed in place reads its new mean."""
    from bastion.learned_prior import mean_context

    rng = np.random.default_rng(3)
    for b in (1, 2, 7, 32, 300):
        ctx = rng.integers(0, 1 << 40, b)
        assert mean_context(ctx) == int(ctx.sum()) // b
        frozen = ctx.copy()
        frozen.setflags(write=False)
        assert mean_context(frozen) == mean_context(frozen) == int(ctx.sum()) // b
        ctx[0] += 1 << 20  # (the writable one, changed in place)
        assert mean_context(ctx) == int(ctx.sum()) // b


def test_mean_floor_kernel_is_python_floor_of_the_exact_sum() -> None:
    """The compiled mean (``mean_floor``) is ``sum(values) // n`` on Python ints for any int64
    values, negatives included (Python floors, C truncates), and declines (None) what it cannot
    sum exactly — an int64 overflow, an empty or non-int64 buffer — where mean_context then
    sums on Python ints: its answer is the exact floor either way."""
    from bastion import learned_prior

    kernel = learned_prior._mean_floor
    if kernel is None:
        pytest.skip("built without the C extension")
    rng = np.random.default_rng(11)
    for b in (1, 2, 3, 7, 32, 301):
        for high in (1 << 10, 1 << 40, 1 << 55):
            values = rng.integers(-high, high, b)
            exact = sum(values.tolist()) // b
            assert kernel(values) == exact
            assert learned_prior.mean_context(values) == exact
    big = np.array([(1 << 62) + 5, (1 << 62) + 6], np.int64)  # the sum leaves int64
    assert kernel(big) is None
    assert learned_prior.mean_context(big) == (1 << 62) + 5
    low = np.array([-(1 << 62) - 5, -(1 << 62) - 6], np.int64)
    assert kernel(low) is None
    assert learned_prior.mean_context(low) == -(1 << 62) - 6
    for other in (np.zeros(0, np.int64), np.arange(4.0), np.arange(4, dtype=np.int32), [1, 2]):
        assert kernel(other) is None
    assert kernel(np.arange(10, dtype=np.int64)[::2]) is None  # not contiguous
