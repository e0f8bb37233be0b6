"""Best-first prefix-tree construction on raw arrays (paper §3.3, Prop. 3.3).

The candidate lattice has one node per rank sequence (r_1, …, r_d), d ≤ D, r_k < K; its score is
ρ = Π_k p[k, r_k] (the root has ρ = 1). Because every p ≤ 1, ρ never increases along a path, so
the best-first tree of size N is simply the N nodes of smallest *key*

    key(node) = (−ρ, depth, position of the parent in the order, rank),

which is a total order in which every parent precedes its children: every prefix of the order is
prefix-closed, and T_1 ⊂ T_2 ⊂ … are nested. Nodes with ρ = 0 are never added.

The construction is the lazy heap of the reference implementations — pop a node, push its next
sibling and its first child — which pops nodes exactly in key order, O(N log N):

- :func:`best_first_heap` is that heap in Python: the reference, the fallback, and the
  benchmark baseline.
- :func:`best_first` / :func:`best_first_many` run the same heap in the compiled kernel
  ``bastion._bestfirst`` (built from ``_bestfirst.c`` at install time when a C compiler is
  present), one request or the B requests of a serving step per call. Tests check node-for-node
  identity with the reference. Vectorised numpy builders (one pass per depth) were tried and
  measured slower than the Python heap at every benchmarked size: per-depth numpy overhead
  dominates trees of at most a few thousand nodes.

What this module does not do: validation (see :class:`bastion.tree.DraftMarginals`) or token
ids — it returns ranks, and :mod:`bastion.tree` maps them to tokens.

Every builder returns ``(parents, depths, ranks, scores)``: int64/int64/int64/float64 arrays in
expansion order, node 0 the root (parent −1, depth 0, rank −1, score 1).
"""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np
import numpy.typing as npt

from bastion.errors import BudgetError, MarginalsError
from bastion.guard import array, public

__all__ = [
    "COMPILED",
    "MAX_TREE_SIZE",
    "TreeArrays",
    "best_first",
    "best_first_heap",
    "best_first_many",
    "buildable_nodes",
]

try:
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # no C compiler at install time: the Python heap gives identical trees
    _compiled = None

COMPILED: bool = _compiled is not None

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
TreeArrays = tuple[IntArray, IntArray, IntArray, FloatArray]  # parents, depths, ranks, scores
# dtypes as objects: a numpy call given one skips converting the scalar type (timeit, this
# project's dev machine: ascontiguousarray 85 -> 61 ns, frombuffer 221 -> 174 ns, 385 with dtype=)
_I8, _F8, _B1 = np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.bool_)


MAX_TREE_SIZE = 1 << 20
"""The largest tree any builder makes (1,048,576 nodes, root included): a budget is first cut to
the nodes the lattice can give (:func:`buildable_nodes`), and a budget still above this limit is
refused before anything is allocated. (The paper's largest tree has 1025 nodes.)"""


