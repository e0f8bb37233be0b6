"""What the learning controller observes of acceptance: per candidate and per tree size.

- :class:`AcceptanceCalibration`: realised/predicted acceptance of a draft candidate per
  (depth, rank); the calibrated marginals keep best-first optimal for the calibrated objective.
- :class:`SizeCalibration`: what each lattice size of a best-first tree really commits, from the
  prefixes of verified trees (exact at T = 0), as increments paired within a step.

What this module does not do: price cycles (:mod:`bastion.cycles`) or choose
(:mod:`bastion.controller`).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, TreeBatch
from bastion.cycles import LATTICE, REFRESH_SHIFT, batch_bucket
from bastion.errors import BudgetError
from bastion.guard import integer, public

__all__ = ["AcceptanceCalibration", "SizeCalibration"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@public(error=BudgetError, depth=integer(1, 4096), ranks=integer(1, 1024))
class AcceptanceCalibration:
    """Realised/predicted acceptance of a draft token, per (depth, rank), learned from steps.

    At depth d the drafter's row gives p_d[r], the surrogate's probability that the target's
    next token is the rank-r candidate, whatever the path. Every verified tree *exposes* the
    children of each node on its accepted path (the root included): each exposed candidate
    was predicted with p_d[r] and was accepted or not. Sums of both per (d, r) — ranks from
    ``ranks − 1`` on pooled, exponentially forgotten with ``decay`` per step, with
    ``prior_weight`` pseudo-observations of ratio 1 — give g(d, r). The calibrated marginals
    are q_d[r] = min(1, p_d[r]·g(d, r)), each row re-sorted. Best-first on q is the optimal
    tree of every size for the calibrated objective Σ Π q along paths: the path products of
    values ≤ 1 never grow along a path, so the N best nodes are prefix-closed (tested with
    :mod:`bastion.testing`'s oracle, with a negative control).
    """

    def __init__(
        self,
        depth: int = 64,
        ranks: int = 8,
        prior_weight: float = 2.0,
        decay: float = 0.998,
    ) -> None:
        for name, value in (("depth", depth), ("ranks", ranks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BudgetError(f"{name} must be an integer ≥ 1; got {value!r}")
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise BudgetError(f"prior_weight must be a finite number > 0; got {prior_weight!r}")
        if not 0 < decay <= 1:
            raise BudgetError(f"decay must be in (0, 1]; got {decay!r}")
        self.depth, self.ranks, self.prior_weight, self.decay = depth, ranks, prior_weight, decay
        self.enabled = True
        self._pred = np.zeros((depth, ranks))
        self._real = np.zeros((depth, ranks))
        self._g = np.ones((depth, ranks))
        self._last: tuple[BatchMarginals, IntArray | None] | None = None  # raw rows, order
        self.steps = 0

    def factors(self, depth: int, k: int) -> FloatArray:
        """g(d, r) for d = 1 … depth, r = 0 … k − 1 (1 beyond the tracked depths)."""
        g = np.ones((depth, k))
        dd, kk = min(depth, self.depth), min(k, self.ranks)
        g[:dd, :kk] = self._g[:dd, :kk]
        if k > kk:
            g[:dd, kk:] = self._g[:dd, kk - 1 : kk]
        return g

    def calibrate(self, marginals: BatchMarginals) -> BatchMarginals:
        """The marginals with every candidate's probability corrected (rows re-sorted)."""
        if self.steps == 0 or not self.enabled:
            self._last = (marginals, None)
            return marginals
        _, depth, k = marginals.probs.shape
        q = np.minimum(marginals.probs * self.factors(depth, k)[None], 1.0)
        order = np.argsort(-q, axis=-1, kind="stable")
        q = np.take_along_axis(q, order, axis=-1)
        ids = np.take_along_axis(marginals.token_ids, order, axis=-1)
        self._last = (marginals, order)
        return BatchMarginals(ids, q)

    def observe(self, trees: TreeBatch, accepted_nodes: IntArray, committed: IntArray) -> None:
        """Fold in a verified step: the trees as verified (built from the last calibrated
        marginals), each request's accepted path (node indices within its tree, root
        excluded, request after request) and committed lengths (accepted + 1)."""
        if self._last is None or trees.depths.size == trees.size:
            return  # nothing drafted (or not by this calibration): nothing to learn
        raw, order = self._last
        self._last = None
        offsets = trees.offsets
        b = trees.size
        if raw.probs.shape[0] != b:
            return
        committed = np.asarray(committed, dtype=np.int64)
        request = np.repeat(np.arange(b), np.diff(offsets))
        on_path = np.zeros(trees.depths.size, bool)
        on_path[offsets[:-1]] = True
        acc = np.asarray(accepted_nodes, dtype=np.int64)
        if acc.size:
            owner = np.repeat(np.arange(b), np.maximum(committed - 1, 0))
            on_path[offsets[owner] + acc] = True
        child = trees.depths >= 1
        parent = offsets[request] + trees.parents
        exposed = child & on_path[np.where(child, parent, 0)]
        d = trees.depths[exposed] - 1
        r = trees.ranks[exposed]
        req = request[exposed]
        if order is not None:
            r = order[req, d, r]  # the rank in the raw row
        p = raw.probs[req, d, r]
        keep = d < self.depth
        d, r, p, hit = d[keep], np.minimum(r[keep], self.ranks - 1), p[keep], on_path[exposed][keep]
        cell = d * self.ranks + r
        size = self.depth * self.ranks
        self._pred *= self.decay
        self._real *= self.decay
        self._pred += np.bincount(cell, weights=p, minlength=size).reshape(self._pred.shape)
        self._real += np.bincount(cell, weights=hit, minlength=size).reshape(self._pred.shape)
        if self.steps % (1 << REFRESH_SHIFT) == 0:  # the sums grow every step, g every 8th
            w = self.prior_weight
            self._g = (self._real + w) / (self._pred + w)
        self.steps += 1


@public(error=BudgetError)
class SizeCalibration:
    """What each lattice size really commits, learned from the prefixes of verified trees.

    A verified best-first tree of N nodes also answers, for every n < N, what its prefix T_n
    would have committed: the accepted path's nodes that lie in T_n (indices < n at batch 1;
    at batch B the first n − B nodes of the batch's merged order) — exact at T = 0, where the
    target's tokens do not depend on the tree. So every step observes, for each lattice size up
    to its own, the realised τ beside the surrogate's Â.

    Larger sizes are observed only on the steps that verified large trees, so comparing cells
    by their own means would compare different steps. The calibration therefore learns
    *increments*, paired within a step: for consecutive lattice sizes L_{k−1} < L_k, the gain
    ratio h_k = Σ (τ(L_k) − τ(L_{k−1})) / Σ (Â(L_k) − Â(L_{k−1})) over the steps that observed
    L_k (sums forgotten with ``decay``, plus ``prior_weight`` pseudo-steps at ratio 1, each worth
    the cell's mean surrogate gain, so a few unlucky steps cannot condemn a size). A
    step's expected τ at L_j is then B + Σ_{k ≤ j} h_k·ΔÂ_k of that step's own Â: the
    surrogate's per-step information, with each increment discounted by what such increments
    realised. A cell never observed borrows the ratio of the nearest observed cell below.
    """

    def __init__(self, prior_weight: float = 8.0, decay: float = 0.998) -> None:
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise BudgetError(f"prior_weight must be a finite number > 0; got {prior_weight!r}")
        if not 0 < decay <= 1:
            raise BudgetError(f"decay must be in (0, 1]; got {decay!r}")
        self.prior_weight, self.decay = prior_weight, decay
        n = LATTICE.shape[0]
        self._da = np.zeros((11, n))  # Σ ΔÂ per cell (forgotten with decay)
        self._dt = np.zeros((11, n))  # Σ Δτ
        self._weight = np.zeros((11, n))  # Σ steps
        self._cache: dict[object, tuple[int, FloatArray]] = {}
        self.version = 0

    def gain_ratios(self, batch_size: int) -> FloatArray:
        """h_k per lattice cell for the bucket of ``batch_size`` (read-only)."""
        b = batch_bucket(batch_size)
        hit = self._cache.get(b)
        epoch = self.version >> REFRESH_SHIFT
        if hit is not None and hit[0] == epoch:
            return hit[1]
        seen = self._weight[b] > 1e-9
        # ``prior_weight`` pseudo-steps of ratio 1, each worth the cell's mean surrogate gain
        prior = self.prior_weight * self._da[b] / np.where(seen, self._weight[b], 1.0)
        h = (self._dt[b] + prior) / np.maximum(self._da[b] + prior, 1e-12)
        h = np.where(self._da[b] + prior > 1e-12, h, 1.0)
        observed = np.flatnonzero(seen)
        if observed.size == 0:
            h = np.ones_like(h)
        elif not seen.all():
            pos = np.searchsorted(observed, np.arange(h.shape[0]), side="right") - 1
            h = np.where(seen, h, np.where(pos >= 0, h[observed[np.maximum(pos, 0)]], 1.0))
        h.flags.writeable = False
        self._cache[b] = (epoch, h)
        return np.asarray(h, dtype=np.float64)

    def expected(self, batch_size: int, cells: IntArray, predicted: FloatArray) -> FloatArray:
        """A step's expected committed tokens at consecutive lattice ``cells`` (from the first
        lattice cell at or above B), given its surrogate Â there."""
        h = self.gain_ratios(batch_size)[cells]
        gains = np.diff(predicted, prepend=float(batch_size))
        return np.asarray(batch_size + np.cumsum(h * gains), dtype=np.float64)

    def factors(self, batch_size: int) -> FloatArray:
        """The cumulative ratio E[τ]/E[Â] per lattice cell, from the paired increments' means
        (what the joint budget divides its cost by)."""
        b = batch_bucket(batch_size)
        key = (-1 - b, batch_size)
        hit = self._cache.get(key)
        epoch = self.version >> REFRESH_SHIFT
        if hit is not None and hit[0] == epoch:
            return hit[1]
        seen = self._weight[b] > 1e-9
        safe = np.where(seen, self._weight[b], 1.0)
        tau = batch_size + np.cumsum(np.where(seen, self._dt[b] / safe, 0.0))
        a_hat = batch_size + np.cumsum(np.where(seen, self._da[b] / safe, 0.0))
        out = np.asarray(np.where(seen, tau / a_hat, 1.0), dtype=np.float64)
        self._cache[key] = (epoch, out)
        return out

    def observe(self, trees: TreeBatch, accepted_nodes: IntArray, committed: IntArray) -> None:
        """Fold in a verified step (trees in best-first order, accepted paths as indices within
        each tree, root excluded, request after request)."""
        b = trees.size
        total = int(trees.offsets[-1])
        if total == b:
            return
        offsets = trees.offsets
        request = np.repeat(np.arange(b), np.diff(offsets))
        within = np.arange(total) - offsets[request]
        nonroot = within > 0
        if b == 1:
            rank = within  # the tree's own order (the root is rank 0)
        else:  # the batch's merged order: ρ descending, then request, then the tree's order
            order = np.lexsort((within, request, -trees.scores, nonroot))  # roots first
            rank = np.empty(total, np.int64)
            rank[order] = np.arange(total)
            rank -= b - 1  # non-root nodes ranked 1 … total − B, roots ≤ 0
        on_path = np.zeros(total, bool)
        acc = np.asarray(accepted_nodes, dtype=np.int64)
        if acc.size:
            owner = np.repeat(np.arange(b), np.maximum(np.asarray(committed) - 1, 0))
            on_path[offsets[owner] + acc] = True
        path_ranks = np.sort(rank[on_path & nonroot])
        gains = trees.scores[nonroot]
        if b > 1:  # a single best-first tree is in that order already
            gains = np.sort(gains)[::-1]
        predicted = b + np.concatenate(([0.0], np.cumsum(gains)))  # Â at M = B + m
        lo, hi = np.searchsorted(LATTICE, [b, total], side="left")
        hi += LATTICE[min(hi, LATTICE.shape[0] - 1)] == total
        idx = np.arange(lo, hi)
        cells = LATTICE[lo:hi]
        m = cells - b
        realised = b + np.searchsorted(path_ranks, m, side="right")
        bb = batch_bucket(b)
        for arr in (self._da, self._dt, self._weight):
            arr[bb] *= self.decay
        self._da[bb, idx] += np.diff(predicted[m], prepend=float(b))
        self._dt[bb, idx] += np.diff(realised.astype(np.float64), prepend=float(b))
        self._weight[bb, idx] += 1.0
        self.version += 1
