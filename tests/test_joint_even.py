"""The joint curve's fast paths read exactly as the general ones: an even spread of the added
nodes (the learned prior's anchors) takes the nodes each request holds without a sort, and the
tiled compute branch reuses the bare branch's features but for the padded T."""

from __future__ import annotations

import numpy as np
import pytest

import bastion.cost.costmodel as costmodel
import bastion.cost.jointcurve as jointcurve
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BudgetError
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model


def _model(name: str, mode: str, tp: int = 1) -> RooflineCostModel:
    model = get_model(name)
    gpu = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model), tp=tp)
    cm, _ = calibrated_cost_model(gpu, mode)
    if mode in ("ema", "ema+calib"):
        cm.ema.gamma = 1.07
    assert isinstance(cm, RooflineCostModel)
    return cm


def _grows(rng: np.random.Generator, b: int) -> list[np.ndarray]:
    n = int(rng.integers(1, 3000))
    even = np.arange(n, dtype=np.int64) % b
    almost = even.copy()
    almost[int(rng.integers(0, n))] = (almost[int(rng.integers(0, n))] + 1) % b
    return [even, almost, rng.integers(0, b, n).astype(np.int64), even[: max(n // 2, 1)]]


@pytest.mark.parametrize(
    ("name", "mode", "tp"),
    [
        ("qwen3-8b", "static", 1),
        ("qwen3-8b", "ema+calib", 1),
        ("qwen3-8b", "bare", 1),
        ("llama-3.1-70b", "static", 4),
        ("qwen3-coder-30b-a3b", "static", 1),
    ],
)
def test_fast_paths_price_as_the_general_ones(
    name: str, mode: str, tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cm = _model(name, mode, tp)
    rng = np.random.default_rng(len(name) + tp)
    cases = []
    for _ in range(6):
        b = int(rng.integers(1, 70))
        ctx = rng.integers(0, 40000, b).astype(np.int64)
        cases += [(ctx, g) for g in _grows(rng, b)]
    fast = [cm.joint_cost_curve(ctx, g) for ctx, g in cases]
    monkeypatch.setattr(jointcurve, "_round_robin", lambda g, n: None)
    monkeypatch.setattr(jointcurve, "_same_but_tile", lambda bare, tiled: False)
    for (ctx, g), got in zip(cases, fast, strict=True):
        want = cm.joint_cost_curve(ctx, g)
        assert np.array_equal(got.verify_s, want.verify_s)
        assert (got.draft_s, got.prep_s, got.ar_step_s, got.growth_s) == (
            want.draft_s,
            want.prep_s,
            want.ar_step_s,
            want.growth_s,
        )


def test_an_even_spread_is_still_checked() -> None:
    cm = _model("qwen3-8b", "static")
    ctx = np.array([10, 20, 30], np.int64)
    with pytest.raises(BudgetError):
        cm.joint_cost_curve(ctx, np.array([0, 1, 2, 3], np.int64))  # request 3 of 3
    shapes = jointcurve.joint_shapes(ctx, np.arange(7, dtype=np.int64) % 3, 16)
    held = np.array([1, 1, 1, 2, 2, 2, 3], np.float64)
    c = np.array([16.0, 32.0, 32.0])
    pairs = (c + 1).sum() + np.cumsum(c[np.arange(7) % 3] + 2 * held + 1)
    assert np.array_equal(shapes.both.attn_pairs[1:-1], pairs)


needs_kernel = pytest.mark.skipif(
    getattr(getattr(jointcurve, "_compiled", None), "joint_price", None) is None,
    reason="compiled kernel not built",
)


@needs_kernel
@pytest.mark.parametrize(
    ("name", "mode", "tp"),
    [
        ("qwen3-8b", "static", 1),
        ("qwen3-8b", "ema+calib", 1),
        ("llama-3.1-8b", "static", 1),
        ("llama-3.1-70b", "static", 4),
        ("llama-3.1-70b", "ema+calib", 4),
        ("qwen3-32b", "static", 2),
    ],
)
def test_compiled_joint_price_is_numpys(
    name: str, mode: str, tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """joint_cost_curve(growth=False) priced by joint_price() reads as the numpy pricing,
    bit for bit (the learned prior's anchors are these curves)."""
    cm = _model(name, mode, tp)
    rng = np.random.default_rng(len(name) * 3 + tp)
    cases = []
    for _ in range(8):
        b = int(rng.integers(1, 70))
        ctx = rng.integers(0, 60000, b).astype(np.int64)
        cases += [(ctx, g) for g in _grows(rng, b)] + [(ctx, np.zeros(0, np.int64))]
    assert all(jointcurve.joint_priced_compiled(cm, c, g) is not None for c, g in cases)
    fast = [cm.joint_cost_curve(c, g, growth=False) for c, g in cases]
    monkeypatch.setattr(jointcurve, "joint_priced_compiled", lambda *a: None)
    monkeypatch.setattr(costmodel, "joint_priced_compiled", lambda *a: None)
    for (ctx, g), got in zip(cases, fast, strict=True):
        want = cm.joint_cost_curve(ctx, g, growth=False)
        assert np.array_equal(got.verify_s, want.verify_s)
        assert (got.draft_s, got.prep_s, got.ar_step_s, got.growth_s) == (
            want.draft_s,
            want.prep_s,
            want.ar_step_s,
            want.growth_s,
        )


@needs_kernel
def test_compiled_joint_price_leaves_what_it_cannot_price_to_numpy() -> None:
    cm = _model("qwen3-8b", "static")
    ctx = np.array([10, 20, 30], np.int64)
    assert jointcurve.joint_priced_compiled(cm, ctx, np.array([0, 3], np.int64)) is None
    assert jointcurve.joint_priced_compiled(cm, ctx, np.array([-1], np.int64)) is None
    huge = np.full(3, 2**52, np.int64)  # counts beyond 2^53: not exact
    assert jointcurve.joint_priced_compiled(cm, huge, np.array([0, 1], np.int64)) is None
    for bad in (np.array([0, 3], np.int64), np.array([0.5])):
        with pytest.raises(BudgetError):
            cm.joint_cost_curve(ctx, bad, growth=False)
    moe = _model("qwen3-coder-30b-a3b", "static")
    assert jointcurve.joint_priced_compiled(moe, ctx, np.array([0, 1], np.int64)) is None
    bare = _model("qwen3-8b", "bare")
    assert jointcurve.joint_priced_compiled(bare, ctx, np.array([0, 1], np.int64)) is None
