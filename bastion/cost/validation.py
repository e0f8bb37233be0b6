"""Validate the cost model against measured per-operator GPU timings (``bastion validate``).

Two public per-operator CSV layouts are read, one row per token count, milliseconds, 16-bit
weights, tensor parallel 1:

- ``vidur`` (Vidur's profiling data, e.g. ``docs/data/a100-80gb_llama-3-8b_per-layer-ops.csv``):
  per-layer ``qkv_proj_ms``, ``o_proj_ms``, ``gate_up_proj_ms``, ``down_proj_ms``, ``act_ms``,
  ``rope_ms``, ``input_norm_ms``, ``post_attn_norm_ms``, ``residual_add_ms`` (one of a layer's
  two adds) and per-pass ``embedding_ms``;
- ``llmservingsim`` (LLMServingSim's profiler): per-layer ``qkv_proj_ms``, ``o_proj_ms``,
  ``gate_up_proj_ms``, ``down_proj_ms``, ``act_fn_ms``, ``rotary_emb_ms``, ``layernorm_ms``
  (one fused add + RMSNorm kernel) and per-pass ``embedding_ms``, ``final_layernorm_ms``,
  ``lm_head_ms``.

Both use vLLM-style kernels (fused q/k/v and gate/up, fused SiLU·mul, gathered embedding rows).
Empty cells are allowed (a column measured over fewer token counts); any other unreadable cell
raises :class:`MeasuredDataError` naming the file, row and column. Every column is either mapped
to roofline operators or reported as unmapped.

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
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from bastion.cost.fitting import MaxAffineFit, fit_max_affine, loo_errors
from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import KernelParams
from bastion.cost.models import ModelSpec
from bastion.cost.roofline import RooflineOptions, verify_pass
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
MeasuredFormat = Literal["vidur", "llmservingsim"]
Mode = Literal["bare", "transfer", "calibrated", "profiled", "kernel-fit", "blended"]
#: The operator name of the whole-pass record (the sum of every scored column over the layers)
PASS = "pass"


class MeasuredDataError(ConfigError):
    """A measured-timings CSV that cannot be read: the message names file, row and column."""


@dataclass(frozen=True)
class ColumnSpec:
    """What one CSV column measures: roofline operators × shares, per layer or per pass."""

    parts: tuple[tuple[str, float], ...]  # (operator, share of it one cell covers)
    per_pass: bool = False  # once per pass (embedding, LM head) rather than per layer
    note: str = ""
    count: float = 1.0  # kernels of this column in one layer (per pass: in the pass)


_LAYER_GEMMS: dict[str, ColumnSpec] = {
    "qkv_proj_ms": ColumnSpec((("qkv_proj", 1.0),), note="fused q/k/v projection"),
    "o_proj_ms": ColumnSpec((("o_proj", 1.0),)),
    "gate_up_proj_ms": ColumnSpec((("gate_up_proj", 1.0),), note="fused gate+up projection"),
    "down_proj_ms": ColumnSpec((("down_proj", 1.0),)),
}

#: Column → what it measures, per format.
FORMATS: dict[str, dict[str, ColumnSpec]] = {
    "vidur": {
        **_LAYER_GEMMS,
        "act_ms": ColumnSpec((("act", 1.0),), note="SiLU·mul"),
        "rope_ms": ColumnSpec((("rope", 1.0),)),
        "input_norm_ms": ColumnSpec((("input_norm", 1.0),)),
        "post_attn_norm_ms": ColumnSpec((("post_attn_norm", 1.0),)),
        "residual_add_ms": ColumnSpec(
            (("residual_add", 0.5),), note="one of a layer's two adds", count=2.0
        ),
        "embedding_ms": ColumnSpec((("embedding", 1.0),), per_pass=True),
    },
    "llmservingsim": {
        **_LAYER_GEMMS,
        "act_fn_ms": ColumnSpec((("act", 1.0),), note="SiLU·mul"),
        "rotary_emb_ms": ColumnSpec((("rope", 1.0),)),
        "layernorm_ms": ColumnSpec(
            (("input_norm", 1.0), ("residual_add", 0.5)),
            note="one fused add + RMSNorm kernel",
            count=2.0,
        ),
        "embedding_ms": ColumnSpec((("embedding", 1.0),), per_pass=True),
        "final_layernorm_ms": ColumnSpec((("final_norm", 1.0),), per_pass=True),
        "lm_head_ms": ColumnSpec((("lm_head", 1.0),), per_pass=True),
    },
}
#: The measured kernels' implementation choices (vLLM).
MEASURED_OPTIONS = RooflineOptions(fused_qkv=True, fused_gate_up=True, full_embedding_table=False)
#: Token counts calibrated on by default (the rest, up to ``DEFAULT_MAX_TOKENS``, are held out).
DEFAULT_TRAIN_TOKENS: tuple[int, ...] = (1, 16, 64, 128, 256, 512, 1024)
DEFAULT_MAX_TOKENS = 1024
#: Fewest calibration points a column needs to be calibrated and scored.
MIN_TRAIN = 5


@dataclass(frozen=True)
class MeasuredTable:
    """A measured CSV: token counts, one array of seconds per mapped column (NaN: empty)."""

    path: str
    format: str
    tokens: Array
    columns: dict[str, Array]  # mapped column → seconds (NaN where the cell was empty)
    unmapped: tuple[str, ...]  # columns present in the file that no operator maps to


def _cell(text: str | None, path: str, row: int, column: str, what: str) -> float:
    if text is None:
        raise MeasuredDataError(
            f"{path}, row {row}, column {column!r}: missing cell (the row has fewer values than "
            "the header); accepted: one value per header column, empty for not measured"
        )
    try:
        value = float(text)
    except ValueError:
        raise MeasuredDataError(
            f"{path}, row {row}, column {column!r}: {text!r} is not a number; accepted: {what}"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise MeasuredDataError(
            f"{path}, row {row}, column {column!r}: {text!r} is out of range; accepted: {what}"
        )
    return value


@public
def load_measured(path: str | os.PathLike[str], format: str = "vidur") -> MeasuredTable:
    """Read a per-operator CSV in ``format`` (``vidur`` or ``llmservingsim``).

    Rows are numbered as lines of the file (the header is row 1).
    """
    if format not in FORMATS:
        raise ConfigError(f"measured format {format!r}; accepted: {', '.join(FORMATS)}")
    spec = FORMATS[format]
    name = os.fspath(path)
    try:
        with open(name, newline="", encoding="utf-8-sig") as fh:  # a byte-order mark is fine
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = list(reader)
    except FileNotFoundError:
        raise MeasuredDataError(f"measured data not found: {name}") from None
    except IsADirectoryError:
        raise MeasuredDataError(f"measured data {name} is a directory; give a CSV file") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise MeasuredDataError(f"{name}: not a readable CSV ({exc})") from None
    except OSError as exc:
        raise MeasuredDataError(f"measured data {name} cannot be read ({exc})") from None
    if "num_tokens" not in header:
        raise MeasuredDataError(
            f"{name}, row 1: no 'num_tokens' column (header: {', '.join(header) or 'empty'}); "
            f"accepted {format} columns: num_tokens, {', '.join(spec)}"
        )
    if not rows:
        raise MeasuredDataError(f"{name}: no data rows after the header")
    mapped = [c for c in header if c in spec]
    unmapped = tuple(c for c in header if c != "num_tokens" and c not in spec)
    if not mapped:
        raise MeasuredDataError(
            f"{name}, row 1: no column of the {format} format; accepted: {', '.join(spec)}"
        )
    tokens = np.empty(len(rows))
    columns = {c: np.full(len(rows), np.nan) for c in mapped}
    seen: dict[float, int] = {}
    for i, row in enumerate(rows):
        line = i + 2
        if None in row:  # more values than header columns
            raise MeasuredDataError(
                f"{name}, row {line}: {len(header) + len(row[None])} values for "
                f"{len(header)} header columns; accepted: one value per header column"
            )
        t = _cell(row["num_tokens"], name, line, "num_tokens", "a positive whole number")
        if t != int(t):
            raise MeasuredDataError(
                f"{name}, row {line}, column 'num_tokens': {row['num_tokens']!r} is not a whole "
                "number; accepted: a positive whole number"
            )
        if t in seen:
            raise MeasuredDataError(
                f"{name}, row {line}, column 'num_tokens': {int(t)} repeats row {seen[t]}; "
                "accepted: one row per token count"
            )
        seen[t] = line
        tokens[i] = t
        for c in mapped:
            text = row[c]
            if text is not None and not text.strip():
                continue  # empty: not measured at this token count
            columns[c][i] = 1e-3 * _cell(
                text, name, line, c, "a positive number of milliseconds or an empty cell"
            )
    order = np.argsort(tokens)
    return MeasuredTable(
        path=name,
        format=format,
        tokens=tokens[order],
        columns={c: v[order] for c, v in columns.items()},
        unmapped=unmapped,
    )


# --------------------------------------------------------------------------------------------
# Features of one column
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorFeatures:
    """Roofline features of one column at the table's token counts (seconds, one cell's share)."""

    bare: Array  # the bare roofline (max of branches + launches)
    compute: dict[str, Array]  # compute-branch variant → R_c
    memory: Array  # R_m, DRAM and L2-resident bytes priced together, [n]
    memory_split: Array  # [n, 2]: DRAM bytes / bandwidth, L2-resident bytes / L2 bandwidth


@public
def operator_features(
    spec: ColumnSpec,
    model: ModelSpec,
    hw: HardwareProfile,
    tokens: npt.ArrayLike,
    options: RooflineOptions = MEASURED_OPTIONS,
    kernel_params: KernelParams | None = None,
) -> OperatorFeatures:
    """The bare roofline and the calibration features of ``spec`` at ``tokens`` (context 0).

    With ``kernel_params`` (and a profile with what the kernel-aware model needs: SM clock,
    threads per SM), the compute variants include ``kernel``: that model's time of the column
    with those parameters, so a calibration can scale its steps."""
    t = np.asarray(tokens, dtype=np.float64)

    def parts(opt: RooflineOptions) -> list[tuple[Any, float]]:
        b = verify_pass(model, hw, [(t, 0)], opt)
        per = 1.0 if spec.per_pass else 1.0 / model.layers
        return [(b.op(op), share * per) for op, share in spec.parts]

    def total(items: list[tuple[Any, float]], attr: str) -> Array:
        out = sum((np.asarray(getattr(o, attr)) * k for o, k in items), np.zeros(()))
        return np.broadcast_to(out, t.shape).astype(np.float64)

    plain = parts(options)
    compute = {"plain": total(plain, "compute_s")}
    for tile in (64, 128):
        compute[f"tile{tile}"] = total(parts(replace(options, tile_tokens=tile)), "compute_s")
    compute["waves"] = total(parts(replace(options, gemm_waves=True)), "compute_s")
    if kernel_params is not None and hw.sm_clock_hz and hw.max_threads_per_sm:
        compute["kernel"] = column_predictor(spec, model, hw, t, options)(kernel_params)
    l2 = parts(replace(options, l2_resident=True))
    l2_s = total(l2, "l2_s")
    return OperatorFeatures(
        bare=total(plain, "time_s"),
        compute=compute,
        memory=total(plain, "memory_s"),
        memory_split=np.column_stack([total(l2, "memory_s") - l2_s, l2_s]),
    )


@dataclass(frozen=True)
class ColumnCalibration:
    """The calibrated roofline of one column: the chosen features and their fit."""

    compute: str  # compute variant (plain, tile64, tile128, waves, kernel)
    memory: str  # memory variant (dram, dram+l2)
    fit: MaxAffineFit
    cv_mape: float  # leave-one-out relative error on the calibration points, mean
    cv_max_error: float

    @property
    def choice(self) -> str:
        return f"{self.compute}/{self.memory}"

    def predict(self, features: OperatorFeatures) -> Array:
        mem = features.memory if self.memory == "dram" else features.memory_split
        return self.fit.predict(features.compute[self.compute], mem)


@public
def calibrate_column(
    features: OperatorFeatures, tokens: Array, seconds: Array, train: npt.NDArray[np.bool_]
) -> ColumnCalibration:
    """Fit every feature variant on ``train``; keep the smallest leave-one-out error."""
    y = seconds[train]
    order = tokens[train]
    best: ColumnCalibration | None = None
    seen: list[tuple[Array, Array]] = []
    for cname, rc_all in features.compute.items():
        for mname, mem_all in (("dram", features.memory), ("dram+l2", features.memory_split)):
            rc, mem = rc_all[train], mem_all[train]
            if mname == "dram+l2" and (not np.any(mem[:, 1] > 0) or not np.any(mem[:, 0] > 0)):
                continue  # nothing L2-resident (or nothing off it): same as dram alone
            if any(np.array_equal(rc, a) and np.array_equal(mem, b) for a, b in seen):
                continue  # this variant changes nothing for this operator
            seen.append((rc, mem))

            def fit_predict(mask: npt.NDArray[np.bool_], i: int, rc=rc, mem=mem) -> float:  # type: ignore[no-untyped-def]
                f = fit_max_affine(rc[mask], mem[mask], y[mask], order=order[mask])
                return float(f.predict(rc[i : i + 1], mem[i : i + 1])[0])

            cv = loo_errors(y.size, fit_predict, y)
            fit = fit_max_affine(rc, mem, y, order=order)
            cand = ColumnCalibration(cname, mname, fit, float(cv.mean()), float(cv.max()))
            if best is None or cand.cv_mape < best.cv_mape - 1e-12:
                best = cand
    assert best is not None
    return best


@public(
    known_tokens=array(1, nonempty=True, positive=True),
    known_seconds=array(1, nonempty=True, positive=True),
    tokens=array(positive=True),
    lengths=("known_tokens", "known_seconds"),
)
def interpolate_loglog(
    known_tokens: Array,
    known_seconds: Array,
    tokens: npt.ArrayLike,
    beyond: Callable[[Array], Array] | None = None,
) -> Array:
    """Piecewise power-law interpolation of measured seconds between measured token counts.

    Outside [min, max] of ``known_tokens``, ``beyond(tokens)`` (the calibrated roofline) is
    used, scaled to meet the measurement at the nearest end; without it the end value is held.
    """
    t = np.asarray(tokens, dtype=np.float64)
    lt, ly = np.log(known_tokens), np.log(known_seconds)
    out = np.exp(np.interp(np.log(t), lt, ly))
    if beyond is not None:
        lo, hi = t < known_tokens[0], t > known_tokens[-1]
        if np.any(lo) or np.any(hi):
            ends = beyond(np.array([known_tokens[0], known_tokens[-1]]))
            model = beyond(t)
            out = np.where(lo, model * known_seconds[0] / ends[0], out)
            out = np.where(hi, model * known_seconds[-1] / ends[1], out)
    return np.asarray(out, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


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


def bundled_measured() -> Mapping[str, Path]:
    """Measured tables shipped in the checkout's ``docs/data`` (empty in a wheel)."""
    root = Path(__file__).resolve().parents[2] / "docs" / "data"
    return {p.stem: p for p in sorted(root.glob("*.csv"))} if root.is_dir() else {}


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
