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

Its parts: the prior it corrects, priced at anchors (:mod:`bastion.learned_prior`), the
decision curves (:mod:`bastion.learned_curves`) and what it learns from each step
(:mod:`bastion.learned_evidence`); this module holds the model's face (the ``CostModel``
protocol) and its start-up calibration (:func:`calibrate_cycles`).

What this module does not do: choose trees (:mod:`bastion.controller`) or time anything itself
(the engine and the simulator report what they measured).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cycles import (
    LATTICE,
    CycleKind,
    CycleTable,
    batch_bucket,
    lattice_index,
    token_lattice,
)
from bastion.errors import BudgetError, CostModelError
from bastion.guard import array, each, integer, is_finite, public
from bastion.interfaces import BatchChoice, CostCurve, CostModel, StepCost, StepLoad
from bastion.learned_evidence import StepEvidence
from bastion.learned_prior import PRIMED_CONTEXT, PricedPrior
from bastion.observed import AcceptanceCalibration, SizeCalibration

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


class LearnedCostModel(StepEvidence):
    """A prior :class:`CostModel` corrected by measured cycles and observed acceptance.

    Implements ``CostModel`` (``step_cost``, ``cost_curve``, ``observe``) and the joint
    protocol (``joint_cost_curve``) with the learned whole-cycle estimate; the learning
    controller reads :meth:`candidate_cycles` / :meth:`joint_decision_curve` (stepped to the
    cheapest measured lattice point at or above each size), :meth:`mode_cycle` (the AR and
    chain cycles) and :attr:`acceptance`. :meth:`observe_step` is the engine's hook: every
    step's measured cycle and accepted paths.

    ``probe_every``: while AR is faster, draft every so many steps to see whether that changed
    (bounded exploration, deterministic; the interval doubles after each probe that confirms
    AR, and is at least the drafted steps' mean loss over
    :data:`~bastion.learned_evidence.PROBE_SHARE`). ``margin``: speculate only when its
    realised speedup over AR exceeds 1 + margin. ``evidence``: the realised speedup is the mean
    over the last so many drafted steps; AR is chosen only once at least half of them were
    seen, and only while their mean is one standard error below 1 + margin
    (:attr:`speedup_upper` ≤ 1 + margin), or sooner, after
    :data:`~bastion.learned_evidence.TURNOVER_EVIDENCE` of them, where their mean is
    :data:`~bastion.learned_evidence.CLEAR_LOSS_SE` standard errors below (1 + margin) /
    :data:`~bastion.learned_evidence.RECHECK_WITHIN` (a clear loss). The evidence and the
    probe and recheck intervals are kept per batch bucket (:func:`bastion.cycles.batch_bucket`).
    A drafted step's realised speedup is paired with the AR cycle measured last before it (the
    median of the last :data:`~bastion.learned_evidence.AR_RECENT` AR steps of its batch
    bucket, the learned AR cycle before any): on a machine whose speed drifts, a drafted step
    and an AR cycle measured at different times compare the drift, not the policies. A drafting
    stretch measures no AR cycle, so while the evidence is within
    :data:`~bastion.learned_evidence.RECHECK_WITHIN` of AR's (or would be at the table's AR
    cycle, when the last AR steps were slower than it) it measures AR again after
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
        self.priced = PricedPrior(prior)  # the prior's cycles, priced at anchors and cached
        self.table = CycleTable(window)
        self.acceptance = acceptance or AcceptanceCalibration()
        self.sizes = SizeCalibration()
        self.startup_s = 0.0  # device seconds spent by calibrate_cycles
        self._start_evidence(probe_every, margin, evidence, explore_every)
        self._start_curves()
        # the controller's plan for the next step, made before drafting: (B, explore, repeat)
        self.pending_plan: tuple[int, bool, tuple[str, int, float] | None] | None = None
        # the controller's last AR choice (batch size, predicted cycle, the choice): reused
        # while both are the same, since an AR step chooses it every step while AR stands
        self.last_ar_choice: tuple[int, float, BatchChoice] | None = None
        self.mode = getattr(prior, "mode", "learned")

    def copy(self) -> LearnedCostModel:
        """An independent copy (what one run learns does not leak into another)."""
        return copy.deepcopy(self)

    def prime(self, max_context: int = PRIMED_CONTEXT) -> None:
        """Price the batch-1 prior at every anchor up to ``max_context`` tokens now (start-up),
        instead of when a decode first reaches it: each anchor is a whole roofline curve,
        about 0.5 ms of host time that would otherwise land on one decode step. The values
        are the ones pricing them later would give (a cache, filled early)."""
        self.priced.prime(max_context)

    # -- CostModel protocol ------------------------------------------------------------------

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
        cc = self.priced.joint(ctx, np.asarray(grow, dtype=np.int64))
        b = ctx.shape[0]
        totals = b + np.arange(cc.verify_s.shape[0], dtype=np.int64)
        learned = self._learned(totals, cc.draft_s + cc.prep_s + cc.verify_s, b)
        return CostCurve(
            cc.draft_s,
            cc.prep_s,
            learned - cc.draft_s - cc.prep_s,
            cc.ar_step_s * float(self.table.ratios("ar", b)[0]),
        )

    # -- the stepped rule (public here; bastion.learned_curves prices the decisions so) ------

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


MeasureFn = Callable[[CycleKind, IntArray, IntArray], float]


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
