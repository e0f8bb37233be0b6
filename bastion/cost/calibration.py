"""Calibration of the roofline against measured latencies (paper §5.2, Appendix G.3).

Three corrections, as in the paper:

- **Static** (offline, linear): a scale and an offset per roofline branch, fitted from measured
  ``(s, c, seconds)`` points, prediction = max(α_c·R_c + β_c, α_m·R_m + β_m), where R_c and R_m
  are the bare compute and memory branches (FLOPs/(η_c·peak), bytes/(η_m·bandwidth)). An
  optional step term evaluates R_c on the token count padded to a tile (64/128 tokens), for the
  latency jumps of tile and wave quantisation that a linear fit cannot follow.
- **EMA**: γ ← (1 − α)·γ + α·observed/predicted on the bare roofline; prediction γ·R(N).
- **EMA+Calib**: the same EMA, as a residual on the calibrated curve.

A profiling sweep times any ``verify(s, c)`` callable over a grid (the paper's 42 points, three
repeats each), and the fit is stored as a JSON record keyed by (device, model, dtype, backend) so
it is reused without refitting.

What this module does not do: pick a cost-model mode (see :mod:`bastion.cost.costmodel`) or
know any backend (see :mod:`bastion.cost.backends`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from bastion.cost.fitting import fit_max_affine, loo_errors
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import ModelSpec
from bastion.cost.notices import announce_reuse, measured_here, warn_if_poor
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import comm_line
from bastion.cost.roofline import verify_pass
from bastion.errors import ArgumentError, ConfigError
from bastion.files import read_json_file, write_json_atomic
from bastion.guard import array, each, forwarded, integer, public

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_CONTEXTS",
    "DEFAULT_TOKENS",
    "MIN_POINTS",
    "Branch",
    "CalibrationCache",
    "CalibrationRecord",
    "EmaCorrection",
    "LinearCalibration",
    "Measurement",
    "calibrate",
    "calibrate_or_load",
    "check_record",
    "fit_linear",
    "profile_sweep",
    "raw_branches",
    "read_record",
    "rmse",
]

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float64]
Weighting = Literal["relative", "absolute"]
VerifyFn = Callable[[int, int], "float | None"]

#: The paper's grid: 14 token counts × 3 contexts = 42 points (Appendix G.3, Figure 7).
DEFAULT_TOKENS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024)
DEFAULT_CONTEXTS: tuple[int, ...] = (64, 256, 1024)
#: Fewest points a fit accepts (four parameters, and one to spare).
MIN_POINTS = 5
#: Where calibration records are stored (default: $XDG_CACHE_HOME/bastion/calibration).
CACHE_DIR_ENV = "BASTION_CALIBRATION_DIR"


@dataclass(frozen=True)
class Measurement:
    """One measured point: a pass of ``tokens`` tokens over ``context`` cached ones."""

    tokens: int  # s
    context: int  # c
    seconds: float  # measured verification time


@dataclass(frozen=True)
class Branch:
    """α·raw + β for one roofline branch."""

    alpha: float  # scale (dimensionless)
    beta: float  # offset (seconds)


@dataclass(frozen=True)
class LinearCalibration:
    """The static calibration: max over the two calibrated branches (+ the tile step)."""

    compute: Branch
    memory: Branch
    tile_tokens: int = 0  # > 0: R_c is evaluated on tokens padded to this multiple

    def predict(self, compute_raw: npt.ArrayLike, memory_raw: npt.ArrayLike) -> Array:
        rc = np.asarray(compute_raw, dtype=np.float64)
        rm = np.asarray(memory_raw, dtype=np.float64)
        return np.maximum(
            self.compute.alpha * rc + self.compute.beta, self.memory.alpha * rm + self.memory.beta
        )


@public(predicted=array(), measured=array(), broadcast=("predicted", "measured"))
def rmse(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Root-mean-square error, in the units of the inputs."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    return float(np.sqrt(np.mean((p - m) ** 2)))


def _validate_measured(measured: Array, n_min: int = MIN_POINTS) -> None:
    if measured.size < n_min:
        raise ConfigError(
            f"calibration needs at least {n_min} measured points, got {measured.size}"
        )
    if not np.all(np.isfinite(measured)) or np.any(measured <= 0):
        raise ConfigError("calibration times must be positive finite seconds")


@public(
    compute_raw=array(1),
    memory_raw=array(),
    measured=array(1),
    lengths=("compute_raw", "memory_raw", "measured"),
)
def fit_linear(
    compute_raw: npt.ArrayLike,
    memory_raw: npt.ArrayLike,
    measured: npt.ArrayLike,
    weighting: Weighting = "relative",
    tile_tokens: int = 0,
) -> LinearCalibration:
    """Fit α_c, β_c, α_m, β_m so that max(α_c·R_c + β_c, α_m·R_m + β_m) ≈ measured.

    ``relative`` weighting minimises Σ((pred − y)/y)², which keeps small passes (a decode step)
    as important as large ones; ``absolute`` minimises Σ(pred − y)². The fit is global and
    start-free (:func:`bastion.cost.fitting.fit_max_affine`: every memory/compute split of the
    points ordered by R_c/R_m, each branch a bounded linear least-squares problem), so the
    calibrated curve does not depend on the profile's peak numbers: scaling R_c or R_m by any
    positive factor rescales α and leaves the predictions unchanged.
    """
    rc = np.asarray(compute_raw, dtype=np.float64).ravel()
    rm = np.asarray(memory_raw, dtype=np.float64).ravel()
    y = np.asarray(measured, dtype=np.float64).ravel()
    _validate_measured(y)
    if rc.shape != y.shape or rm.shape != y.shape:
        raise ConfigError("compute_raw, memory_raw and measured must have the same length")
    if np.any(rc < 0) or np.any(rm <= 0):
        raise ConfigError("roofline branches must be non-negative (memory positive)")
    fit = fit_max_affine(rc, rm, y, weighting=weighting)
    # α > 0 keeps the calibrated curve strictly increasing in its branch (the controller's
    # growth bound reads α); a slope the data leave at 0 becomes a negligible 1e-9
    return LinearCalibration(
        compute=Branch(max(fit.compute_slope, 1e-9), fit.compute_offset),
        memory=Branch(max(fit.memory_slopes[0], 1e-9), fit.memory_offset),
        tile_tokens=tile_tokens,
    )


@public(
    tokens=array(lo=1),
    contexts=array(lo=0),
    tile_tokens=integer(lo=0),
    broadcast=("tokens", "contexts"),
)
def raw_branches(
    model: ModelSpec,
    hw: HardwareProfile,
    tokens: npt.ArrayLike,
    contexts: npt.ArrayLike,
    options: RooflineOptions | None = None,
    tile_tokens: int = 0,
) -> tuple[Array, Array, Array]:
    """(R_c, R_m, bare roofline) in seconds for single-request passes of (s, c) pairs."""
    opt = options or RooflineOptions()
    s = np.asarray(tokens, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    bare = verify_pass(model, hw, [(s, c)], opt)
    if tile_tokens:
        tiled = RooflineOptions(**{**asdict(opt), "tile_tokens": tile_tokens})
        rc = verify_pass(model, hw, [(s, c)], tiled).compute_s
    else:
        rc = bare.compute_s
    shape = np.broadcast_shapes(s.shape, c.shape)
    return (
        np.broadcast_to(rc, shape).astype(np.float64),
        np.broadcast_to(bare.memory_s, shape).astype(np.float64),
        np.broadcast_to(bare.total_s, shape).astype(np.float64),
    )


# --------------------------------------------------------------------------------------------
# EMA
# --------------------------------------------------------------------------------------------


@public
@dataclass
class EmaCorrection:
    """γ ← (1 − α)·γ + α·observed/predicted; predictions are multiplied by γ.

    ``clip`` bounds one observation's ratio so that a single outlier (a page fault, a context
    switch) cannot move γ by more than α·clip.
    """

    alpha: float = 0.1  # EMA weight of the newest observation, in (0, 1]
    gamma: float = 1.0  # current multiplicative correction
    clip: tuple[float, float] = (0.1, 10.0)
    updates: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ConfigError(f"EMA alpha must be in (0, 1], got {self.alpha}")
        if not self.gamma > 0:
            raise ConfigError(f"EMA gamma must be positive, got {self.gamma}")

    def update(self, observed_s: float, predicted_s: float) -> float:
        """Fold one observation in (``predicted_s`` is the uncorrected prediction)."""
        if not (math.isfinite(observed_s) and observed_s > 0):
            raise ConfigError(f"observed time must be positive finite seconds, got {observed_s}")
        if not (math.isfinite(predicted_s) and predicted_s > 0):
            raise ConfigError(f"predicted time must be positive, got {predicted_s}")
        ratio = min(max(observed_s / predicted_s, self.clip[0]), self.clip[1])
        self.gamma = (1.0 - self.alpha) * self.gamma + self.alpha * ratio
        self.updates += 1
        return self.gamma


# --------------------------------------------------------------------------------------------
# Records, cache, sweep
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationRecord:
    """A fitted static calibration for one (device, model, dtype, backend)."""

    device: str
    model: str
    dtype: str
    backend: str
    calibration: LinearCalibration
    prep_s: float = 0.0  # T_aux, a constant
    rmse_bare_s: float = float("nan")  # bare roofline vs the sweep
    rmse_calibrated_s: float = float("nan")  # calibrated vs the sweep (in-sample)
    cv_mape: float = float("nan")  # leave-one-out relative error of the fit, mean (held-out)
    cv_max_error: float = float("nan")  # … and its worst point
    points: tuple[Measurement, ...] = ()
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    inputs: str = ""  # inputs_digest(profile, model): what the fit depends on besides points

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.device, self.model, self.dtype, self.backend, self.inputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "model": self.model,
            "dtype": self.dtype,
            "backend": self.backend,
            "compute": asdict(self.calibration.compute),
            "memory": asdict(self.calibration.memory),
            "tile_tokens": self.calibration.tile_tokens,
            "prep_s": self.prep_s,
            "rmse_bare_s": self.rmse_bare_s,
            "rmse_calibrated_s": self.rmse_calibrated_s,
            "cv_mape": self.cv_mape,
            "cv_max_error": self.cv_max_error,
            "points": [asdict(p) for p in self.points],
            "created": self.created,
            "inputs": self.inputs,
        }

    @classmethod
    @public(error=ConfigError)
    def from_dict(cls, data: Mapping[str, Any], origin: str = "<record>") -> CalibrationRecord:
        try:
            cal = LinearCalibration(
                compute=Branch(float(data["compute"]["alpha"]), float(data["compute"]["beta"])),
                memory=Branch(float(data["memory"]["alpha"]), float(data["memory"]["beta"])),
                tile_tokens=int(data.get("tile_tokens", 0)),
            )
            points = tuple(
                Measurement(int(p["tokens"]), int(p["context"]), float(p["seconds"]))
                for p in data.get("points", ())
            )
            record = cls(
                device=str(data["device"]),
                model=str(data["model"]),
                dtype=str(data["dtype"]),
                backend=str(data["backend"]),
                calibration=cal,
                prep_s=float(data.get("prep_s", 0.0)),
                rmse_bare_s=float(data.get("rmse_bare_s", float("nan"))),
                rmse_calibrated_s=float(data.get("rmse_calibrated_s", float("nan"))),
                cv_mape=float(data.get("cv_mape", float("nan"))),
                cv_max_error=float(data.get("cv_max_error", float("nan"))),
                points=points,
                created=str(data.get("created", "")),
                inputs=str(data.get("inputs", "")),
            )
        except (KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"{origin}: not a calibration record ({exc!r})") from None
        if cal.compute.alpha <= 0 or cal.memory.alpha <= 0 or record.prep_s < 0:
            raise ConfigError(f"{origin}: calibration scales must be positive, prep_s ≥ 0")
        numbers = (cal.compute.alpha, cal.compute.beta, cal.memory.alpha, cal.memory.beta)
        if not all(math.isfinite(x) for x in (*numbers, record.prep_s)):
            raise ConfigError(f"{origin}: calibration scales, offsets and prep_s must be finite")
        return record


@public
def read_record(path: str | os.PathLike[str]) -> CalibrationRecord:
    """The calibration record in the JSON file ``path`` (what ``bastion calibrate`` writes; its
    path is printed). Missing, unreadable, invalid or not a record: a :class:`ConfigError`
    naming the file."""
    data = read_json_file(path, "calibration record")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a calibration record is a JSON object")
    return CalibrationRecord.from_dict(data, origin=str(path))


@public
def check_record(
    record: CalibrationRecord, hw: HardwareProfile, model: ModelSpec, origin: str = "<record>"
) -> bool:
    """Refuse a record fitted on another device or another model; say whether it was fitted
    against exactly these inputs.

    The device is matched by the profile's name. The model by name, or by shape: the real
    backend names a target ``DIRNAME-DIGEST`` (:meth:`ModelSpec.shape_digest`), so a record of
    the demo target matches ``--model bastion/demo/models/target``. A mismatch is a
    :class:`ConfigError` naming both. Returns whether the record's inputs digest
    (:func:`inputs_digest`: the profile's contents, the model's shape, the package version)
    is this profile's and model's — ``False`` when the profile file changed since the fit or
    another bastion version made it; the caller decides whether to warn."""
    if record.device != hw.name:
        raise ConfigError(
            f"{origin}: the record was fitted on device {record.device!r}, the simulation's "
            f"profile is {hw.name!r}; give the profile it was fitted on (on a CPU, the probed "
            "profile kept beside the records: this-machine-*.toml)"
        )
    digest = model.shape_digest()
    if record.model != model.name and not record.model.endswith(f"-{digest}"):
        raise ConfigError(
            f"{origin}: the record was fitted for model {record.model!r}, not for {model.name!r} "
            f"(shape digest {digest}); give the model it was fitted for"
        )
    return record.inputs == inputs_digest(hw, replace(model, name=record.model))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


@public
class CalibrationCache:
    """JSON records on disk, one file per (device, model, dtype, backend)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        if directory is None:
            directory = os.environ.get(CACHE_DIR_ENV) or (
                Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "bastion"
                / "calibration"
            )
        self.directory = Path(directory)

    def path_for(self, key: tuple[str, ...]) -> Path:
        return self.directory / ("__".join(_slug(k) for k in key) + ".json")

    def load(self, key: tuple[str, ...]) -> CalibrationRecord | None:
        path = self.path_for(key)
        if not path.is_file():
            return None
        data = read_json_file(path, "calibration record")
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a calibration record is a JSON object")
        return CalibrationRecord.from_dict(data, origin=str(path))

    def save(self, record: CalibrationRecord) -> Path:
        """Write ``record`` (atomically) where :meth:`load` finds it, as measured by this
        process; returns its path."""
        path = self.path_for(record.key)
        write_json_atomic(path, record.to_dict())
        measured_here(path)
        return path


