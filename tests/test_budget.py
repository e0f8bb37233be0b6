"""The controller: self-verification (Prop. 3.2), first-decrease optimality (Prop. 3.4), and
its fast paths (compiled chunks, cached cost curves) against plain references."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.budget as budget_module
from bastion.bestfirst import COMPILED, best_first_heap
from bastion.budget import (
    BudgetDiagnostics,
    choose_tree,
    first_decrease,
    is_convex,
    speedup_curve,
)
from bastion.cost.calibration import Branch, LinearCalibration
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BastionError, BudgetError, CostModelError
from bastion.interfaces import CostCurve, RequestLoad, StepLoad
from bastion.tree import DraftMarginals, DraftTree, best_first_tree, surrogate_acceptance
from tests.strategies import convex_costs, marginals


def self_verified_lengths(tree: DraftTree, m: DraftMarginals, n: int, seed: int) -> np.ndarray:
    """Committed length when the drafter verifies itself: X_k ~ q_k independently (Prop. 3.2).

    Each position draws a rank in 0 … K−1, or K for the mass outside the top-K (never in a
    tree); a node is covered iff X_{1:d} equals its path, and the committed length is the size
    of the covered chain, root included.
    """
    rng = np.random.default_rng(seed)
    tail = np.clip(1.0 - m.probs.sum(axis=1, keepdims=True), 0.0, None)
    full = np.concatenate((m.probs, tail), axis=1)
    full = full / full.sum(axis=1, keepdims=True)
    cdf = np.cumsum(full, axis=1)
    draws = (rng.random((n, m.depth, 1)) > cdf[None, :, :]).sum(axis=2)  # [n, depth] ranks
    covered = np.ones((n, tree.size), dtype=bool)
    for i in range(1, tree.size):
        covered[:, i] = covered[:, tree.parents[i]] & (
            draws[:, tree.depths[i] - 1] == tree.ranks[i]
        )
    return covered.sum(axis=1)


def self_verified_variance(tree: DraftTree) -> float:
    """Exact Var[A_self]: two nodes are both covered only when one is the other's ancestor, so
    E[A²] = Σ_i ρ(i)·(1 + 2·depth(i)) and Var = E[A²] − Â²."""
    a_hat = surrogate_acceptance(tree)
    return float(np.sum(tree.scores * (1 + 2 * tree.depths)) - a_hat**2)


def agrees_within(samples: np.ndarray, expected: float, variance: float, z: float = 6.0) -> bool:
    """Mean of ``samples`` within z exact standard errors of ``expected`` (plus float slack)."""
    se = np.sqrt(max(variance, 0.0) / samples.size)
    return bool(abs(samples.mean() - expected) <= z * se + 1e-9)


@settings(derandomize=True)  # a statistical test: fixed examples, so CI cannot flake
@given(marginals(max_depth=8, max_k=4), st.integers(1, 40), st.integers(0, 2**31))
def test_surrogate_is_expected_self_verified_length(
    m: DraftMarginals, budget: int, seed: int
) -> None:
    """Prop. 3.2: E[A_self(T)] = Â(T); Monte-Carlo mean within 5 standard errors."""
    tree = best_first_tree(m, budget)
    lengths = self_verified_lengths(tree, m, 4000, seed)
    assert agrees_within(lengths, surrogate_acceptance(tree), self_verified_variance(tree))


def test_self_verification_check_rejects_a_wrong_surrogate() -> None:
    """Negative control: Σ of per-node marginals (no path product) is not E[A_self]."""
    m = DraftMarginals([[0, 1], [2, 3], [4, 5]], [[0.6, 0.3], [0.6, 0.3], [0.6, 0.3]])
    tree = best_first_tree(m, 10)
    lengths = self_verified_lengths(tree, m, 4000, seed=1)
    wrong = 1.0 + float(m.probs[tree.depths[1:] - 1, tree.ranks[1:]].sum())
    var = self_verified_variance(tree)
    assert agrees_within(lengths, surrogate_acceptance(tree), var)
    assert not agrees_within(lengths, wrong, var)


def curve_from(costs: np.ndarray, ar_step_s: float = 1.0) -> CostCurve:
    return CostCurve(draft_s=0.0, prep_s=0.0, verify_s=np.asarray(costs), ar_step_s=ar_step_s)


@given(marginals(max_depth=10, max_k=6), st.data())
def test_first_decrease_is_global_argmax_for_convex_cost(
    m: DraftMarginals, data: st.DataObject
) -> None:
    """Prop. 3.4: concave Â and convex positive Ĉ make the first decrease of Ŝ its maximum."""
    n_max = data.draw(st.integers(1, 120))
    costs = data.draw(convex_costs(n_max))
    assert is_convex(costs)
    tree_fd, diag_fd = choose_tree(m, curve_from(costs), n_max, mode="first-decrease")
    _, diag_ex = choose_tree(m, curve_from(costs), n_max, mode="exhaustive")
    best = float(diag_ex.s_hat.max())
    assert diag_fd.s_hat[tree_fd.size - 1] == pytest.approx(best, rel=1e-12)
    assert tree_fd == best_first_tree(m, tree_fd.size)


@given(marginals(max_depth=10, max_k=6), st.integers(1, 200), st.integers(1, 64))
def test_chunked_growth_equals_node_by_node_scan(
    m: DraftMarginals, n_max: int, initial: int
) -> None:
    """Growing in doubling chunks stops where a node-by-node first-decrease scan would."""
    n = np.arange(1, n_max + 1)
    costs = 1.0 + 0.02 * n + 1e-4 * n**2
    tree, _ = choose_tree(m, curve_from(costs), n_max, "first-decrease", initial_budget=initial)
    full = best_first_tree(m, n_max)
    s_hat = speedup_curve(np.cumsum(full.scores), costs[: full.size], 1.0)
    expect = first_decrease(s_hat) or full.size
    assert tree.size == expect


def test_non_convex_cost_fools_first_decrease_but_not_exhaustive() -> None:
    """A step in Ĉ (tile quantisation, MoE saturation) makes Ŝ bimodal: first-decrease stops
    at the first local peak, the exhaustive scan finds the better one, and auto mode notices."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.95, 0.04], (15, 1)))
    n_max = 64
    costs = np.where(np.arange(1, n_max + 1) <= 4, 1.0, 1.6)  # flat, a jump, flat: not convex
    assert not is_convex(costs)
    early, d_fd = choose_tree(m, curve_from(costs), n_max, mode="first-decrease")
    best, d_ex = choose_tree(m, curve_from(costs), n_max, mode="exhaustive")
    auto, d_auto = choose_tree(m, curve_from(costs), n_max, mode="auto")
    assert early.size == 4
    assert best.size > 4
    assert d_ex.predicted_speedup > d_fd.predicted_speedup * 1.5
    assert d_auto.mode == "bounded" and auto.size == best.size


