"""What the learning controller observes of acceptance: per candidate and per tree size.

- :class:`AcceptanceCalibration`: realised/predicted acceptance of a draft candidate per
  (depth, rank); the calibrated marginals keep best-first optimal for the calibrated objective.
- :class:`SizeCalibration`: what each lattice size of a best-first tree really commits, from the
  prefixes of verified trees (exact at T = 0), as increments paired within a step.

What this module does not do: price cycles (:mod:`bastion.cycles`) or choose
(:mod:`bastion.controller`).
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, TreeBatch
from bastion.cycles import LATTICE, REFRESH_SHIFT, batch_bucket
from bastion.errors import BudgetError
from bastion.fastinit import trusted_init
from bastion.guard import integer, public

__all__ = ["AcceptanceCalibration", "SizeCalibration", "chain_shadow", "observe_tree_step"]

try:
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # no C compiler at install time: the numpy paths give identical results
    _kernel = None
_shadow = getattr(_kernel, "shadow", None)  # the chain's shadow (_bestfirst_chain.c)

_LATTICE: list[int] = LATTICE.tolist()

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
# dtypes as objects: a numpy call given one skips converting the scalar type (timeit, this
# project's dev machine: ascontiguousarray 85 -> 61 ns, frombuffer 221 -> 174 ns)
_I8, _F8 = np.dtype(np.int64), np.dtype(np.float64)


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
        self._starts: dict[tuple[int, int, int], IntArray] = {}
        self._factor_cache: dict[tuple[int, int], tuple[int, FloatArray]] = {}
        self._g_version = 0  # counts recomputations of g
        self.steps = 0

    def _factors(self, depth: int, k: int) -> FloatArray:
        """:meth:`factors`, C-contiguous and cached until g is next recomputed."""
        hit = self._factor_cache.get((depth, k))
        if hit is None or hit[0] != self._g_version:
            if len(self._factor_cache) > 16:
                self._factor_cache.clear()
            g = np.ascontiguousarray(self.factors(depth, k))
            g.flags.writeable = False
            hit = self._factor_cache[(depth, k)] = (self._g_version, g)
        return hit[1]

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
        b, depth, k = marginals.probs.shape
        g = self._factors(depth, k)
        if _kernel is not None:
            probs = np.ascontiguousarray(marginals.probs, _F8)
            ids = np.ascontiguousarray(marginals.token_ids, _I8)
            qb, idb, ob = _kernel.calibrate(probs, ids, g, b * depth, k)
            shape = (b, depth, k)  # (arrays over the kernel's bytes: read-only, no copy)
            q = np.ndarray(shape, _F8, qb)
            if ob is None:
                self._last = (marginals, None)
                return _batch_marginals(marginals.token_ids, q)
            order = np.ndarray(shape, _I8, ob)
            self._last = (marginals, order)  # ids_sorted is order where every id is its rank
            return _batch_marginals(order if idb is ob else np.ndarray(shape, _I8, idb), q)
        q = np.minimum(marginals.probs * g[None], 1.0)
        if k < 2 or bool((q[..., :-1] >= q[..., 1:]).all()):  # still sorted: nothing to reorder
            self._last = (marginals, None)
            return BatchMarginals(marginals.token_ids, q)
        order = np.argsort(-q, axis=-1, kind="stable")
        flat = (order + self._row_starts(b, depth, k)).ravel()
        q = q.ravel()[flat].reshape(order.shape)
        ids = marginals.token_ids.ravel()[flat].reshape(order.shape)
        self._last = (marginals, order)
        return BatchMarginals(ids, q)

    def _row_starts(self, b: int, depth: int, k: int) -> IntArray:
        """[B, D, 1] flat offsets of each row of a [B, D, K] array (cached per shape)."""
        hit = self._starts.get((b, depth, k))
        if hit is None:
            if len(self._starts) > 32:
                self._starts.clear()
            hit = np.arange(0, b * depth * k, k, dtype=np.int64).reshape(b, depth, 1)
            self._starts[(b, depth, k)] = hit
        return hit

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
        acc = np.asarray(accepted_nodes, dtype=np.int64)
        if b == 1:  # one tree: node indices are the batch's
            on_path = np.zeros(trees.depths.size, bool)
            on_path[0] = True
            on_path[acc] = True
            nodes = 1 + np.flatnonzero(on_path[trees.parents[1:]])
            d = trees.depths[nodes] - 1
            r = trees.ranks[nodes]
            if order is not None:
                r = order[0, d, r]
            p = raw.probs[0, d, r]
            hit = on_path[nodes]
        else:
            committed = np.asarray(committed, dtype=np.int64)
            request = np.repeat(np.arange(b), np.diff(offsets))
            on_path = np.zeros(trees.depths.size, bool)
            on_path[offsets[:-1]] = True
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
            hit = on_path[exposed]
        if raw.probs.shape[1] > self.depth:  # drafted deeper than tracked: drop the rest
            keep = d < self.depth
            d, r, p, hit = d[keep], r[keep], p[keep], hit[keep]
        r = np.minimum(r, self.ranks - 1)
        cell = d * self.ranks + r
        size = self.depth * self.ranks
        self._pred *= self.decay
        self._real *= self.decay
        self._pred += np.bincount(cell, weights=p, minlength=size).reshape(self._pred.shape)
        self._real += np.bincount(cell, weights=hit, minlength=size).reshape(self._pred.shape)
        self._refresh()

    def _refresh(self) -> None:
        """After a step's sums: g is recomputed once per 2^REFRESH_SHIFT steps (the sums grow
        every step)."""
        if self.steps % (1 << REFRESH_SHIFT) == 0:
            w = self.prior_weight
            self._g = (self._real + w) / (self._pred + w)
            self._g_version += 1
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
        if _kernel is not None:  # the same operations, compiled (tests/test_learned_kernels.py)
            h = np.frombuffer(
                _kernel.gains(self._da[b], self._dt[b], self._weight[b], float(self.prior_weight)),
                _F8,
            )
            self._cache[b] = (epoch, h)
            return h
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
        return np.asarray(batch_size + np.cumsum(h * _steps(predicted, float(batch_size))))

    def factors(self, batch_size: int) -> FloatArray:
        """The cumulative ratio E[τ]/E[Â] per lattice cell (what the joint budget divides its
        cost by): each cell's mean surrogate gain, realised at its gain ratio h_k
        (:meth:`gain_ratios`, so with the same ``prior_weight`` pseudo-steps: a few lucky
        steps cannot make a size look cheap either)."""
        b = batch_bucket(batch_size)
        key = (-1 - b, batch_size)
        hit = self._cache.get(key)
        epoch = self.version >> REFRESH_SHIFT
        if hit is not None and hit[0] == epoch:
            return hit[1]
        if _kernel is not None:  # the same operations, compiled (tests/test_learned_kernels.py)
            h = self.gain_ratios(batch_size)
            out = np.frombuffer(
                _kernel.size_factors(self._da[b], self._weight[b], h, int(batch_size)), _F8
            )
            self._cache[key] = (epoch, out)
            return out
        seen = self._weight[b] > 1e-9
        safe = np.where(seen, self._weight[b], 1.0)
        gain = np.where(seen, self._da[b] / safe, 0.0)
        tau = batch_size + np.cumsum(gain * self.gain_ratios(batch_size))
        a_hat = batch_size + np.cumsum(gain)
        out = np.asarray(np.where(seen, tau / a_hat, 1.0), dtype=np.float64)
        self._cache[key] = (epoch, out)
        return out

    def observe(self, trees: TreeBatch, accepted_nodes: IntArray, committed: IntArray) -> None:
        """Fold in a verified step (trees in best-first order, accepted paths as indices within
        each tree, root excluded, request after request)."""
        b = trees.size
        offsets = trees.offsets
        total = int(offsets[-1])
        if total == b:
            return
        acc = np.asarray(accepted_nodes, dtype=np.int64)
        if b == 1:  # a single best-first tree: its own order, the root ranked 0
            path_ranks = np.sort(acc)
            gains = trees.scores[1:]
        else:  # the batch's merged order: ρ descending, then request, then the tree's order
            request = np.repeat(np.arange(b), np.diff(offsets))
            within = np.arange(total) - offsets[request]
            nonroot = within > 0
            order = np.lexsort((within, request, -trees.scores, nonroot))  # roots first
            rank = np.empty(total, np.int64)
            rank[order] = np.arange(total)
            rank -= b - 1  # non-root nodes ranked 1 … total − B, roots ≤ 0
            on_path = np.zeros(total, bool)
            if acc.size:
                owner = np.repeat(np.arange(b), np.maximum(np.asarray(committed) - 1, 0))
                on_path[offsets[owner] + acc] = True
            path_ranks = np.sort(rank[on_path & nonroot])
            gains = np.sort(trees.scores[nonroot])[::-1]
        predicted = np.empty(gains.shape[0] + 1)  # Â at M = B + m
        predicted[0] = 0.0
        np.cumsum(gains, out=predicted[1:])
        predicted += b
        lo = bisect.bisect_left(_LATTICE, b)
        hi = bisect.bisect_left(_LATTICE, total)
        hi += hi < len(_LATTICE) and _LATTICE[hi] == total
        bb = batch_bucket(b)
        for arr in (self._da, self._dt, self._weight):
            arr[bb] *= self.decay
        if hi > lo:
            m = LATTICE[lo:hi] - b
            at = predicted[m]
            self._da[bb, lo:hi] += _steps(at, float(b))
            realised = b + np.searchsorted(path_ranks, m, side="right")
            self._dt[bb, lo:hi] += _steps(realised.astype(np.float64), float(b))
            self._weight[bb, lo:hi] += 1.0
        self.version += 1


def _steps(values: FloatArray, start: float) -> FloatArray:
    """``np.diff(values, prepend=start)``, without its concatenation (a hot path)."""
    out = np.empty_like(values)
    if out.shape[0] == 0:
        return out
    out[0] = values[0] - start
    np.subtract(values[1:], values[:-1], out=out[1:])
    return out


@public
def chain_shadow(
    trees: TreeBatch, accepted_nodes: IntArray, committed: IntArray, top1: FloatArray
) -> tuple[float, float]:
    """What the chain would have committed on a verified best-first tree step, beside its Â:
    (Σ realised, Σ predicted) over the requests, each of the chain cut at the tree's depth.
    ``top1`` [B, depth]: the top-1 marginal at each position of the marginals the trees were
    grown from.

    Every best-first tree holds the top-1 path down to its own depth D (the top-1 node at each
    depth has that depth's largest ρ, so it is taken before any other there), and the path the
    chain would accept is the accepted path's leading run of rank-0 nodes (at T = 0 the target's
    tokens do not depend on the tree). So the chain cut at D would have committed that run + 1,
    against its Â of 1 + Σ_{d ≤ D} Π_{k ≤ d} top1[k]. Cutting at D keeps the comparison fair
    where the run reaches the tree's depth (the full chain might have accepted more). The chain
    is rarely run once trees win, and the per-(depth, rank) acceptance calibration mixes top-1
    children of off-path prefixes (which a position-wise drafter predicts worse) into rank 0:
    this is how the chain's own acceptance is learned on every tree step."""
    b = trees.size
    offsets = trees.offsets
    counts = np.asarray(committed, dtype=np.int64) - 1
    ranks = trees.ranks
    accepted = np.asarray(accepted_nodes, dtype=np.int64)
    if b == 1:  # the batch-1 controller's hot path
        d = int(trees.depths.max())  # the root is always there
        predicted = 1.0 + float(top1[0, :d].cumprod().sum())
        off = ranks[accepted] != 0
        run = int(off.argmax()) if off.any() else int(off.shape[0])
        return 1.0 + run, predicted
    chain = np.cumsum(np.cumprod(top1, axis=1), axis=1)
    depth = np.maximum.reduceat(trees.depths, offsets[:-1])
    predicted = b + float(chain[np.arange(b), np.maximum(depth - 1, 0)][depth > 0].sum())
    if accepted.shape[0] == 0:
        return float(b), predicted
    seg = np.repeat(np.arange(b), counts)
    off_path = ranks[offsets[seg] + accepted] != 0
    seen = np.cumsum(off_path)  # off-path nodes so far, less those of earlier requests
    before = np.zeros(b + 1, np.int64)
    np.cumsum(np.bincount(seg, off_path, minlength=b).astype(np.int64), out=before[1:])
    leading = int(np.count_nonzero(seen == before[seg]))
    return float(b + leading), predicted


