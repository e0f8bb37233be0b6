"""Fitting a measured truth (:mod:`bastion.sim.measured`) from real steps and prefills.

Each term is fitted by non-negative least squares, started on relative error, stalls of the
machine left out, then mean-unbiased (see :func:`_nnls`); the forms are
:mod:`bastion.sim.measured`'s. What this module does not do: price (the terms do) or measure
(the real backend does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.measured import (
    _MIN_SAMPLES,
    _STAGE_TERMS,
    Curve,
    DraftTerm,
    HostTerm,
    MeasuredCosts,
    PrefillTerm,
    VerifyTerm,
)
from bastion.stepcosts import BUILDERS, CONTROLS, KINDS, PrefillSample, StepSample

__all__ = ["BUSY_STALL_SHARE", "STALL_SIGMAS", "fit_measured"]

Array = npt.NDArray[np.float64]


def _hats(x: Array, knots: Sequence[float]) -> Array:
    """[len(x), len(knots)] weights of the piecewise-linear curve through the knots at x:
    linear between knots, the first and last segments extended beyond them."""
    k = np.asarray(knots, dtype=np.float64)
    out = np.zeros((x.shape[0], k.shape[0]))
    if k.shape[0] == 1:
        out[:, 0] = 1.0
        return out
    seg = np.clip(np.searchsorted(k, x, side="right") - 1, 0, k.shape[0] - 2)
    lo, hi = k[seg], k[seg + 1]
    w = (x - lo) / (hi - lo)
    rows = np.arange(x.shape[0])
    out[rows, seg] = 1.0 - w
    out[rows, seg + 1] = w
    return out


def _knots(x: Array) -> tuple[float, ...]:
    """Powers of two from 1 to the first at or above max(x), each kept only where a sample lies
    within its neighbours (so that every knot's value is fitted by some sample)."""
    top = float(np.max(x))
    grid = [1.0]
    while grid[-1] < top:
        grid.append(grid[-1] * 2.0)
    keep = []
    for i, k in enumerate(grid):
        lo = grid[i - 1] if i else 0.0
        hi = grid[i + 1] if i + 1 < len(grid) else math.inf
        if np.any((x > lo) & (x < hi)):
            keep.append(k)
    return tuple(keep) or (1.0,)


STALL_SIGMAS = 4.0  # a sample above fit × exp(this × robust σ) is a stall, left out of the fit
BUSY_STALL_SHARE = 0.05  # stalls above this share of the verify time: the machine was busy


def _robust_sigma(y: Array, fit: Array) -> float:
    ok = fit > 0
    if not ok.any():
        return 0.0
    r = np.log(y[ok] / fit[ok])
    return float(1.4826 * np.median(np.abs(r - np.median(r))))


def _nnls(columns: Array, y: Array) -> tuple[Array, float, float]:
    """Non-negative coefficients whose fit is the *mean* of y where it is measured, stalls left
    out, with a fast pass counting as much as a slow one; (coefficients, robust σ of the log
    residuals).

    What the simulator must reproduce is a request's time per token — a mean over its steps —
    and the real runs report the median of it over requests, which a rare stall of the machine
    (hundreds of ms, landing on one step of one request) does not move. So: least squares on
    relative error starts the fit (near the median of y); the samples above it by more than
    :data:`STALL_SIGMAS` robust standard deviations (σ from the median absolute deviation of the
    log residuals) are stalls and are left out; then iteratively reweighted least squares with
    variance ∝ fit (Σ (y − f)² / f), whose solution has Σ x_j·(y / f − 1) = 0 for every column
    x_j: over the rest, the measured times are on average what the fit says. The third value is
    the stalls' share of the measured time (their excess over the fit ÷ the total)."""
    from scipy.optimize import nnls

    coef, _ = nnls(columns / y[:, None], np.ones_like(y))
    fit = columns @ coef
    sigma = _robust_sigma(y, fit)
    keep = ~(y > np.maximum(fit, 1e-12) * math.exp(STALL_SIGMAS * max(sigma, 1e-3)))
    every_x, every_y = columns, y
    if keep.sum() >= columns.shape[1]:
        columns, y = columns[keep], y[keep]
    for _ in range(4):
        fit = np.maximum(columns @ coef, 1e-12)
        w = 1.0 / np.sqrt(fit)
        coef, _ = nnls(columns * w[:, None], y * w)
    excess = np.maximum(every_y - every_x @ coef, 0.0)[~keep].sum()
    return coef, _robust_sigma(y, columns @ coef), float(excess / every_y.sum())


def _verify_features(rows: Array, sizes: Array, contexts: Array) -> Array:
    """The columns of a verify term beside its curve: R − 1, R·N·(L + N), R·L."""
    r, n, c = rows, sizes, contexts
    return np.stack([r - 1.0, r * n * (c + n), r * c], axis=1)


def _fit_verify(
    samples: Sequence[StepSample], kind: str, part: str = "verify_s"
) -> tuple[VerifyTerm, float, float]:
    rows = np.array([s.rows for s in samples], dtype=np.float64)
    sizes = np.array([1 if kind == "ar" else max(s.sizes) for s in samples], dtype=np.float64)
    contexts = np.array([max(s.contexts) for s in samples], dtype=np.float64)
    y = np.array([max(getattr(s, part), 1e-9) for s in samples], dtype=np.float64)
    tokens = rows * sizes
    knots = _knots(tokens)
    extra = _verify_features(rows, sizes, contexts)
    if kind == "ar":
        extra = extra[:, 1:]  # h(R) carries the rows
    coef, sigma, stalls = _nnls(np.hstack([_hats(tokens, knots), extra]), y)
    h = coef[: len(knots)]
    rest = [0.0, *coef[len(knots) :].tolist()] if kind == "ar" else coef[len(knots) :].tolist()
    row, attention, cache = (float(x) for x in rest)
    term = VerifyTerm(Curve(knots, tuple(h.tolist())), row, attention, cache, len(samples))
    return term, sigma, stalls


def _fit_draft(samples: Sequence[StepSample]) -> DraftTerm:
    rows = np.array([s.rows for s in samples], dtype=np.float64)
    total = np.array([sum(s.contexts) for s in samples], dtype=np.float64)
    appended = np.array([s.appended for s in samples], dtype=np.float64)
    y = np.array([s.draft_s for s in samples], dtype=np.float64)
    knots = _knots(rows)
    columns = [_hats(rows, knots), total[:, None]]
    recorded = bool(np.all(appended > 0))  # a drafted step appends ≥ 1 token per request
    if recorded and np.ptp(appended) > 0:
        columns.append(appended[:, None])
    coef = _nnls(np.hstack(columns), y)[0]
    curve = Curve(knots, tuple(coef[: len(knots)].tolist()))
    append_s = float(coef[len(knots) + 1]) if len(columns) == 3 else 0.0
    mean = float(np.mean(appended / rows)) if recorded else 0.0
    return DraftTerm(curve, float(coef[len(knots)]), len(samples), append_s, mean)


def _fit_affine(x: Array, y: Array) -> Array:
    """Non-negative coefficients of y ≈ x·coef, dropping columns that do not vary (a constant
    column stays): the fit degrades to fewer terms rather than to nonsense."""
    keep = [j for j in range(x.shape[1]) if j == 0 or np.ptp(x[:, j]) > 0]
    coef = np.zeros(x.shape[1])
    coef[keep] = _nnls(x[:, keep], y)[0]
    return coef


def _fit_host(samples: Sequence[StepSample], part: str) -> HostTerm:
    x = np.array(
        [[1.0, s.rows, sum(s.sizes), float(s.rows > 1)] for s in samples], dtype=np.float64
    )
    y = np.array([max(getattr(s, part), 1e-9) for s in samples], dtype=np.float64)
    if not (np.any(x[:, 3] == 0.0) and np.any(x[:, 3] == 1.0)):
        x[:, 3] = 0.0  # one side of the jump only: nothing to tell it from the constant
    step, request, node, batched = _fit_affine(x, y).tolist()
    return HostTerm(step, request, node, samples=len(samples), batched_s=batched)


def _fit_prefill(prefills: Sequence[PrefillSample]) -> PrefillTerm:
    n = np.array([p.tokens for p in prefills], dtype=np.float64)
    y = np.array([max(p.seconds, 1e-9) for p in prefills], dtype=np.float64)
    columns = np.stack([np.ones_like(n), n, n * n], axis=1)
    if np.unique(n).shape[0] < 3:
        columns[:, 2] = 0.0  # too few lengths for a curvature
    a, b, c = _fit_affine(columns, y).tolist()
    return PrefillTerm(a, b, c, samples=len(prefills))


@public
def fit_measured(
    steps: Sequence[StepSample],
    prefills: Sequence[PrefillSample],
    meta: Mapping[str, Any] | None = None,
) -> MeasuredCosts:
    """Fit every term of a measured truth from real steps and prefills (see the module).

    Needs at least three samples of each kind's verify pass, of each drafter preparation and of
    each kind's static host work, and three prefills; what is missing is named in the error."""
    if not all(isinstance(s, StepSample) for s in steps):
        raise ConfigError("fit_measured: steps must be StepSample instances")
    if not all(isinstance(p, PrefillSample) for p in prefills):
        raise ConfigError("fit_measured: prefills must be PrefillSample instances")
    verify: dict[str, VerifyTerm] = {}
    draft: dict[str, DraftTerm] = {}
    host: dict[str, HostTerm] = {}
    loop: dict[str, HostTerm] = {}
    sigmas = []
    stalls: list[float] = []  # seconds of the verify passes that stalls added
    total = 0.0
    missing = []
    for kind in KINDS:
        group = [s for s in steps if s.kind == kind and s.verify_s > 0]
        if len(group) < _MIN_SAMPLES:
            missing.append(f"verify of {kind} steps ({len(group)} samples)")
            continue
        staged = all(s.staged for s in group)  # the verifier's stages, each its own term
        verify[kind], sigma, stalled = _fit_verify(
            group, kind, "forward_s" if staged else "verify_s"
        )
        sigmas.append(sigma)
        seconds = sum(s.forward_s if staged else s.verify_s for s in group)
        stalls.append(stalled * seconds)
        total += seconds
        for stage in _STAGE_TERMS if staged else ():
            verify[f"{kind}_{stage}"] = _fit_verify(group, kind, f"{stage}_s")[0]
        for control in CONTROLS:
            hosted = [s for s in steps if s.kind == kind and s.control == control]
            for builder in BUILDERS:
                own = [s for s in hosted if s.builder == builder]
                name = builder or kind
                if len(own) >= _MIN_SAMPLES:
                    host[f"{name}_{control}"] = _fit_host(own, "build_s")
                    loop[f"{name}_{control}"] = _fit_host(own, "other_s")
                elif control == "static" and not builder:
                    missing.append(f"host work of static {kind} steps ({len(own)} samples)")
    for preparation in ("argmax", "topk"):
        group = [s for s in steps if s.preparation == preparation and s.draft_s > 0]
        if len(group) < _MIN_SAMPLES:
            missing.append(f"drafter passes with {preparation} preparation ({len(group)} samples)")
            continue
        draft[preparation] = _fit_draft(group)
    if len(prefills) < _MIN_SAMPLES:
        missing.append(f"prefills ({len(prefills)} samples)")
    if missing:
        raise ConfigError(
            "too few measurements for a measured truth: " + "; ".join(missing) + f" (each needs "
            f"≥ {_MIN_SAMPLES}; measure with ar, chain and a tree policy such as fixed:16)"
        )
    info = dict(meta or {})
    info.setdefault("steps", len(steps))
    info.setdefault("prefills", len(prefills))
    info.setdefault("stall_share", round(sum(stalls) / total, 4) if total else 0.0)
    return MeasuredCosts(
        verify, draft, host, loop, _fit_prefill(prefills), float(np.median(sigmas)), info
    )
