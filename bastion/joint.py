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

The chain is grown lazily in chunks: each request's best-first arrays are built to a budget b;
a truncated request's next node may have ρ as large as its last computed one, so only the merged
prefix that no unseen node can precede is final; while the stop rule needs more of the chain, b
doubles (or grows up to 8×, when the priced Ĉ shows that auto's bound needs a much longer
chain). The answer equals a node-by-node scan; the chunks only save work.

What this module does not do: price passes (a :class:`JointCostModel` such as
:class:`bastion.cost.costmodel.RooflineCostModel` does), decide which requests share a pass, or
weigh requests unequally (every committed token counts the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import TreeArrays, best_first, best_first_many
from bastion.budget import ControllerMode, Rule, first_decrease
from bastion.errors import BudgetError, CostModelError
from bastion.interfaces import CostCurve, CostModel, RequestLoad, StepLoad
from bastion.tree import DraftMarginals, DraftTree, tree_from_arrays

__all__ = [
    "JointCostModel",
    "JointCurve",
    "JointDiagnostics",
    "choose_joint",
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


def merge_order(scores: Sequence[FloatArray]) -> tuple[IntArray, FloatArray]:
    """The joint best-first order of B requests' added nodes.

    ``scores[i]`` is request i's best-first ρ array, root first (ρ non-increasing). Returns
    (request index, ρ) of every non-root node, sorted by ρ descending, ties by request index,
    each request's own order kept: the stable sort of the concatenation.
    """
    if len(scores) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    merged = _merge(scores)
    return merged.req, merged.rho


@dataclass(frozen=True)
class _Merged:
    req: IntArray  # merged order: request of each added node
    rho: FloatArray  # merged order: its ρ
    sizes: IntArray  # nodes per request (roots included)
    last: FloatArray  # each request's last ρ
    built: FloatArray  # each request's Σ ρ over its built nodes (Â of its whole array)


def _merge(scores: Sequence[FloatArray]) -> _Merged:
    """:func:`merge_order`, plus what the controller needs to know of each request."""
    sizes = np.fromiter((s.shape[0] for s in scores), dtype=np.int64, count=len(scores))
    if np.any(sizes < 1):
        raise BudgetError("every request's best-first scores start with its root")
    cat = np.concatenate(scores)
    ends = np.cumsum(sizes)
    keep = np.ones(cat.shape[0], dtype=bool)
    keep[ends - sizes] = False  # the roots
    rho = cat[keep]
    req = np.repeat(np.arange(sizes.shape[0], dtype=np.int64), sizes - 1)
    order = np.argsort(-rho, kind="stable")  # B sorted runs: timsort merges them
    built = np.add.reduceat(cat, ends - sizes)
    return _Merged(req[order], rho[order], sizes, cat[ends - 1], built)


def _check_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BudgetError(f"{name} must be an integer ≥ 1; got {value!r}")
    return int(value)


def _chain_costs(cc: CostCurve, m: int) -> FloatArray:
    """Ĉ for m = 0 … ``m`` added nodes, checked finite and positive (CostModelError if not)."""
    verify = np.asarray(cc.verify_s, dtype=np.float64)
    if verify.ndim != 1 or verify.shape[0] < m + 1:
        raise CostModelError(
            f"a joint cost curve must price 0 … {m} added nodes ({m + 1} entries); "
            f"got shape {verify.shape}"
        )
    for name in ("draft_s", "prep_s", "ar_step_s"):
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


def _valid_prefix(
    req: IntArray, rho: FloatArray, last: FloatArray, truncated: npt.NDArray[np.bool_]
) -> tuple[int, float]:
    """How much of the merged order is final, and a bound on the ρ of the chain's next node.

    A truncated request j's unseen nodes have ρ ≤ last[j] and sort after its computed ones, so a
    merged node is final iff its key (−ρ, request) precedes (−τ, j*), τ = max last[j] over the
    truncated requests and j* the smallest such j attaining it.
    """
    if not truncated.any():
        return int(rho.shape[0]), 0.0
    lasts = np.where(truncated, last, -1.0)
    j_star = int(np.argmax(lasts))  # the first maximum: the smallest index attaining τ
    tau = float(lasts[j_star])
    # the merged order is sorted by that key, so the final nodes are a prefix
    valid = int(np.searchsorted(-rho, -tau, side="left"))
    valid += int(np.count_nonzero(req[valid : valid + np.count_nonzero(rho == tau)] <= j_star))
    return valid, tau


def _lattice_mass(probs: FloatArray) -> FloatArray:
    """Σ ρ over every node of the lattice of ``probs`` ([..., D, K]), root included.

    The nodes at depth d have ρ summing to Π_{k≤d} (Σ_j p[k, j]), so this is the Â of the
    whole lattice: never above depth + 1, and tighter when the top-K rows miss mass. The small
    relative slack covers rounding.
    """
    rows = np.cumprod(probs.sum(axis=-1), axis=-1)
    return np.asarray((1.0 + rows.sum(axis=-1)) * (1.0 + 1e-9), dtype=np.float64)


def _gain_bound(
    merged: _Merged,
    valid: int,
    a_valid: float,
    mass: FloatArray,
    truncated: npt.NDArray[np.bool_],
    n_max: int,
    rho_next: float,
) -> float:
    """An upper bound on Σ Â over every longer chain: Σ Â(M) + what the chain can still gain.

    The gain is bounded two ways: each further node gains ≤ ``rho_next`` (gains never grow
    along the chain), at most as many nodes as the caps leave; and per request, by the built
    nodes not yet in the final prefix plus, for a truncated request j, min((N_max − n_j)·ρ_last,
    its lattice mass not yet built).
    """
    sizes = merged.sizes
    room = float(np.sum(np.where(truncated, n_max, sizes)) - sizes.shape[0] - valid)
    pending = float(merged.built.sum()) - a_valid  # built, not in the final prefix
    unseen = np.minimum((n_max - sizes) * merged.last, np.maximum(mass - merged.built, 0.0))
    gain = min(room * rho_next, pending + float(np.sum(unseen[truncated])))
    return (a_valid + gain) * (1.0 + 1e-12)  # slack for the rounding of the sums


def _growth(c_hat: FloatArray, c_needed: float) -> int:
    """How much to grow the budgets so that the chain reaches Ĉ = ``c_needed`` (2 … 8).

    Only a speed heuristic (the stop rule decides the answer): extrapolates Ĉ linearly from
    the last half of the priced chain, since every round has a fixed cost.
    """
    v = c_hat.shape[0] - 1
    if v < 2:
        return 2
    slope = (float(c_hat[-1]) - float(c_hat[v // 2])) / (v - v // 2)
    if slope <= 0.0:
        return 8
    target = v + (c_needed - float(c_hat[-1])) / slope
    return int(min(8.0, max(2.0, np.ceil(target / v))))


def choose_joint(
    marginals: Sequence[DraftMarginals],
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
    non-decreasing along the chain).
    """
    batch = list(marginals)
    b = len(batch)
    if b == 0:
        raise BudgetError("a joint budget needs at least one request")
    n_max = _check_int(n_max, "n_max")
    if mode not in _MODES:
        raise BudgetError(f"unknown controller mode {mode!r}; known: {', '.join(_MODES)}")
    initial = _check_int(initial_budget, "initial_budget")
    roots = [-1] * b if root_tokens is None else [int(t) for t in root_tokens]
    if len(roots) != b:
        raise BudgetError(f"{len(roots)} root tokens for {b} requests")
    rule: Rule = "bounded" if mode == "auto" else mode
    shape = batch[0].probs.shape
    stacked = (
        np.array([m.probs for m in batch]) if all(m.probs.shape == shape for m in batch) else None
    )
    mass = (
        _lattice_mass(stacked)
        if stacked is not None
        else np.array([_lattice_mass(m.probs) for m in batch])
    )

    budgets = np.full(b, n_max if rule == "exhaustive" else min(initial, n_max), dtype=np.int64)
    while True:
        growth = 2
        arrays: list[TreeArrays] = (
            best_first_many(stacked, budgets)
            if stacked is not None
            else [best_first(m.probs, int(n)) for m, n in zip(batch, budgets, strict=True)]
        )
        merged = _merge([a[3] for a in arrays])
        req, rho, sizes = merged.req, merged.rho, merged.sizes
        ran_out = sizes < budgets
        truncated = ~ran_out & (budgets < n_max)
        valid, rho_next = _valid_prefix(req, rho, merged.last, truncated)
        cc = curve(req[:valid])
        c_hat = _chain_costs(cc, valid)
        a_hat = np.cumsum(np.concatenate(([float(b)], rho[:valid])))
        s_hat = a_hat * cc.ar_step_s / c_hat
        done = not truncated.any()
        if rule == "first-decrease":
            stop = first_decrease(s_hat)
            if stop is not None or done:
                chosen = stop - 1 if stop is not None else valid
                break
        else:
            chosen = int(np.argmax(s_hat))
            if done:
                break
            # No longer chain can beat Ŝ(chosen) if even the most optimistic Σ Â cannot
            # (_gain_bound), with Ĉ of any longer chain ≥ Ĉ at the end of the final prefix (Ĉ
            # non-decreasing; checked on the priced range, else keep scanning).
            if bool(np.all(c_hat[1:] >= c_hat[:-1])):
                a_far = _gain_bound(
                    merged, valid, float(a_hat[-1]), mass, truncated, n_max, rho_next
                )
                c_needed = a_far * cc.ar_step_s / float(s_hat[chosen])
                if c_needed <= c_hat[-1]:
                    break
                growth = _growth(c_hat, c_needed)
        budgets = np.where(truncated, np.minimum(growth * budgets, n_max), budgets)

    alloc = 1 + np.bincount(req[:chosen], minlength=b)
    diag = JointDiagnostics(
        tree_sizes=tuple(alloc.tolist()),
        total_size=b + chosen,
        mode=rule,
        a_hat_total=a_hat,
        c_hat=c_hat,
        s_hat=s_hat,
        ar_step_s=float(cc.ar_step_s),
        exhausted=bool(np.all(ran_out)),
        capped=bool(np.any(alloc == n_max)),
    )
    return _trees(batch, arrays, alloc, sizes, roots, stacked is not None), diag


def _trees(
    batch: list[DraftMarginals],
    arrays: list[TreeArrays],
    alloc: IntArray,
    sizes: IntArray,
    roots: list[int],
    same_shape: bool,
) -> list[DraftTree]:
    """Each request's best-first prefix of ``alloc[i]`` nodes, tokens gathered in one pass."""
    if not same_shape:
        return [
            tree_from_arrays((a[0][:n], a[1][:n], a[2][:n], a[3][:n]), m, r)
            for a, m, r, n in zip(arrays, batch, roots, alloc.tolist(), strict=True)
        ]
    ids = np.array([m.token_ids for m in batch])
    node_req = np.repeat(np.arange(len(batch)), sizes)
    depths = np.concatenate([a[1] for a in arrays])
    ranks = np.concatenate([a[2] for a in arrays])
    tokens = ids[node_req, depths - 1, ranks]  # the roots' entries are overwritten below
    starts = np.cumsum(sizes) - sizes
    tokens[starts] = roots
    tokens.flags.writeable = False
    return [
        DraftTree.trusted(a[0][:n], tokens[s : s + n], a[1][:n], a[3][:n], a[2][:n])
        for a, s, n in zip(arrays, starts.tolist(), alloc.tolist(), strict=True)
    ]


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