@public
def observe_tree_step(
    acceptance: AcceptanceCalibration,
    sizes: SizeCalibration,
    trees: TreeBatch,
    accepted_nodes: IntArray,
    committed: IntArray,
) -> bool:
    """A verified tree step folded into both calibrations in one compiled call — the same
    operations as their ``observe`` methods, bit for bit (tested), at a fraction of the host
    time. Returns False, having done nothing, where it does not apply (no compiled kernel,
    root-only trees, marginals not from ``acceptance.calibrate``): the caller then runs the
    two ``observe`` methods."""
    return learn_step(acceptance, sizes, trees, accepted_nodes, committed, shadow=False) is not None


def learn_step(
    acceptance: AcceptanceCalibration,
    sizes: SizeCalibration | None,
    trees: TreeBatch,
    accepted_nodes: IntArray,
    committed: IntArray,
    hint: bytes = b"",
    shadow: bool = True,
) -> tuple[IntArray, IntArray] | tuple[()] | None:
    """:func:`observe_tree_step` (``sizes`` None: the acceptance calibration only, what a
    chain step teaches), returning per request the leading run of rank-0 nodes on the accepted
    path and the tree's depth — :func:`chain_shadow`'s inputs, see :func:`shadow_of` — or
    None, having done nothing, where the compiled call does not apply. The engine's hot path:
    its arguments are trusted (the controller's own trees and the verifier's paths).

    ``shadow`` False: () instead of the two arrays (a caller that takes no shadow this step
    is spared forming them).

    ``hint``: the batch's merged order as the compiled forest gave it (int64 bytes, the request
    of each added node in turn), which spares the kernel its merge where it is that order
    exactly (checked there; any other hint is ignored: the results do not depend on it)."""
    last = acceptance._last
    b = trees.offsets.shape[0] - 1
    if _kernel is None or last is None or int(trees.offsets[-1]) == b:
        return None
    raw, order = last
    if raw.probs.shape[0] != b:
        return None
    acceptance._last = None
    lattice: npt.NDArray[np.generic] = LATTICE
    if sizes is None:
        da = dt = weight = lattice = _EMPTY
        s_decay = 1.0
    else:
        bucket = batch_bucket(b)
        da, dt, weight = sizes._da[bucket], sizes._dt[bucket], sizes._weight[bucket]
        s_decay = float(sizes.decay)
    args = (
        trees.offsets,
        trees.parents,
        trees.depths,
        trees.ranks,
        trees.scores,
        accepted_nodes,
        committed,
        b"" if order is None else order,  # calibrate()'s own: an array over its kernel's int64
        raw.probs,
        int(raw.probs.shape[2]),
        acceptance._pred,
        acceptance._real,
        acceptance.ranks,
        float(acceptance.decay),
        da,
        dt,
        weight,
        s_decay,
        lattice,
        hint,
    )
    # the kernel takes the arrays as they are where each is C-contiguous int64 (float64 scores
    # and probabilities) — the controller's own always are — and answers None, having changed
    # nothing, where one is not: converted, they are then
    learned = _kernel.learn(*args)
    if learned is None:
        contiguous = np.ascontiguousarray
        head = args[: len(_LAYOUT)]
        converted = [
            a if t is None else contiguous(a, t) for a, t in zip(head, _LAYOUT, strict=True)
        ]
        learned = _kernel.learn(*converted, *args[len(_LAYOUT) :])
    run, deepest = learned
    if acceptance.steps & _REFRESH_MASK:  # (_refresh's own test: most steps, without its call)
        acceptance.steps += 1
    else:
        acceptance._refresh()
    if sizes is not None:
        sizes.version += 1
    if not shadow:
        return ()
    return np.frombuffer(run, _I8), np.frombuffer(deepest, _I8)


