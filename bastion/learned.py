"""What the learning controller knows: measured cycle costs and observed acceptance.

Design decision 9: *decide on what was measured; model only what was not.* A GPU's cost curve
has steps (kernel tile and wave choices) that no smooth fit reproduces, so the controller of
:mod:`bastion.controller` does not trust a fitted curve between the points it was fitted on. It
keeps learned corrections of its priors (the first in :mod:`bastion.cycles`, the others in
:mod:`bastion.observed`; re-exported here):

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
import functools
import inspect
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.batch import TreeBatch
from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cycles import (
    LATTICE,
    REFRESH_SHIFT,
    CycleKind,
    CycleTable,
    batch_bucket,
    lattice_index,
    small_median,
    token_lattice,
)
from bastion.errors import BudgetError, CostModelError
from bastion.guard import array, each, integer, is_finite, public
from bastion.interfaces import BatchChoice, CostCurve, CostModel, StepCost, StepLoad
from bastion.observed import (
    AcceptanceCalibration,
    SizeCalibration,
    chain_shadow,
    learn_step,
    shadow_of,
)

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
]  # the table and calibrations live in bastion.cycles and bastion.observed

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
JOINT_HORIZON = 4096  # batch totals the joint decision looks ahead to, beyond its chain
MODE_CONTEXT_STEP = 128  # the priors are priced per this step of (mean) context
SINGLE_PRIOR_SIZES = 1024  # batch 1: the prior is priced for N = 1 … this (or 2^k ×) at once
ANCHOR_STEP = 512  # … at contexts that are multiples of this, interpolated between
PRIMED_CONTEXT = 16384  # start-up prices the batch-1 anchors up to this context (prime)
MAX_PRIMED = 65536  # … and never beyond this (the anchor cache holds 256 entries)
# while speculation's evidence is within this factor of AR's, a drafting stretch measures AR
# again now and then (the AR cycle a drafted step is paired with is otherwise as old as the
# stretch)
RECHECK_WITHIN = 1.25
AR_RECENT = 3  # a drafted step is paired with the median of this many last AR cycles
PriceFn = Callable[[IntArray], FloatArray]


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
    many drafted steps; AR is chosen only once at least half of them were seen, and only while
    their mean is one standard error below 1 + margin (:attr:`speedup_upper` ≤ 1 + margin).
    A drafted step's realised speedup is paired with the AR cycle measured last before it (the
    median of the last :data:`AR_RECENT` AR steps of its batch bucket, the learned AR cycle
    before any): on a machine whose speed drifts, a drafted step and an AR cycle measured at
    different times compare the drift, not the policies. A drafting stretch measures no AR
    cycle, so while the evidence is within :data:`RECHECK_WITHIN` of AR's (or would be at the
    table's AR cycle, when the last AR steps were slower than it) it measures AR again after
    ``probe_every`` drafted steps (two AR steps: a majority of the median), the interval
    doubling after each, up to 64 × ``probe_every``.
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
        if not (is_finite(margin) and margin >= 0):
            raise BudgetError(f"margin must be a finite number ≥ 0; got {margin!r:.80}")
        if isinstance(evidence, bool) or not isinstance(evidence, int) or evidence < 2:
            raise BudgetError(f"evidence must be an integer ≥ 2; got {evidence!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int):
            raise BudgetError(f"explore_every must be an integer ≥ 0; got {explore_every!r}")
        if explore_every < 0:
            raise BudgetError(f"explore_every must be an integer ≥ 0; got {explore_every!r}")
        if acceptance is not None and not isinstance(acceptance, AcceptanceCalibration):
            raise BudgetError(
                f"acceptance must be an AcceptanceCalibration or None; got {acceptance!r:.80}"
            )
        self.prior = prior
        self.table = CycleTable(window)
        self.acceptance = acceptance or AcceptanceCalibration()
        self.sizes = SizeCalibration()
        self.probe_every, self.margin, self.evidence = probe_every, margin, evidence
        self._realised: list[float] = []  # the last ``evidence`` drafted steps' speedups
        # per batch bucket: the measured/prior ratios of the last AR_RECENT AR steps
        self._ar_recent: dict[int, list[float]] = {}
        self._since_ar = 0  # drafted steps since the last AR step
        self._recheck_interval = probe_every  # … after which a thin margin measures AR again
        self._recheck_left = 0  # AR steps the current re-measurement still takes
        self.startup_s = 0.0  # device seconds spent by calibrate_cycles
        self.speedup = math.inf  # mean realised speedup of recent drafted steps over AR (∞: too
        # few of them yet); AR stands while its upper bound (+ one standard error) is ≤ 1 +
        # margin (the bound is the mean itself while the mean is above that)
        self.speedup_upper = math.inf
        self._since_draft = 0
        self._chain = [0.0, 0.0, 0.0]  # the chain's Σ realised τ, Σ Â, steps (forgotten)
        self._probe_interval = probe_every
        self.always_draft = False  # e.g. while recording traces: never skip the drafter
        self._drafted = 0
        self.explore_every = explore_every
        self._decision: tuple[str, int, int, float] | None = None  # kind, B, total, cycle
        self._reused = 0  # steps that repeated it since
        self._interval = 1  # steps it stands for (see decided)
        # the top-1 calibrated marginals of the last step's trees (the chain's shadow)
        self.last_top1: FloatArray | None = None
        # … and the chain's Â less its root cut at every depth ([B, depth], see shadow_of)
        self.last_chain: FloatArray | None = None
        # the controller's plan for the next step, made before drafting: (B, explore, repeat)
        self.pending_plan: tuple[int, bool, tuple[str, int, float] | None] | None = None
        # the controller's last AR choice (batch size, predicted cycle, the choice): reused
        # while both are the same, since an AR step chooses it every step while AR stands
        self.last_ar_choice: tuple[int, float, BatchChoice] | None = None
        self._joint = getattr(prior, "joint_cost_curve", None)
        if self._joint is not None and _takes_growth(self._joint):  # priced entries only
            self._joint = functools.partial(self._joint, growth=False)
        self._candidates: dict[
            tuple[int, int], tuple[int, IntArray, IntArray, FloatArray, float]
        ] = {}
        # what candidate_cycles multiplies: the table's ratio and pessimism per lattice cell
        # and AR ratio (per refresh), the prior's cycle per size and AR cycle (per context step)
        self._single_table: tuple[int, FloatArray, FloatArray, float] | None = None
        self._mode_memo: dict[tuple[str, int, int, int], tuple[tuple[int, int, int], float]] = {}
        self._single_priced: dict[
            tuple[int, int], tuple[IntArray, IntArray, FloatArray, float]
        ] = {}
        # the priors, per (what, batch size, …) and context step / anchor (see _anchored)
        self._lerped: dict[tuple[tuple[Any, ...], int], FloatArray] = {}
        self._anchors: dict[tuple[tuple[Any, ...], int], FloatArray] = {}
        self._ar_memo: dict[tuple[int, int], float] = {}  # the AR prior (see _ar_prior)
        self._joint_cache: dict[tuple[int, int, int], tuple[Any, ...]] = {}
        self._cells: dict[tuple[int, int], IntArray] = {}  # lattice cell of totals B … top
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

    @public(error=BudgetError, max_tree_size=integer(1, MAX_TREE_SIZE))
    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        """The learned cycle of one request's tree, N = 1 … max: the prior's curve scaled by
        the cells of the batch's bucket at the pass's total (the co-batched trees' sizes plus
        N; batch 1 has none) — the per-request rule's view of the learned table."""
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

    @public(error=BudgetError, tree_size=integer(1, MAX_TREE_SIZE))
    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        """The prior's breakdown with its verification scaled so the total is the learned one."""
        cost = self.prior.step_cost(tree_size, load)
        totals = np.asarray([tree_size + sum(r.tree_size for r in load.co_batched)])
        ratio = float(self.table.ratios("tree", load.batch_size)[lattice_index(totals)[0]])
        extra = cost.total_s * (ratio - 1.0)
        return StepCost(cost.draft_s, cost.prep_s, cost.verify_s + extra, cost.breakdown)

    learns_whole_steps = True  # the engine reports steps (observe_step), not verify passes

    @public(error=BudgetError, tree_size=integer(1, MAX_TREE_SIZE))
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
    @public(
        error=BudgetError,
        totals=array(1, lo=1, hi=MAX_TREE_SIZE, nonempty=True, whole=True),
        cost=array(1, nonempty=True),
        lengths=("totals", "cost"),
    )
    def stepped(totals: IntArray, cost: FloatArray) -> FloatArray:
        """Each entry priced at the cheapest lattice point at or above it (within the priced
        range; its last entry counts as one): non-decreasing, constant within a lattice cell.
        ``totals`` are consecutive token counts, ``cost[j]`` the price at ``totals[j]``."""
        totals = np.asarray(totals, dtype=np.int64)
        cost = np.asarray(cost, dtype=np.float64)
        if np.any(np.diff(totals) != 1):
            raise BudgetError(f"totals must be consecutive token counts; got {totals!r:.80}")
        cell_end = LATTICE[lattice_index(totals)]
        end = np.minimum(cell_end - totals[0], cost.shape[0] - 1)
        at_end = cost[end]
        return np.minimum.accumulate(at_end[::-1])[::-1]

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
                prior, ar_prior = self._single(int(context_len), int(n_max))
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
        key = (b, _mean_context(ctx) // MODE_CONTEXT_STEP, top)
        stamp = (self.table.stamp("tree"), self.sizes.version >> REFRESH_SHIFT)
        hit = self._joint_cache.get(key)
        if hit is None or hit[0] != stamp:
            even = self._even_prior(ctx, top)
            n_cells = int(lattice_index([top])[0]) + 1
            points = LATTICE[:n_cells]
            # the factors do not depend on the context: a new context step reuses them
            units = self._joint_cache.get((b, -1, n_cells))
            if units is None or units[0] != stamp:
                units = self._joint_cache[(b, -1, n_cells)] = (
                    stamp,
                    self._deciding(points, np.ones(n_cells), b),
                )
            unit = units[1]
            # a lattice point beyond ``top`` (the last cell's) is priced at ``top`` itself
            reach = np.minimum(points, top)
            ok = reach >= b
            at_point = np.full(n_cells, np.inf)
            at_point[ok] = even[reach[ok] - b] * unit[ok]
            best_above = np.minimum.accumulate(at_point[::-1])[::-1]
            if len(self._joint_cache) > 64:
                self._joint_cache.clear()
            hit = self._joint_cache[key] = (stamp, best_above)
        cells = self._cells.get((b, top))
        if cells is None:
            if len(self._cells) > 64:
                self._cells.clear()
            totals = np.arange(b, top + 1, dtype=np.int64)
            cells = self._cells[(b, top)] = lattice_index(totals)
        return cells, hit[1]

    def joint_cycle(self, context_lens: IntArray, total: int) -> float:
        """Batch > 1: the learned cycle of the batch with ``total`` tree nodes spread evenly
        (what a step of that total is predicted to take; the decision curve also carries the
        pessimism and the size correction)."""
        ctx = np.asarray(context_lens, dtype=np.int64)
        b = ctx.shape[0]
        even = self._even_prior(ctx, _even_top(b, total))
        return float(self._learned(np.array([total]), even[total - b : total - b + 1], b)[0])

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
        """The prior's batch cycle for totals B … ``top`` along an even spread."""
        b = ctx.shape[0]
        key, mean = ("even", b, top), _mean_context(ctx)
        # a hot path (every batched step observes its cycle against it): a cached step is read
        # without building its price
        hit = self._lerped_at(key, mean)
        if hit is not None:
            return hit
        return self._anchored(key, b, mean, lambda c: self._prior(c, None, top).cycle)

    def mode_cycle(self, kind: CycleKind, contexts: IntArray, depth: int) -> float:
        """The learned cycle of a whole step of ``kind`` ("ar" or "chain" with ``depth``
        draft positions per request) for requests with ``contexts``."""
        ctx = np.asarray(contexts, dtype=np.int64)
        # a hot path (every step, and every decision): memoised per batch size and mean-context
        # step (what the prior is priced at) until the table's ratio of ``kind`` may move
        key = (kind, ctx.shape[0], _mean_context(ctx) // MODE_CONTEXT_STEP, depth)
        stamp = self.table.ratio_stamp(kind)
        hit = self._mode_memo.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = self._mode_cycle(kind, ctx, depth)
        if len(self._mode_memo) > 256:
            self._mode_memo.clear()
        self._mode_memo[key] = (stamp, value)
        return value

    def _mode_cycle(self, kind: CycleKind, ctx: IntArray, depth: int) -> float:
        b = ctx.shape[0]
        if kind == "ar":
            prior = self._ar_prior(ctx)
        elif b == 1:  # the chain's causal pass is priced as the tree of its size
            prior = float(self._single(int(ctx[0]), depth + 1)[0][depth])
        else:
            sizes = np.full(b, depth + 1, np.int64)
            prior = float(
                self._anchored(
                    ("chain", b, depth),
                    b,
                    _mean_context(ctx),
                    lambda c: self._prior(c, sizes, b * (depth + 1)).cycle[-1:],
                )[0]
            )
        return prior * float(self.table.ratios(kind, b)[0])

    def _single(self, context_len: int, n: int) -> tuple[FloatArray, float]:
        """Batch 1: the prior's whole cycle for N = 1 … (at least) ``n`` and its AR cycle."""
        both = self._single_both(int(context_len), n)
        return both[:-1], float(both[-1])

    def _single_both(self, context_len: int, n: int) -> FloatArray:
        """:meth:`_single` as one array, the AR cycle last: a hot path (every batch-1 step
        observes its cycle against it), so a cached step is read without building its price."""
        top = SINGLE_PRIOR_SIZES
        while top < n:
            top *= 2
        key = ("single", top)
        hit = self._lerped_at(key, context_len)
        if hit is not None:
            return hit
        return self._anchored(key, 1, context_len, self._single_price(top))

    def _single_price(self, top: int) -> PriceFn:
        """The batch-1 prior's pricing of N = 1 … ``top`` and AR."""

        def price(c: IntArray) -> FloatArray:
            cc = self.prior.cost_curve(top, StepLoad(int(c[0])))
            return np.append(cc.draft_s + cc.prep_s + cc.verify_s[:top], cc.ar_step_s)

        return price

    def prime(self, max_context: int = PRIMED_CONTEXT) -> None:
        """Price the batch-1 prior at every anchor up to ``max_context`` tokens now (start-up),
        instead of when a decode first reaches it: each anchor is a whole roofline curve,
        about 0.5 ms of host time that would otherwise land on one decode step. The values
        are the ones pricing them later would give (a cache, filled early)."""
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 0:
            raise BudgetError(f"max_context must be an integer ≥ 0; got {max_context!r}")
        price = self._single_price(SINGLE_PRIOR_SIZES)
        for index in range(min(max_context, MAX_PRIMED) // ANCHOR_STEP + 2):
            self._anchor(("single", SINGLE_PRIOR_SIZES), index, 1, price)

    def _ar_prior(self, ctx: IntArray) -> float:
        """The prior's AR cycle (B requests, their mean context's step): a hot path, priced on
        every AR step and every decision, so memoised per (B, context step) — the value
        :meth:`_anchored` gives there, which never changes."""
        b = ctx.shape[0]
        mean = int(ctx[0]) if b == 1 else _mean_context(ctx)
        key = (b, mean // MODE_CONTEXT_STEP)
        hit = self._ar_memo.get(key)
        if hit is not None:
            return hit
        if b == 1:
            value = self._single(mean, 1)[1]
        else:
            zero = np.zeros(0, np.int64)
            value = float(
                self._anchored(
                    ("ar", b),
                    b,
                    mean,
                    lambda c: np.array([self._prior_joint(c, zero).ar_step_s]),
                )[0]
            )
        if len(self._ar_memo) > 512:
            self._ar_memo.clear()
        self._ar_memo[key] = value
        return value

    def _anchored(
        self, key: tuple[Any, ...], b: int, mean_context: int, price: PriceFn
    ) -> FloatArray:
        """A prior quantity (``price`` of B requests' contexts, an array) at the middle of the
        mean context's step of :data:`MODE_CONTEXT_STEP` tokens, interpolated linearly
        between its values at the multiples of :data:`ANCHOR_STEP` tokens on either side.

        Cached per ``key`` and step, so what a step observes is divided by the same prior the
        decision multiplies by, and the prior — the dear part — is priced once per anchor:
        within an anchor step it is linear in the context but for the roofline's few
        compute/memory crossings (≤ 1.3 % off on the shipped models, tested)."""
        step = mean_context // MODE_CONTEXT_STEP
        hit = self._lerped_at(key, mean_context)
        if hit is None:
            mid = step * MODE_CONTEXT_STEP + MODE_CONTEXT_STEP // 2
            lo = mid // ANCHOR_STEP
            w = (mid - lo * ANCHOR_STEP) / ANCHOR_STEP
            hit = (1.0 - w) * self._anchor(key, lo, b, price) + w * self._anchor(
                key, lo + 1, b, price
            )
            hit.flags.writeable = False
            if len(self._lerped) > 512:
                self._lerped.clear()
            self._lerped[(key, step)] = hit
        return hit

    def _lerped_at(self, key: tuple[Any, ...], mean_context: int) -> FloatArray | None:
        """What :meth:`_anchored` holds for ``key`` at the mean context's step, or None (a
        caller whose price is dear to build looks here first)."""
        return self._lerped.get((key, mean_context // MODE_CONTEXT_STEP))

    def _anchor(self, key: tuple[Any, ...], index: int, b: int, price: PriceFn) -> FloatArray:
        hit = self._anchors.get((key, index))
        if hit is None:
            hit = np.asarray(price(np.full(b, index * ANCHOR_STEP, np.int64)), dtype=np.float64)
            if len(self._anchors) > 256:
                self._anchors.clear()
            self._anchors[(key, index)] = hit
        return hit

    # -- learning ----------------------------------------------------------------------------

    def chain_ratio(self) -> float:
        """Realised/predicted τ of the chain so far — its own steps and its shadow on every
        tree step (:func:`bastion.observed.chain_shadow`) — with ``prior_weight`` pseudo-steps
        of ratio 1, as the size calibration."""
        real, pred, steps = self._chain
        prior = self.sizes.prior_weight * (pred / steps if steps else 0.0)
        return (real + prior) / (pred + prior) if pred + prior > 0 else 1.0

    def _observe_chain(self, realised: float, predicted: float) -> None:
        """One step's (or one shadow's) realised and predicted chain τ, forgotten as the size
        calibration forgets."""
        d = self.sizes.decay
        self._chain[0] = d * self._chain[0] + realised
        self._chain[1] = d * self._chain[1] + predicted
        self._chain[2] = d * self._chain[2] + 1.0

    def explore_now(self) -> bool:
        """Whether this drafted step should verify a larger tree than the best one: every
        ``explore_every``-th drafted step from the first on (deterministic, so the same run
        repeats)."""
        self._drafted += 1  # the first drafted step explores too: it teaches the most then
        return self.explore_every > 0 and self._drafted % self.explore_every == 1

    def repeat_decision(self, batch_size: int) -> tuple[str, int, float] | None:
        """The last full decision's (kind, total nodes, predicted cycle) while it may stand for
        this step (see :meth:`decided`), else None: decide afresh. A batch size of another
        bucket (:func:`batch_bucket`) or an AR step between also ends it; within the bucket a
        tree total is scaled with the batch size (a request that left or joined)."""
        last = self._decision
        if (
            last is None
            or batch_bucket(last[1]) != batch_bucket(batch_size)
            or self._reused + 1 >= self._interval
        ):
            return None
        self._reused += 1
        if last[1] == batch_size:
            return last[0], last[2], last[3]
        # a request left or joined: the same decision per request (a tree total scaled)
        return last[0], max(batch_size, round(last[2] * batch_size / last[1])), last[3]

    def last_decision_kind(self) -> str | None:
        """The kind of the last full decision ("tree" or "chain"), None after an AR step."""
        return None if self._decision is None else self._decision[0]

    def decided(self, kind: str, batch_size: int, total: int, cycle_s: float, every: int) -> None:
        """Record a full decision. Deciding is the controller's dear part and the best kind and
        total move slowly, so a decision that agrees with the previous one (same kind and batch
        bucket, nodes per request within ±25 %) doubles the number of steps it stands for, up
        to ``every``; one that differs stands for one step (the next step decides again)."""
        last = self._decision
        same = (
            last is not None
            and last[0] == kind
            and batch_bucket(last[1]) == batch_bucket(batch_size)
            and 0.8 * last[2] / last[1] <= total / batch_size <= 1.25 * last[2] / last[1]
        )
        self._interval = min(2 * self._interval, every) if same else 1
        self._decision = (kind, batch_size, total, cycle_s)
        self._reused = 0

    def wants_draft(self, batch_size: int) -> bool:
        """Whether the next step should draft: yes unless AR stands (:attr:`speedup_upper` ≤
        1 + margin; untried speculation does not), but for an AR step every
        ``probe_every``-th step since the last AR step while speculation's margin is within
        :data:`RECHECK_WITHIN` (the interval doubling after each, up to 64 × ``probe_every``,
        until speculation stands anew); while AR stands, every ``probe_every``-th step, the
        interval doubling after each probe that confirms it (up to 64 × ``probe_every``) and
        halving after each that finds speculation faster (down to ``probe_every``)."""
        if self.always_draft:
            return True
        threshold = 1.0 + self.margin
        if self.speedup_upper > threshold:
            if self._recheck_left:  # measuring AR again
                self._recheck_left -= 1
                return False
            if self._since_ar + 1 < self._recheck_interval or self.speedup == math.inf:
                return True
            # the AR cycle this stretch's steps are paired with is as old as the stretch: if
            # the margin is thin, or would be at the table's AR cycle (the last AR steps may
            # have been a slow spell), measure it again
            # (no AR step since the stretch began: the ratio its steps were paired with)
            paired = self._recent_ar_ratio(batch_size)
            level = 1.0
            if paired is not None:  # paired with the last AR steps, not the table
                level = min(1.0, float(self.table.ratios("ar", batch_size)[0]) / paired)
            if self.speedup * level > RECHECK_WITHIN * threshold:
                return True
            self._recheck_interval = min(2 * self._recheck_interval, 64 * self.probe_every)
            self._recheck_left = AR_RECENT // 2  # this step and as many more
            return False
        return self._since_draft + 1 >= self._probe_interval

    def _recent_ar_ratio(self, b: int) -> float | None:
        """The median measured/prior ratio of the last AR steps of ``b``'s batch bucket, or None
        before any."""
        recent = self._ar_recent.get(batch_bucket(b))
        return small_median(recent) if recent else None

    def _ar_paired(self, contexts: IntArray, b: int) -> float:
        """The AR cycle a drafted step of ``b`` requests is paired with: the prior's AR cycle at
        its contexts × the median ratio of the last AR steps of its batch bucket (the learned
        AR cycle before any)."""
        ratio = self._recent_ar_ratio(b)
        if ratio is None:
            return self.mode_cycle("ar", contexts, 0)
        return self._ar_prior(np.asarray(contexts, dtype=np.int64)) * ratio

    def observe_cycle(
        self, kind: CycleKind, contexts: IntArray, sizes: IntArray, cycle_s: float
    ) -> float:
        """Fold one measured cycle into the table; returns the ratio it recorded."""
        total = int(np.add.reduce(np.asarray(sizes, dtype=np.int64)))
        return self._observe_total(kind, np.asarray(contexts, dtype=np.int64), total, cycle_s)

    def _observe_total(self, kind: CycleKind, ctx: IntArray, total: int, cycle_s: float) -> float:
        """:meth:`observe_cycle` of a step with ``total`` tree nodes (roots included)."""
        b = ctx.shape[0]
        if kind == "ar":
            prior = self._ar_prior(ctx)
        elif b == 1:
            prior = float(self._single_both(int(ctx[0]), total)[total - 1])
        else:  # the even-spread prior the joint decision prices with
            prior = float(self._even_prior(ctx, _even_top(b, total))[total - b])
        ratio = cycle_s / prior if prior > 0 else math.nan
        self.table.observe(kind, b, total, ratio)
        return ratio

    def observe_step(
        self,
        kind: CycleKind,
        contexts: IntArray,
        trees: TreeBatch,
        committed: IntArray,
        accepted_nodes: IntArray,
        cycle_s: float,
        preparation: str = "topk",
    ) -> None:
        """The engine's hook: one step's kind, trees, committed lengths, accepted paths (node
        indices within each tree, root excluded, request after request), measured cycle and
        preparation ("topk", "argmax" or "none"). A chain chosen by a decision step (top-K
        preparation and the decision's host time) does not price the chain: choosing the chain
        means the standing chain's cycle (argmax preparation, no decision), which that step's
        cycle would overstate; its acceptance still counts."""
        if not (math.isfinite(cycle_s) and cycle_s > 0):
            return
        if kind == "ar":  # the hot path while AR stands: a root per request, nothing drafted
            ctx = np.asarray(contexts, dtype=np.int64)
            ratio = self._observe_total("ar", ctx, ctx.shape[0], cycle_s)
            if ratio > 0:  # NaN (a degenerate prior) is not
                recent = self._ar_recent.setdefault(batch_bucket(ctx.shape[0]), [])
                recent.append(ratio)
                if len(recent) > AR_RECENT:
                    del recent[0]
            self._since_draft += 1
            self._since_ar = 0
            self._decision = None  # the next drafted step decides afresh
            return
        offsets = trees.offsets
        b = offsets.shape[0] - 1
        if kind != "chain" or preparation == "argmax":
            ctx = np.asarray(contexts, dtype=np.int64)
            self._observe_total(kind, ctx, int(offsets[-1]), cycle_s)
        self._since_draft = 0
        self._since_ar += 1
        if kind == "tree":
            learned = learn_step(self.acceptance, self.sizes, trees, accepted_nodes, committed)
            if learned is None:
                self.acceptance.observe(trees, accepted_nodes, committed)
                self.sizes.observe(trees, accepted_nodes, committed)
            top1, self.last_top1 = self.last_top1, None
            chain, self.last_chain = self.last_chain, None
            if top1 is not None and top1.shape[0] == b and top1.shape[1] > 0:
                # what the chain would have committed (it is rarely run once trees win)
                if learned is not None and chain is not None:
                    self._observe_chain(*shadow_of(*learned, chain))
                else:
                    self._observe_chain(*chain_shadow(trees, accepted_nodes, committed, top1))
        elif kind == "chain":  # what the chain's Â realised, as the size calibration does
            if learn_step(self.acceptance, None, trees, accepted_nodes, committed) is None:
                self.acceptance.observe(trees, accepted_nodes, committed)
            self._observe_chain(float(np.add.reduce(committed)), float(trees.scores.sum()))
        realised = float(np.add.reduce(committed)) * self._ar_paired(contexts, b) / (b * cycle_s)
        threshold = 1.0 + self.margin
        probing = self.speedup_upper <= threshold
        recent = self._realised
        recent.append(realised)
        if len(recent) > self.evidence:
            del recent[0]
        n = len(recent)
        # one unlucky step must not switch decoding off: AR needs evidence/2 steps of it, and
        # their mean one standard error below 1 (a step's realised speedup is skewed and
        # noisy: most commit little, a few a lot)
        if 2 * n < self.evidence:
            self.speedup = self.speedup_upper = math.inf
        else:
            total = sum(recent)
            self.speedup = self.speedup_upper = mean = total / n
            if mean <= threshold:  # (above it, so is the bound: the spread is not needed)
                sq = sum(map(operator.mul, recent, recent))
                self.speedup_upper += math.sqrt(max(0.0, sq - total * mean) / max(n - 1, 1) / n)
        if self.speedup_upper > threshold:
            if probing:  # speculation stands anew: its AR cycle is measured again soon
                self._recheck_interval = self.probe_every
            self._probe_interval = self.probe_every
            return
        if probing:  # AR still stands: look again less often, or sooner when this probe
            # found speculation faster (the machine may have changed: its evidence is then
            # refreshed a probe at a time, every probe_every steps, not ever more rarely)
            if realised > threshold:
                self._probe_interval = max(self._probe_interval // 2, self.probe_every)
            else:
                self._probe_interval = min(2 * self._probe_interval, 64 * self.probe_every)


MeasureFn = Callable[[CycleKind, IntArray, IntArray], float]


def _takes_growth(joint: Callable[..., Any]) -> bool:
    """Whether a prior's ``joint_cost_curve`` can skip its growth proof (``growth=False``, as
    :class:`bastion.cost.costmodel.RooflineCostModel`'s): the learned model never reads it."""
    try:
        parameter = inspect.signature(joint).parameters.get("growth")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY


def _even_top(b: int, total: int) -> int:
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
    totals B … (see :meth:`LearnedCostModel.joint_decision_curve`): each total's cell is its
    pass's (shifted by ``riding``) and every price is lowered by the chunk's own cost at no
    tree, Ĉ(B + riding) − Ĉ(B), so what a total is charged is what it adds to that pass on top
    of a bare step's cost (still > 0 and non-decreasing: the curve stays its own floor)."""
    sunk = float(best_above[cells[riding]] - best_above[cells[0]])
    return cells[riding : riding + n], best_above - sunk


def _mean_context(ctx: IntArray) -> int:
    """The mean context of a step's requests, rounded down."""
    return int(ctx[0]) if ctx.shape[0] == 1 else int(np.add.reduce(ctx)) // ctx.shape[0]


@public(
    error=BudgetError,
    batch_sizes=each(integer(1, 1 << 10)),
    n_max=integer(1, 1 << 20),
    max_total=integer(1, 1 << 20),
    context_len=integer(lo=0),
    depth=integer(0, 1024),
    repeats=integer(1, 1000),
)
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
    if 1 in batch_sizes:  # host work a decode at batch 1 would otherwise pay mid-stream
        model.prime()
    return {"cells": len(plan), "passes": total, "device_s": spent}


@public(error=BudgetError, total=integer(0, 1 << 30), batch=integer(1, 1 << 20))
def even_sizes(total: int, batch: int) -> IntArray:
    """``total`` tree nodes spread over ``batch`` requests as evenly as possible."""
    sizes = np.full(batch, total // batch, np.int64)
    sizes[: total % batch] += 1
    return sizes
