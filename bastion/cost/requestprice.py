"""The numbers the compiled per-request rule prices a roofline cost model's curves from.

``request()`` (``_bestfirst_request.c``) runs the paper's per-request rule for a whole batched
step, each request's curve priced as :meth:`bastion.cost.costmodel.RooflineCostModel.cost_curve`
prices it in a calibrated mode (static, ema+calib) for a dense target: per operator, the
constant and per-feature FLOP and byte counts of the masked pass (a tree's) and of the
unmasked one (L_AR), whole numbers, so that the kernel's counts are exact and its sums over
the operators numpy's. :func:`request_pricing` reads them off the model's own pricers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cost.curvecache import memo_of
from bastion.cost.jointcurve import calibrated_dense

__all__ = ["request_pricing"]

Array = npt.NDArray[np.float64]


def request_pricing(model: Any) -> tuple[Array, int] | None:
    """(the 32·ops + 16 numbers ``request()`` reads before T_draft and T_aux, ops), or None
    where the model is not a calibrated roofline of a dense target with whole, non-negative
    counts (the caller then runs the rule in Python). Kept on the model per correction."""
    if not calibrated_dense(model):
        return None
    mode, cal = model.mode, model.calibration
    stamp = (mode, model.ema.gamma, model.prep_s)
    memo = memo_of(model)
    fixed = memo.get(("request-pricing", stamp))
    if fixed is None:
        branches = []
        for masked in (True, False):
            bare = model._pricer(masked, tiled=False)
            compute = model._pricer(masked, tiled=True) if model._tiled is not None else bare
            for const, per_feature in (compute.flops, bare.nbytes):
                branches.append(np.vstack((const[None, :], per_feature)))  # [7, ops]
        stacked = np.concatenate([b.ravel() for b in branches])
        if not np.array_equal(stacked, np.floor(stacked)) or np.any(stacked < 0):
            return None  # counts that are not whole non-negative numbers: numpy's order matters
        bare = model._pricer(True, tiled=False)
        unmasked = model._pricer(False, tiled=False)
        if (bare.has_comm, bare.comm_const, bare.comm_slope) != (
            unmasked.has_comm,
            unmasked.comm_const,
            unmasked.comm_slope,
        ):
            return None  # the kernel adds one link's seconds to both passes
        compute = model._pricer(True, tiled=True) if model._tiled is not None else bare
        gamma = model.ema.gamma if mode == "ema+calib" else 0.0
        scalars = [
            compute.flop_rate,
            bare.byte_rate,
            compute.options.tile_tokens,
            bare.options.tile_tokens,
            cal.compute.alpha,
            cal.compute.beta,
            cal.memory.alpha,
            cal.memory.beta,
            gamma,
            # tensor parallelism's all-reduces, added to both passes as _base adds them
            1.0 if bare.has_comm else 0.0,
            bare.comm_const,
            bare.comm_slope,
        ]
        columns, maps, counts = zip(*(_unique_columns(m) for m in branches), strict=True)
        parts = (*(c.ravel() for c in columns), *maps, counts, scalars)
        fixed = memo.put(("request-pricing", stamp), np.concatenate(parts).astype(np.float64))
    ops = (fixed.shape[0] - 16) // 32
    return fixed, ops


def _unique_columns(counts: Array) -> tuple[Array, Array, int]:
    """A branch's [7, ops] counts as its distinct non-zero operator columns first ([7, ops],
    zero-padded), each operator's column among them (−1: all zero, priced 0.0) and how many:
    operators with the same counts have the same quotient, so it is divided once."""
    ops = counts.shape[1]
    seen: dict[bytes, int] = {}
    index = np.full(ops, -1.0)
    for j in range(ops):
        if counts[:, j].any():
            index[j] = seen.setdefault(counts[:, j].tobytes(), len(seen))
    unique = np.zeros_like(counts)
    for key, at in seen.items():
        unique[:, at] = np.frombuffer(key, dtype=np.float64)
    return unique, index, len(seen)