def _probs(probs: npt.ArrayLike, ndim: int | None) -> FloatArray:
    """``probs`` as float64 with ``ndim`` dimensions, or a MarginalsError. The builders are
    guarded here, in the body, not by ``@public``: they run several times per decode step, and
    a checked array costs one ``np.asarray``."""
    try:
        p = np.asarray(probs, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MarginalsError(f"probs must be an array of probabilities: {exc}") from None
    if ndim is not None and p.ndim != ndim:
        raise MarginalsError(f"probs must be {ndim}-D; got shape {p.shape}")
    return p


_SMALL_BUDGET = 1 << 14  # budgets up to this are passed on as they are (cheap to allocate)


def buildable_nodes(probs: npt.ArrayLike, limit: int = MAX_TREE_SIZE + 1) -> npt.NDArray[np.int64]:
    """Nodes with ρ > 0 in the lattice of ``probs`` ([D, K] → shape (), [B, D, K] → [B]), root
    included, counted up to ``limit`` (a bigger lattice reads as ``limit``): what a budget can
    actually buy. Rows are sorted descending, so a row's positive entries come first and every
    path through them has ρ > 0 unless some factor underflows (then fewer are built)."""
    p = _probs(probs, None)
    if isinstance(limit, bool) or not isinstance(limit, int | np.integer) or not 1 <= limit < 2**62:
        raise BudgetError(f"limit must be an integer in [1, 2**62); got {limit!r:.80}")
    positive = np.sum(p > 0.0, axis=-1).astype(np.float64)  # [..., D]
    with np.errstate(divide="ignore"):  # log(0) = -inf: no node below an empty row
        log_level = np.cumsum(np.log(positive), axis=-1)  # nodes at depth 1 … D, in log space
    level = np.exp(np.minimum(log_level, math.log(limit)))  # finite, never NaN
    total = np.minimum(1.0 + np.sum(level, axis=-1), float(limit))
    out: npt.NDArray[np.int64] = np.rint(total).astype(np.int64)
    return out


def _as_tree_arrays(
    parents: list[int] | IntArray,
    depths: list[int] | IntArray,
    ranks: list[int] | IntArray,
    scores: list[float] | FloatArray,
) -> TreeArrays:
    return (
        np.asarray(parents, dtype=np.int64),
        np.asarray(depths, dtype=np.int64),
        np.asarray(ranks, dtype=np.int64),
        np.asarray(scores, dtype=np.float64),
    )


@public(probs=array(2, 0.0, 1.0))
def best_first_heap(probs: FloatArray, budget: int) -> TreeArrays:
    """Reference lazy best-first on a binary heap (how DDTree-style implementations do it)."""
    probs = np.asarray(probs, dtype=np.float64)
    depth_max, k = probs.shape
    p = probs.tolist()
    parents, depths, ranks, scores = [-1], [0], [-1], [1.0]
    # heap entries are the key itself: (-score, depth, parent position, rank)
    heap: list[tuple[float, int, int, int]] = []
    if depth_max and k and p[0][0] > 0.0:
        heap.append((-p[0][0], 1, 0, 0))
    while heap and len(scores) < budget:
        neg, d, par, r = heapq.heappop(heap)
        pos = len(scores)
        parents.append(par)
        depths.append(d)
        ranks.append(r)
        scores.append(-neg)
        if r + 1 < k:  # next sibling
            s = scores[par] * p[d - 1][r + 1]
            if s > 0.0:
                heapq.heappush(heap, (-s, d, par, r + 1))
        if d < depth_max:  # first child
            s = -neg * p[d][0]
            if s > 0.0:
                heapq.heappush(heap, (-s, d + 1, pos, 0))
    return _as_tree_arrays(parents, depths, ranks, scores)


def _clamped(probs: FloatArray, budgets: npt.ArrayLike) -> IntArray:
    """Budgets [B] (≥ 1) cut to what each request's lattice can build; refuses more than
    :data:`MAX_TREE_SIZE` before allocating."""
    b = probs.shape[0]
    try:
        given = np.asarray(budgets)
        if given.dtype != np.int64:  # the engine's own budgets are int64 already
            fits = given.dtype.kind == "i" or (
                given.dtype.kind == "u" and not (given.size and int(given.max()) >> 63)
            )
            if not fits:
                raise TypeError(f"dtype {given.dtype} is not int64 integers")
            given = given.astype(np.int64)
        bud = np.broadcast_to(given, (b,))
    except (TypeError, ValueError) as exc:
        raise BudgetError(
            f"budgets must be an integer ≥ 1 or one per request ({b}); got {budgets!r:.80} ({exc})"
        ) from None
    if b and int(bud.min()) < 1:
        raise BudgetError(f"every budget must be ≥ 1 (the root counts); got {int(bud.min())}")
    if not b or int(bud.max()) <= _SMALL_BUDGET:  # the common case: nothing big to allocate
        return np.ascontiguousarray(bud)
    bud = np.minimum(bud, buildable_nodes(probs))
    if int(bud.max()) > MAX_TREE_SIZE:
        raise BudgetError(
            f"a tree of more than MAX_TREE_SIZE = {MAX_TREE_SIZE} nodes was asked for (the "
            "lattice has that many nodes with ρ > 0); give a smaller budget"
        )
    return np.ascontiguousarray(bud)


def best_first(probs: FloatArray, budget: int) -> TreeArrays:
    """Best-first tree of size ``budget`` (fewer if the lattice runs out of ρ > 0 nodes)."""
    p = _probs(probs, 2)
    small = isinstance(budget, int | np.integer) and not isinstance(budget, bool)
    if _compiled is not None and small and 1 <= budget <= _SMALL_BUDGET:
        depth, k = p.shape  # the batch-1 controller's hot path: straight to the kernel
        p = np.ascontiguousarray(p)
        par, dep, rnk, sco, _ = _compiled.build(p, depth, k, np.array([budget], np.int64))
        return (
            np.frombuffer(par, _I8),
            np.frombuffer(dep, _I8),
            np.frombuffer(rnk, _I8),
            np.frombuffer(sco, _F8),
        )
    return best_first_many(p[None], budget)[0]


def best_first_many(probs: FloatArray, budgets: npt.ArrayLike) -> list[TreeArrays]:
    """Best-first trees for B requests: ``probs`` is [B, D, K], ``budgets`` an int or [B].

    With the compiled kernel all B trees are built in one call without the interpreter in the
    loop; without it, this is B calls of :func:`best_first_heap`. The output is identical.
    """
    probs = _probs(probs, 3)
    b, depth, k = probs.shape
    bud = _clamped(probs, budgets)
    if _compiled is None:
        return [best_first_heap(probs[j], int(bud[j])) for j in range(b)]
    p = np.ascontiguousarray(probs, _F8)
    par, dep, rnk, sco, off = _compiled.build(p, depth, k, bud)
    parents = np.frombuffer(par, _I8)
    depths = np.frombuffer(dep, _I8)
    ranks = np.frombuffer(rnk, _I8)
    scores = np.frombuffer(sco, _F8)
    offsets = np.frombuffer(off, _I8).tolist()
    return [
        (parents[a:e], depths[a:e], ranks[a:e], scores[a:e]) for a, e in itertools.pairwise(offsets)
    ]


# ---------------------------------------------------------------------------------------------
# A forest: the B trees of one serving step grown together (the joint budget's merged order)
# ---------------------------------------------------------------------------------------------

ForestArrays = tuple[IntArray, IntArray, IntArray, FloatArray, IntArray, IntArray, FloatArray, bool]
"""(parents, depths, ranks, scores, offsets, order, order_scores, more): the B trees concatenated
request by request (each in its own best-first order, root first; ``offsets`` [B + 1]), the
request of every added node in the order it was added and its ρ, and whether some request could
still grow."""


def best_first_forest_heap(probs: FloatArray, caps: npt.ArrayLike, total: int) -> ForestArrays:
    """Reference: one lazy heap over the frontiers of B requests, key (−ρ, request, depth,
    parent position, rank) — the merged best-first order of :mod:`bastion.joint`."""
    b, depth_max, k = probs.shape
    cap = np.broadcast_to(np.asarray(caps, dtype=np.int64), (b,)).tolist()
    p = probs.tolist()
    trees: list[tuple[list[int], list[int], list[int], list[float]]] = [
        ([-1], [0], [-1], [1.0]) for _ in range(b)
    ]
    heap: list[tuple[float, int, int, int, int, float]] = []
    for r in range(b):
        if depth_max and k and cap[r] > 1 and p[r][0][0] > 0.0:
            heap.append((-p[r][0][0], r, 1, 0, 0, 1.0))
    heapq.heapify(heap)
    order: list[int] = []
    order_scores: list[float] = []
    while heap and len(order) < total:
        neg, r, d, par, rank, parent_score = heapq.heappop(heap)
        parents, depths, ranks, scores = trees[r]
        if len(scores) >= cap[r]:
            continue  # this request is full: its frontier is dropped
        pos = len(scores)
        parents.append(par)
        depths.append(d)
        ranks.append(rank)
        scores.append(-neg)
        order.append(r)
        order_scores.append(-neg)
        if rank + 1 < k:
            s = parent_score * p[r][d - 1][rank + 1]
            if s > 0.0:
                heapq.heappush(heap, (-s, r, d, par, rank + 1, parent_score))
        if d < depth_max:
            s = -neg * p[r][d][0]
            if s > 0.0:
                heapq.heappush(heap, (-s, r, d + 1, pos, 0, -neg))
    more = any(len(trees[e[1]][3]) < cap[e[1]] for e in heap)
    sizes = [len(t[3]) for t in trees]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    cat = [np.concatenate([np.asarray(t[f]) for t in trees]) for f in range(4)]
    return (
        cat[0].astype(np.int64),
        cat[1].astype(np.int64),
        cat[2].astype(np.int64),
        cat[3].astype(np.float64),
        offsets,
        np.asarray(order, dtype=np.int64),
        np.asarray(order_scores, dtype=np.float64),
        more,
    )


def best_first_forest(probs: FloatArray, caps: npt.ArrayLike, total: int) -> ForestArrays:
    """The B best-first trees of ``probs`` [B, D, K] grown together in merged order: at most
    ``caps[i]`` nodes for request i (root included), at most ``total`` nodes added beyond the
    roots. Compiled when the kernel is built; identical to :func:`best_first_forest_heap`."""
    b, depth, k = probs.shape
    if type(caps) is int:  # one cap for every request (the controller's n_max): no broadcast
        cap = np.full(b, caps, np.int64)
    else:
        cap = np.ascontiguousarray(np.broadcast_to(np.asarray(caps, dtype=np.int64), (b,)))
    forest = getattr(_compiled, "forest", None)
    if forest is None:
        return best_first_forest_heap(probs, cap, total)
    p = np.ascontiguousarray(probs, _F8)
    par, dep, rnk, sco, off, order, order_scores, more = forest(p, depth, k, cap, total)
    ints = (np.frombuffer(x, _I8) for x in (par, dep, rnk))
    return (
        *ints,
        np.frombuffer(sco, _F8),
        np.frombuffer(off, _I8),
        np.frombuffer(order, _I8),
        np.frombuffer(order_scores, _F8),
        bool(more),
    )  # type: ignore[return-value]


def best_first_flat(probs: FloatArray, budgets: npt.ArrayLike) -> tuple[TreeArrays, IntArray]:
    """:func:`best_first_many` concatenated: the B trees' arrays one after another, and the
    B + 1 offsets into them (the layout of :class:`bastion.batch.TreeBatch`)."""
    probs = _probs(probs, 3)
    b, depth, k = probs.shape
    bud = _clamped(probs, budgets)
    if _compiled is None:
        trees = [best_first_heap(probs[j], int(bud[j])) for j in range(b)]
        offsets = np.concatenate(([0], np.cumsum([t[0].shape[0] for t in trees])))
        flat = tuple(np.concatenate([t[f] for t in trees]) for f in range(4))
        return flat, offsets.astype(np.int64)  # type: ignore[return-value]
    p = np.ascontiguousarray(probs, _F8)
    par, dep, rnk, sco, off = _compiled.build(p, depth, k, bud)
    ints = tuple(np.frombuffer(x, _I8) for x in (par, dep, rnk))
    flat = (*ints, np.frombuffer(sco, _F8))
    return flat, np.frombuffer(off, _I8)  # type: ignore[return-value]


def accepted_paths(
    parents: IntArray, tokens: IntArray, depths: IntArray, offsets: IntArray, target: IntArray
) -> tuple[IntArray, npt.NDArray[np.bool_], IntArray, IntArray] | None:
    """The compiled acceptance walk of a batch of trees, or None without the compiled kernel.

    Returns (accepted tokens per request, on-path flag per node, every request's accepted
    tokens then its bonus token ``target[i, min(accepted, width − 1)]``, the accepted nodes'
    indices within their trees). :func:`bastion.sim.backend.accepted_counts` defines the walk
    and has its numpy form."""
    accept = getattr(_compiled, "accept", None)
    if accept is None:
        return None
    counts, on_path, committed, nodes, _ = _accept(accept, parents, tokens, depths, offsets, target)
    return (
        np.frombuffer(counts, _I8),
        np.frombuffer(on_path, _B1),
        np.frombuffer(committed, _I8),
        np.frombuffer(nodes, _I8),
    )


def verified_paths(
    parents: IntArray, tokens: IntArray, depths: IntArray, offsets: IntArray, target: IntArray
) -> tuple[IntArray, IntArray, IntArray] | None:
    """:func:`accepted_paths`' walk as a verifier reports it: (committed tokens per request —
    the accepted ones plus the bonus —, every request's accepted tokens then its bonus token,
    the accepted nodes' indices within their trees), or None without the compiled kernel."""
    accept = getattr(_compiled, "accept", None)
    if accept is None:
        return None
    _, _, committed, nodes, lengths = _accept(accept, parents, tokens, depths, offsets, target)
    frombuffer = np.frombuffer
    return (
        frombuffer(lengths, _I8),
        frombuffer(committed, _I8),
        frombuffer(nodes, _I8),
    )


def _accept(  # type: ignore[no-untyped-def]
    accept, parents, tokens, depths, offsets, target
) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """The compiled walk (see accept() in _bestfirst_learn.c) on contiguous int64 arrays."""
    t = np.ascontiguousarray(target, _I8)
    contiguous = np.ascontiguousarray
    return accept(  # type: ignore[no-any-return]
        contiguous(parents, _I8),
        contiguous(tokens, _I8),
        contiguous(depths, _I8),
        contiguous(offsets, _I8),
        t,
        t.shape[1],
    )