def test_diagnostics_report_the_curves() -> None:
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.9, 0.05], (15, 1)))
    n = np.arange(1, 257)
    curve = CostCurve(draft_s=1e-3, prep_s=1e-4, verify_s=8e-3 + 2e-5 * n, ar_step_s=8e-3)
    tree, diag = choose_tree(m, curve, 256, mode="first-decrease")
    assert diag.mode == "first-decrease" and diag.tree_size == tree.size
    np.testing.assert_allclose(diag.c_hat, curve.total_s()[: diag.c_hat.size])
    np.testing.assert_allclose(diag.a_hat[tree.size - 1], surrogate_acceptance(tree))
    assert diag.predicted_speedup == pytest.approx(diag.s_hat.max())


def test_is_convex_on_a_range() -> None:
    f = np.array([5.0, 3.0, 2.0, 2.5, 2.4, 4.0])
    assert is_convex(f, 1, 4)
    assert not is_convex(f)
    assert is_convex(f, 5, 6)
    with pytest.raises(BudgetError):
        is_convex(f, 0, 3)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1.0, 0.0, 1.0]),
        np.array([1.0, -1.0, 1.0]),
        np.array([1.0, np.nan, 1.0]),
        np.array([1.0, np.inf, 1.0]),
        np.array([1.0, 1.0]),  # too short for n_max = 3
    ],
)
def test_bad_cost_curves_are_named(bad: np.ndarray) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    with pytest.raises(CostModelError) as err:
        choose_tree(m, curve_from(bad), 3)
    assert isinstance(err.value, BastionError)


