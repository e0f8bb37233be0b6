"""Best-first prefix-tree construction on raw arrays (paper §3.3, Prop. 3.3).

The candidate lattice has one node per rank sequence (r_1, …, r_d), d ≤ D, r_k < K; its score is
ρ = Π_k p[k, r_k] (the root has ρ = 1). Because every p ≤ 1, ρ never increases along a path, so
the best-first tree of size N is simply the N nodes of smallest *key*

    key(node) = (−ρ, depth, position of the parent in the order, rank),

which is a total order in which every parent precedes its children: every prefix of the order is
prefix-closed, and T_1 ⊂ T_2 ⊂ … are nested. Nodes with ρ = 0 are never added.

Three builders produce this same order (tests check that they agree node for node):

- :func:`best_first_heap` — the lazy heap of the reference implementations: pop a node, push its
  next sibling and its first child. Simple, O(N log N), one Python iteration per node. Kept as
  the reference and the benchmark baseline.
- :func:`best_first_levels` — vectorised, one numpy pass per depth. At depth d only the pairs
  (parent i, rank r) with (i + 1)(r + 1) ≤ N − 1 can be in the tree (all (i' ≤ i, r' ≤ r) pairs
  precede them), and nothing at or below the running (N − 1)-th best score can enter.
- :func:`best_first_batch` — the same for the B requests of one serving step in flat arrays.

What this module does not do: validation (see :class:`bastion.tree.DraftMarginals`) or token
ids — it returns ranks, and :mod:`bastion.tree` maps them to tokens.

Every builder returns ``(parents, depths, ranks, scores)``: int64/int64/int64/float64 arrays in
expansion order, node 0 the root (parent −1, depth 0, rank −1, score 1).
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

__all__ = ["TreeArrays", "best_first_batch", "best_first_heap", "best_first_levels"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
TreeArrays = tuple[IntArray, IntArray, IntArray, FloatArray]  # parents, depths, ranks, scores


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


def best_first_heap(probs: FloatArray, budget: int) -> TreeArrays:
    """Reference lazy best-first on a binary heap (how DDTree-style implementations do it)."""
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


def _hyperbolic_pairs(n_parents: int, k: int, cap: int) -> tuple[IntArray, IntArray]:
    """All (i, r) with i < n_parents, r < k and (i + 1)(r + 1) ≤ cap, in (i, r) order."""
    i = np.arange(min(n_parents, cap), dtype=np.int64)
    counts = np.minimum(k, cap // (i + 1))
    total = int(counts.sum())
    parent_idx = np.repeat(i, counts)
    starts = np.cumsum(counts) - counts
    rank = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
    return parent_idx, rank


def best_first_levels(probs: FloatArray, budget: int) -> TreeArrays:
    """Vectorised best-first: identical output to :func:`best_first_heap`."""
    depth_max, k = probs.shape
    m = budget - 1  # non-root nodes wanted
    if m <= 0 or depth_max == 0 or k == 0:
        return _as_tree_arrays([-1], [0], [-1], [1.0])

    # Per depth, the kept nodes in within-level key order (−score, parent index, rank).
    level_scores: list[FloatArray] = []
    level_parent: list[IntArray] = []
    level_rank: list[IntArray] = []
    parent_scores = np.ones(1)
    best = np.empty(0)  # the up-to-m best scores seen so far (unordered)
    theta = 0.0  # a node must score > theta to possibly enter once m nodes are known
    for d in range(depth_max):
        if parent_scores.size == 0:
            break
        pi, r = _hyperbolic_pairs(parent_scores.size, k, m)
        s = parent_scores[pi] * probs[d, r]
        keep = s > theta
        if not keep.all():
            s, pi, r = s[keep], pi[keep], r[keep]
        if s.size > m:  # only the m best of this level can enter; ties go to earlier pairs
            v = np.partition(s, s.size - m)[s.size - m]
            above = s > v
            tied = np.flatnonzero(s == v)[: m - int(above.sum())]
            sel = np.flatnonzero(above)
            sel = np.union1d(sel, tied) if tied.size else sel
            s, pi, r = s[sel], pi[sel], r[sel]
        order = np.argsort(-s, kind="stable")
        s, pi, r = s[order], pi[order], r[order]
        level_scores.append(s)
        level_parent.append(pi)
        level_rank.append(r)
        best = np.concatenate((best, s))
        if best.size >= m:
            best = np.partition(best, best.size - m)[best.size - m :]
            theta = float(best.min())
            parent_scores = s[: int(np.searchsorted(-s, -theta, side="left"))]
        else:
            parent_scores = s

    return _assemble(level_scores, level_parent, level_rank, m)


def _assemble(
    level_scores: list[FloatArray],
    level_parent: list[IntArray],
    level_rank: list[IntArray],
    m: int,
) -> TreeArrays:
    """Merge per-depth sorted levels into the global order and keep the first m nodes."""
    sizes = np.array([x.size for x in level_scores], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    scores = np.concatenate(level_scores) if level_scores else np.empty(0)
    depths = np.repeat(np.arange(1, sizes.size + 1, dtype=np.int64), sizes)
    ranks = np.concatenate(level_rank) if level_rank else np.empty(0, np.int64)
    # global id of each node's parent (−1 = root)
    parent_gid = np.concatenate(
        [np.full(sizes[0], -1, np.int64)]
        + [level_parent[d] + offsets[d - 1] for d in range(1, sizes.size)]
    )
    # Stable sort on −score over depth-major, within-level-sorted input = the full key order.
    if scores.size > m:
        v = np.partition(scores, scores.size - m)[scores.size - m]
        above = scores > v
        tied = np.flatnonzero(scores == v)[: m - int(above.sum())]
        sel = np.union1d(np.flatnonzero(above), tied)
    else:
        sel = np.arange(scores.size)
    sel = sel[np.argsort(-scores[sel], kind="stable")]
    pos = np.full(scores.size + 1, -1, dtype=np.int64)  # pos[gid + 1]; slot 0 is the root
    pos[0] = 0
    pos[sel + 1] = np.arange(1, sel.size + 1)
    parents = pos[parent_gid[sel] + 1]
    return (
        np.concatenate(([-1], parents)),
        np.concatenate(([0], depths[sel])),
        np.concatenate(([-1], ranks[sel])),
        np.concatenate(([1.0], scores[sel])),
    )


def best_first_batch(probs: FloatArray, budgets: npt.ArrayLike) -> list[TreeArrays]:
    """Best-first trees for B requests at once; ``probs`` is [B, D, K], ``budgets`` int or [B].

    Identical output, request by request, to :func:`best_first_heap`. All requests advance one
    depth per numpy pass; each keeps only pairs inside its own hyperbolic cap and above a lower
    bound of its final cut-off score (the m-th best among the chain's one-token deviations).
    """
    b, depth_max, k = probs.shape
    m = np.broadcast_to(np.asarray(budgets, dtype=np.int64) - 1, (b,)).copy()
    if b == 0:
        return []
    if depth_max == 0 or k == 0 or int(m.max()) <= 0:
        return [best_first_levels(probs[j], int(m[j]) + 1) for j in range(b)]

    # θ_lo: the m-th best of {chain prefix to d−1} × {every rank at d}; any m nodes' minimum is
    # ≤ the true m-th best score, so nodes strictly below it can never enter.
    chain = np.cumprod(np.concatenate((np.ones((b, 1)), probs[:, :-1, 0]), axis=1), axis=1)
    dev = (chain[:, :, None] * probs).reshape(b, -1)
    theta = np.zeros(b)
    ok = (m > 0) & (m <= dev.shape[1])
    if ok.any():
        dev_sorted = -np.sort(-dev[ok], axis=1)
        theta[ok] = dev_sorted[np.arange(int(ok.sum())), m[ok] - 1]

    level_scores: list[FloatArray] = []
    level_parent: list[IntArray] = []
    level_rank: list[IntArray] = []
    level_seg: list[IntArray] = []
    # current parents: flat arrays with segment ids, sorted by (segment, key)
    par_seg = np.arange(b, dtype=np.int64)[m > 0]
    par_score = np.ones(par_seg.size)
    par_idx = np.zeros(par_seg.size, dtype=np.int64)  # within-segment index of each parent
    cap_k = min(k, int(m.max()))
    for d in range(depth_max):
        if par_seg.size == 0:
            break
        # candidate (parent, rank) pairs in (segment, parent index, rank) order
        mp = m[par_seg]
        counts = np.minimum(cap_k, mp // (par_idx + 1))
        counts[par_idx >= mp] = 0
        parent_of = np.repeat(np.arange(par_seg.size, dtype=np.int64), counts)
        starts = np.cumsum(counts) - counts
        r = np.arange(parent_of.size, dtype=np.int64) - np.repeat(starts, counts)
        seg = par_seg[parent_of]
        s = par_score[parent_of] * probs[seg, d, r]
        keep = (s >= theta[seg]) & (s > 0.0)
        s, seg, r, parent_of = s[keep], seg[keep], r[keep], parent_of[keep]
        order = np.lexsort((-s, seg))  # stable: ties keep (parent index, rank) order
        s, seg, r, parent_of = s[order], seg[order], r[order], parent_of[order]
        level_scores.append(s)
        level_parent.append(par_idx[parent_of])
        level_rank.append(r)
        level_seg.append(seg)
        # within-segment index of each new node
        first = np.concatenate(([True], seg[1:] != seg[:-1])) if seg.size else seg.astype(bool)
        seg_start = np.maximum.accumulate(np.where(first, np.arange(seg.size), 0))
        par_seg, par_score, par_idx = seg, s, np.arange(seg.size) - seg_start

    results: list[TreeArrays] = []
    n_levels = len(level_scores)
    for j in range(b):
        if m[j] <= 0:
            results.append(_as_tree_arrays([-1], [0], [-1], [1.0]))
            continue
        parts = [np.searchsorted(level_seg[d], [j, j + 1]) for d in range(n_levels)]
        results.append(
            _assemble(
                [level_scores[d][a:e] for d, (a, e) in enumerate(parts)],
                [level_parent[d][a:e] for d, (a, e) in enumerate(parts)],
                [level_rank[d][a:e] for d, (a, e) in enumerate(parts)],
                int(m[j]),
            )
        )
    return results
