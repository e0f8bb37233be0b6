"""The learning controller's decision curves: the prior's cycles times the learned ratios.

:class:`DecisionCurves` is the part of :class:`bastion.learned.LearnedCostModel` the controller
decides on: at batch 1 the learned cycle of each lattice size (:meth:`candidate_cycles`), at
batch > 1 the batch cycle *stepped* so that every total is priced at the cheapest measured
lattice total at or above it (:meth:`joint_decision_curve`, :meth:`joint_decision_arrays`),
and the learned cycles of an AR step and of the chain (:meth:`mode_cycle`). Each is the prior's
cycle (:class:`bastion.learned_prior.PricedPrior`) times the learned ratio of its cell of the
:class:`bastion.cycles.CycleTable`; what the decision prices also carries one standard error
on the expensive side and the size correction of :class:`bastion.observed.SizeCalibration`.
Each is cached until the table (or the size calibration) refreshes.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cycles import (
    _LATTICE_POINTS,
    LATTICE,
    REFRESH_SHIFT,
    CycleKind,
    CycleTable,
    lattice_index,
)
from bastion.interfaces import CostCurve
from bastion.learned_prior import MODE_CONTEXT_STEP, Lerp, PricedPrior, mean_context
from bastion.observed import SizeCalibration

try:  # the compiled decision floor (bastion._bestfirst.floor); the numpy below without it
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _kernel = None

__all__: list[str] = []  # a part of bastion.learned's LearnedCostModel, public there

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
JOINT_HORIZON = 4096  # batch totals the joint decision looks ahead to, beyond its chain


class DecisionCurves:
    """The learned cycles the controller decides on (a part of ``LearnedCostModel``).

    It reads the model's :attr:`table` (the measured/prior ratios), :attr:`sizes` (the size
    correction) and :attr:`priced` (the prior, priced); :meth:`_start_curves` sets up its caches.
    """

    table: CycleTable
    sizes: SizeCalibration
    priced: PricedPrior

    def _start_curves(self) -> None:
        """Empty caches of the decision curves."""
        self._candidates: dict[
            tuple[int, int], tuple[int, IntArray, IntArray, FloatArray, float]
        ] = {}
        # what candidate_cycles multiplies: the table's ratio and pessimism per lattice cell
        # and AR ratio (per refresh), the prior's cycle per size and AR cycle (per context step)
        self._single_table: tuple[int, FloatArray, FloatArray, float] | None = None
        # (kind, B, context step, depth) → (ratio epoch, the learned cycle, the prior's cycle)
        self._mode_memo: dict[tuple[str, int, int, int], tuple[int, float, float]] = {}
        self._single_priced: dict[
            tuple[int, int], tuple[IntArray, IntArray, FloatArray, float]
        ] = {}
        self._joint_cache: dict[tuple[int, int, int], tuple[Any, ...]] = {}
        # the decision's factor per lattice cell (the prior's cycle aside), per batch size: a
        # cell's factor does not depend on how many cells are read, so one array serves every top
        self._units: dict[int, tuple[Any, FloatArray]] = {}

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

    def candidate_cycles(
        self, n_max: int, context_len: int
    ) -> tuple[IntArray, IntArray, FloatArray, float]:
        """Batch 1: the lattice sizes up to ``n_max``, their cells, the learned cycle of each
        (one standard error on the expensive side) and the learned AR cycle — recomputed once
        per refresh of the table and per 128 tokens of context."""
        key = (int(context_len) // MODE_CONTEXT_STEP, int(n_max))
        hit = self._candidates.get(key)
        epoch = self.table.version >> REFRESH_SHIFT
        if hit is None or hit[0] != epoch:
            # the table's part (per refresh) and the prior's (per context step) apart: a new
            # context step costs two products, a refresh one more read of the table
            table = self._single_table
            if table is None or table[0] != epoch:
                ratio = self.table.ratios("tree", 1)
                seen = np.minimum(np.maximum(self.table.count("tree", 1), 1), self.table.window)
                pessimism = 1.0 + self.table.noise("tree", 1) / np.sqrt(seen)
                table = (epoch, ratio, pessimism, float(self.table.ratios("ar", 1)[0]))
                self._single_table = table
            priced = self._single_priced.get(key)
            if priced is None:
                sizes = LATTICE[: int(np.searchsorted(LATTICE, int(n_max), side="right"))]
                prior, ar_prior = self.priced.single(int(context_len), int(n_max))
                if len(self._single_priced) > 64:
                    self._single_priced.clear()
                priced = (
                    sizes,
                    np.arange(sizes.shape[0], dtype=np.int64),
                    prior[sizes - 1],
                    ar_prior,
                )
                self._single_priced[key] = priced
            m = priced[0].shape[0]
            if len(self._candidates) > 64:
                self._candidates.clear()
            cycles = priced[2] * table[1][:m] * table[2][:m]
            hit = (epoch, priced[0], priced[1], cycles, priced[3] * table[3])
            self._candidates[key] = hit
        return hit[1], hit[2], hit[3], hit[4]

    def joint_decision_curve(
        self, context_lens: IntArray, grow: IntArray, n_max: int = 1024, riding: int = 0
    ) -> CostCurve:
        """Batch > 1: the stepped decision cost of the batch for the totals along ``grow``.

        The prior is the batch's cycle with the added nodes spread evenly (cached per batch
        size and mean context), not along ``grow`` itself: how the nodes are spread changes
        only the attention pairs, the learned ratios (measured on the allocations actually
        chosen) absorb that, and pricing one cached curve instead of the chain every step is
        what keeps the joint controller's host time down.

        The chain is grown only as far as the stop rule needs, so a cheaper measured total
        beyond its end (a kernel step's far side: 256 tokens after 136–255) would be invisible
        and the controller would settle in front of it. Every entry is therefore priced at the
        cheapest lattice total at or above it, up to B·n_max (at most :data:`JOINT_HORIZON`
        tokens, itself counted as a lattice point): the controller keeps growing towards it.
        A total between lattice points costs what its cell's lattice point costs, wherever the
        chain ends: an earlier form also priced the chain's own end at its own total, which
        made the totals just past a kernel step look cheap whenever the chain stopped there.
        The price of a total does not depend on the chain, so the curve is its own
        ``floor_s``.

        ``riding`` prompt tokens of a prefill chunk in the same pass (see
        :attr:`bastion.batch.StepRequests.riding_tokens`): the chunk's own cost is sunk (the
        pass carries it whatever the trees), so a total T is charged what it adds to the
        chunk's pass, on top of what a step without a chunk costs bare:
        Ĉ(B + riding + (T − B)) − Ĉ(B + riding) + Ĉ(B), the totals shifted along the same
        stepped curve. (Charging the whole pass instead, Ĉ(T + riding), makes the chunk a
        fixed cost that larger trees amortise: the step's own ratio grows trees the run's
        throughput does not pay for.)"""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        m = int(np.asarray(grow).shape[0])
        top = max(min(b * int(n_max), JOINT_HORIZON), b + m)
        cells, best_above = self._joint_deciding(ctx, top, riding)
        # the cheapest lattice total from each entry on, up to ``top`` (itself counted as
        # one): the same for any chain, however far it was grown, so it is its own floor
        floor = best_above[cells]
        return CostCurve(0.0, 0.0, floor[: m + 1], self.mode_cycle("ar", ctx, 0), floor_s=floor)

    def joint_decision_arrays(
        self, context_lens: IntArray, n_max: int = 1024, riding: int = 0
    ) -> tuple[IntArray, FloatArray, float]:
        """What :meth:`joint_decision_curve` is built from, for chains of up to
        min(B·n_max, :data:`JOINT_HORIZON`) − B added nodes: the lattice cell of every total
        B … top (of the pass: each total plus ``riding``), the cheapest decision cost at or
        above each cell, and the learned AR cycle (the compiled joint budget prices the chain
        from these)."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        top = max(min(b * int(n_max), JOINT_HORIZON), b)
        cells, best_above = self._joint_deciding(ctx, top, riding)
        return cells, best_above, self.mode_cycle("ar", ctx, 0)

    def _joint_deciding(
        self, ctx: IntArray, top: int, riding: int = 0
    ) -> tuple[IntArray, FloatArray]:
        """Batch > 1, for totals B … ``top`` (the added nodes spread evenly): each total's
        lattice cell and, per cell, the cheapest decision cost of a lattice total at or above
        it (up to ``top``): the prior's cycle there times the decision's factor
        (:meth:`_deciding`). Per batch size, mean-context step and ``top``, recomputed when the
        learned table or the size calibration refreshes. With ``riding`` prefill tokens in the
        pass, those of the totals' passes, charged as :func:`_with_riding` says."""
        b = ctx.shape[0]
        if riding:
            further = self._joint_deciding(ctx, top + _riding_room(riding))
            return _with_riding(*further, riding, top - b + 1)
        key = (b, mean_context(ctx) // MODE_CONTEXT_STEP, top)
        stamp = (self.table.stamp("tree"), self.sizes.version >> REFRESH_SHIFT)
        hit = self._joint_cache.get(key)
        if hit is None or hit[0] != stamp:
            if len(self._joint_cache) > 64:
                self._joint_cache.clear()
            best_above = self._floor(self.priced.even(ctx, top), b, top, stamp)
            hit = self._joint_cache[key] = (stamp, best_above)
        return _cells_of(b, top), hit[1]

    def _floor(self, even: Lerp, b: int, top: int, stamp: tuple[Any, ...]) -> FloatArray:
        """:meth:`_joint_deciding`'s cheapest decision cost at or above each lattice cell up to
        ``top``, from the even-spread prior ``even`` at totals B … (``stamp``: the table's and
        the size calibration's, as of now): the compiled ``floor()`` where it is built, else
        numpy (its reference, the same operations)."""
        n_cells = bisect_left(_LATTICE_POINTS, top) + 1
        table = self.table
        floor = getattr(_kernel, "floor", None)
        if floor is not None and n_cells <= LATTICE.shape[0]:
            best = floor(
                np.ascontiguousarray(even.lo, np.float64),
                np.ascontiguousarray(even.hi, np.float64),
                float(even.w),
                table.ratios("tree", b),
                table.count("tree", b),
                np.ascontiguousarray(self.sizes.factors(b), np.float64),
                float(table.noise("tree", b)),
                int(table.window),
                b,
                top,
                n_cells,
                LATTICE,
            )
            return np.frombuffer(best, np.float64)
        # the factors do not depend on the context: a new context step reuses them
        units = self._units.get(b)
        if units is None or units[0] != stamp:
            if len(self._units) > 64:
                self._units.clear()
            units = self._units[b] = (stamp, self._deciding(LATTICE, _ONES, b))
        unit = units[1][:n_cells]
        # a lattice point beyond ``top`` (the last cell's) is priced at ``top`` itself
        reach = np.minimum(LATTICE[:n_cells], top)
        ok = reach >= b
        at_point = np.full(n_cells, np.inf)
        at_point[ok] = even[reach[ok] - b] * unit[ok]
        return np.minimum.accumulate(at_point[::-1])[::-1]

    def joint_cycle(self, context_lens: IntArray, total: int) -> float:
        """Batch > 1: the learned cycle of the batch with ``total`` tree nodes spread evenly
        (what a step of that total is predicted to take; the decision curve also carries the
        pessimism and the size correction)."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        even = self.priced.even(ctx, even_top(b, total))
        if total < b:  # (not a batch total: as the array form, which fails)
            return float(self._learned(np.array([total]), even[total - b : total - b + 1], b)[0])
        # _learned of one total, as scalars (the same product; the cell by bisection)
        cell = bisect_left(_LATTICE_POINTS, total)
        return float(even[total - b] * self.table.ratios("tree", b)[cell])

    def joint_cycles(self, context_lens: IntArray, totals: tuple[int, ...]) -> list[float]:
        """:meth:`joint_cycle` of each of ``totals`` (batch totals ≥ B), the same floats: the
        contexts, the prior of each horizon and the table's ratios read once for all (a step
        with a prefill chunk prices five totals; nothing is observed in between)."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        ratios = self.table.ratios("tree", b)
        evens: dict[int, Lerp] = {}
        out = []
        for total in totals:
            if total < b:  # (not a batch total: as joint_cycle, which fails)
                out.append(self.joint_cycle(ctx, total))
                continue
            top = even_top(b, total)
            even = evens.get(top)
            if even is None:
                even = evens[top] = self.priced.even(ctx, top)
            out.append(float(even[total - b] * ratios[bisect_left(_LATTICE_POINTS, total)]))
        return out

    def affordable_total(
        self, context_lens: IntArray, total: int, n_max: int, factor: float
    ) -> int:
        """Batch > 1: the largest lattice total up to B·n_max (at most :data:`JOINT_HORIZON`)
        whose learned batch cycle (even spread) is at most ``factor`` times that of ``total``."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        top = max(min(b * int(n_max), JOINT_HORIZON), total)
        even = self.priced.even(ctx, top)
        totals = LATTICE[(b <= LATTICE) & (top >= LATTICE)]
        learned = self._learned(totals, even[totals - b], b)
        here = float(self._learned(np.array([total]), even[total - b : total - b + 1], b)[0])
        ok = totals[learned <= factor * here]
        return int(ok.max()) if ok.size else total

    def mode_cycle(self, kind: CycleKind, contexts: IntArray, depth: int) -> float:
        """The learned cycle of a whole step of ``kind`` ("ar" or "chain" with ``depth``
        draft positions per request) for requests with ``contexts``."""
        # a hot path (every step, and every decision): memoised per batch size and mean-context
        # step (what the prior is priced at) until the table's ratio of ``kind`` may move
        # (an int64 ndarray is what np.asarray would give back; one request's mean context is
        # its context, read here without mean_context's call: every batch-1 step)
        if type(contexts) is np.ndarray and contexts.dtype == np.int64:
            ctx = contexts
        else:
            ctx = np.asarray(contexts, dtype=np.int64)
        b = ctx.shape[0]
        mean = int(ctx[0]) if b == 1 else mean_context(ctx)
        key = (kind, b, mean // MODE_CONTEXT_STEP, depth)
        stamp = self.table.ratio_epoch
        hit = self._mode_memo.get(key)
        if hit is not None:
            if hit[0] == stamp:
                return hit[1]
            prior = hit[2]  # the prior's cycle of the key never changes: only the ratio moved
        else:
            prior = self.priced.mode(kind, ctx, depth)
        value = prior * float(self.table.ratios(kind, b)[0])
        if len(self._mode_memo) > 256:
            self._mode_memo.clear()
        self._mode_memo[key] = (stamp, value, prior)
        return value


_ONES = np.ones(LATTICE.shape[0])
_ONES.flags.writeable = False
_CELLS = np.zeros(0, np.int64)  # the lattice cell of every total 0 … (grown on demand)


def _cells_of(b: int, top: int) -> IntArray:
    """The lattice cell of every total B … ``top`` (read-only): a slice of one table."""
    global _CELLS
    if _CELLS.shape[0] <= top:
        cells = lattice_index(np.arange(max(top + 1, 2 * _CELLS.shape[0]), dtype=np.int64))
        cells.flags.writeable = False
        _CELLS = cells
    return _CELLS[b : top + 1]


def even_top(b: int, total: int) -> int:
    """How far an even-spread prior is priced to hold ``total`` nodes of B requests: the joint
    horizon, or beyond it (a pass with a prefill chunk, very large trees) the power of two at or
    above ``total``, so a few cached curves serve every such total (the curve's prefix does not
    depend on how far it is priced)."""
    top = max(min(b * 1024, JOINT_HORIZON), b)
    return top if total <= top else 1 << (total - 1).bit_length()


def _riding_room(riding: int) -> int:
    """How far past the chains' own top the stepped decision curve is priced for a pass that
    also carries ``riding`` prefill tokens: ``riding`` rounded up to a power of two (≥ 64), so
    chunks of many sizes share a few cached curves."""
    return 0 if riding <= 0 else max(64, 1 << (int(riding) - 1).bit_length())


def _with_riding(
    cells: IntArray, best_above: FloatArray, riding: int, n: int
) -> tuple[IntArray, FloatArray]:
    """The decision arrays of a pass that also carries ``riding`` prefill tokens, for ``n``
    totals B … (see :meth:`DecisionCurves.joint_decision_curve`): each total's cell is its
    pass's (shifted by ``riding``) and every price is lowered by the chunk's own cost at no
    tree, Ĉ(B + riding) − Ĉ(B), so what a total is charged is what it adds to that pass on top
    of a bare step's cost (still > 0 and non-decreasing: the curve stays its own floor)."""
    sunk = float(best_above[cells[riding]] - best_above[cells[0]])
    return cells[riding : riding + n], best_above - sunk