@pytest.mark.parametrize("ar", [0.0, -1.0, float("nan")])
def test_bad_ar_step_is_named(ar: float) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    with pytest.raises(CostModelError, match="ar_step_s"):
        choose_tree(m, curve_from(np.ones(3), ar_step_s=ar), 3)


@pytest.mark.parametrize("kwargs", [{"n_max": 0}, {"mode": "greedy"}, {"initial_budget": 0}])
def test_bad_controller_arguments(kwargs: dict[str, object]) -> None:
    m = DraftMarginals([[0, 1]], [[0.5, 0.4]])
    args: dict[str, object] = {"n_max": 3, **kwargs}
    with pytest.raises(BudgetError):
        choose_tree(m, curve_from(np.ones(3)), **args)  # type: ignore[arg-type]


@st.composite
def monotone_costs(draw: st.DrawFn, n_max: int) -> np.ndarray:
    """Non-decreasing Ĉ(N), convex or not: random non-negative increments, some large steps."""
    steps = np.array(draw(st.lists(st.floats(0.0, 0.05), min_size=n_max, max_size=n_max)))
    jumps = draw(st.lists(st.integers(1, n_max), max_size=4))
    steps[np.array(jumps, dtype=int) - 1] += draw(st.floats(0.0, 2.0))
    return draw(st.floats(0.1, 2.0)) + np.cumsum(steps)


@given(marginals(max_depth=12, max_k=6), st.data())
def test_auto_is_the_exact_argmax_for_monotone_costs(
    m: DraftMarginals, data: st.DataObject
) -> None:
    """auto prunes its scan with a bound but returns the exhaustive maximum of Ŝ."""
    n_max = data.draw(st.integers(1, 300))
    costs = data.draw(monotone_costs(n_max))
    base = data.draw(st.floats(0.0, 50.0))
    initial = data.draw(st.integers(1, 64))
    auto, d_auto = choose_tree(m, curve_from(costs), n_max, "auto", initial, base_tokens=base)
    _, d_ex = choose_tree(m, curve_from(costs), n_max, "exhaustive", base_tokens=base)
    assert d_auto.s_hat[auto.size - 1] == pytest.approx(float(d_ex.s_hat.max()), rel=1e-12)


@given(marginals(max_depth=10, max_k=6), st.data())
def test_auto_agrees_with_first_decrease_on_convex_costs(
    m: DraftMarginals, data: st.DataObject
) -> None:
    n_max = data.draw(st.integers(1, 200))
    costs = data.draw(convex_costs(n_max))
    a, d_a = choose_tree(m, curve_from(costs), n_max, "auto")
    f, d_f = choose_tree(m, curve_from(costs), n_max, "first-decrease")
    assert d_a.s_hat[a.size - 1] == pytest.approx(d_f.s_hat[f.size - 1], rel=1e-12)


def test_lazy_curve_is_priced_only_as_far_as_needed() -> None:
    """Given a callable, the controller asks for short curves when the peak comes early."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.6, 0.3], (15, 1)))
    asked: list[int] = []

    def source(n: int) -> CostCurve:
        asked.append(n)
        return curve_from(1.0 + 0.05 * np.arange(1, n + 1))

    tree, _ = choose_tree(m, source, 1024, "auto", initial_budget=16)
    assert tree.size < 16 and max(asked) < 1024
    full, _ = choose_tree(m, curve_from(1.0 + 0.05 * np.arange(1, 1025)), 1024, "exhaustive")
    assert full.size == tree.size


def test_pruning_relies_on_a_non_decreasing_cost() -> None:
    """Negative control for auto's premise: a cost that drops after the scanned prefix hides a
    better tree from the pruned scan, while the exhaustive scan finds it."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.6, 0.3], (15, 1)))
    n = np.arange(1, 257)
    costs = np.where(n <= 40, 1.0 + 10.0 * n, 0.05)  # far cheaper beyond 40 nodes: not monotone
    pruned, _ = choose_tree(m, curve_from(costs), 256, "auto", initial_budget=16)
    full, _ = choose_tree(m, curve_from(costs), 256, "exhaustive")
    assert full.size > 40 and pruned.size <= 32


