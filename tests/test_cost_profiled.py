"""The profiled cost model (``--cost-model profiled:FILE``) and the factory that names it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.profiled import ProfiledCostModel, cost_model_from_spec
from bastion.errors import ConfigError
from bastion.interfaces import StepLoad

CSV = Path(__file__).resolve().parents[1] / "docs/data/a100-80gb_llama-3-8b_per-layer-ops.csv"
HW, MODEL = get_profile("a100-sxm-80gb"), get_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def profiled() -> ProfiledCostModel:
    cm = cost_model_from_spec(f"profiled:vidur:{CSV}", HW, MODEL)
    assert isinstance(cm, ProfiledCostModel)
    return cm


def test_measured_operators_replace_the_roofline_ones(profiled: ProfiledCostModel) -> None:
    """At a measured token count the covered operators cost exactly what was measured."""
    s, c = 64, 0
    cm_bare = RooflineCostModel(HW, MODEL, mode="bare", options=profiled.options, context_bucket=1)
    pm = ProfiledCostModel(HW, MODEL, profiled.table, context_bucket=1)
    load = StepLoad(c)
    measured = sum(col.count * col.seconds[col.tokens == s][0] for col in pm.columns)
    covered = float(pm._covered_bare(np.array([float(s)]))[0])
    expected = cm_bare.step_cost(s, load).verify_s - covered + measured
    assert pm.step_cost(s, load).verify_s == pytest.approx(expected, rel=1e-9)
    assert measured > 0.5 * expected  # the table covers most of a short pass


def test_curve_is_positive_and_joint_matches_step_cost(profiled: ProfiledCostModel) -> None:
    curve = profiled.cost_curve(128, StepLoad(512))
    assert np.all(curve.verify_s > 0) and curve.ar_step_s > 0
    joint = profiled.joint_cost_curve(np.array([512, 100]), np.array([0, 0, 1]))
    assert joint.verify_s.shape == (4,) and np.all(np.diff(joint.verify_s) > -1e-12)


def test_beyond_the_table_the_calibrated_roofline_takes_over(profiled: ProfiledCostModel) -> None:
    col = profiled.columns[0]
    top = col.tokens[-1]
    beyond = col.seconds_at(np.array([top, 2 * top]))
    assert beyond[0] == pytest.approx(col.seconds[-1]) and beyond[1] > 1.5 * beyond[0]


def test_factory_names_every_mode_and_refuses_others(tmp_path: Path) -> None:
    for mode in ("bare", "ema"):
        assert cost_model_from_spec(mode, HW, MODEL).mode == mode
    with pytest.raises(ConfigError, match="accepted: bare, static"):
        cost_model_from_spec("roofline", HW, MODEL)
    with pytest.raises(ConfigError, match="no file"):
        cost_model_from_spec(f"profiled:{tmp_path / 'none.csv'}", HW, MODEL)
