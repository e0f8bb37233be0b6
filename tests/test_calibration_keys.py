"""Calibration records cannot go stale silently: keyed by the inputs' contents, reuse announced."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bastion.cost import notices
from bastion.cost.calibration import CalibrationCache, calibrate_or_load, inputs_digest
from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.roofline import verify_pass


def test_changed_inputs_recalibrate_and_reuse_is_announced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, hw = get_model("qwen3-8b"), get_profile("h100-sxm")
    calls = []

    def verify(s: int, c: int) -> float:
        calls.append((s, c))
        return 1.3 * float(verify_pass(model, hw, [(s, c)]).total_s)

    cache = CalibrationCache(tmp_path)
    kw = {"backend": "unit", "cache": cache, "sweep_kwargs": {"repeats": 1, "warmup": 0}}
    first = calibrate_or_load(model, hw, verify, **kw)
    swept = len(calls)
    assert swept > 0 and "reusing" not in capsys.readouterr().err
    # read back by the process that measured it: the measurement, not a reuse
    again = calibrate_or_load(model, hw, verify, **kw)
    assert len(calls) == swept and again.calibration == first.calibration
    assert "reusing" not in capsys.readouterr().err
    # read by a later process (one that measured nothing): a reuse, announced
    monkeypatch.setattr(notices, "_MEASURED_HERE", set())
    again = calibrate_or_load(model, hw, verify, **kw)
    assert len(calls) == swept and again.calibration == first.calibration
    assert "reusing the calibration record" in capsys.readouterr().err
    # the same profile name with other numbers (an edited file) is a different key: measure again
    edited = replace(hw, memory_bandwidth=hw.memory_bandwidth * 0.5)
    assert inputs_digest(edited, model) != inputs_digest(hw, model)
    calibrate_or_load(model, edited, verify, **kw)
    assert len(calls) == 2 * swept
    assert len(list(tmp_path.glob("*.json"))) == 2