@public(
    tokens=each(integer(1, 1 << 24)),
    contexts=each(integer(0, 1 << 24)),
    repeats=integer(1, 10_000),
    warmup=integer(0, 10_000),
)
def profile_sweep(
    verify: VerifyFn,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    repeats: int = 3,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Measurement]:
    """Time ``verify(s, c)`` at every grid point; the median of ``repeats`` runs per point.

    ``verify`` may return the time itself (a simulated backend) or ``None``, in which case the
    wall time around the call is used (a real backend must synchronise its device inside).
    """
    if repeats < 1:
        raise ConfigError(f"repeats must be ≥ 1, got {repeats}")
    out = []
    for c in contexts:
        for s in tokens:
            for _ in range(warmup):
                verify(s, c)
            runs = []
            for _ in range(repeats):
                start = clock()
                reported = verify(s, c)
                try:
                    elapsed = float(clock() - start)
                    runs.append(float(reported) if reported is not None else elapsed)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise ArgumentError(
                        f"profile_sweep: verify must return seconds or None and clock seconds "
                        f"({exc})"
                    ) from None
            out.append(Measurement(int(s), int(c), statistics.median(runs)))
    return out


@public
def calibrate(
    model: ModelSpec,
    hw: HardwareProfile,
    points: Iterable[Measurement],
    *,
    backend: str = "unknown",
    dtype: str = "bf16",
    options: RooflineOptions | None = None,
    tile_candidates: Sequence[int] = (0,),
    weighting: Weighting = "relative",
    prep_s: float = 0.0,
) -> CalibrationRecord:
    """Fit the static calibration to ``points``; with several ``tile_candidates`` keep the one
    with the smallest leave-one-out error (a tile step fits the points it was fitted on better
    by construction; held-out points say whether it generalises).

    Records the RMSE of the bare roofline and of the calibrated curve on the points (in-sample)
    and the leave-one-out relative error of the chosen fit (mean and max, held-out).
    """
    pts = tuple(points)
    y = np.array([p.seconds for p in pts], dtype=np.float64)
    _validate_measured(y)
    s = np.array([p.tokens for p in pts], dtype=np.float64)
    c = np.array([p.context for p in pts], dtype=np.float64)
    if np.any(s < 1) or np.any(c < 0):
        raise ConfigError("calibration points need tokens ≥ 1 and context ≥ 0")
    best: tuple[float, float, float, LinearCalibration] | None = None
    bare = np.zeros_like(y)
    # tensor parallelism: the all-reduces' seconds are the profile's link's, added to the
    # device's time (bastion.cost.parallel); the fit corrects the device's branches alone
    opt = options or RooflineOptions()
    c0, c1 = comm_line(model, hw, opt.tensor_parallel, opt.bytes_per_act)
    comm = c0 + c1 * s if opt.tensor_parallel > 1 else None
    device_y = y - comm if comm is not None else y
    for tile in tile_candidates:
        rc, rm, bare = raw_branches(model, hw, s, c, options, tile_tokens=tile)
        cal = fit_linear(rc, rm, device_y, weighting=weighting, tile_tokens=tile)
        cv = _loo(rc, rm, device_y, weighting) if y.size > MIN_POINTS else np.full(1, np.nan)
        score = (
            float(np.mean(cv)) if np.all(np.isfinite(cv)) else rmse(cal.predict(rc, rm), device_y)
        )
        if best is None or score < best[0]:
            best = (score, float(np.mean(cv)), float(np.max(cv)), cal)
    assert best is not None
    rc, rm, _ = raw_branches(model, hw, s, c, options, tile_tokens=best[3].tile_tokens)
    record = CalibrationRecord(
        device=hw.name,
        model=model.name,
        dtype=dtype,
        backend=backend,
        calibration=best[3],
        prep_s=prep_s,
        rmse_bare_s=rmse(bare, y),
        rmse_calibrated_s=rmse(best[3].predict(rc, rm) + (comm if comm is not None else 0.0), y),
        cv_mape=best[1],
        cv_max_error=best[2],
        points=pts,
        inputs=inputs_digest(hw, model),
    )
    log.info(
        "calibrated %s on %s: RMSE %.3f ms bare -> %.3f ms calibrated (%d points, "
        "leave-one-out error %.1f %% mean, %.1f %% max)",
        model.name,
        hw.name,
        record.rmse_bare_s * 1e3,
        record.rmse_calibrated_s * 1e3,
        len(pts),
        record.cv_mape * 100,
        record.cv_max_error * 100,
    )
    return record


