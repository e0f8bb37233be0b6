"""Prop. 3.4's premises: dense C(N) convex and non-decreasing; MoE non-convexity detected."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.cost.calibration import Branch, LinearCalibration
from bastion.cost.convexity import (
    cost_curve_convexity_violations,
    cost_curve_is_convex,
    cost_curve_is_nondecreasing,
)
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile, known_profiles
from bastion.cost.models import DrafterSpec, get_model, known_models
from bastion.cost.roofline import RooflineOptions
from bastion.interfaces import RequestLoad, StepLoad

DENSE = [m for m in known_models() if not get_model(m).is_moe]
MOE = [m for m in known_models() if get_model(m).is_moe]

loads = st.builds(
    StepLoad,
    context_len=st.integers(0, 32768),
    co_batched=st.lists(
        st.builds(RequestLoad, tree_size=st.integers(1, 64), context_len=st.integers(0, 8192)),
        max_size=3,
    ).map(tuple),
)
calibrations = st.builds(
    LinearCalibration,
    compute=st.builds(Branch, alpha=st.floats(0.5, 3.0), beta=st.floats(0.0, 5e-3)),
    memory=st.builds(Branch, alpha=st.floats(0.5, 3.0), beta=st.floats(0.0, 5e-3)),
)


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(DENSE),
    profile=st.sampled_from(known_profiles()),
    load=loads,
    n_max=st.integers(3, 1024),
)
def test_dense_cost_is_convex_and_nondecreasing(
    model: str, profile: str, load: StepLoad, n_max: int
) -> None:
    """For every bundled dense model × profile, the bare Ĉ(N) is convex and non-decreasing."""
    m = get_model(model)
    cm = RooflineCostModel(get_profile(profile), m, drafter=DrafterSpec.dflash_for(m))
    total = cm.cost_curve(n_max, load).total_s()
    assert np.all(total > 0)
    assert cost_curve_is_nondecreasing(total)
    assert cost_curve_is_convex(total)


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(DENSE), cal=calibrations, load=loads)
def test_calibrated_dense_cost_stays_convex(
    model: str, cal: LinearCalibration, load: StepLoad
) -> None:
    """The static calibration (α > 0, no tile step) keeps the curve convex: max of convex lines."""
    cm = RooflineCostModel(get_profile("a100-sxm-80gb"), get_model(model), calibration=cal)
    total = cm.cost_curve(512, load).total_s()
    assert cost_curve_is_convex(total) and cost_curve_is_nondecreasing(total)


@settings(max_examples=20, deadline=None)
@given(
    profile=st.sampled_from(known_profiles()),
    context=st.integers(0, 4096),
    form=st.sampled_from(["saturating", "uniform"]),
)
def test_moe_nonconvexity_is_detected_near_saturation(
    profile: str, context: int, form: str
) -> None:
    """Qwen3-MoE: the expert-touch term bends Ĉ(N) down by s = E/K; the check must see it."""
    m = get_model(MOE[0])
    cm = RooflineCostModel(
        get_profile(profile),
        m,
        options=RooflineOptions(expert_touch=form),  # type: ignore[arg-type]
    )
    verify = cm.cost_curve(128, StepLoad(context)).verify_s
    bad = cost_curve_convexity_violations(verify)
    assert not cost_curve_is_convex(verify)
    saturation = m.experts / m.experts_per_token  # 16
    assert bad.size and bad.min() + 1 <= saturation + 1  # the first violation, as a tree size N
    if form == "saturating":
        assert saturation - 1 in bad  # the kink itself: N = E/K is index E/K − 1


def test_the_checks_can_fail() -> None:
    n = np.arange(1, 50, dtype=float)
    assert cost_curve_is_convex(n**2) and not cost_curve_is_convex(np.sqrt(n))
    assert cost_curve_is_nondecreasing(n) and not cost_curve_is_nondecreasing(-n)
    assert list(cost_curve_convexity_violations([0.0, 2.0, 3.0, 5.0])) == [1]
    steps = RooflineCostModel(
        get_profile("a100-sxm-80gb"),
        get_model("qwen3-8b"),
        calibration=LinearCalibration(Branch(1.0, 0.0), Branch(1.0, 0.0), tile_tokens=64),
    )
    assert not cost_curve_is_convex(steps.cost_curve(1024, StepLoad(64)).verify_s)
