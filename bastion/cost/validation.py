"""Validate the cost model against measured per-operator GPU timings (``bastion validate``).

The tables are read by :mod:`bastion.cost.measured` (two CSV layouts, every column mapped to
roofline operators or reported as unmapped) and each column is calibrated by
:mod:`bastion.cost.columnfit`; this module scores the predictions and reports them.

For every mapped column, :func:`validate` calibrates on the token counts ``train_tokens`` and
scores three predictions on every other token count ≤ ``max_tokens`` (held out):

- ``bare``: the per-operator roofline with the profile's default efficiencies;
- ``calibrated``: the global max-of-two-branches fit (:mod:`bastion.cost.fitting`) with the
  compute feature (plain, 64- or 128-token tiles, whole GEMM waves) and the memory feature
  (DRAM only, or DRAM and L2-resident bytes apart) chosen by leave-one-out error on the
  calibration points;
- ``profiled``: log-log interpolation between the calibration points (the calibrated roofline
  beyond them), as :class:`bastion.cost.profiled.ProfiledCostModel` predicts;
- on request, ``kernel-fit`` (the kernel-aware model, :mod:`bastion.cost.kernels`, with the
  parameters of the column's kernels fitted on its calibration points: steps where the GPU's
  tiles, waves and L2 put them) and ``blended`` (the geometric mean of ``calibrated`` and
  ``kernel-fit``).

What this module does not do: plot (``docs/make_cost_figures.py``) or print (``bastion.cli``).
The names of :mod:`bastion.cost.measured` and :mod:`bastion.cost.columnfit` it lists in
``__all__`` are re-exported from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from bastion.cost.columnfit import (
    ColumnCalibration,
    OperatorFeatures,
    calibrate_column,
    interpolate_loglog,
    operator_features,
)
from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import KernelParams
from bastion.cost.measured import (
    FORMATS,
    MEASURED_OPTIONS,
    ColumnSpec,
    MeasuredDataError,
    MeasuredFormat,
    MeasuredTable,
    load_measured,
)
from bastion.cost.measured import bundled_measured as bundled_measured
from bastion.cost.models import ModelSpec
from bastion.cost.transfer import column_predictor, fit_column_params
from bastion.errors import ConfigError
from bastion.guard import array, public

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TRAIN_TOKENS",
    "FORMATS",
    "MEASURED_OPTIONS",
    "PASS",
    "ColumnSpec",
    "MeasuredDataError",
    "MeasuredFormat",
    "MeasuredTable",
    "OperatorFeatures",
    "OperatorResult",
    "ValidationReport",
    "calibrate_column",
    "interpolate_loglog",
    "load_measured",
    "operator_features",
    "step_positions",
    "steps_matched",
    "validate",
]

Array = npt.NDArray[np.float64]
Mode = Literal["bare", "transfer", "calibrated", "profiled", "kernel-fit", "blended"]
#: The operator name of the whole-pass record (the sum of every scored column over the layers)
PASS = "pass"
#: Token counts calibrated on by default (the rest, up to ``DEFAULT_MAX_TOKENS``, are held out).
DEFAULT_TRAIN_TOKENS: tuple[int, ...] = (1, 16, 64, 128, 256, 512, 1024)
DEFAULT_MAX_TOKENS = 1024
#: Fewest calibration points a column needs to be calibrated and scored.
MIN_TRAIN = 5


@dataclass(frozen=True)
class OperatorResult:
    """The error of one prediction mode on one column's held-out token counts."""

    operator: str  # the column's name without ``_ms``
    mode: str  # bare | transfer | calibrated | profiled | kernel-fit | blended
    mape: float  # mean |pred − meas| / meas
    max_error: float  # the worst held-out point's |pred − meas| / meas
    n_test: int
    rmse_us: float = float("nan")
    worst_tokens: int = 0  # the token count of the worst point
    detail: str = ""  # calibrated: the chosen features and their leave-one-out error

    def to_record(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "mode": self.mode,
            "mape": self.mape,
            "max_error": self.max_error,
            "n_test": self.n_test,
        }


