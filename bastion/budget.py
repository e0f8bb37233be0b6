"""The budget controller: how large a tree to verify this step (paper §3.4, Prop. 3.4).

Best-first expansion yields nested trees T_1 ⊂ T_2 ⊂ …, with Â(N + 1) = Â(N) + ρ(i_{N+1}). With
a cost model's estimate Ĉ(N) = T_draft + T_aux + T_verify(N) of one cycle and L_AR of one
autoregressive step, the estimated speedup of a size-N tree is

    Ŝ(N) = Â(N) · L_AR / Ĉ(N).

In a batched pass the quantity to maximise is the batch's committed tokens per second, so with
A_o the other requests' expected tokens (``base_tokens``) the controller uses
Ŝ(N) = (A_o + Â(N)) · L_AR / Ĉ(N) — the same unimodality argument holds, since adding a constant
keeps the numerator concave. At batch 1, A_o = 0.

If Â is concave and non-decreasing and Ĉ is convex and positive, Ŝ is unimodal and the first N
with Ŝ(N + 1) < Ŝ(N) is its global maximiser (Prop. 3.4), so the controller can stop there.
Cost curves that are not convex (MoE expert saturation, tile/wave steps) break that guarantee;
for them the exhaustive mode takes the argmax over every N ≤ N_max. ``mode="auto"`` (the
default) computes the same argmax but stops early, as soon as a bound shows that no larger tree
can win: since ΔÂ never grows, Â(N') ≤ Â(n) + (N' − n)·ρ(i_n), and Â ≤ depth + 1; with Ĉ
non-decreasing (every roofline term grows with N), Ŝ(N') ≤ (A_o + that bound)·L_AR / Ĉ(n). It
needs no convexity, and where Ĉ is convex it returns the first-decrease N.
:func:`is_convex` tells whether a curve meets Prop. 3.4's premise on a range.

The chain is grown in doubling chunks (build T_b, scan it, double b if Ŝ has not yet turned
down) instead of one node at a time: the builder's output is nested, so the answer is the same
as a node-by-node scan and the work is at most twice that of building the final tree.

Speed: the controller runs every decode step, so a chunk — validating the priced curve, building
T_b, its tokens, Â, Ĉ, Ŝ and the stopping rule — is one call of the compiled kernel
``bastion._bestfirst.chunk`` (tens of µs for the whole step instead of a few hundred numpy calls'
worth). Without the kernel the same loop runs in numpy (:func:`_choose_numpy`); both perform the
same floating-point operations in the same order and return identical trees and diagnostics
(tested against a straightforward reference).

What this module does not do: price trees (that is the ``CostModel``) or verify them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE, best_first, buildable_nodes
from bastion.errors import BudgetError, CostModelError
from bastion.guard import array, number, public
from bastion.interfaces import CostCurve
from bastion.tree import DraftMarginals, DraftTree, tree_from_arrays

try:
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # no C compiler at install time: the numpy loop gives identical results
    _compiled = None

# one growth round in C (None without the kernel, or with a kernel built before it existed)
_chunk: Any = getattr(_compiled, "chunk", None)

__all__ = [
    "BudgetDiagnostics",
    "ControllerMode",
    "CurveSource",
    "choose_tree",
    "first_decrease",
    "is_convex",
    "speedup_curve",
]

ControllerMode = Literal["first-decrease", "exhaustive", "auto"]
Rule = Literal["first-decrease", "exhaustive", "bounded"]
_MODES = ("first-decrease", "exhaustive", "auto")


@dataclass(frozen=True, eq=False)
class BudgetDiagnostics:
    """Why the controller chose its N: the curves it scanned, up to where it stopped."""

    tree_size: int  # the chosen N
    mode: Rule  # the rule actually applied ("bounded" is auto's pruned exhaustive scan)
    a_hat: npt.NDArray[np.float64]  # Â(N), N = 1 … len
    c_hat: npt.NDArray[np.float64]  # Ĉ(N) in seconds
    s_hat: npt.NDArray[np.float64]  # Ŝ(N)
    ar_step_s: float  # L_AR
    exhausted: bool  # the lattice had no more nodes with ρ > 0
    capped: bool  # the chosen N is N_max itself

    @property
    def predicted_speedup(self) -> float:
        return float(self.s_hat[self.tree_size - 1])


def validate_cost_curve(curve: CostCurve, n_max: int) -> npt.NDArray[np.float64]:
    """Ĉ(N) for N = 1 … n_max, checked finite and positive; raises CostModelError otherwise."""
    if not isinstance(curve, CostCurve):
        raise CostModelError(
            f"a cost model or curve source must return a CostCurve pricing N = 1 … {n_max}; "
            f"got {curve!r:.80}"
        )
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


@public(values=array(1))
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


@public(
    a_hat=array(1),
    c_hat=array(1, nonempty=True),
    ar_step_s=number(positive=True),
    lengths=("a_hat", "c_hat"),
)
def speedup_curve(
    a_hat: npt.NDArray[np.float64], c_hat: npt.NDArray[np.float64], ar_step_s: float
) -> npt.NDArray[np.float64]:
    """Ŝ(N) = Â(N) · L_AR / Ĉ(N)."""
    return np.asarray(a_hat, dtype=np.float64) * ar_step_s / np.asarray(c_hat, dtype=np.float64)


@public(s_hat=array(1))
def first_decrease(s_hat: npt.NDArray[np.float64]) -> int | None:
    """The smallest N with Ŝ(N + 1) < Ŝ(N), or None if Ŝ never decreases on the array."""
    s = np.asarray(s_hat, dtype=np.float64)
    down = np.flatnonzero(s[1:] < s[:-1])
    return int(down[0]) + 1 if down.size else None


CurveSource = Callable[[int], CostCurve]  # n → a curve pricing at least N = 1 … n


@public(error=BudgetError)
def choose_tree(
    marginals: DraftMarginals,
    curve: CostCurve | CurveSource,
    n_max: int,
    mode: ControllerMode = "auto",
    initial_budget: int = 128,
    root_token: int = -1,
    base_tokens: float = 0.0,
) -> tuple[DraftTree, BudgetDiagnostics]:
    """Grow best-first trees and stop where the estimated speedup Ŝ(N) peaks.

    ``curve`` prices N = 1 … n_max, either as one ``CostCurve`` or as a callable asked for a
    curve of at least n entries as the tree grows (so a controller that stops at N = 20 never
    prices N = 1024). ``base_tokens`` is A_o, the expected tokens of the other requests in a
    batched pass (0 at batch 1). Returns the chosen tree T_N and the diagnostics (whose
    ``a_hat`` is this request's Â alone).

    Modes: ``first-decrease`` (Prop. 3.4; optimal when Ĉ is convex), ``exhaustive`` (argmax of
    Ŝ over every N ≤ n_max), ``auto`` (the same argmax, pruned: it stops once no larger tree can
    beat the best found — exact whenever Ĉ is non-decreasing, with no convexity needed).
    """
    finite = (
        0.0 <= base_tokens < math.inf  # a float: the same test without numpy's scalar overhead
        if type(base_tokens) is float
        else bool(np.isfinite(base_tokens)) and not base_tokens < 0
    )
    if not finite:
        raise BudgetError(f"base_tokens must be a finite number ≥ 0; got {base_tokens!r}")
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)) or n_max < 1:
        raise BudgetError(f"n_max must be an integer ≥ 1; got {n_max!r}")
    if mode not in _MODES:
        raise BudgetError(f"unknown controller mode {mode!r}; known: {', '.join(_MODES)}")
    if (
        isinstance(initial_budget, bool)
        or not isinstance(initial_budget, (int, np.integer))
        or initial_budget < 1
    ):
        raise BudgetError(f"initial_budget must be an integer ≥ 1; got {initial_budget!r}")
    if n_max > MAX_TREE_SIZE:  # no tree outgrows its lattice or the builders' limit
        n_max = min(MAX_TREE_SIZE, int(buildable_nodes(marginals.probs)) + 1)
    source: CurveSource = curve if callable(curve) else (lambda _n: curve)
    rule: Rule = "bounded" if mode == "auto" else mode
    if _chunk is not None and marginals.probs.ndim == 2 and marginals.probs.size:
        return _choose_compiled(
            marginals, source, n_max, rule, initial_budget, root_token, base_tokens
        )
    return _choose_numpy(marginals, source, n_max, rule, initial_budget, root_token, base_tokens)


_RULE_CODES: dict[str, int] = {"first-decrease": 0, "exhaustive": 1, "bounded": 2}


def _choose_compiled(
    marginals: DraftMarginals,
    source: CurveSource,
    n_max: int,
    rule: Rule,
    initial_budget: int,
    root_token: int,
    base_tokens: float,
) -> tuple[DraftTree, BudgetDiagnostics]:
    """The loop of :func:`_choose_numpy` with each chunk in one call of the compiled kernel."""
    probs = np.ascontiguousarray(marginals.probs, dtype=np.float64)
    ids = np.ascontiguousarray(marginals.token_ids, dtype=np.int64)
    depth, k = probs.shape
    code = _RULE_CODES[rule]
    a_ceiling = depth + 1.0  # Â ≤ E[committed length] ≤ depth + 1
    bounded = rule == "bounded"
    chunk = _chunk
    budget = n_max if rule == "exhaustive" else min(initial_budget, n_max)
    while True:
        ahead = min(2 * budget, n_max) if bounded else budget
        cc = source(ahead)
        if not isinstance(cc, CostCurve):
            validate_cost_curve(cc, ahead)  # raises the named error
        verify = np.asarray(cc.verify_s, dtype=np.float64)
        if verify.ndim != 1 or verify.shape[0] < ahead:
            validate_cost_curve(cc, ahead)  # raises the named error
        if not verify.flags.c_contiguous:
            verify = np.ascontiguousarray(verify)
        ints = np.empty(4 * budget, dtype=np.int64)  # parents, depths, ranks, tokens
        floats = np.empty(4 * budget, dtype=np.float64)  # ρ, Â, Ĉ, Ŝ
        status, n, chosen = chunk(
            probs, ids, depth, k, budget, ahead, n_max, code, root_token, verify,
            cc.draft_s, cc.prep_s, cc.draft_s + cc.prep_s, cc.ar_step_s, base_tokens, a_ceiling,
            ints, floats,
        )  # fmt: skip
        if status < 0:  # the curve fails validation: name the problem as the reference does
            validate_cost_curve(cc, ahead)
            raise CostModelError(f"cost curve for N ≤ {ahead} rejected")  # pragma: no cover
        if status:
            break
        budget = min(2 * budget, n_max)
    ints.flags.writeable = False
    floats.flags.writeable = False
    b = budget
    diag = BudgetDiagnostics(
        tree_size=chosen,
        mode=rule,
        a_hat=floats[b : b + n],
        c_hat=floats[2 * b : 2 * b + n],
        s_hat=floats[3 * b : 3 * b + n],
        ar_step_s=float(cc.ar_step_s),
        exhausted=n < budget,
        capped=(chosen == n == n_max),
    )
    tree = DraftTree.trusted(
        ints[:chosen],
        ints[3 * b : 3 * b + chosen],
        ints[b : b + chosen],
        floats[:chosen],
        ints[2 * b : 2 * b + chosen],
    )
    return tree, diag


def _choose_numpy(
    marginals: DraftMarginals,
    source: CurveSource,
    n_max: int,
    rule: Rule,
    initial_budget: int,
    root_token: int,
    base_tokens: float,
) -> tuple[DraftTree, BudgetDiagnostics]:
    """The controller's loop in numpy (the fallback without the compiled kernel)."""
    a_ceiling = marginals.depth + 1.0  # Â ≤ E[committed length] ≤ depth + 1

    budget = n_max if rule == "exhaustive" else min(initial_budget, n_max)
    while True:
        # the bounded scan prices one chunk ahead, which tightens its stopping bound
        ahead = min(2 * budget, n_max) if rule == "bounded" else budget
        cc = source(ahead)
        c_all = validate_cost_curve(cc, ahead)
        arrays = best_first(marginals.probs, budget)
        n = arrays[3].size
        exhausted = n < budget
        a_hat = np.cumsum(arrays[3])
        s_hat = speedup_curve(base_tokens + a_hat, c_all[:n], cc.ar_step_s)
        done = exhausted or budget >= n_max
        if rule == "first-decrease":
            stop = first_decrease(s_hat)
            if stop is not None or done:
                chosen = stop if stop is not None else n
                break
        else:
            chosen = int(np.argmax(s_hat)) + 1
            if done:
                break
            # No N' > n can beat Ŝ(chosen) if even the most optimistic Â(N') cannot:
            # Â(N') ≤ Â(n) + (N' − n)·ρ_n (gains never grow) and ≤ depth + 1. Priced Ĉ is used
            # up to the lookahead; beyond it, Ĉ(N') ≥ Ĉ(lookahead) (Ĉ non-decreasing).
            if not bool(np.all(np.diff(c_all) >= 0.0)):
                budget = min(2 * budget, n_max)
                continue  # the premise fails on the priced range: keep scanning, no pruning
            rho, a_n = arrays[3][-1], a_hat[-1]
            near = np.arange(n + 1, ahead + 1)
            a_near = np.minimum(a_n + (near - n) * rho, a_ceiling)
            bound = float(np.max((base_tokens + a_near) / c_all[n:ahead], initial=0.0))
            a_far = min(a_n + (n_max - n) * rho, a_ceiling)
            bound = max(bound, (base_tokens + a_far) / c_all[ahead - 1]) * cc.ar_step_s
            if bound <= s_hat[chosen - 1]:
                break
        budget = min(2 * budget, n_max)

    diag = BudgetDiagnostics(
        tree_size=chosen,
        mode=rule,
        a_hat=a_hat,
        c_hat=c_all[:n],
        s_hat=s_hat,
        ar_step_s=float(cc.ar_step_s),
        exhausted=exhausted,
        capped=(chosen == n == n_max),
    )
    tree = tree_from_arrays(tuple(a[:chosen] for a in arrays), marginals, root_token)  # type: ignore[arg-type]
    return tree, diag