def shadow_of(run: IntArray, deepest: IntArray, chain: FloatArray) -> tuple[float, float]:
    """:func:`chain_shadow` from :func:`learn_step`'s per-request leading runs and tree depths
    and ``chain`` [B, depth], the cumulative sum of the cumulative product of the top-1
    marginals along each request's row (the chain's Â less its root, cut at every depth);
    compiled where built (``shadow()``, the same two numbers)."""
    b = run.shape[0]
    shaped = chain.ndim == 2 and chain.shape[0] == b and chain.shape[1] > 0
    if _shadow is not None and b > 1 and shaped:
        return _shadow(  # type: ignore[no-any-return]
            np.ascontiguousarray(run, _I8),
            np.ascontiguousarray(deepest, _I8),
            np.ascontiguousarray(chain, _F8),
            chain.shape[1],
        )
    if b == 1:  # the batch-1 controller's hot path
        d = int(deepest[0])
        return 1.0 + float(run[0]), 1.0 + (float(chain[0, d - 1]) if d > 0 else 0.0)
    cut = chain[np.arange(b), np.maximum(deepest - 1, 0)]
    return float(b + int(np.add.reduce(run))), b + float(np.add.reduce(cut[deepest > 0]))


_EMPTY = np.zeros(0, np.float64)
# learn()'s arrays' types, in learn_step's order (the order's bytes as they are)
_REFRESH_MASK = (1 << REFRESH_SHIFT) - 1
_LAYOUT = (_I8, _I8, _I8, _I8, _F8, _I8, _I8, None, _F8)
_batch_marginals = trusted_init(BatchMarginals)  # the calibrated marginals, every step
