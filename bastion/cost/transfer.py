"""Cross-GPU fit ("transfer"): the kernel model's efficiency parameters from other GPUs' tables.

A GPU without measurements is predicted by :mod:`bastion.cost.kernels` from its datasheet
numbers and the few parameters a datasheet does not give (:class:`KernelParams`: achieved DRAM
and tensor fractions, L2 feed per SM per clock, fixed cycles per tile and per row-wise wave,
fixed seconds per kernel, the usable share of L2, the gather's cycles per row). Those are
fitted here on the measured per-operator tables of *other* GPUs, every table weighted equally:
the target GPU's table is never read. ``bastion validate --measured FILE --transfer-from
OTHER[,OTHER…]`` reports the result as the ``transfer`` mode.

The objective is the mean over (table, column) of the mean squared log error over the table's
token counts up to ``max_tokens`` (a relative error that treats over- and under-prediction
alike); it is minimised by Nelder–Mead in the logarithm of the parameters (fractions capped at
1), from :data:`FIT_START`, restarted once from its own result. Deterministic: no random
starts. What this module does not do: read files (the caller passes loaded tables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import KIND_PARAMS, KernelParams, KernelPricer, operator_kind
from bastion.cost.models import ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.errors import ConfigError
from bastion.guard import public

__all__ = [
    "FIT_START",
    "TransferFit",
    "TransferSource",
    "column_params",
    "column_predictor",
    "fit_column_params",
    "fit_kernel_params",
]

Array = npt.NDArray[np.float64]
#: Where every fit starts: round guesses written down before any table was fitted (not the
#: defaults of :class:`KernelParams`, which are a fit on all shipped tables), so a
#: leave-one-GPU-out fold depends on nothing of its held-out table, not even its start.
FIT_START = KernelParams(
    dram_efficiency=0.8,
    stream_efficiency=0.8,
    tensor_efficiency=0.8,
    l2_bytes_per_flop=0.02,
    tile_cycles=2000.0,
    kernel_s=3e-6,
    row_cycles=4000.0,
    sm_bytes_per_clock=8.0,
    l2_fraction=0.5,
    gather_cycles=80.0,
)
_FRACTIONS = ("dram_efficiency", "stream_efficiency", "tensor_efficiency", "l2_fraction")


@dataclass(frozen=True)
class TransferSource:
    """One measured table with the model and the GPU profile it was measured on."""

    name: str  # shown in reports (the file's path)
    columns: dict[str, Array]  # column → seconds per token count (NaN: not measured)
    tokens: Array
    specs: dict[str, object]  # column → ColumnSpec (from bastion.cost.validation.FORMATS)
    model: ModelSpec
    hw: HardwareProfile


def _parts(spec: object) -> tuple[tuple[str, float], ...]:
    """``spec.parts`` of a column spec (``bastion.cost.validation.ColumnSpec``), checked:
    (operator name, share) pairs."""
    parts = getattr(spec, "parts", None)
    ok = isinstance(parts, tuple | list) and len(parts) > 0
    for part in parts if ok else ():  # type: ignore[union-attr]
        ok = ok and isinstance(part, tuple | list) and len(part) == 2 and isinstance(part[0], str)
        ok = ok and isinstance(part[1], int | float) and not isinstance(part[1], bool)
    if not ok or not isinstance(getattr(spec, "per_pass", None), bool):
        raise ConfigError(
            "spec must be a column spec (bastion.cost.validation.ColumnSpec: parts of (operator, "
            f"share), per_pass); got {spec!r:.80}"
        )
    return tuple((str(op), float(share)) for op, share in parts)  # type: ignore[union-attr]


@public
def column_predictor(
    spec: object,
    model: ModelSpec,
    hw: HardwareProfile,
    tokens: npt.ArrayLike,
    options: RooflineOptions,
) -> Callable[[KernelParams], Array]:
    """params → the kernel model's seconds of one cell of the column ``spec`` at ``tokens``."""
    parts = _parts(spec)
    pricer = KernelPricer(model, hw, tokens, options)
    per = 1.0 if spec.per_pass else 1.0 / model.layers  # type: ignore[attr-defined]

    names = {op for op, _ in parts}

    def predict(params: KernelParams) -> Array:
        sec = pricer.seconds(params, names)
        out = sum((sec[op] * share * per for op, share in parts), np.zeros(()))
        return np.asarray(np.broadcast_to(out, pricer.tokens.shape), dtype=np.float64)

    return predict


@dataclass(frozen=True)
class TransferFit:
    """Fitted parameters and the fit's own (in-sample) error on every source table."""

    params: KernelParams
    sources: tuple[str, ...]
    train_rmsle: float  # root mean squared log error over the sources' cells (fitted)
    train_mape: dict[str, float]  # source → mean relative error over its columns (fitted)


