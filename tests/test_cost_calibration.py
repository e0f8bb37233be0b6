"""Static linear calibration, EMA, the profiling sweep and the record cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.cost.backends import get_backend, known_backends, register_backend
from bastion.cost.calibration import (
    DEFAULT_CONTEXTS,
    DEFAULT_TOKENS,
    Branch,
    CalibrationCache,
    CalibrationRecord,
    EmaCorrection,
    LinearCalibration,
    Measurement,
    calibrate,
    calibrate_or_load,
    fit_linear,
    profile_sweep,
    raw_branches,
)
from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.errors import ConfigError, UnknownNameError

HW = get_profile("h100-sxm")
MODEL = get_model("qwen3-8b")


def _grid() -> tuple[np.ndarray, np.ndarray]:
    s, c = np.meshgrid(np.array(DEFAULT_TOKENS, float), np.array(DEFAULT_CONTEXTS, float))
    return s.ravel(), c.ravel()


@settings(max_examples=25, deadline=None)
@given(
    ac=st.floats(0.8, 3.0),
    bc=st.floats(0.0, 2e-3),
    am=st.floats(0.8, 3.0),
    bm=st.floats(0.0, 2e-3),
)
def test_fit_recovers_a_known_calibration(ac: float, bc: float, am: float, bm: float) -> None:
    """Noise-free data made by max(α_c·R_c + β_c, α_m·R_m + β_m) is reproduced by the fit."""
    s, c = _grid()
    rc, rm, _ = raw_branches(MODEL, HW, s, c)
    truth = LinearCalibration(Branch(ac, bc), Branch(am, bm))
    y = truth.predict(rc, rm)
    fit = fit_linear(rc, rm, y)
    assert np.max(np.abs(fit.predict(rc, rm) / y - 1)) < 1e-3


def test_too_few_or_bad_points_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least"):
        fit_linear([1, 2, 3], [1, 2, 3], [1, 2, 3])
    with pytest.raises(ConfigError, match="positive"):
        fit_linear([1.0] * 6, [1.0] * 6, [1, 2, 3, 0, 5, 6])
    pts = [Measurement(s, 64, -1.0) for s in (1, 2, 4, 8, 16, 32)]
    with pytest.raises(ConfigError):
        calibrate(MODEL, HW, pts)
    with pytest.raises(ConfigError):
        calibrate(MODEL, HW, [Measurement(0, 64, 1e-3)] * 6)


def test_ema_update_rule() -> None:
    ema = EmaCorrection(alpha=0.25)
    assert ema.update(2.0, 1.0) == pytest.approx(0.75 + 0.25 * 2.0)
    for _ in range(200):
        ema.update(1.5, 1.0)
    assert ema.gamma == pytest.approx(1.5)
    ema.update(1e6, 1.0)  # one outlier moves γ by at most α·clip
    assert ema.gamma <= 0.75 * 1.5 + 0.25 * 10 + 1e-12
    with pytest.raises(ConfigError):
        ema.update(0.0, 1.0)
    with pytest.raises(ConfigError):
        EmaCorrection(alpha=0.0)


def test_sweep_is_the_papers_grid() -> None:
    calls: list[tuple[int, int]] = []

    def verify(s: int, c: int) -> float:
        calls.append((s, c))
        return 1e-3 * s

    pts = profile_sweep(verify)
    assert len(pts) == 42 and len(calls) == 42 * (3 + 1)
    assert {(p.tokens, p.context) for p in pts} == {
        (s, c) for s in DEFAULT_TOKENS for c in DEFAULT_CONTEXTS
    }


def test_sweep_times_with_the_clock_when_verify_returns_none() -> None:
    ticks = iter(range(1000))
    pts = profile_sweep(lambda s, c: None, tokens=(1,), contexts=(0,), clock=lambda: next(ticks))
    assert pts[0].seconds == 1.0


def test_calibration_beats_the_bare_roofline_on_a_synthetic_device() -> None:
    verify = get_backend("synthetic")(MODEL, HW, 0)
    record = calibrate(MODEL, HW, profile_sweep(verify, repeats=1), tile_candidates=(0, 64))
    assert record.rmse_calibrated_s < 0.2 * record.rmse_bare_s


def test_record_round_trip_and_reuse(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path)
    verify = get_backend("synthetic")(MODEL, HW, 1)
    sweep = {"tokens": (1, 8, 64, 256, 1024), "contexts": (64, 1024), "repeats": 1}
    rec = calibrate_or_load(MODEL, HW, verify, backend="synthetic", cache=cache, sweep_kwargs=sweep)
    path = cache.path_for(rec.key)
    assert path.is_file() and json.loads(path.read_text())["model"] == "qwen3-8b"

    def must_not_run(s: int, c: int) -> float:
        raise AssertionError("a stored record must be reused without profiling")

    again = calibrate_or_load(MODEL, HW, must_not_run, backend="synthetic", cache=cache)
    assert again.calibration == rec.calibration
    assert CalibrationRecord.from_dict(rec.to_dict()).to_dict() == rec.to_dict()
    path.write_text(json.dumps({"device": "x"}))
    with pytest.raises(ConfigError):
        cache.load(rec.key)


def test_backend_registry() -> None:
    assert "synthetic" in known_backends()
    with pytest.raises(UnknownNameError, match="synthetic"):
        get_backend("cuda-magic")
    with pytest.raises(ValueError):
        register_backend("synthetic", get_backend("synthetic"))


def test_a_poorly_fitting_record_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep timed while the machine was busy fits its own points badly; using such a record
    (fitted now or reused) says so, naming the file and what to do. A good fit stays silent."""
    from dataclasses import replace

    from bastion.cost.notices import POOR_FIT, warn_if_poor

    verify = get_backend("synthetic")(MODEL, HW, 0)
    good = calibrate(MODEL, HW, profile_sweep(verify, repeats=1), tile_candidates=(0, 64))
    assert good.cv_mape <= POOR_FIT
    assert warn_if_poor(good, tmp_path / "good.json") is False
    assert capsys.readouterr().err == ""
    busy = replace(good, cv_mape=0.69, cv_max_error=4.0)
    assert warn_if_poor(busy, tmp_path / "busy.json") is True
    err = capsys.readouterr().err
    assert "busy.json" in err and "69%" in err and "--refit" in err
    assert warn_if_poor(replace(good, cv_mape=float("nan")), tmp_path / "x.json") is False

    cache = CalibrationCache(tmp_path)  # the reuse path flags a stored poor record too
    rec = calibrate_or_load(MODEL, HW, verify, backend="synthetic", cache=cache)
    capsys.readouterr()
    cache.path_for(rec.key).write_text(json.dumps(replace(rec, cv_mape=0.9).to_dict()))
    calibrate_or_load(MODEL, HW, verify, backend="synthetic", cache=cache)
    assert "fits its own timings poorly" in capsys.readouterr().err