# --------------------------------------------------------------------------------------------
# Fast paths: the compiled controller and the cached cost curve against plain references
# --------------------------------------------------------------------------------------------


def reference_choose_tree(
    m: DraftMarginals,
    source: Callable[[int], CostCurve],
    n_max: int,
    mode: str,
    initial: int,
    root_token: int,
    base: float,
) -> tuple[DraftTree, dict[str, object]]:
    """The controller written plainly: T_b from the pure-Python heap, Â/Ĉ/Ŝ and the stopping
    rules as loops, the same doubling chunks (valid curves only)."""
    rule = "bounded" if mode == "auto" else mode
    budget = n_max if rule == "exhaustive" else min(initial, n_max)
    while True:
        ahead = min(2 * budget, n_max) if rule == "bounded" else budget
        cc = source(ahead)
        dp = cc.draft_s + cc.prep_s
        c_all = np.array([dp + v for v in np.asarray(cc.verify_s)[:ahead].tolist()])
        parents, depths, ranks, scores = best_first_heap(m.probs, budget)
        n = scores.size
        a_list = list(itertools.accumulate(scores.tolist()))
        pairs = zip(a_list, c_all[:n].tolist(), strict=True)
        a_hat = np.array(a_list)
        s_hat = np.array([(base + a) * cc.ar_step_s / c for a, c in pairs])
        done = n < budget or budget >= n_max
        if rule == "first-decrease":
            down = [i + 1 for i in range(n - 1) if s_hat[i + 1] < s_hat[i]]
            if down or done:
                chosen = down[0] if down else n
                break
        else:
            chosen = max(range(n), key=lambda i: (s_hat[i], -i)) + 1  # the first maximum
            if done:
                break
            if all(c_all[i + 1] - c_all[i] >= 0.0 for i in range(ahead - 1)):
                rho, a_n, ceiling = scores[-1], a_hat[-1], m.depth + 1.0
                bound = 0.0
                for j in range(n + 1, ahead + 1):
                    bound = max(bound, (base + min(a_n + (j - n) * rho, ceiling)) / c_all[j - 1])
                a_far = min(a_n + (n_max - n) * rho, ceiling)
                bound = max(bound, (base + a_far) / c_all[ahead - 1]) * cc.ar_step_s
                if bound <= s_hat[chosen - 1]:
                    break
        budget = min(2 * budget, n_max)
    nodes = zip(depths[1:], ranks[1:], strict=True)
    tokens = np.array([root_token] + [int(m.token_ids[d - 1, r]) for d, r in nodes], np.int64)
    k = chosen
    tree = DraftTree(parents[:k], tokens[:k], depths[:k], scores[:k], ranks[:k])
    diag = {
        "tree_size": chosen,
        "mode": rule,
        "a_hat": a_hat,
        "c_hat": c_all[:n],
        "s_hat": s_hat,
        "ar_step_s": float(cc.ar_step_s),
        "exhausted": n < budget,
        "capped": chosen == n == n_max,
    }
    return tree, diag


def assert_same_choice(
    got: tuple[DraftTree, BudgetDiagnostics], want: tuple[DraftTree, dict[str, object]]
) -> None:
    """Identical tree and diagnostics: every array bit for bit, with its dtype and length."""
    (tree, diag), (ref_tree, ref) = got, want
    for f in ("parents", "tokens", "depths", "scores", "ranks"):
        a, b = getattr(tree, f), getattr(ref_tree, f)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f
    for f, b in ref.items():
        a = getattr(diag, f)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f
        else:
            assert a == b and type(a) is type(b), f


@st.composite
def any_costs(draw: st.DrawFn, n_max: int) -> np.ndarray:
    """Ĉ(N) of every kind the controller meets: convex, monotone with steps, or neither."""
    kind = draw(st.sampled_from(["convex", "monotone", "wild"]))
    if kind == "convex":
        return draw(convex_costs(n_max))
    if kind == "monotone":
        return draw(monotone_costs(n_max))
    return np.array(draw(st.lists(st.floats(0.05, 3.0), min_size=n_max, max_size=n_max)))


