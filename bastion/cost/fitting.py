"""Convex, start-free fits of the calibrated roofline and their cross-validated error.

The calibrated roofline of one operator (or of a whole pass) is a max of two affine branches,

    ŷ = max(a_c·R_c + b_c,  Σ_j a_j·M_j + b_m),

with R_c the compute feature (FLOPs / peak, possibly on tile- or wave-padded tokens) and M_j the
memory features (DRAM bytes / bandwidth, L2-resident bytes / L2 bandwidth). A max of affine
functions is not convex in its parameters, so a local optimiser started from the profile's numbers
lands in optima that depend on those numbers. Here the fit is global instead:

1. the points are ordered along the pass (``order``, default: by R_c / ΣM, the arithmetic
   intensity, which no positive rescaling of a feature changes); every split of that order into
   a memory-bound prefix and a compute-bound suffix is tried (n + 1 splits);
2. for a given split each branch is a linear least-squares problem with bounds (slopes ≥ 0,
   offsets ≥ −½·min y), which is convex and solved exactly (``scipy.optimize.lsq_linear``) on
   features scaled to unit median;
3. the split whose max-model has the smallest weighted squared error wins (ties: the first).

Every step is equivariant under a positive rescaling of any feature column (a different peak
FLOP/s, bandwidth or efficiency in the profile): the fitted slopes rescale inversely and the
predictions are the same. ``tests/test_cost_fitting.py`` checks this with Hypothesis.

:func:`loo_errors` is leave-one-out cross-validation of any fit, the honest uncertainty stored
with calibration records and used to choose tile/step terms.

What this module does not do: compute features (see :mod:`bastion.cost.roofline`) or store
records (see :mod:`bastion.cost.calibration`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from bastion.errors import ArgumentError, ConfigError
from bastion.guard import array, as_float, integer, public

__all__ = ["MaxAffineFit", "Weighting", "fit_max_affine", "loo_errors"]

Array = npt.NDArray[np.float64]
Weighting = Literal["relative", "absolute"]


@dataclass(frozen=True)
class MaxAffineFit:
    """max(compute_slope·R_c + compute_offset, memory_slopes·M + memory_offset)."""

    compute_slope: float
    compute_offset: float  # seconds
    memory_slopes: tuple[float, ...]
    memory_offset: float  # seconds

    def predict(self, compute: npt.ArrayLike, memory: npt.ArrayLike) -> Array:
        rc = np.asarray(compute, dtype=np.float64)
        mem = np.asarray(memory, dtype=np.float64)
        if mem.ndim == rc.ndim:  # one memory feature given as a vector
            mem = mem[..., None]
        m_branch = mem @ np.asarray(self.memory_slopes) + self.memory_offset
        out: Array = np.maximum(self.compute_slope * rc + self.compute_offset, m_branch)
        return out


def _as_features(compute: npt.ArrayLike, memory: npt.ArrayLike, y: Array) -> tuple[Array, Array]:
    rc = np.asarray(compute, dtype=np.float64).ravel()
    mem = np.asarray(memory, dtype=np.float64)
    mem = mem.reshape(-1, 1) if mem.ndim <= 1 else mem
    if rc.shape != y.shape or mem.shape[0] != y.shape[0]:
        raise ConfigError("compute, memory and measured must have the same number of points")
    if not (np.all(np.isfinite(rc)) and np.all(np.isfinite(mem))):
        raise ConfigError("roofline features must be finite")
    if np.any(rc < 0) or np.any(mem < 0) or np.any(mem.sum(axis=1) <= 0):
        raise ConfigError("roofline branches must be non-negative (memory positive)")
    return rc, mem


def _branch(x: Array, y: Array, w: Array, floor: float) -> Array:
    """Bounded least squares of one branch: slopes ≥ 0, offset ≥ ``floor`` (last coefficient)."""
    from scipy.optimize import lsq_linear

    k = x.shape[1]
    if y.size == 0:
        return np.zeros(k + 1)
    a = np.column_stack([x, np.ones(y.size)]) * w[:, None]
    lower = np.r_[np.zeros(k), floor]
    upper = np.full(k + 1, np.inf)
    sol = lsq_linear(a, y * w, bounds=(lower, upper), method="bvls")
    return np.asarray(sol.x, dtype=np.float64)


MAX_REFINEMENTS = 16  # reassignment rounds after the split search (each must lower the loss)


@public(
    compute=array(1),
    memory=array(),
    measured=array(1),
    lengths=("compute", "memory", "measured", "order"),
)
def fit_max_affine(
    compute: npt.ArrayLike,
    memory: npt.ArrayLike,
    measured: npt.ArrayLike,
    *,
    weighting: Weighting = "relative",
    order: npt.ArrayLike | None = None,
) -> MaxAffineFit:
    """The global least-squares fit of ``max(a_c·R_c + b_c, Σ a_j·M_j + b_m)`` to ``measured``.

    ``memory`` is one feature per point or an [n, k] matrix; ``order`` (n values) is the order
    along which points go from memory- to compute-bound (default: R_c / ΣM). ``relative``
    weighting minimises Σ((ŷ − y)/y)²; ``absolute`` Σ(ŷ − y)².
    """
    y = np.asarray(measured, dtype=np.float64).ravel()
    if y.size == 0 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ConfigError("measured times must be positive finite seconds")
    if weighting not in ("relative", "absolute"):
        raise ConfigError(f"weighting {weighting!r}; accepted: 'relative', 'absolute'")
    rc, mem = _as_features(compute, memory, y)
    # unit-median features and times: the bounded solves see O(1) numbers whatever the units
    y_scale = float(np.median(y))
    c_scale = float(np.median(rc[rc > 0])) if np.any(rc > 0) else 1.0
    m_scale = np.array(
        [float(np.median(col[col > 0])) if np.any(col > 0) else 1.0 for col in mem.T]
    )
    yn, rcn, memn = y / y_scale, rc / c_scale, mem / m_scale
    w = 1.0 / yn if weighting == "relative" else np.ones_like(yn)
    key = rc / mem.sum(axis=1) if order is None else np.asarray(order, dtype=np.float64).ravel()
    if key.shape != y.shape:
        raise ConfigError("order must have one value per point")
    ranked = np.argsort(key, kind="stable")
    floor = -0.5 * float(yn.min())
    best: tuple[float, Array, Array] | None = None
    for split in range(y.size + 1):
        on_memory = np.zeros(y.size, dtype=bool)
        on_memory[ranked[:split]] = True
        mc = _branch(memn[on_memory], yn[on_memory], w[on_memory], floor)
        cc = _branch(rcn[~on_memory, None], yn[~on_memory], w[~on_memory], floor)
        pred = np.maximum(cc[0] * rcn + cc[1], memn @ mc[:-1] + mc[-1])
        loss = float(np.sum(((pred - yn) * w) ** 2))
        if best is None or loss < best[0] * (1 - 1e-9) - 1e-30:
            best = (loss, cc, mc)
    assert best is not None
    # The splits above are thresholds along ``key``; where the branches' offsets differ, the
    # true partition (which branch is the larger at each point) need not be one. Refine: give
    # each point to the branch the best fit makes larger there, refit, and keep a lower loss.
    for _ in range(MAX_REFINEMENTS):
        _, cc, mc = best
        on_memory = memn @ mc[:-1] + mc[-1] >= cc[0] * rcn + cc[1]
        mc = _branch(memn[on_memory], yn[on_memory], w[on_memory], floor)
        cc = _branch(rcn[~on_memory, None], yn[~on_memory], w[~on_memory], floor)
        pred = np.maximum(cc[0] * rcn + cc[1], memn @ mc[:-1] + mc[-1])
        loss = float(np.sum(((pred - yn) * w) ** 2))
        if not loss < best[0] * (1 - 1e-9) - 1e-30:
            break
        best = (loss, cc, mc)
    _, cc, mc = best
    return MaxAffineFit(
        compute_slope=float(cc[0]) * y_scale / c_scale,
        compute_offset=float(cc[1]) * y_scale,
        memory_slopes=tuple(float(s) * y_scale / m for s, m in zip(mc[:-1], m_scale, strict=True)),
        memory_offset=float(mc[-1]) * y_scale,
    )


@public(n=integer(lo=0), measured=array(positive=True))
def loo_errors(
    n: int, fit_predict: Callable[[npt.NDArray[np.bool_], int], float], measured: npt.ArrayLike
) -> Array:
    """Leave-one-out relative errors |ŷ_i − y_i| / y_i, i = 0 … n − 1.

    ``fit_predict(train_mask, i)`` fits on the points of ``train_mask`` and predicts point i (a
    finite number; anything else is an :class:`ArgumentError`). ``measured`` holds at least n
    positive values.
    """
    y = np.asarray(measured, dtype=np.float64).ravel()
    if y.size < n:
        raise ArgumentError(f"loo_errors: n = {n} needs {n} measured values; got {y.size}")
    out = np.empty(n)
    for i in range(n):
        mask = np.ones(n, dtype=bool)
        mask[i] = False
        predicted = as_float(
            fit_predict(mask, i), f"loo_errors: what fit_predict(train_mask, {i}) returned"
        )
        out[i] = abs(predicted - y[i]) / y[i]
    return out