@dataclass(frozen=True)
class ValidationReport:
    """Per column and mode, the held-out error; which columns were mapped and which not."""

    path: str
    format: str
    model: str
    gpu: str
    train_tokens: tuple[int, ...]  # the calibration sizes the table has (≤ max_tokens)
    max_tokens: int | None
    results: tuple[OperatorResult, ...]
    mapped: dict[str, str]  # column → what it measures
    unmapped: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)  # mapped but not scored: why
    # calibration sizes asked for that the table lacks (or that exceed max_tokens)
    missing_train_tokens: tuple[int, ...] = ()

    def records(self) -> list[dict[str, Any]]:
        return [r.to_record() for r in self.results]

    def mean_mape(self, mode: str) -> float:
        """Mean over the operators (columns) of their held-out error; the pass excluded."""
        vals = [r.mape for r in self.results if r.mode == mode and r.operator != PASS]
        return float(np.mean(vals)) if vals else float("nan")

    def max_error(self, mode: str) -> float:
        """The worst held-out point of any operator (the pass excluded)."""
        vals = [r.max_error for r in self.results if r.mode == mode and r.operator != PASS]
        return float(np.max(vals)) if vals else float("nan")

    def pass_result(self, mode: str) -> OperatorResult | None:
        """The whole-pass record of ``mode`` (None when no token count had every column)."""
        for r in self.results:
            if r.mode == mode and r.operator == PASS:
                return r
        return None

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.mode for r in self.results))


def _describe(spec: ColumnSpec) -> str:
    ops = " + ".join(op if k == 1.0 else f"{k:g}·{op}" for op, k in spec.parts)
    scope = "per pass" if spec.per_pass else "per layer"
    return f"{ops} ({scope}{'; ' + spec.note if spec.note else ''})"


@public
def validate(
    table: MeasuredTable,
    model: ModelSpec,
    hw: HardwareProfile,
    train_tokens: Sequence[int] = DEFAULT_TRAIN_TOKENS,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    modes: Sequence[str] | None = None,
    transfer: KernelParams | None = None,
) -> ValidationReport:
    """Calibrate every mapped column on ``train_tokens``; score every mode on the others.

    ``transfer``: kernel-model parameters fitted on *other* GPUs' tables
    (:func:`bastion.cost.transfer.fit_kernel_params`); adds the ``transfer`` mode (the kernel
    model with them, nothing of this table used) and makes them the calibrated mode's
    ``kernel`` feature. Besides one record per column and mode, each mode gets a whole-pass
    record (operator ``pass``): Σ over the scored columns of a cell × its kernels per layer ×
    layers (per-pass columns once), at the held-out token counts where every scored column is
    measured — what the simulator sums for a step, less the operators the table lacks.

    Two opt-in modes (``modes``; they need a profile with the kernel model's keys):
    ``kernel-fit``, the kernel model with the parameters its column reads refitted on that
    column's calibration points (:func:`bastion.cost.transfer.fit_column_params`, from
    ``transfer`` if given, else ``FIT_START``), and ``blended``, the geometric mean of
    ``calibrated`` and ``kernel-fit`` (no choice between them is made on any point).
    """
    if modes is None:
        modes = ("bare", "transfer", "calibrated", "profiled") if transfer else _DEFAULT_MODES
    for mode in modes:
        if mode not in get_args(Mode):
            raise ConfigError(f"mode {mode!r}; accepted: {', '.join(get_args(Mode))}")
    if "transfer" in modes and transfer is None:
        raise ConfigError("mode 'transfer' needs kernel parameters fitted on other GPUs' tables")
    spec = FORMATS[table.format]
    tokens = table.tokens
    in_range = tokens <= (max_tokens if max_tokens else np.inf)
    wanted = np.isin(tokens, np.asarray(train_tokens, dtype=np.float64))
    results: list[OperatorResult] = []
    skipped: dict[str, str] = {}
    pass_pred = {mode: np.zeros(tokens.shape) for mode in modes}
    pass_meas = np.zeros(tokens.shape)
    pass_have = np.ones(tokens.shape, dtype=bool)
    for column, seconds in table.columns.items():
        have = np.isfinite(seconds) & in_range
        train, test = have & wanted, have & ~wanted
        if train.sum() < MIN_TRAIN or test.sum() < 1:
            skipped[column] = (
                f"{int(train.sum())} calibration and {int(test.sum())} held-out token counts "
                f"measured (needs ≥ {MIN_TRAIN} and ≥ 1)"
            )
            continue
        feats = operator_features(spec[column], model, hw, tokens, kernel_params=transfer)
        y = seconds
        name = column.removesuffix("_ms")
        preds: dict[str, tuple[Array, str]] = {"bare": (feats.bare, "")}
        if transfer is not None:
            predict = column_predictor(spec[column], model, hw, tokens, MEASURED_OPTIONS)
            preds["transfer"] = (predict(transfer), "kernel model, parameters of other GPUs")
        cal: ColumnCalibration | None = None
        if {"calibrated", "profiled", "blended"} & set(modes):
            cal = calibrate_column(feats, tokens, y, train)
            preds["calibrated"] = (
                cal.predict(feats),
                f"{cal.choice}, leave-one-out {cal.cv_mape:.1%} mean / {cal.cv_max_error:.1%} max",
            )
        if "profiled" in modes:
            assert cal is not None
            full = cal.predict(feats)

            def beyond(t: Array, full: Array = full) -> Array:
                return np.interp(t, tokens, full)

            prof = interpolate_loglog(tokens[train], y[train], tokens, beyond)
            preds["profiled"] = (prof, "interpolated between the calibration points")
        if {"kernel-fit", "blended"} & set(modes):
            kp = fit_column_params(
                spec[column], model, hw, tokens[train], y[train], MEASURED_OPTIONS, transfer
            )
            kfit = column_predictor(spec[column], model, hw, tokens, MEASURED_OPTIONS)(kp)
            start = "transferred parameters" if transfer else "FIT_START"
            preds["kernel-fit"] = (
                kfit,
                f"kernel model refitted on the calibration points from {start}",
            )
            assert cal is not None
            preds["blended"] = (
                np.sqrt(cal.predict(feats) * kfit),
                f"geometric mean of calibrated ({cal.choice}) and kernel-fit",
            )
        weight = spec[column].count * (1.0 if spec[column].per_pass else model.layers)
        pass_have &= np.isfinite(y)
        pass_meas += np.where(np.isfinite(y), y, 0.0) * weight
        for mode in modes:
            pred, detail = preds[mode]
            pass_pred[mode] += pred * weight
            results.append(_score(name, mode, pred, y, test, tokens, detail))
    scored = [c for c in table.columns if c not in skipped]
    pass_test = pass_have & in_range & ~wanted
    if scored and pass_test.any():
        detail = f"sum of {len(scored)} columns × kernels per layer × {model.layers} layers"
        for mode in modes:
            pred = pass_pred[mode]
            results.append(_score(PASS, mode, pred, pass_meas, pass_test, tokens, detail))
    return ValidationReport(
        path=table.path,
        format=table.format,
        model=model.name,
        gpu=hw.name,
        train_tokens=tuple(int(t) for t in tokens[wanted & in_range]),
        max_tokens=max_tokens,
        results=tuple(results),
        mapped={c: _describe(spec[c]) for c in table.columns},
        unmapped=table.unmapped,
        skipped=skipped,
        missing_train_tokens=tuple(
            sorted({int(t) for t in train_tokens} - {int(t) for t in tokens[wanted & in_range]})
        ),
    )