def _to_params(x: Array) -> KernelParams:
    v = np.exp(np.clip(x, -30.0, 30.0))
    p = KernelParams.from_vector(np.ones(x.shape))  # names in order
    names = list(p.to_dict())
    for i, name in enumerate(names):
        if name in _FRACTIONS:
            v[i] = min(v[i], 1.0)
    return KernelParams.from_vector(v)


@public
def fit_kernel_params(
    sources: Sequence[TransferSource],
    options: RooflineOptions,
    max_tokens: float | None = 1024,
    start: KernelParams | None = None,
    maxiter: int = 4000,
) -> TransferFit:
    """Fit :class:`KernelParams` on ``sources`` (see the module docstring)."""
    from scipy.optimize import minimize

    if not sources:
        raise ConfigError("a transfer fit needs at least one measured table of another GPU")
    terms: list[tuple[str, Callable[[KernelParams], Array], Array]] = []
    for src in sources:
        keep = src.tokens <= (max_tokens if max_tokens else np.inf)
        for column, seconds in src.columns.items():
            have = keep & np.isfinite(seconds)
            if not np.any(have):
                continue
            spec = src.specs[column]
            predict = column_predictor(spec, src.model, src.hw, src.tokens[have], options)
            terms.append((src.name, predict, seconds[have]))
    if not terms:
        raise ConfigError("the transfer tables hold no measured cell in range")

    def loss(x: Array) -> float:
        try:
            p = _to_params(x)
        except ConfigError:
            return 1e9
        total = 0.0
        for _, predict, y in terms:
            total += float(np.mean(np.log(predict(p) / y) ** 2))
        return total / len(terms)

    x0 = np.log((start or FIT_START).as_vector())
    settings = {"maxiter": maxiter, "xatol": 1e-4, "fatol": 1e-9}
    res = minimize(loss, x0, method="Nelder-Mead", options=settings)
    res = minimize(loss, res.x, method="Nelder-Mead", options=settings)
    params = _to_params(res.x)
    per_source: dict[str, list[float]] = {}
    for name, predict, y in terms:
        per_source.setdefault(name, []).append(float(np.mean(np.abs(predict(params) / y - 1.0))))
    return TransferFit(
        params=params,
        sources=tuple(dict.fromkeys(s.name for s in sources)),
        train_rmsle=float(np.sqrt(res.fun)),
        train_mape={k: float(np.mean(v)) for k, v in per_source.items()},
    )


@public
def column_params(spec: object) -> tuple[str, ...]:
    """The :class:`KernelParams` the kernel model's price of column ``spec`` reads: those of
    its operators' kinds (:data:`bastion.cost.kernels.KIND_PARAMS`), in field order."""
    kinds = {operator_kind(op) for op, _ in _parts(spec)}
    wanted = {name for kind in kinds for name in KIND_PARAMS[kind]}
    return tuple(name for name in KernelParams().to_dict() if name in wanted)


@public
def fit_column_params(
    spec: object,
    model: ModelSpec,
    hw: HardwareProfile,
    tokens: npt.ArrayLike,
    seconds: npt.ArrayLike,
    options: RooflineOptions,
    start: KernelParams | None = None,
    maxiter: int = 2000,
) -> KernelParams:
    """The kernel model calibrated on one column's measured points: the parameters its kinds
    read (:func:`column_params`) fitted to ``seconds`` at ``tokens`` (mean squared log error,
    Nelder–Mead in the logarithm, fractions capped at 1, from ``start`` or :data:`FIT_START`,
    restarted once from its own result); every other parameter stays at ``start``'s. With
    fewer points than free parameters the fit is not unique (the optimiser's end point is
    returned); a column priced only by the roofline has nothing to fit and gets ``start``."""
    from scipy.optimize import minimize

    base = start or FIT_START
    y = np.asarray(seconds, dtype=np.float64)
    free = column_params(spec)
    if not free or y.size == 0:
        return base
    predict = column_predictor(spec, model, hw, tokens, options)
    names = list(base.to_dict())
    idx = [names.index(name) for name in free]
    v0 = base.as_vector()

    def params(x: Array) -> KernelParams:
        v = v0.copy()
        v[idx] = np.exp(np.clip(x, -30.0, 30.0))
        for i, name in enumerate(names):
            if name in _FRACTIONS:
                v[i] = min(v[i], 1.0)
        return KernelParams.from_vector(v)

    def loss(x: Array) -> float:
        try:
            p = params(x)
        except ConfigError:
            return 1e9
        return float(np.mean(np.log(predict(p) / y) ** 2))

    settings = {"maxiter": maxiter, "xatol": 1e-4, "fatol": 1e-10}
    res = minimize(loss, np.log(v0[idx]), method="Nelder-Mead", options=settings)
    res = minimize(loss, res.x, method="Nelder-Mead", options=settings)
    return params(res.x)
