"""What the learning controller knows: measured cycle costs and observed acceptance.

Design decision 9: *decide on what was measured; model only what was not.* A GPU's cost curve
has steps (kernel tile and wave choices) that no smooth fit reproduces, so the controller of
:mod:`bastion.controller` does not trust a fitted curve between the points it was fitted on. It
keeps learned corrections of its priors:

- :class:`CycleTable`: the measured/predicted ratio of the *whole cycle* (drafting, preparation,
  the controller itself and the verification pass) per batch-size bucket and per cell of a
  token lattice (:func:`token_lattice`: 1 … 8, every 8 tokens up to 256, then coarser), plus one
  cell per bucket for a target-only AR step and one for the chain. Each cell is the median of
  its last ``window`` observations, so a noisy or one-off step moves nothing. Start-up
  calibration (:func:`calibrate_cycles`) fills the cells by timing real (or simulated) cycles;
  every step the engine runs adds one observation to the cell it touched. Where a cell was
  never measured its ratio is interpolated from the measured cells of the bucket (then the
  nearest bucket), and the prior — the calibrated roofline — extrapolates to other contexts.
- :class:`AcceptanceCalibration`: realised/predicted acceptance of a candidate per (depth,
  rank). The calibrated marginals q = min(1, p·g) keep best-first optimal for the calibrated
  objective (path products of values ≤ 1 never grow along a path).
- :class:`SizeCalibration`: what each lattice size really commits, learned from the prefixes
  of verified trees as increments paired within a step.

:class:`LearnedCostModel` puts them behind the :class:`bastion.interfaces.CostModel` protocol
(and the joint one of :mod:`bastion.joint`): its ``cost_curve`` is the prior's cycle times the
learned ratios; the controller reads :meth:`LearnedCostModel.candidate_cycles` (batch 1) and
:meth:`LearnedCostModel.joint_decision_curve` (batch > 1: the batch cycle *stepped* so that
every total is priced at the cheapest measured lattice total at or above it, which keeps the
curve non-decreasing, so the joint budget's exact pruned argmax still applies however
non-monotone the measured table is, and whose best total is a measured one).

What this module does not do: choose trees (:mod:`bastion.controller`) or time anything itself
(the engine and the simulator report what they measured).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, TreeBatch
from bastion.errors import BudgetError, CostModelError
from bastion.interfaces import CostCurve, CostModel, StepCost, StepLoad

__all__ = [
    "AcceptanceCalibration",
    "CycleKind",
    "CycleTable",
    "LearnedCostModel",
    "SizeCalibration",
    "batch_bucket",
    "calibrate_cycles",
    "even_sizes",
    "lattice_index",
    "token_lattice",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
CycleKind = Literal["tree", "chain", "ar"]
_KINDS: tuple[CycleKind, ...] = ("tree", "chain", "ar")

# (up to, step): every 8 tokens up to 256, every 16 up to 512, … — dense where GEMM tile
# choices change most (multiples of 8/16/64/128 tokens), coarse where a step is a small share
_SPACING = ((8, 1), (256, 8), (512, 16), (1024, 32), (2048, 64), (4096, 128), (8192, 256))
_TOP = 1 << 20  # the largest total the lattice covers (MAX_TREE_SIZE)
JOINT_HORIZON = 4096  # batch totals the joint decision looks ahead to, beyond its chain
MODE_CONTEXT_STEP = 128  # batched AR / chain priors are priced per this step of mean context


def token_lattice(hi: int = _TOP) -> IntArray:
    """The candidate token counts up to ``hi``: 1 … 8, then every 8 up to 256, 16 up to 512,
    32 up to 1024, 64 up to 2048, 128 up to 4096, 256 up to 8192, then doubling steps."""
    points: list[int] = []
    lo = 0
    for top, step in _SPACING:
        points.extend(range(lo + step, min(top, hi) + 1, step))
        lo = top
        if top >= hi:
            break
    step = 512
    while lo < hi:
        points.extend(range(lo + step, min(2 * lo, hi) + 1, step))
        lo, step = 2 * lo, 2 * step
    if not points or points[-1] != hi:
        points.append(hi)
    return np.asarray(sorted(set(points)), dtype=np.int64)


LATTICE = token_lattice()
LATTICE.flags.writeable = False


def lattice_index(tokens: npt.ArrayLike) -> IntArray:
    """Index in :data:`LATTICE` of the smallest lattice point ≥ each token count."""
    return np.asarray(np.searchsorted(LATTICE, np.asarray(tokens, dtype=np.int64)), np.int64)


def batch_bucket(batch_size: int) -> int:
    """The batch-size bucket of a step: the power of two nearest to B in log scale (≤ 1024)."""
    if batch_size < 1:
        raise BudgetError(f"batch_size must be ≥ 1; got {batch_size}")
    return min(10, round(math.log2(batch_size)))


class CycleTable:
    """Measured/predicted cycle ratios per (kind, batch bucket, lattice cell), robust to noise.

    Each cell keeps its last ``window`` ratios in a ring and reads as their median. ``version``
    counts updates (a caller caches derived curves per version).
    """

    def __init__(self, window: int = 9) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise BudgetError(f"window must be an integer ≥ 1; got {window!r}")
        self.window = window
        n = LATTICE.shape[0]
        # per kind: [bucket, cell, slot] ring buffers, counts and medians (NaN: never measured)
        self._ring = {k: np.full((11, n if k == "tree" else 1, window), np.nan) for k in _KINDS}
        self._count = {k: np.zeros((11, n if k == "tree" else 1), np.int64) for k in _KINDS}
        self._median = {k: np.full((11, n if k == "tree" else 1), np.nan) for k in _KINDS}
        self._filled: dict[tuple[str, int], tuple[tuple[int, int], FloatArray]] = {}
        self._noise: dict[tuple[str, int], tuple[int, float]] = {}
        self._kind_version = dict.fromkeys(_KINDS, 0)  # updates per kind
        self.version = 0

    def observe(self, kind: CycleKind, batch_size: int, tokens: int, ratio: float) -> None:
        """One measured/predicted ratio of a ``kind`` cycle of ``tokens`` total tree tokens."""
        if not (math.isfinite(ratio) and ratio > 0):
            return  # a failed or degenerate measurement teaches nothing
        b = batch_bucket(batch_size)
        cell = int(np.searchsorted(LATTICE, tokens)) if kind == "tree" else 0
        count = self._count[kind]
        ring = self._ring[kind][b, cell]
        seen = int(count[b, cell])
        ring[seen % self.window] = ratio
        count[b, cell] = seen + 1
        vals = sorted(ring[: min(seen + 1, self.window)].tolist())
        half = len(vals) // 2
        median = vals[half] if len(vals) % 2 else 0.5 * (vals[half - 1] + vals[half])
        self._median[kind][b, cell] = median
        self._kind_version[kind] += 1
        self.version += 1

    def noise(self, kind: CycleKind, batch_size: int) -> float:
        """The relative spread of one observation in the bucket: 1.4826 × the median absolute
        deviation of every stored ratio from its cell's median, relative to that median (0
        with fewer than two observations in any cell)."""
        b = batch_bucket(batch_size)
        epoch = self.version >> 6  # re-estimated every 64 observations: it moves slowly
        hit = self._noise.get((kind, b))
        if hit is not None and hit[0] == epoch:
            return hit[1]
        ring = self._ring[kind][b]
        med = self._median[kind][b]
        many = self._count[kind][b] >= 2
        value = 0.0
        if many.any():
            dev = np.abs(ring[many] / med[many, None] - 1.0)
            value = float(1.4826 * np.nanmedian(dev))
        self._noise[(kind, b)] = (epoch, value)
        return value

    def count(self, kind: CycleKind, batch_size: int) -> IntArray:
        """Observations per cell of ``kind`` in the bucket of ``batch_size`` (read-only)."""
        return np.asarray(self._count[kind][batch_bucket(batch_size)], dtype=np.int64)

    def ratios(self, kind: CycleKind, batch_size: int) -> FloatArray:
        """The ratio of every cell of the bucket (read-only): measured medians, gaps filled by
        interpolation between measured cells of the bucket, else from the nearest measured
        bucket, else from the tree cells of the bucket, else 1 (the prior as it is)."""
        b = batch_bucket(batch_size)
        key = (kind, b)
        # what the fill reads: every bucket of this kind (nearest-bucket fallback), and the
        # tree cells for an AR or chain cell never measured
        stamp = (self._kind_version[kind], self._kind_version["tree"])
        hit = self._filled.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        out = self._fill(kind, b)
        out.flags.writeable = False
        self._filled[key] = (stamp, out)
        return out

    def _fill(self, kind: CycleKind, b: int) -> FloatArray:
        med = self._median[kind]
        order = sorted(range(11), key=lambda x: (abs(x - b), x))  # this bucket, then nearest
        for bb in order:
            row = med[bb]
            ok = np.isfinite(row)
            if ok.any():
                if ok.all():
                    return np.array(row, dtype=np.float64)
                x = np.flatnonzero(ok)
                return np.asarray(np.interp(np.arange(row.shape[0]), x, row[x]), np.float64)
        if kind != "tree":  # no AR or chain cycle measured yet: the tree cells' typical ratio
            tree = self._median["tree"]
            for bb in order:
                vals = tree[bb][np.isfinite(tree[bb])]
                if vals.size:
                    return np.full(1, float(np.median(vals)))
        return np.ones(med.shape[1])


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
        w = self.prior_weight
        self._g = (self._real + w) / (self._pred + w)
        self.steps += 1


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
        if hit is not None and hit[0] == self.version:
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
        self._cache[b] = (self.version, h)
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
        if hit is not None and hit[0] == self.version:
            return hit[1]
        seen = self._weight[b] > 1e-9
        safe = np.where(seen, self._weight[b], 1.0)
        tau = batch_size + np.cumsum(np.where(seen, self._dt[b] / safe, 0.0))
        a_hat = batch_size + np.cumsum(np.where(seen, self._da[b] / safe, 0.0))
        out = np.asarray(np.where(seen, tau / a_hat, 1.0), dtype=np.float64)
        self._cache[key] = (self.version, out)
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


@dataclass(frozen=True)
class _Prior:
    """The prior's whole cycle along a batch's growth: totals M and cycle seconds."""

    totals: IntArray  # M for each entry
    cycle: FloatArray  # prior draft + prep + verify at M
    curve: CostCurve  # the prior's curve (draft, prep, L_AR)


class LearnedCostModel:
    """A prior :class:`CostModel` corrected by measured cycles and observed acceptance.

    Implements ``CostModel`` (``step_cost``, ``cost_curve``, ``observe``) and the joint
    protocol (``joint_cost_curve``) with the learned whole-cycle estimate; the learning
    controller reads :meth:`candidate_cycles` / :meth:`joint_decision_curve` (stepped to the
    cheapest measured lattice point at or above each size), :meth:`mode_cycle` (the AR and
    chain cycles) and :attr:`acceptance`. :meth:`observe_step` is the engine's hook: every
    step's measured cycle and accepted paths.

    ``probe_every``: while AR is faster, draft every so many steps to see whether that changed
    (bounded exploration, deterministic). ``margin``: speculate only when its realised speedup
    over AR exceeds 1 + margin. ``evidence``: the realised speedup is the mean over the last so
    many drafted steps, and AR is chosen only once at least half of them were seen.
    """

    def __init__(
        self,
        prior: CostModel,
        *,
        window: int = 9,
        probe_every: int = 16,
        margin: float = 0.0,
        evidence: int = 16,
        explore_every: int = 128,
        acceptance: AcceptanceCalibration | None = None,
    ) -> None:
        if isinstance(prior, LearnedCostModel):
            prior = prior.prior  # type: ignore[has-type]
        for name in ("cost_curve", "step_cost"):
            if not callable(getattr(prior, name, None)):
                raise CostModelError(f"the prior must be a CostModel (no {name}); got {prior!r}")
        if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 1:
            raise BudgetError(f"probe_every must be an integer ≥ 1; got {probe_every!r}")
        if not (math.isfinite(margin) and margin >= 0):
            raise BudgetError(f"margin must be a finite number ≥ 0; got {margin!r}")
        if isinstance(evidence, bool) or not isinstance(evidence, int) or evidence < 2:
            raise BudgetError(f"evidence must be an integer ≥ 2; got {evidence!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int):
            raise BudgetError(f"explore_every must be an integer ≥ 0; got {explore_every!r}")
        if explore_every < 0:
            raise BudgetError(f"explore_every must be an integer ≥ 0; got {explore_every!r}")
        self.prior = prior
        self.table = CycleTable(window)
        self.acceptance = acceptance or AcceptanceCalibration()
        self.sizes = SizeCalibration()
        self.probe_every, self.margin, self.evidence = probe_every, margin, evidence
        self._realised: list[float] = []  # the last ``evidence`` drafted steps' speedups
        self.startup_s = 0.0  # device seconds spent by calibrate_cycles
        self.speedup = math.inf  # mean realised speedup of recent drafted steps over AR (∞: too
        # few of them yet)
        self._since_draft = 0
        self._chain = [0.0, 0.0, 0.0]  # the chain's Σ realised τ, Σ Â, steps (forgotten)
        self._probe_interval = probe_every
        self.always_draft = False  # e.g. while recording traces: never skip the drafter
        self._drafted = 0
        self.explore_every = explore_every
        self._joint = getattr(prior, "joint_cost_curve", None)
        self._curves: dict[tuple[int, int], tuple[int, CostCurve, FloatArray]] = {}
        self._even: dict[tuple[int, int, int], FloatArray] = {}
        # batched AR and chain priors per (kind, B, depth, mean context step): they move slowly
        self._modes: dict[tuple[str, int, int, int], float] = {}
        self.mode = getattr(prior, "mode", "learned")

    def copy(self) -> LearnedCostModel:
        """An independent copy (what one run learns does not leak into another)."""
        return copy.deepcopy(self)

    # -- the prior ---------------------------------------------------------------------------

    def _prior(self, contexts: IntArray, sizes: IntArray | None, n: int) -> _Prior:
        """The prior's cycle as the batch grows: B = 1 along N = 1 … n; B > 1 along an even
        spread of the added nodes (``sizes`` None) or along the given allocation's growth."""
        b = contexts.shape[0]
        if b == 1 and sizes is None:
            cc = self.prior.cost_curve(n, StepLoad(int(contexts[0])))
            totals = np.arange(1, n + 1, dtype=np.int64)
            return _Prior(totals, cc.draft_s + cc.prep_s + cc.verify_s[:n], cc)
        if sizes is None:
            grow = np.arange(max(n - b, 0), dtype=np.int64) % b
        else:
            grow = np.repeat(np.arange(b, dtype=np.int64), np.maximum(sizes, 1) - 1)
        cc = self._prior_joint(contexts, grow)
        totals = b + np.arange(grow.shape[0] + 1, dtype=np.int64)
        return _Prior(totals, cc.draft_s + cc.prep_s + cc.verify_s, cc)

    def _prior_joint(self, contexts: IntArray, grow: IntArray) -> CostCurve:
        if self._joint is not None:
            return self._joint(contexts, grow)  # type: ignore[no-any-return]
        from bastion.joint import joint_curve_from_cost_model

        return joint_curve_from_cost_model(self.prior, contexts)(grow)

    # -- CostModel protocol ------------------------------------------------------------------

    def _learned(self, totals: IntArray, cycle: FloatArray, b: int) -> FloatArray:
        return cycle * self.table.ratios("tree", b)[lattice_index(totals)]

    def _deciding(self, totals: IntArray, cycle: FloatArray, b: int) -> FloatArray:
        """What the decision prices: the learned cycle, one standard error on the expensive
        side (the spread of one observation over √observations, so a size that looks cheap
        by noise alone does not lure the controller), over the size correction h."""
        cells = lattice_index(totals)
        ratio = self.table.ratios("tree", b)[cells]
        seen = np.maximum(self.table.count("tree", b)[cells], 1)
        pessimism = 1.0 + self.table.noise("tree", b) / np.sqrt(np.minimum(seen, self.table.window))
        return cycle * ratio * pessimism / self.sizes.factors(b)[cells]

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        """The learned cycle of one request's tree (the others as in ``load``), N = 1 … max."""
        if load.co_batched:
            return self._fallback_curve(max_tree_size, load)
        cc = self.prior.cost_curve(max_tree_size, load)
        totals = np.arange(1, max_tree_size + 1, dtype=np.int64)
        cycle = cc.draft_s + cc.prep_s + cc.verify_s[:max_tree_size]
        learned = self._learned(totals, cycle, 1)
        return CostCurve(
            draft_s=cc.draft_s,
            prep_s=cc.prep_s,
            verify_s=learned - cc.draft_s - cc.prep_s,
            ar_step_s=cc.ar_step_s * float(self.table.ratios("ar", 1)[0]),
        )

    def _fallback_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        """A request priced inside a batch: the prior's curve scaled by the batch cell's ratio
        at the batch's total (the per-request rule's view of the learned table)."""
        cc = self.prior.cost_curve(max_tree_size, load)
        b = load.batch_size
        others = sum(r.tree_size for r in load.co_batched)
        totals = others + np.arange(1, max_tree_size + 1, dtype=np.int64)
        cycle = cc.draft_s + cc.prep_s + cc.verify_s[:max_tree_size]
        learned = self._learned(totals, cycle, b)
        return CostCurve(
            draft_s=cc.draft_s,
            prep_s=cc.prep_s,
            verify_s=learned - cc.draft_s - cc.prep_s,
            ar_step_s=cc.ar_step_s * float(self.table.ratios("ar", b)[0]),
        )

    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        """The prior's breakdown with its verification scaled so the total is the learned one."""
        cost = self.prior.step_cost(tree_size, load)
        totals = np.asarray([tree_size + sum(r.tree_size for r in load.co_batched)])
        ratio = float(self.table.ratios("tree", load.batch_size)[lattice_index(totals)[0]])
        extra = cost.total_s * (ratio - 1.0)
        return StepCost(cost.draft_s, cost.prep_s, cost.verify_s + extra, cost.breakdown)

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        """A verify-only measurement: not what this model learns from (see observe_step)."""

    def joint_cost_curve(self, context_lens: IntArray, grow: IntArray) -> CostCurve:
        """The learned cycle of the whole batch along ``grow`` (the joint protocol)."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        cc = self._prior_joint(ctx, np.asarray(grow, dtype=np.int64))
        b = ctx.shape[0]
        totals = b + np.arange(cc.verify_s.shape[0], dtype=np.int64)
        learned = self._learned(totals, cc.draft_s + cc.prep_s + cc.verify_s, b)
        return CostCurve(
            cc.draft_s,
            cc.prep_s,
            learned - cc.draft_s - cc.prep_s,
            cc.ar_step_s * float(self.table.ratios("ar", b)[0]),
        )

    # -- what the controller decides on ------------------------------------------------------

    @staticmethod
    def stepped(totals: IntArray, cost: FloatArray) -> FloatArray:
        """Each entry priced at the cheapest lattice point at or above it (within the priced
        range; its last entry counts as one): non-decreasing, constant within a lattice cell."""
        cell_end = LATTICE[lattice_index(totals)]
        end = np.minimum(cell_end - totals[0], cost.shape[0] - 1)
        at_end = cost[end]
        return np.minimum.accumulate(at_end[::-1])[::-1]

    def candidate_cycles(
        self, cells: IntArray, sizes: IntArray, n_max: int, context_len: int
    ) -> tuple[FloatArray, float]:
        """Batch 1: the learned cycle of trees of ``sizes`` (lattice ``cells``), one standard
        error on the expensive side, and the learned AR cycle."""
        key = (int(context_len), int(n_max))
        hit = self._curves.get(key)
        if hit is None or hit[0] != self.table.version or hit[2].shape[0] != sizes.shape[0]:
            cc = self.prior.cost_curve(n_max, StepLoad(int(context_len)))
            cycle = cc.draft_s + cc.prep_s + cc.verify_s[sizes - 1]
            ratio = self.table.ratios("tree", 1)[cells]
            seen = np.minimum(np.maximum(self.table.count("tree", 1)[cells], 1), self.table.window)
            pessimism = 1.0 + self.table.noise("tree", 1) / np.sqrt(seen)
            ar = cc.ar_step_s * float(self.table.ratios("ar", 1)[0])
            if len(self._curves) > 64:
                self._curves.clear()
            hit = (self.table.version, CostCurve(0.0, 0.0, cycle, ar), cycle * ratio * pessimism)
            self._curves[key] = hit
        return hit[2], hit[1].ar_step_s

    def joint_decision_curve(
        self, context_lens: IntArray, grow: IntArray, n_max: int = 1024
    ) -> CostCurve:
        """Batch > 1: the stepped decision cost of the batch for the totals along ``grow``.

        The prior is the batch's cycle with the added nodes spread evenly (cached per batch
        size and mean context), not along ``grow`` itself: how the nodes are spread changes
        only the attention pairs, the learned ratios (measured on the allocations actually
        chosen) absorb that, and pricing one cached curve instead of the chain every step is
        what keeps the joint controller's host time down.

        The chain is grown only as far as the stop rule needs, so a cheaper measured total
        beyond its end (a kernel step's far side: 256 tokens after 136–255) would be invisible
        and the controller would settle in front of it. Every entry is therefore also capped by
        the cheapest lattice total beyond the end, up to B·n_max (at most
        :data:`JOINT_HORIZON` tokens): the controller keeps growing towards it."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        m = int(np.asarray(grow).shape[0])
        top = max(min(b * int(n_max), JOINT_HORIZON), b + m)
        even = self._even_prior(ctx, top)
        totals = b + np.arange(m + 1, dtype=np.int64)
        deciding = self.stepped(totals, self._deciding(totals, even[: m + 1], b))
        beyond = LATTICE[(b + m < LATTICE) & (top >= LATTICE)]
        if beyond.size:
            tail = self._deciding(beyond, even[beyond - b], b)
            deciding = np.minimum(deciding, float(tail.min()))
        ar = self._ar_prior(ctx) * float(self.table.ratios("ar", b)[0])
        return CostCurve(0.0, 0.0, deciding, ar)

    def affordable_total(
        self, context_lens: IntArray, total: int, n_max: int, factor: float
    ) -> int:
        """Batch > 1: the largest lattice total up to B·n_max (at most :data:`JOINT_HORIZON`)
        whose learned batch cycle (even spread) is at most ``factor`` times that of ``total``."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        top = max(min(b * int(n_max), JOINT_HORIZON), total)
        even = self._even_prior(ctx, top)
        totals = LATTICE[(b <= LATTICE) & (top >= LATTICE)]
        learned = self._learned(totals, even[totals - b], b)
        here = float(self._learned(np.array([total]), even[total - b : total - b + 1], b)[0])
        ok = totals[learned <= factor * here]
        return int(ok.max()) if ok.size else total

    def _even_prior(self, ctx: IntArray, top: int) -> FloatArray:
        """The prior's batch cycle for totals B … ``top`` along an even spread, cached per
        batch size and mean context (in steps of 256 tokens)."""
        b = ctx.shape[0]
        key = (b, int(ctx.mean()) // MODE_CONTEXT_STEP, top)
        hit = self._even.get(key)
        if hit is None:
            if len(self._even) > 64:
                self._even.clear()
            hit = self._even[key] = self._prior(ctx, None, top).cycle
        return hit

    def mode_cycle(self, kind: CycleKind, contexts: IntArray, depth: int) -> float:
        """The learned cycle of a whole step of ``kind`` ("ar" or "chain" with ``depth``
        draft positions per request) for requests with ``contexts``."""
        ctx = np.asarray(contexts, dtype=np.int64)
        b = ctx.shape[0]
        if kind == "ar":
            prior = self._ar_prior(ctx)
        else:
            key = ("chain", b, depth, int(ctx.mean()) // MODE_CONTEXT_STEP)
            prior = self._modes.get(key, -1.0)
            if prior < 0:
                sizes = np.full(b, depth + 1, np.int64)
                p = self._prior(ctx, sizes if b > 1 else None, b * (depth + 1))
                prior = self._remember(key, float(p.cycle[-1]))
        return prior * float(self.table.ratios(kind, b)[0])

    def _ar_prior(self, ctx: IntArray) -> float:
        if ctx.shape[0] == 1:
            return float(self.prior.cost_curve(1, StepLoad(int(ctx[0]))).ar_step_s)
        key = ("ar", ctx.shape[0], 0, int(ctx.mean()) // MODE_CONTEXT_STEP)
        prior = self._modes.get(key, -1.0)
        if prior < 0:
            cc = self._prior_joint(ctx, np.zeros(0, np.int64))
            prior = self._remember(key, float(cc.ar_step_s))
        return prior

    def _remember(self, key: tuple[str, int, int, int], value: float) -> float:
        if len(self._modes) > 256:
            self._modes.clear()
        self._modes[key] = value
        return value

    # -- learning ----------------------------------------------------------------------------

    def chain_ratio(self) -> float:
        """Realised/predicted τ of the chain steps so far (``prior_weight`` pseudo-steps of
        ratio 1, as the size calibration)."""
        real, pred, steps = self._chain
        prior = self.sizes.prior_weight * (pred / steps if steps else 0.0)
        return (real + prior) / (pred + prior) if pred + prior > 0 else 1.0

    def explore_now(self) -> bool:
        """Whether this drafted step should verify a larger tree than the best one: every
        ``explore_every``-th drafted step from the first on (deterministic, so the same run
        repeats)."""
        self._drafted += 1  # the first drafted step explores too: it teaches the most then
        return self.explore_every > 0 and self._drafted % self.explore_every == 1

    def wants_draft(self, batch_size: int) -> bool:
        """Whether the next step should draft: yes while speculation has paid (or is untried);
        while AR has been faster, every ``probe_every``-th step, the interval doubling after
        each probe that confirms it (up to 16 × ``probe_every``)."""
        if self.always_draft or self.speedup > 1.0 + self.margin:
            return True
        return self._since_draft + 1 >= self._probe_interval

    def observe_cycle(
        self, kind: CycleKind, contexts: IntArray, sizes: IntArray, cycle_s: float
    ) -> float:
        """Fold one measured cycle into the table; returns the ratio it recorded."""
        ctx = np.asarray(contexts, dtype=np.int64)
        b = ctx.shape[0]
        s = np.asarray(sizes, dtype=np.int64)
        if kind == "ar":
            prior = self._ar_prior(ctx)
        elif b == 1:
            n = int(s[0])
            cc = self.prior.cost_curve(n, StepLoad(int(ctx[0])))
            prior = float(cc.draft_s + cc.prep_s + cc.verify_s[n - 1])
        else:  # the even-spread prior the joint decision prices with
            total = int(s.sum())
            prior = float(
                self._even_prior(ctx, max(total, min(b * 1024, JOINT_HORIZON)))[total - b]
            )
        ratio = cycle_s / prior if prior > 0 else math.nan
        self.table.observe(kind, b, int(s.sum()), ratio)
        return ratio

    def observe_step(
        self,
        kind: CycleKind,
        contexts: IntArray,
        trees: TreeBatch,
        committed: IntArray,
        accepted_nodes: IntArray,
        cycle_s: float,
    ) -> None:
        """The engine's hook: one step's kind, trees, committed lengths, accepted paths (node
        indices within each tree, root excluded, request after request) and measured cycle."""
        if not (math.isfinite(cycle_s) and cycle_s > 0):
            return
        sizes = trees.sizes
        self.observe_cycle(kind, contexts, sizes, cycle_s)
        b = sizes.shape[0]
        if kind == "ar":
            self._since_draft += 1
            return
        self._since_draft = 0
        self.acceptance.observe(trees, accepted_nodes, committed)
        if kind == "tree":
            self.sizes.observe(trees, accepted_nodes, committed)
        elif kind == "chain":  # what the chain's Â realised, as the size calibration does
            d = self.sizes.decay
            self._chain[0] = d * self._chain[0] + float(np.sum(committed))
            self._chain[1] = d * self._chain[1] + float(trees.scores.sum())
            self._chain[2] = d * self._chain[2] + 1.0
        ar = self.mode_cycle("ar", contexts, 0)
        realised = float(np.sum(committed)) * ar / (b * cycle_s)
        threshold = 1.0 + self.margin
        probing = self.speedup <= threshold
        recent = self._realised
        recent.append(realised)
        if len(recent) > self.evidence:
            del recent[0]
        # one unlucky step must not switch decoding off: AR needs evidence/2 steps of it
        self.speedup = sum(recent) / len(recent) if 2 * len(recent) >= self.evidence else math.inf
        if self.speedup > threshold:
            self._probe_interval = self.probe_every
        elif probing:  # a probe that found AR still faster: look again less often
            self._probe_interval = min(2 * self._probe_interval, 16 * self.probe_every)


MeasureFn = Callable[[CycleKind, IntArray, IntArray], float]


def calibrate_cycles(
    model: LearnedCostModel,
    measure: MeasureFn,
    *,
    batch_sizes: Sequence[int] = (1,),
    n_max: int = 1024,
    context_len: int = 512,
    depth: int = 15,
    repeats: int = 2,
    max_total: int = 2048,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Start-up calibration: time whole cycles at every lattice point and fill the table.

    ``measure(kind, contexts, sizes)`` runs (or simulates) one cycle of ``kind`` with one
    request per entry of ``contexts`` and tree sizes ``sizes``, and returns its seconds. For
    each batch size B, the tree cells from B to min(B·n_max, max(max_total, n_max at B = 1))
    are timed with the nodes spread evenly over the requests, plus one AR and one chain cycle,
    ``repeats`` times each. Returns what it did: cells, passes and device seconds (also added
    to ``model.startup_s``).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise BudgetError(f"repeats must be an integer ≥ 1; got {repeats!r}")
    if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 1:
        raise BudgetError(f"n_max must be an integer ≥ 1; got {n_max!r}")
    plan: list[tuple[CycleKind, int, int]] = []
    for b in sorted(set(int(x) for x in batch_sizes)):
        if b < 1:
            raise BudgetError(f"batch sizes must be ≥ 1; got {b}")
        top = b * n_max if b == 1 else min(b * n_max, max(max_total, b))
        plan.extend(("tree", b, int(m)) for m in token_lattice(top) if m >= b)
        plan.append(("ar", b, b))
        plan.append(("chain", b, b * (depth + 1)))
    spent = 0.0
    total = len(plan) * repeats
    done = 0
    for kind, b, m in plan:
        ctx = np.full(b, context_len, np.int64)
        sizes = even_sizes(m, b)
        for _ in range(repeats):
            seconds = float(measure(kind, ctx, sizes))
            spent += seconds
            model.observe_cycle(kind, ctx, sizes, seconds)
            done += 1
            if progress is not None:
                progress(done, total)
    model.startup_s += spent
    return {"cells": len(plan), "passes": total, "device_s": spent}


def even_sizes(total: int, batch: int) -> IntArray:
    """``total`` tree nodes spread over ``batch`` requests as evenly as possible."""
    sizes = np.full(batch, total // batch, np.int64)
    sizes[: total % batch] += 1
    return sizes
