"""A joint tree budget across the requests of one batched step (beyond the paper).

:func:`bastion.budget.choose_tree` sizes one request's tree against the cost of the batched pass
with the other requests' trees held fixed. :func:`choose_joint` sizes all B trees of a serving
step together: it chooses the allocation (N_1, …, N_B), every N_i ≥ 1 (each request keeps its
root) and N_i ≤ N_max, that maximises the batch's estimated speedup

    Ŝ(M) = (Σ_i Â_i(N_i)) · L_AR / Ĉ(N_1, …, N_B),    M = Σ_i N_i,

where Â_i is request i's surrogate (the cumulative sum of its best-first scores ρ), Ĉ the
predicted cycle of the whole batch (drafter pass, T_aux, one verification pass over all trees)
and L_AR one target-only autoregressive step of the whole batch (B tokens, no tree mask).

The maths. Along request i's best-first order the gains ρ never increase, so Â_i is concave in
N_i. Merging the B best-first expansions into one global order by ρ (descending; ties broken by
request index, each request's own order kept — a stable sort of the concatenation) is the greedy
algorithm for a sum of concave functions: for every total M, the first M − B merged nodes give
an allocation that maximises Σ_i Â_i(N_i) over all allocations with Σ_i N_i = M (an exchange
argument: any other allocation swaps some merged node for one of no larger ρ). The controller
therefore scans one chain, M = B, B + 1, …, priced by a batched cost curve along the merged
order (:class:`JointCostModel`), with the rules of ``choose_tree``:

- ``first-decrease``: the first M with Ŝ(M + 1) < Ŝ(M); optimal when the chain's Ĉ is convex;
- ``exhaustive``: the argmax of Ŝ over the whole chain;
- ``auto``: the same argmax, pruned once no larger M can win: Σ Â(M') ≤ Σ Â(M) + (M' − M)·ρ
  with ρ an upper bound on the next gain, Σ Â is at most the lattices' total mass
  Σ_i Σ_d Π_{k≤d} (Σ_j p_i[k, j]) (≤ Σ_i (depth_i + 1); per request, what is not built yet is
  also at most (N_max − n_i)·ρ_last), and Ĉ is non-decreasing, so Ĉ(M') ≥ Ĉ(M).

When Ĉ depends on M alone the merged chain holds, for every M, an allocation of maximal Σ Â, so
its best Ŝ is the best over all allocations. With the roofline Ĉ (which also depends on how the
M nodes are spread, through the attention pairs Σ N_i·(c_i + N_i)) the chain is the
surrogate-optimal allocation for each M, and the controller picks the best M along it.

The chain is grown lazily: :func:`bastion.bestfirst.best_first_forest` grows the B best-first
trees together with one heap over every request's frontier (key −ρ, then request index, then
the single-tree key), which adds nodes exactly in the merged order, up to a total; while the
stop rule needs more of the chain, it is regrown 2× longer (up to 8× when the priced Ĉ shows
that auto's bound needs a much longer chain). The answer equals a node-by-node scan; the chunks
only save work.

What this module does not do: price passes (a :class:`JointCostModel` such as
:class:`bastion.cost.costmodel.RooflineCostModel` does), decide which requests share a pass, or
weigh requests unequally (every committed token counts the same).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, TreeBatch
from bastion.bestfirst import best_first_forest
from bastion.budget import ControllerMode, Rule, first_decrease
from bastion.cost.jointcurve import joint_pricing
from bastion.errors import BudgetError, CostModelError
from bastion.fastinit import trusted_init
from bastion.guard import array, each, public
from bastion.interfaces import CostCurve, CostModel, RequestLoad, StepLoad
from bastion.tree import DraftMarginals, DraftTree

try:
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # no C compiler at install time: the forest's Python heap instead
    _compiled = None

__all__ = [
    "JointCostModel",
    "JointCurve",
    "JointDiagnostics",
    "choose_joint",
    "choose_joint_batch",
    "forest_batch",
    "joint_curve_from_cost_model",
    "merge_order",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
JointCurve = Callable[[IntArray], CostCurve]  # grow → Ĉ along it (len(grow) + 1 entries)
_MODES = ("first-decrease", "exhaustive", "auto")


@runtime_checkable
class JointCostModel(Protocol):
    """Prices the batched pass along a growing joint allocation."""

    def joint_cost_curve(self, context_lens: IntArray, grow: IntArray) -> CostCurve:
        """Ĉ of the whole batch as nodes are added in the order ``grow``.

        ``context_lens[i]`` is request i's KV length; ``grow[j]`` the request that receives the
        j-th node added beyond the B roots. ``verify_s[m]`` (length ``len(grow) + 1``) is the
        batch's verification pass with every root plus the first m added nodes; ``draft_s`` the
        drafter's pass over the batch; ``ar_step_s`` one target-only step of the batch (B
        tokens, unmasked).
        """
        ...


@dataclass(frozen=True, eq=False)
class JointDiagnostics:
    """Why the controller chose its allocation: the chain's curves, up to where it stopped.

    The arrays are indexed by m = M − B, the number of nodes added beyond the B roots: entry m
    is the first m nodes of the merged order (total size M = B + m).
    """

    tree_sizes: tuple[int, ...]  # the chosen N_i
    total_size: int  # M = Σ N_i
    mode: Rule  # the rule applied ("bounded" is auto's pruned exhaustive scan)
    a_hat_total: FloatArray  # Σ_i Â_i along the chain
    c_hat: FloatArray  # Ĉ(M) in seconds
    s_hat: FloatArray  # Ŝ(M)
    ar_step_s: float  # L_AR of the batch
    exhausted: bool  # every request's lattice ran out of ρ > 0 nodes before N_max
    capped: bool  # some chosen N_i is N_max itself

    @property
    def batch_size(self) -> int:
        return len(self.tree_sizes)

    @property
    def predicted_speedup(self) -> float:
        return float(self.s_hat[self.total_size - self.batch_size])


_joint_diagnostics = trusted_init(JointDiagnostics)  # every compiled joint step's
_kernel_trees = trusted_init(TreeBatch)  # a compiled joint step's or forest's trees (its buffers)


@public(scores=each(array(1, lo=0.0, nonempty=True)))
def merge_order(scores: Sequence[FloatArray]) -> tuple[IntArray, FloatArray]:
    """The joint best-first order of B requests' added nodes (the definition; the controller
    grows it directly with :func:`bastion.bestfirst.best_first_forest`, which tests check equal).

    ``scores[i]`` is request i's best-first ρ array, root first (ρ non-increasing). Returns
    (request index, ρ) of every non-root node, sorted by ρ descending, ties by request index,
    each request's own order kept: the stable sort of the concatenation.
    """
    if len(scores) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    scores = [np.asarray(s, dtype=np.float64) for s in scores]
    sizes = np.fromiter((s.shape[0] for s in scores), dtype=np.int64, count=len(scores))
    if np.any(sizes < 1):
        raise BudgetError("every request's best-first scores start with its root")
    rho = np.concatenate([s[1:] for s in scores])
    req = np.repeat(np.arange(sizes.shape[0], dtype=np.int64), sizes - 1)
    order = np.argsort(-rho, kind="stable")  # B sorted runs: timsort merges them
    return req[order], rho[order]


def _check_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BudgetError(f"{name} must be an integer ≥ 1; got {value!r}")
    return int(value)


def _chain_costs(cc: CostCurve, m: int) -> FloatArray:
    """Ĉ for m = 0 … ``m`` added nodes, checked finite and positive (CostModelError if not)."""
    if not isinstance(cc, CostCurve):
        raise CostModelError(
            f"a joint cost curve must be a CostCurve pricing 0 … {m} added nodes; got {cc!r:.80}"
        )
    verify = np.asarray(cc.verify_s, dtype=np.float64)
    if verify.ndim != 1 or verify.shape[0] < m + 1:
        raise CostModelError(
            f"a joint cost curve must price 0 … {m} added nodes ({m + 1} entries); "
            f"got shape {verify.shape}"
        )
    for name in ("draft_s", "prep_s", "ar_step_s", "growth_s"):
        value = getattr(cc, name)
        if not np.isfinite(value) or value < 0 or (name == "ar_step_s" and value <= 0):
            raise CostModelError(f"cost model returned {name} = {value!r}; need finite and > 0")
    total = cc.draft_s + cc.prep_s + verify[: m + 1]
    if not (np.all(np.isfinite(total)) and np.all(total > 0.0)):
        j = int(np.flatnonzero(~np.isfinite(total) | (total <= 0.0))[0])
        raise CostModelError(
            f"cost model returned Ĉ = {total[j]!r} with {j} added nodes; costs must be finite "
            "and > 0"
        )
    return total


def _lattice_mass(probs: FloatArray) -> FloatArray:
    """Σ ρ over every node of the lattice of ``probs`` ([..., D, K]), root included.

    The nodes at depth d have ρ summing to Π_{k≤d} (Σ_j p[k, j]), so this is the Â of the
    whole lattice: never above depth + 1, and tighter when the top-K rows miss mass. The small
    relative slack covers rounding.
    """
    rows = np.cumprod(probs.sum(axis=-1), axis=-1)
    return np.asarray((1.0 + rows.sum(axis=-1)) * (1.0 + 1e-9), dtype=np.float64)


def _floor_bound(
    floor: FloatArray,
    extra: float,
    a_end: float,
    c_end: float,
    a_far: float,
    rate: float,
    m: int,
    most: int,
) -> float:
    """The largest Â/Ĉ any chain longer than ``m`` added nodes can reach, by a curve's
    ``floor_s``: at j > m added nodes Â ≤ min(A + (j − m)·ρ, A_far) (gains never grow along
    the merged order) and Ĉ ≥ max(Ĉ(m), ``extra`` + floor[j]) (Ĉ never decreases, as the
    first bound assumes); beyond the floor's last entry, A_far over its last entry."""
    last = floor.shape[0] - 1
    high = min(last, most)
    best = 0.0
    if high > m:
        j = np.arange(m + 1, high + 1, dtype=np.int64)
        a_up = np.minimum(a_end + (j - m) * rate, a_far)
        best = float((a_up / np.maximum(c_end, extra + floor[m + 1 : high + 1])).max())
    if most > last:
        best = max(best, a_far / max(c_end, extra + float(floor[last])))
    return best