_DEFAULT_MODES = ("bare", "calibrated", "profiled")


def _score(
    name: str,
    mode: str,
    pred: Array,
    y: Array,
    test: npt.NDArray[np.bool_],
    tokens: Array,
    detail: str,
) -> OperatorResult:
    rel = np.abs(pred[test] - y[test]) / y[test]
    worst = int(np.argmax(rel))
    return OperatorResult(
        operator=name,
        mode=mode,
        mape=float(rel.mean()),
        max_error=float(rel.max()),
        n_test=int(test.sum()),
        rmse_us=float(np.sqrt(np.mean((pred[test] - y[test]) ** 2))) * 1e6,
        worst_tokens=int(tokens[test][worst]),
        detail=detail,
    )


@public(tokens=array(1), seconds=array(1), lengths=("tokens", "seconds"))
def step_positions(tokens: npt.ArrayLike, seconds: npt.ArrayLike, jump: float) -> list[int]:
    """Token counts where ``seconds`` rises by more than ``jump`` (a fraction) from the
    previous token count of ``tokens`` (sorted): where a kernel switch or a new wave starts."""
    t = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    return [int(t[i + 1]) for i in range(t.size - 1) if y[i + 1] > (1.0 + jump) * y[i]]


@public
def steps_matched(measured: Sequence[int], model: Sequence[int], within: int = 64) -> list[int]:
    """The measured step positions that have a model step within ``within`` tokens."""
    return [s for s in measured if any(abs(s - m) <= within for m in model)]