PATHS = ["default", "numpy"]  # the compiled chunks where the kernel is built; the fallback


def check_against_reference(
    path: str,
    m: DraftMarginals,
    costs: np.ndarray,
    n_max: int,
    mode: str,
    initial: int,
    root: int = -1,
    base: float = 0.0,
    ar: float = 1.0,
    draft: float = 0.0,
    prep: float = 0.0,
) -> None:
    """choose_tree on ``path`` returns exactly the reference's tree and diagnostics and asks
    the curve source for the same lengths in the same order."""
    asked: tuple[list[int], list[int]] = ([], [])

    def source(log: list[int]) -> Callable[[int], CostCurve]:
        def price(n: int) -> CostCurve:
            log.append(n)
            return CostCurve(draft_s=draft, prep_s=prep, verify_s=costs[:n], ar_step_s=ar)

        return price

    original = budget_module._chunk
    if path == "numpy":
        budget_module._chunk = None
    try:
        got = choose_tree(m, source(asked[0]), n_max, mode, initial, root, base)  # type: ignore[arg-type]
    finally:
        budget_module._chunk = original
    want = reference_choose_tree(m, source(asked[1]), n_max, mode, initial, root, base)
    assert_same_choice(got, want)
    assert asked[0] == asked[1]


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=150)
@given(marginals(max_depth=12, max_k=8), st.data())
def test_fast_controller_equals_reference(
    path: str, m: DraftMarginals, data: st.DataObject
) -> None:
    n_max = data.draw(st.integers(1, 300), label="n_max")
    check_against_reference(
        path,
        m,
        data.draw(any_costs(n_max), label="costs"),
        n_max,
        data.draw(st.sampled_from(["first-decrease", "exhaustive", "auto"]), label="mode"),
        data.draw(st.integers(1, 80), label="initial"),
        root=data.draw(st.integers(-1, 99), label="root_token"),
        base=data.draw(st.sampled_from([0.0, 0.5, 3.0, 40.0]), label="base_tokens"),
        ar=data.draw(st.floats(0.01, 2.0), label="ar_step_s"),
        draft=data.draw(st.sampled_from([0.0, 1e-3, 0.1]), label="draft_s"),
        prep=data.draw(st.sampled_from([0.0, 0.01]), label="prep_s"),
    )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["first-decrease", "exhaustive", "auto"])
@given(marginals(max_depth=12, max_k=8), st.integers(1, 300), st.integers(1, 80), st.data())
def test_fast_controller_equals_reference_on_ties(
    path: str, mode: str, m: DraftMarginals, n_max: int, initial: int, data: st.DataObject
) -> None:
    """Ĉ(N) = 2^j·Â(N) makes Ŝ exactly flat: every argmax and first-decrease test ties."""
    a_hat = np.cumsum(best_first_heap(m.probs, n_max)[3])
    padded = np.concatenate((a_hat, np.full(n_max - a_hat.size, a_hat[-1])))
    scale = data.draw(st.sampled_from([0.5, 2.0]), label="scale")
    check_against_reference(path, m, scale * padded, n_max, mode, initial)


@pytest.mark.parametrize("path", PATHS)
def test_fast_controller_caps_the_bound_at_depth_plus_one(path: str) -> None:
    """A lattice small enough that auto stops only because Â ≤ depth + 1 caps the bound (an
    uncapped bound would build one more chunk): rare in random draws, so pinned here."""
    m = DraftMarginals([[0, 1, 2, 3]], [[0.35, 0.34, 0.2, 0.02]])
    costs = 0.25 + 0.02 * np.arange(1, 24)
    check_against_reference(path, m, costs, 23, "auto", 1)
    _, diag = choose_tree(m, curve_from(costs), 23, "auto", initial_budget=1)
    assert diag.s_hat.size == 4  # stopped with the 4-node chunk, the lattice has 5 nodes


def test_fast_path_is_compiled_when_the_kernel_is() -> None:
    """The default path under test above is the compiled one wherever the kernel is built."""
    assert (budget_module._chunk is not None) == COMPILED


