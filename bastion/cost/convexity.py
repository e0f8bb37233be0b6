"""Checks of the controller's premises on a sampled cost curve (Prop. 3.4).

The first-decrease stopping rule of the controller is exact when Ĉ(N) is convex and positive.
The dense roofline is; a Qwen3-MoE curve is not near s = E/K, where the expert-touch term
saturates. These helpers say which case a sampled curve is in, so that a controller can fall back
to an exhaustive search over N.

What this module does not do: decide what the controller does with the answer.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bastion.guard import array, public

__all__ = [
    "cost_curve_convexity_violations",
    "cost_curve_is_convex",
    "cost_curve_is_nondecreasing",
]


def _tolerance(v: npt.NDArray[np.float64], rtol: float) -> float:
    return rtol * float(np.max(np.abs(v))) if v.size else 0.0


@public(values=array())
def cost_curve_convexity_violations(
    values: npt.ArrayLike, rtol: float = 1e-9
) -> npt.NDArray[np.intp]:
    """Indices i (1 ≤ i ≤ n − 2) where v[i−1] − 2·v[i] + v[i+1] < −rtol·max|v|.

    For a curve sampled at N = 1 … n (``values[N − 1]``), index i is the tree size N = i + 1.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 3:
        return np.zeros(0, dtype=np.intp)
    second = v[:-2] - 2.0 * v[1:-1] + v[2:]
    return np.flatnonzero(second < -_tolerance(v, rtol)) + 1


@public(values=array(1))
def cost_curve_is_convex(values: npt.ArrayLike, rtol: float = 1e-9) -> bool:
    """True when every second difference of the sampled curve is ≥ −rtol·max|v|."""
    return cost_curve_convexity_violations(values, rtol).size == 0


@public(values=array())
def cost_curve_is_nondecreasing(values: npt.ArrayLike, rtol: float = 1e-9) -> bool:
    """True when every first difference of the sampled curve is ≥ −rtol·max|v|."""
    v = np.asarray(values, dtype=np.float64).ravel()
    return bool(np.all(np.diff(v) >= -_tolerance(v, rtol)))