def _loo(rc: Array, rm: Array, y: Array, weighting: Weighting) -> Array:
    """Leave-one-out relative errors of :func:`fit_linear` on the points (rc, rm, y)."""

    def fit_predict(train: npt.NDArray[np.bool_], i: int) -> float:
        cal = fit_linear(rc[train], rm[train], y[train], weighting=weighting)
        return float(cal.predict(rc[i], rm[i]))

    return loo_errors(y.size, fit_predict, y)


@public
def calibrate_or_load(
    model: ModelSpec,
    hw: HardwareProfile,
    verify: VerifyFn,
    *,
    backend: str,
    dtype: str = "bf16",
    cache: CalibrationCache | None = None,
    refit: bool = False,
    sweep_kwargs: Mapping[str, Any] | None = None,
    **calibrate_kwargs: Any,
) -> CalibrationRecord:
    """The cached record for (device, model, dtype, backend), or sweep, fit and store one.

    Records are keyed by :func:`inputs_digest` too, so a changed profile or model file, or a new
    package version, never reuses a stale record; a reused record is announced on stderr."""
    store = cache or CalibrationCache()
    key = calibration_key(hw, model, dtype, backend)
    if not refit:
        found = store.load(key)
        if found is not None:
            announce_reuse(store.path_for(key))
            warn_if_poor(found, store.path_for(key))
            return found
    # the caller's keyword arguments are checked as if the caller had passed them itself
    points = forwarded(profile_sweep)(verify, **(sweep_kwargs or {}))
    record = forwarded(calibrate)(
        model, hw, points, backend=backend, dtype=dtype, **calibrate_kwargs
    )
    warn_if_poor(record, store.save(record))
    return record


def calibration_key(
    hw: HardwareProfile, model: ModelSpec, dtype: str, backend: str
) -> tuple[str, str, str, str, str]:
    """Where a calibration record is stored: (device, model, dtype, backend, inputs digest)."""
    return (hw.name, model.name, dtype, backend, inputs_digest(hw, model))


def inputs_digest(hw: HardwareProfile, model: ModelSpec) -> str:
    """A short hash of what a calibration depends on besides its measurements: the profile's
    and the model's contents and the package version."""
    from bastion.cost.hardware import profile_to_dict

    try:
        version = metadata.version("bastion")
    except metadata.PackageNotFoundError:  # a source tree without an install
        version = "source"
    blob = json.dumps(
        {"hw": profile_to_dict(hw), "model": repr(model), "version": version},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
