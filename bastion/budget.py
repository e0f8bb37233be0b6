"""The budget controller: how large a tree to verify this step (paper §3.4, Prop. 3.4).

Best-first expansion yields nested trees T_1 ⊂ T_2 ⊂ …, with Â(N + 1) = Â(N) + ρ(i_{N+1}). With
a cost model's estimate Ĉ(N) = T_draft + T_aux + T_verify(N) of one cycle and L_AR of one
autoregressive step, the estimated speedup of a size-N tree is

    Ŝ(N) = Â(N) · L_AR / Ĉ(N).

If Â is concave and non-decreasing and Ĉ is convex and positive, Ŝ is unimodal and the first N
with Ŝ(N + 1) < Ŝ(N) is its global maximiser (Prop. 3.4), so the controller can stop there.
Cost curves that are not convex (MoE expert saturation, tile/wave steps) break that guarantee;
for them the exhaustive mode takes the argmax over every N ≤ N_max, and ``mode="auto"`` picks
first-decrease only when :func:`is_convex` accepts the curve.

The chain is grown in doubling chunks (build T_b, scan it, double b if Ŝ has not yet turned
down) instead of one node at a time: the builder's output is nested, so the answer is the same
as a node-by-node scan and the work is at most twice that of building the final tree.

What this module does not do: price trees (that is the ``CostModel``) or verify them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import best_first
from bastion.errors import BudgetError, CostModelError
from bastion.interfaces import CostCurve
from bastion.tree import DraftMarginals, DraftTree, tree_from_arrays

__all__ = [
    "BudgetDiagnostics",
    "ControllerMode",
    "choose_tree",
    "first_decrease",
    "is_convex",
    "speedup_curve",
]

ControllerMode = Literal["first-decrease", "exhaustive", "auto"]
_MODES = ("first-decrease", "exhaustive", "auto")


@dataclass(frozen=True, eq=False)
class BudgetDiagnostics:
    """Why the controller chose its N: the curves it scanned, up to where it stopped."""

    tree_size: int  # the chosen N
    mode: Literal["first-decrease", "exhaustive"]  # the rule actually applied
    a_hat: npt.NDArray[np.float64]  # Â(N), N = 1 … len
    c_hat: npt.NDArray[np.float64]  # Ĉ(N) in seconds
    s_hat: npt.NDArray[np.float64]  # Ŝ(N)
    ar_step_s: float  # L_AR
    exhausted: bool  # the lattice had no more nodes with ρ > 0
    capped: bool  # N_max was reached without Ŝ turning down

    @property
    def predicted_speedup(self) -> float:
        return float(self.s_hat[self.tree_size - 1])


def validate_cost_curve(curve: CostCurve, n_max: int) -> npt.NDArray[np.float64]:
    """Ĉ(N) for N = 1 … n_max, checked finite and positive; raises CostModelError otherwise."""
    verify = np.asarray(curve.verify_s, dtype=np.float64)
    if verify.ndim != 1 or verify.shape[0] < n_max:
        raise CostModelError(
            f"cost curve must give T_verify for N = 1 … {n_max}; got shape {verify.shape}"
        )
    total = curve.draft_s + curve.prep_s + verify[:n_max]
    scalars = {"draft_s": curve.draft_s, "prep_s": curve.prep_s, "ar_step_s": curve.ar_step_s}
    for name, value in scalars.items():
        if not np.isfinite(value) or value < 0 or (name == "ar_step_s" and value <= 0):
            raise CostModelError(f"cost model returned {name} = {value!r}; need finite and > 0")
    if not np.all(np.isfinite(total)) or np.any(total <= 0.0):
        bad = int(np.flatnonzero(~np.isfinite(total) | (total <= 0.0))[0]) + 1
        raise CostModelError(
            f"cost model returned Ĉ({bad}) = {total[bad - 1]!r}; costs must be finite and > 0"
        )
    return total


def is_convex(
    values: npt.ArrayLike, lo: int = 1, hi: int | None = None, rtol: float = 1e-9
) -> bool:
    """Whether f(N) = values[N − 1] is convex on the integers lo … hi (inclusive, 1-based).

    Convex on integers means non-negative second differences; ``rtol`` (relative to max |f|)
    absorbs floating-point noise.
    """
    f = np.asarray(values, dtype=np.float64)
    hi = f.shape[0] if hi is None else hi
    if not 1 <= lo <= hi <= f.shape[0]:
        raise BudgetError(
            f"convexity range must satisfy 1 ≤ lo ≤ hi ≤ {f.shape[0]}; got {lo}, {hi}"
        )
    seg = f[lo - 1 : hi]
    if seg.size < 3:
        return True
    tol = rtol * max(1.0, float(np.max(np.abs(seg))))
    return bool(np.all(np.diff(seg, 2) >= -tol))


def speedup_curve(
    a_hat: npt.NDArray[np.float64], c_hat: npt.NDArray[np.float64], ar_step_s: float
) -> npt.NDArray[np.float64]:
    """Ŝ(N) = Â(N) · L_AR / Ĉ(N)."""
    return a_hat * ar_step_s / c_hat


def first_decrease(s_hat: npt.NDArray[np.float64]) -> int | None:
    """The smallest N with Ŝ(N + 1) < Ŝ(N), or None if Ŝ never decreases on the array."""
    down = np.flatnonzero(s_hat[1:] < s_hat[:-1])
    return int(down[0]) + 1 if down.size else None


def choose_tree(
    marginals: DraftMarginals,
    curve: CostCurve,
    n_max: int,
    mode: ControllerMode = "auto",
    initial_budget: int = 64,
    root_token: int = -1,
) -> tuple[DraftTree, BudgetDiagnostics]:
    """Grow best-first trees and stop where the estimated speedup Ŝ(N) peaks.

    ``curve`` must price N = 1 … n_max. Returns the chosen tree T_N and the diagnostics.
    """
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)) or n_max < 1:
        raise BudgetError(f"n_max must be an integer ≥ 1; got {n_max!r}")
    if mode not in _MODES:
        raise BudgetError(f"unknown controller mode {mode!r}; known: {', '.join(_MODES)}")
    if initial_budget < 1:
        raise BudgetError(f"initial_budget must be ≥ 1; got {initial_budget}")
    c_all = validate_cost_curve(curve, n_max)
    rule: Literal["first-decrease", "exhaustive"] = (
        mode if mode != "auto" else ("first-decrease" if is_convex(c_all) else "exhaustive")
    )

    budget = n_max if rule == "exhaustive" else min(initial_budget, n_max)
    while True:
        arrays = best_first(marginals.probs, budget)
        n = arrays[3].size
        exhausted = n < budget
        a_hat = np.cumsum(arrays[3])
        s_hat = speedup_curve(a_hat, c_all[:n], curve.ar_step_s)
        if rule == "exhaustive":
            chosen = int(np.argmax(s_hat)) + 1
            break
        stop = first_decrease(s_hat)
        if stop is not None:
            chosen = stop
            break
        if exhausted or budget >= n_max:
            chosen = n
            break
        budget = min(2 * budget, n_max)

    diag = BudgetDiagnostics(
        tree_size=chosen,
        mode=rule,
        a_hat=a_hat,
        c_hat=c_all[:n],
        s_hat=s_hat,
        ar_step_s=float(curve.ar_step_s),
        exhausted=exhausted,
        capped=(rule == "first-decrease" and chosen == n == n_max),
    )
    tree = tree_from_arrays(tuple(a[:chosen] for a in arrays), marginals, root_token)  # type: ignore[arg-type]
    return tree, diag