GROWTH_MIN = 1.25  # the least a bounded round regrows the chain by (see _growth)


def _growth(c_hat: FloatArray, c_needed: float) -> float:
    """How much to grow the chain so that it reaches Ĉ = ``c_needed``: a speed heuristic (the
    trees do not depend on where a round stops). Ĉ extrapolated linearly from the chain's last
    half; at least :data:`GROWTH_MIN` (a round has a fixed cost), at most 8 — a fraction: a
    whole factor ≥ 2 overshot the ≈ 2× of the chosen total the proof needs."""
    v = c_hat.shape[0] - 1
    if v < 2:
        return 2.0
    slope = (float(c_hat[-1]) - float(c_hat[v // 2])) / (v - v // 2)
    if slope <= 0.0:
        return 8.0
    target = v + (c_needed - float(c_hat[-1])) / slope
    return float(min(8.0, max(GROWTH_MIN, target / v)))


def _regrown(total: int, growth: float, b: int, most: int) -> int:
    """The next round's total: ``growth`` times this one's, rounded up, at least B more, at
    most ``most`` (the compiled loops compute the same doubles)."""
    return min(max(math.ceil(growth * total), total + b), most)


@public(error=BudgetError)
def choose_joint(
    marginals: Sequence[DraftMarginals] | BatchMarginals,
    curve: JointCurve,
    n_max: int,
    mode: ControllerMode = "auto",
    initial_budget: int = 64,
    root_tokens: Sequence[int] | None = None,
) -> tuple[list[DraftTree], JointDiagnostics]:
    """Size the B trees of one batched step together, where the batch's Ŝ(M) peaks.

    ``curve(grow)`` prices the batch along a merged order (see :class:`JointCostModel`;
    :func:`joint_curve_from_cost_model` makes one from a cost model). ``n_max`` caps each tree;
    ``initial_budget`` is the per-request size of the first chunk. Returns the B trees (each a
    best-first prefix of its request) and the diagnostics. Modes as in
    :func:`bastion.budget.choose_tree`: ``first-decrease`` (optimal for a convex Ĉ along the
    chain), ``exhaustive``, ``auto`` (the exhaustive argmax, pruned; exact when Ĉ is
    non-decreasing along the chain). :func:`choose_joint_batch` is the same on a
    :class:`BatchMarginals`, returning a :class:`TreeBatch`.
    """
    if isinstance(marginals, BatchMarginals):
        batch = marginals
    else:
        rows = list(marginals)
        if not rows:
            raise BudgetError("a joint budget needs at least one request")
        batch = BatchMarginals.from_rows(rows)
    trees, diag = choose_joint_batch(batch, curve, n_max, mode, initial_budget, root_tokens)
    return trees.trees(), diag


@public(error=BudgetError)
def choose_joint_batch(
    marginals: BatchMarginals,
    curve: JointCurve,
    n_max: int,
    mode: ControllerMode = "auto",
    initial_budget: int = 64,
    root_tokens: npt.ArrayLike | None = None,
) -> tuple[TreeBatch, JointDiagnostics]:
    """:func:`choose_joint` on a batch's stacked marginals; the trees as one :class:`TreeBatch`.

    The chain is :func:`bastion.bestfirst.best_first_forest`: the B best-first trees grown
    together in merged order (one heap over every request's frontier), so every node it returns
    is final; while the stop rule needs more, the chain is regrown longer (1.25–8×).

    A curve's ``growth_s`` (δ ≥ 0) is a guaranteed lower bound on how much Ĉ grows per node
    added beyond its last entry; auto uses it to bound Ĉ beyond the priced chain,
    Ĉ(M + k) ≥ Ĉ(M) + k·δ, which prunes far earlier. δ = 0 assumes only that Ĉ never
    decreases.
    """
    probs = marginals.probs
    b = probs.shape[0]
    if b == 0:
        raise BudgetError("a joint budget needs at least one request")
    n_max = _check_int(n_max, "n_max")
    if mode not in _MODES:
        raise BudgetError(f"unknown controller mode {mode!r}; known: {', '.join(_MODES)}")
    initial = _check_int(initial_budget, "initial_budget")
    roots = np.full(b, -1, np.int64) if root_tokens is None else np.asarray(root_tokens)
    if roots.shape != (b,) or roots.dtype.kind not in "iu":
        raise BudgetError(f"root_tokens must be {b} integers, one per request; got {root_tokens!r}")
    rule: Rule = "bounded" if mode == "auto" else mode
    mass = _lattice_mass(probs)
    most = b * (n_max - 1)  # nodes that can be added at all
    total = most if rule == "exhaustive" else min(b * (min(initial, n_max) - 1), most)

    while True:
        growth = 2.0
        parents, depths, ranks, scores, offsets, order, rho, more = best_first_forest(
            probs, n_max, total
        )
        m = order.shape[0]
        cc = curve(order)
        c_hat = _chain_costs(cc, m)
        a_hat = np.empty(m + 1)
        a_hat[0] = b
        a_hat[1:] = rho
        np.cumsum(a_hat, out=a_hat)  # the sums in the order choose_tree adds them
        s_hat = a_hat * cc.ar_step_s / c_hat
        done = not more
        if rule == "first-decrease":
            stop = first_decrease(s_hat)
            if stop is not None or done:
                chosen = stop - 1 if stop is not None else m
                break
        else:
            chosen = int(np.argmax(s_hat))
            if done:
                break
            # No longer chain can beat Ŝ(chosen) if even the most optimistic Σ Â cannot: each
            # request j still gains at most min((N_max − n_j)·ρ_last, its unbuilt lattice
            # mass), ρ_last the chain's last gain (gains never grow along the merged order);
            # and Ĉ of any longer chain ≥ Ĉ at its end (Ĉ non-decreasing; checked on the
            # priced range, else keep scanning).
            if m > 0 and bool(np.all(c_hat[1:] >= c_hat[:-1])):
                sizes = np.diff(offsets)
                built = np.add.reduceat(scores, offsets[:-1])
                unseen = np.minimum((n_max - sizes) * rho[-1], np.maximum(mass - built, 0.0))
                a_end, c_end = float(a_hat[-1]), float(c_hat[-1])
                a_far = (a_end + float(unseen.sum())) * (1.0 + 1e-12)
                s_best = float(s_hat[chosen])
                c_needed = a_far * cc.ar_step_s / s_best
                if c_needed <= c_end:
                    break
                if cc.growth_s > 0.0:  # Ŝ(M + k) ≤ L·min(A + kρ, A_far) / (C + kδ), k ≥ 1
                    rate, step = float(rho[-1]) * (1.0 + 1e-12), float(cc.growth_s)
                    k_star = max(1.0, (a_far - a_end) / rate) if rate > 0 else 1.0
                    near = (a_end + rate) / (c_end + step)
                    far = min(a_end + k_star * rate, a_far) / (c_end + k_star * step)
                    if max(near, far) * cc.ar_step_s <= s_best:
                        break
                if cc.floor_s is not None:
                    rate = float(rho[-1]) * (1.0 + 1e-12)
                    extra = float(cc.draft_s + cc.prep_s)
                    ahead = _floor_bound(cc.floor_s, extra, a_end, c_end, a_far, rate, m, most)
                    if ahead * cc.ar_step_s <= s_best:
                        break
                growth = _growth(c_hat, c_needed)
        total = _regrown(total, growth, b, most)

    alloc = 1 + np.bincount(order[:chosen], minlength=b)
    sizes = np.diff(offsets)
    diag = JointDiagnostics(
        tree_sizes=tuple(alloc.tolist()),
        total_size=b + chosen,
        mode=rule,
        a_hat_total=a_hat,
        c_hat=c_hat,
        s_hat=s_hat,
        ar_step_s=float(cc.ar_step_s),
        exhausted=not more and bool(np.all(sizes < n_max)),
        capped=bool(np.any(alloc == n_max)),
    )
    request = np.repeat(np.arange(b), sizes)
    keep = np.arange(offsets[-1]) - offsets[request] < alloc[request]  # each tree's prefix
    trees = _tree_batch(
        marginals, request[keep], parents[keep], depths[keep], ranks[keep], scores[keep], alloc
    )
    trees.tokens[trees.offsets[:-1]] = roots
    return trees, diag


def choose_joint_priced(
    marginals: BatchMarginals,
    cost_model: JointCostModel,
    contexts: IntArray,
    n_max: int,
    mode: ControllerMode = "auto",
    initial_budget: int = 64,
) -> tuple[TreeBatch, JointDiagnostics]:
    """``choose_joint_batch(marginals, lambda grow: cost_model.joint_cost_curve(contexts,
    grow), n_max, mode, initial_budget)``: in one compiled call (``paper()``,
    ``_bestfirst_paper.c``, which prices the curve itself) where the kernel applies — mode
    auto, a calibrated roofline of a dense target (:func:`bastion.cost.jointcurve.joint_pricing`)
    — with the same answer, else as written."""
    fast = None
    if mode == "auto" and getattr(_compiled, "paper", None) is not None:
        fast = _choose_paper_compiled(marginals, cost_model, contexts, n_max, initial_budget)
    if fast is not None:
        return fast
    return choose_joint_batch(
        marginals, lambda grow: cost_model.joint_cost_curve(contexts, grow), n_max, mode,
        initial_budget,
    )  # fmt: skip


def _choose_paper_compiled(
    marginals: BatchMarginals,
    cost_model: object,
    contexts: IntArray,
    n_max: int,
    initial_budget: int,
) -> tuple[TreeBatch, JointDiagnostics] | None:
    """:func:`choose_joint_priced`'s compiled call, or None where it does not answer."""
    ctx = np.asarray(contexts)
    probs = marginals.probs
    if ctx.ndim != 1 or ctx.dtype.kind not in "iu" or probs.ndim != 3 or not probs.size:
        return None
    b, depth, k = probs.shape
    n_max = _check_int(n_max, "n_max")
    initial = _check_int(initial_budget, "initial_budget")
    priced = joint_pricing(cost_model, b) if ctx.shape == (b,) else None
    if priced is None:
        return None
    price, bucket, draft_at0, draft_slope, draft_launch = priced
    most = b * (n_max - 1)
    out = _compiled.paper(
        np.ascontiguousarray(probs, np.float64),
        np.ascontiguousarray(marginals.token_ids, np.int64),
        depth,
        k,
        n_max,
        min(b * (min(initial, n_max) - 1), most),
        most,
        b"",  # the lattice masses: computed by the kernel
        np.ascontiguousarray(ctx, np.int64),  # (a context < 0: status -3, the Python loop)
        price,
        bucket,
        draft_at0,
        draft_slope,
        draft_launch,
    )
    return joint_result(b, n_max, out, out[7]) if out[0] == 0 else None


def joint_result(
    b: int, n_max: int, out: tuple[Any, ...], ar: float
) -> tuple[TreeBatch, JointDiagnostics]:
    """A compiled joint budget's answer (``out``: joint()'s or paper()'s, status 0) as
    :func:`choose_joint_batch`'s: the trees and the diagnostics of the bounded rule, views of
    its two buffers (int64 offsets, parents, tokens, depths, ranks; float64 scores, then Â, Ĉ
    and Ŝ of the m + 1 passes priced). Internal: shared by the joint kernels' callers."""
    chosen, exhausted, m = out[1], out[3], out[6]
    n, a = b + chosen, m + 1
    iv, fv = np.frombuffer(out[4], np.int64), np.frombuffer(out[5], np.float64)
    t, c = iv[b + 1 :], fv[n:]  # the nodes' int64 arrays, the curves
    trees = _kernel_trees(iv[: b + 1], t[:n], t[n : 2 * n], t[2 * n : 3 * n], fv[:n], t[3 * n :])
    sizes = tuple((iv[1 : b + 1] - iv[:b]).tolist())  # (TreeBatch.sizes of its offsets)
    capped = n_max in sizes
    diag = _joint_diagnostics(
        sizes, n, "bounded", c[:a], c[a : 2 * a], c[2 * a :], float(ar), bool(exhausted), capped
    )
    return trees, diag


@functools.lru_cache(maxsize=64)
def _caps(b: int, n_max: int) -> IntArray:
    """[B] the cap of every request's tree (read-only, one array per batch size)."""
    caps = np.full(b, n_max, np.int64)
    caps.flags.writeable = False
    return caps


@public
def forest_batch(marginals: BatchMarginals, n_max: int, total: int) -> TreeBatch:
    """The B best-first trees of a batch grown together in merged order to ``total`` nodes,
    roots included (fewer where the lattices run out), at most ``n_max`` per request — the
    allocation the joint budget makes for that total; root tokens −1."""
    return forest_and_order(marginals, n_max, total)[0]


def forest_and_order(marginals: BatchMarginals, n_max: int, total: int) -> tuple[TreeBatch, bytes]:
    """:func:`forest_batch` and, compiled, its merged order (int64 bytes: the request of each
    added node in turn; learning the step then spares its merge) — else ``b""``. Internal."""
    b, depth, k = marginals.probs.shape
    if _compiled is not None:  # the hot path (a standing joint decision): tokens looked up there
        out = _compiled.forest(
            np.ascontiguousarray(marginals.probs, np.float64),
            depth,
            k,
            _caps(b, n_max),
            max(total - b, 0),
            np.ascontiguousarray(marginals.token_ids, np.int64),
        )
        frombuffer, i64 = np.frombuffer, np.int64  # (every step a joint decision stands)
        trees = _kernel_trees(
            frombuffer(out[4], i64),  # offsets
            frombuffer(out[0], i64),  # parents
            frombuffer(out[8], i64),  # tokens
            frombuffer(out[1], i64),  # depths
            frombuffer(out[3], np.float64),  # scores
            frombuffer(out[2], i64),  # ranks
        )
        return trees, out[5]
    parents, depths, ranks, scores, offsets, *_ = best_first_forest(
        marginals.probs, n_max, max(total - b, 0)
    )
    sizes = np.diff(offsets)
    request = np.repeat(np.arange(b), sizes)
    trees = _tree_batch(marginals, request, parents, depths, ranks, scores, sizes)
    trees.tokens[trees.offsets[:-1]] = -1
    return trees, b""


def _tree_batch(
    marginals: BatchMarginals,
    request: npt.NDArray[np.int64],
    parents: npt.NDArray[np.int64],
    depths: npt.NDArray[np.int64],
    ranks: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    sizes: npt.NDArray[np.int64],
) -> TreeBatch:
    """Forest arrays (request-major, each tree in best-first order) as a TreeBatch, every
    node's token looked up in its request's marginals (the roots' left for the caller)."""
    tokens = marginals.token_ids[request, np.maximum(depths - 1, 0), np.maximum(ranks, 0)]
    starts = np.zeros(sizes.shape[0] + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    return TreeBatch(starts, parents, tokens, depths, scores, ranks)


@public(error=BudgetError, context_lens=array(1, lo=0, nonempty=True, whole=True))
def joint_curve_from_cost_model(
    cost_model: JointCostModel | CostModel, context_lens: npt.ArrayLike
) -> JointCurve:
    """A ``curve`` for :func:`choose_joint` from a cost model and the requests' KV lengths.

    A :class:`JointCostModel` prices the chain in one vectorised call. Any other
    :class:`bastion.interfaces.CostModel` is the fallback: each prefix of the chain is priced as
    an explicit batch (one ``step_cost`` per entry, so O(len(grow)·B) — correct but slow).
    """
    ctx = np.asarray(context_lens)
    if ctx.ndim != 1 or ctx.size == 0 or ctx.dtype.kind not in "iu" or np.any(ctx < 0):
        raise BudgetError(
            f"context_lens must be a non-empty 1-D array of integers ≥ 0; got {context_lens!r}"
        )
    ctx = ctx.astype(np.int64)
    if isinstance(cost_model, JointCostModel):
        joint = cost_model

        def priced(grow: IntArray) -> CostCurve:
            return joint.joint_cost_curve(ctx, np.asarray(grow, dtype=np.int64))

        return priced
    if isinstance(cost_model, CostModel):
        return _step_cost_curve(cost_model, ctx)
    raise CostModelError(
        f"{type(cost_model).__name__} has neither joint_cost_curve nor the CostModel methods"
    )


def _step_cost_curve(cost_model: CostModel, ctx: IntArray) -> JointCurve:
    contexts = [int(c) for c in ctx]

    def load(sizes: Sequence[int]) -> StepLoad:
        others = tuple(RequestLoad(s, c) for s, c in zip(sizes[1:], contexts[1:], strict=True))
        return StepLoad(contexts[0], others)

    def priced(grow: IntArray) -> CostCurve:
        g = np.asarray(grow, dtype=np.int64)
        if g.ndim != 1 or (g.size and (g.min() < 0 or g.max() >= ctx.size)):
            raise BudgetError(f"grow must hold request indices in [0, {ctx.size})")
        sizes = [1] * ctx.size
        base = cost_model.cost_curve(1, load(sizes))  # the B-token AR step, T_draft, T_aux
        verify = [cost_model.step_cost(1, load(sizes)).verify_s]
        for i in g.tolist():
            sizes[i] += 1
            verify.append(cost_model.step_cost(sizes[0], load(sizes)).verify_s)
        return CostCurve(
            draft_s=base.draft_s,
            prep_s=base.prep_s,
            verify_s=np.array(verify, dtype=np.float64),
            ar_step_s=base.ar_step_s,
        )

    return priced
