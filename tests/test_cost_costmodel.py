"""RooflineCostModel: the CostModel protocol, its four modes, batching, and its speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bastion.cost.calibration import Branch, EmaCorrection, LinearCalibration
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BudgetError, ConfigError, CostModelError
from bastion.interfaces import CostModel, RequestLoad, StepLoad

HW = get_profile("a100-sxm-80gb")
MODEL = get_model("qwen3-8b")
CAL = LinearCalibration(Branch(1.2, 1e-3), Branch(1.1, 5e-4))


def _model(**kw: object) -> RooflineCostModel:
    return RooflineCostModel(HW, MODEL, drafter=DrafterSpec.dflash_for(MODEL), **kw)  # type: ignore[arg-type]


def test_implements_the_protocol() -> None:
    assert isinstance(_model(), CostModel)


@pytest.mark.parametrize("mode", ["bare", "static", "ema", "ema+calib"])
def test_curve_agrees_with_step_cost(mode: str) -> None:
    cm = _model(calibration=CAL, mode=mode)
    load = StepLoad(777, (RequestLoad(9, 100),))
    curve = cm.cost_curve(256, load)
    for n in (1, 17, 256):
        step = cm.step_cost(n, load)
        assert step.verify_s == pytest.approx(curve.verify_s[n - 1], rel=1e-12)
        assert step.draft_s == curve.draft_s > 0
        ops = sum(v for k, v in step.breakdown.items() if k.startswith("verify."))
        assert ops == pytest.approx(step.verify_s)
    assert curve.ar_step_s < curve.verify_s[0]


def test_static_is_the_calibration() -> None:
    cm = _model(calibration=CAL)
    assert cm.mode == "static"
    rb = cm.roofline(np.arange(1, 65), StepLoad(1024))
    expected = CAL.predict(rb.compute_s, rb.memory_s)
    np.testing.assert_allclose(cm.cost_curve(64, StepLoad(1024)).verify_s, expected)


def test_ema_modes_track_observations() -> None:
    for mode in ("ema", "ema+calib"):
        cm = _model(calibration=CAL, mode=mode, ema_alpha=0.5)
        load = StepLoad(512)
        before = cm.step_cost(32, load).verify_s
        for _ in range(30):
            cm.observe(32, load, 2.0 * before)
        assert cm.step_cost(32, load).verify_s == pytest.approx(2.0 * before, rel=1e-6)
    static = _model(calibration=CAL)
    v = static.step_cost(32, StepLoad(512)).verify_s
    static.observe(32, StepLoad(512), 10 * v)  # the static mode ignores feedback
    assert static.step_cost(32, StepLoad(512)).verify_s == v


def test_batch_raises_the_pass_time() -> None:
    cm = _model()
    alone = cm.cost_curve(64, StepLoad(1024)).verify_s
    shared = cm.cost_curve(64, StepLoad(1024, (RequestLoad(64, 1024),) * 3)).verify_s
    assert np.all(shared > alone)


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="calibration"):
        _model(mode="static")
    with pytest.raises(ConfigError):
        _model(mode="fast")  # type: ignore[arg-type]
    with pytest.raises(BudgetError):
        _model().cost_curve(0, StepLoad(10))
    with pytest.raises(BudgetError):
        _model().step_cost(4, StepLoad(-1))
    broken = LinearCalibration(Branch(1e-6, -1.0), Branch(1e-6, -1.0))
    with pytest.raises(CostModelError):
        _model(calibration=broken).cost_curve(8, StepLoad(10))


def test_ema_state_is_per_model() -> None:
    a, b = _model(mode="ema"), _model(mode="ema")
    a.observe(8, StepLoad(64), 1.0)
    assert isinstance(a.ema, EmaCorrection) and a.ema.gamma != b.ema.gamma


def test_curve_is_fast_enough_for_every_decode_step() -> None:
    """The controller calls cost_curve every step: ≪ 1 ms for N_max = 1024 once cached."""
    cm = _model(calibration=CAL)
    cm.cost_curve(1024, StepLoad(4000))  # the first call of a context bucket builds the curve
    runs = []
    for c in range(4000, 4064, 4):  # the same 64-token bucket: cached
        start = time.perf_counter()
        cm.cost_curve(1024, StepLoad(c))
        runs.append(time.perf_counter() - start)
    assert float(np.median(runs)) < 2e-4
    start = time.perf_counter()
    cm.cost_curve(1024, StepLoad(9000))  # a miss: one vectorised evaluation
    assert time.perf_counter() - start < 2e-2


def test_cost_modules_import_without_torch_or_matplotlib() -> None:
    import subprocess
    import sys

    code = (
        "import sys, bastion.cost.costmodel, bastion.cost.calibration, bastion.cost.backends, "
        "bastion.cost.validation, bastion.cost.kernels, bastion.cost.transfer, "
        "bastion.cost.datasets, bastion.cli.cost_cmd, bastion.cli.hw_cmd; "
        "print(any(m in sys.modules for m in ('torch', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
