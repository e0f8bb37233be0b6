"""A measured column's roofline features and their calibration, shared by validation and profiling.

A measured column (:class:`~bastion.cost.measured.ColumnSpec`) covers shares of roofline
operators; :func:`operator_features` prices those shares at the table's token counts (the bare
roofline, the compute branch with and without tile padding, whole GEMM waves or the kernel-aware
model, and the memory branch with and without L2-resident bytes apart), and
:func:`calibrate_column` fits the global max-of-two-branches model (:mod:`bastion.cost.fitting`)
on every variant, keeping the one of smallest leave-one-out error. :func:`interpolate_loglog`
is the profiled prediction between measured token counts.

What this module does not do: read tables (:mod:`bastion.cost.measured`) or score predictions
(:mod:`bastion.cost.validation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cost.fitting import MaxAffineFit, fit_max_affine, loo_errors
from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import KernelParams
from bastion.cost.measured import MEASURED_OPTIONS, ColumnSpec
from bastion.cost.models import ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.roofline import verify_pass
from bastion.cost.transfer import column_predictor
from bastion.guard import array, public

__all__ = ["OperatorFeatures", "calibrate_column", "interpolate_loglog", "operator_features"]

Array = npt.NDArray[np.float64]


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