def test_choice_comparison_notices_one_ulp() -> None:
    """Negative control for the identity test: a one-ulp change in Ĉ is a difference."""
    m = DraftMarginals(np.arange(30).reshape(15, 2), np.tile([0.9, 0.05], (15, 1)))
    n = np.arange(1, 257)
    costs = 1.0 + 0.01 * n
    got = choose_tree(m, curve_from(costs), 256, "auto")
    assert_same_choice(
        got,
        reference_choose_tree(m, lambda k: curve_from(costs[:k]), 256, "auto", 128, -1, 0.0),
    )
    bumped = costs.copy()
    bumped[0] = np.nextafter(bumped[0], np.inf)
    with pytest.raises(AssertionError):
        assert_same_choice(
            got,
            reference_choose_tree(m, lambda k: curve_from(bumped[:k]), 256, "auto", 128, -1, 0.0),
        )


def _cost_models() -> list[RooflineCostModel]:
    hw = get_profile("h100-sxm")
    dense, moe = get_model("qwen3-8b"), get_model("qwen3-coder-30b-a3b")
    cal = LinearCalibration(Branch(1.4, 2e-3), Branch(1.5, -6e-4), tile_tokens=64)
    out = []
    for target in (dense, moe):
        drafter = DrafterSpec.dflash_for(target)
        out.append(RooflineCostModel(hw, target, drafter, prep_s=1e-4))
        for mode in ("static", "ema", "ema+calib"):
            out.append(RooflineCostModel(hw, target, drafter, cal, mode, ema_alpha=0.5))  # type: ignore[arg-type]
    return out


def reference_cost_curve(cm: RooflineCostModel, n: int, load: StepLoad) -> CostCurve:
    """``cost_curve`` priced from scratch for exactly N = 1 … n (no cache, no slicing)."""
    bare, cal = cm._base(np.arange(1, n + 1, dtype=np.float64), load)
    ar_bare, ar_cal = cm._base(np.ones(1), load, masked=False)
    return CostCurve(
        draft_s=cm.draft_s(load),
        prep_s=cm.prep_s,
        verify_s=cm._correct(bare, cal),
        ar_step_s=float(cm._correct(ar_bare, ar_cal)[0]),
    )


def test_cached_cost_curve_equals_a_fresh_pricing() -> None:
    """The cache (priced once per situation at a power-of-two length, sliced, corrected once
    per γ) returns bit for bit what pricing exactly N = 1 … n afresh returns, in every mode,
    for dense and MoE models, alone and batched, with γ moving between calls."""
    rng = np.random.default_rng(0)
    for cm in _cost_models():
        for _ in range(40):
            co = tuple(
                RequestLoad(int(rng.integers(1, 64)), int(rng.integers(0, 5000)))
                for _ in range(int(rng.integers(0, 3)))
            )
            load = StepLoad(int(rng.integers(0, 3000)), co)
            n = int(rng.choice([1, 2, 3, 63, 64, 65, 200, 255, 256, 257, 700, 1024]))
            got = cm.cost_curve(n, load)
            want = reference_cost_curve(cm, n, load)
            assert got.verify_s.tobytes() == want.verify_s.tobytes()
            assert (got.draft_s, got.prep_s, got.ar_step_s) == (
                want.draft_s,
                want.prep_s,
                want.ar_step_s,
            )
            assert not got.verify_s.flags.writeable
            if rng.random() < 0.3:
                cm.observe(int(rng.integers(1, 300)), load, float(rng.uniform(5e-3, 5e-2)))


def test_cached_cost_curve_checks_only_the_asked_range() -> None:
    """An entry invalid beyond N is an error only for curves that reach it, on every call."""
    cm = _cost_models()[0]
    load = StepLoad(100)
    cm.cost_curve(8, load)  # prices N ≤ 64 for this situation
    entry = cm._curves[(cm.bucket(100), ())]
    bad = entry.base[0].copy()
    bad[40] = np.nan
    entry.base = (bad, bad)
    entry.stamp = None  # as after a change of γ: re-corrected and re-checked
    assert cm.cost_curve(40, load).verify_s.size == 40
    for _ in range(2):
        with pytest.raises(CostModelError, match="verify"):
            cm.cost_curve(41, load)
