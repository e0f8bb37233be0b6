"""What the learning controller learns from each step, and what that says about its next one.

:class:`StepEvidence` is the part of :class:`bastion.learned.LearnedCostModel` the engine feeds
(:meth:`StepEvidence.observe_step`): every step's measured cycle goes into the
:class:`bastion.cycles.CycleTable` (as its ratio to the prior), a tree step's accepted paths
into the acceptance and size calibrations of :mod:`bastion.observed` and into the chain's shadow
(what the chain would have committed), and every drafted step's realised speedup over AR into
the evidence for or against speculation. From these the controller learns whether the next step
drafts or runs AR (:meth:`StepEvidence.wants_draft`), whether it explores a larger tree
(:meth:`StepEvidence.explore_now`) and whether the last decision still stands
(:meth:`StepEvidence.repeat_decision`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from bastion.batch import TreeBatch
from bastion.cycles import CycleKind, batch_bucket, small_median
from bastion.learned_curves import DecisionCurves, even_top
from bastion.observed import AcceptanceCalibration, chain_shadow, learn_step, shadow_of

__all__: list[str] = []  # a part of bastion.learned's LearnedCostModel, public there

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
# while speculation's evidence is within this factor of AR's, a drafting stretch measures AR
# again now and then (the AR cycle a drafted step is paired with is otherwise as old as the
# stretch)
RECHECK_WITHIN = 1.25
AR_RECENT = 3  # a drafted step is paired with the median of this many last AR cycles
# a new text at batch 1 restarts the evidence for AR (StepEvidence.wants_draft_for): this many
# of its drafted steps judge it, not evidence/2 (where AR wins, each new text costs so few)
TURNOVER_EVIDENCE = 3
# … and as few already decide for AR wherever speculation lost by far: their mean this many
# standard errors below (1 + margin) / RECHECK_WITHIN (at a batch size where a drafted step costs
# twice an AR step, each of the evidence/2 drafted steps otherwise spent costs one)
CLEAR_LOSS_SE = 3.0
# while AR stands, the drafted steps that look again (probes) may cost at most this share of
# AR's time: a probe that lost L AR steps (its cycle in AR steps less the tokens it committed
# per request) is followed by at least L / PROBE_SHARE steps before the next (on the CPU demo
# pair at batch 8 a probe — a chain over every request plus the drafter taking in every
# skipped step's features — costs about 5 AR steps: probes 16 steps apart would cost 30 %)
PROBE_SHARE = 0.01
# what the evidence for or against speculation is, kept per batch bucket (batch_bucket): a
# drafter that pays at batch 1 may cost twice what it saves at batch 8, so the evidence gathered
# at one batch size says little about another
_BUCKET_STATE = (
    "_realised",
    "_losses",
    "speedup",
    "speedup_upper",
    "_recheck_interval",
    "_recheck_left",
    "_since_ar",
    "_since_draft",
    "_probe_interval",
    "_fresh",
)
_UPPER = _BUCKET_STATE.index("speedup_upper")


class StepEvidence(DecisionCurves):
    """What each step teaches (a part of ``LearnedCostModel``, over its decision curves).

    :meth:`_start_evidence` sets up what nothing has been observed yet looks like; the
    parameters ``probe_every``, ``margin``, ``evidence`` and ``explore_every`` are
    :class:`bastion.learned.LearnedCostModel`'s (checked there).
    """

    acceptance: AcceptanceCalibration

    def _start_evidence(
        self, probe_every: int, margin: float, evidence: int, explore_every: int
    ) -> None:
        """Nothing observed yet."""
        self.probe_every, self.margin, self.evidence = probe_every, margin, evidence
        self._realised: list[float] = []  # the last ``evidence`` drafted steps' speedups
        self._losses: list[float] = []  # … and what each cost beyond AR, in AR steps
        self._ar = ARRatios()  # per batch bucket: the last AR steps' measured/prior ratios
        self._since_ar = 0  # drafted steps since the last AR step
        self._recheck_interval = probe_every  # … after which a thin margin measures AR again
        self._recheck_left = 0  # AR steps the current re-measurement still takes
        self.speedup = math.inf  # mean realised speedup of recent drafted steps over AR (∞: too
        # few of them yet); AR stands while its upper bound (+ one standard error) is ≤ 1 +
        # margin (the bound is the mean itself while the mean is above that)
        self.speedup_upper = math.inf
        self._since_draft = 0
        self._chain = [0.0, 0.0, 0.0]  # the chain's Σ realised τ, Σ Â, steps (forgotten)
        self._probe_interval = probe_every
        self._drafted_for: int | None = None  # at batch 1: the request of the last drafted step
        self._fresh = False  # the evidence restarted for a new text: TURNOVER_EVIDENCE judges it
        self._bucket = 0  # the batch bucket the evidence above belongs to
        self._stored: dict[int, tuple[object, ...]] = {}  # … and that of the other buckets
        self._untried = _state_copy(getattr(self, n) for n in _BUCKET_STATE)  # a new bucket's
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
        # the merged order of the last step's compiled forest (see learn_step), or b""
        self.merge_hint = b""

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
        bucket = batch_bucket(batch_size)
        if bucket != self._bucket:  # (_evidence_for's own first test, without its call)
            _evidence_for(self, bucket)
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
            paired = self._ar.median(bucket)  # the last AR steps' median ratio, or None before any
            level = 1.0
            if paired is not None:  # paired with the last AR steps, not the table
                level = min(1.0, float(self.table.ratios("ar", batch_size)[0]) / paired)
            if self.speedup * level > RECHECK_WITHIN * threshold:
                return True
            self._recheck_interval = min(2 * self._recheck_interval, 64 * self.probe_every)
            self._recheck_left = AR_RECENT // 2  # this step and as many more
            return False
        return self._since_draft + 1 >= self._probe_interval

    def wants_draft_for(self, request_ids: IntArray) -> bool:
        """:meth:`wants_draft` for a step of these requests. At batch 1, while AR stands, a
        request other than the last drafted step's starts the evidence afresh, as a run's start
        does: a drafter's acceptance moves with the text (on the CPU demo pair a request's mean
        committed tokens per step ranges 1.7–6.3 and consecutive steps correlate at 0.7), so
        the evidence for AR, gathered on a text that has left, says little about the new one,
        which would otherwise get one probe in many steps. :data:`TURNOVER_EVIDENCE` drafted
        steps of the new text then judge it (AR again if their mean is one standard error
        below 1 + margin)."""
        b = request_ids.shape[0]
        if b == 1:
            _evidence_for(self, 0)
            rid = int(request_ids[0])
            if (
                self._drafted_for is not None
                and rid != self._drafted_for
                and self.speedup_upper <= 1.0 + self.margin
            ):
                self._realised.clear()
                self._losses.clear()
                self._fresh = True
                self.speedup = self.speedup_upper = math.inf
                self._probe_interval = self._recheck_interval = self.probe_every
                self._recheck_left = 0
            drafts = self.wants_draft(1)
            if drafts:
                self._drafted_for = rid
            return drafts
        return self.wants_draft(b)

    def _ar_paired(self, contexts: IntArray, bucket: int) -> float:
        """The AR cycle a drafted step of the contexts' requests is paired with: the prior's AR
        cycle at its contexts × the median ratio of the last AR steps of its batch bucket (the
        learned AR cycle before any)."""
        ratio = self._ar.median(bucket)
        if ratio is None:
            return self.mode_cycle("ar", contexts, 0)
        return self.priced.ar(np.asarray(contexts, dtype=np.int64)) * ratio

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
            prior = self.priced.ar(ctx)
        elif b == 1:
            prior = float(self.priced.single_both(int(ctx[0]), total)[total - 1])
        else:  # the even-spread prior the joint decision prices with
            prior = self.priced.even_at(ctx, even_top(b, total), total)
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
            bucket = batch_bucket(ctx.shape[0])
            _evidence_for(self, bucket)
            ratio = self._observe_total("ar", ctx, ctx.shape[0], cycle_s)
            if ratio > 0:  # NaN (a degenerate prior) is not
                self._ar.add(bucket, ratio)
            self._since_draft += 1
            self._since_ar = 0
            self._decision = None  # the next drafted step decides afresh
            return
        offsets = trees.offsets
        b = offsets.shape[0] - 1
        bucket = batch_bucket(b)
        _evidence_for(self, bucket)
        if kind != "chain" or preparation == "argmax":
            ctx = np.asarray(contexts, dtype=np.int64)
            self._observe_total(kind, ctx, int(offsets[-1]), cycle_s)
        self._since_draft = 0
        self._since_ar += 1
        if kind == "tree":
            _learn_tree(self, trees, accepted_nodes, committed, b)
        elif kind == "chain":  # what the chain's Â realised, as the size calibration does
            if (
                learn_step(self.acceptance, None, trees, accepted_nodes, committed, shadow=False)
                is None
            ):
                self.acceptance.observe(trees, accepted_nodes, committed)
            self._observe_chain(float(np.add.reduce(committed)), float(np.add.reduce(trees.scores)))
        ar_s = self._ar_paired(contexts, bucket)
        # per request (batch 1: the one count, what the sum of one is)
        # (an int64 array's sum, exact on Python ints: the same float, less numpy per step)
        tokens = float(committed[0]) if b == 1 else float(sum(np.asarray(committed).tolist())) / b
        realised = tokens * ar_s / cycle_s
        threshold = 1.0 + self.margin
        probing = self.speedup_upper <= threshold
        recent, losses = self._realised, self._losses
        recent.append(realised)
        losses.append(cycle_s / ar_s - tokens)  # AR steps spent beyond AR's for its tokens
        if len(recent) > self.evidence:
            del recent[0]
            del losses[0]
        n = len(recent)
        # one unlucky step must not switch decoding off: AR needs evidence/2 steps of it, and
        # their mean one standard error below 1 (a step's realised speedup is skewed and
        # noisy: most commit little, a few a lot)
        if 2 * n >= self.evidence:
            self._fresh = False
        if n < min(TURNOVER_EVIDENCE, self.evidence):  # (a window of 2 judges on its 2)
            self.speedup = self.speedup_upper = math.inf
        else:
            total = sum(recent)
            self.speedup = self.speedup_upper = mean = total / n
            if mean <= threshold:  # (above it, so is the bound: the spread is not needed)
                sq = sum(map(operator.mul, recent, recent))
                self.speedup_upper += math.sqrt(max(0.0, sq - total * mean) / max(n - 1, 1) / n)
            if n < (self.evidence + 1) // 2 and not (self._fresh or probing):
                # too few steps for the usual bound: AR comes to stand only where speculation
                # lost by far (its mean CLEAR_LOSS_SE standard errors below the recheck level)
                se = self.speedup_upper - mean
                if mean + CLEAR_LOSS_SE * se > threshold / RECHECK_WITHIN:
                    self.speedup = self.speedup_upper = math.inf
        if self.speedup_upper > threshold:
            if probing:  # speculation stands anew: its AR cycle is measured again soon
                self._recheck_interval = self.probe_every
            self._probe_interval = self.probe_every
            return
        _space_probes(self, probing, realised > threshold)


class ARRatios:
    """The measured/prior ratios of the last :data:`AR_RECENT` AR steps per batch bucket (a
    part of :class:`StepEvidence`), and each ring's median, kept until the ring takes a ratio
    (a drafted step pairs with it every step; AR steps are rare while speculation stands)."""

    def __init__(self) -> None:
        self._rings: dict[int, list[float]] = {}
        self._medians: dict[int, float] = {}

    def add(self, bucket: int, ratio: float) -> None:
        ring = self._rings.setdefault(bucket, [])
        ring.append(ratio)
        if len(ring) > AR_RECENT:
            del ring[0]
        self._medians.pop(bucket, None)

    def median(self, bucket: int) -> float | None:
        """The ring's median, or None before its first ratio."""
        hit = self._medians.get(bucket)
        if hit is None:
            ring = self._rings.get(bucket)
            if not ring:
                return None
            hit = self._medians[bucket] = small_median(ring)
        return hit


def _learn_tree(
    evidence: StepEvidence, trees: TreeBatch, accepted_nodes: IntArray, committed: IntArray, b: int
) -> None:
    """A tree step's accepted paths into the acceptance and size calibrations, and what the
    chain would have committed on it (its shadow: the chain is rarely run once trees win)."""
    hint, evidence.merge_hint = evidence.merge_hint, b""
    top1, evidence.last_top1 = evidence.last_top1, None
    chain, evidence.last_chain = evidence.last_chain, None
    shadow = top1 is not None and top1.shape[0] == b and top1.shape[1] > 0
    # (the shadow's arrays are formed only where shadow_of reads them)
    learned = learn_step(
        evidence.acceptance,
        evidence.sizes,
        trees,
        accepted_nodes,
        committed,
        hint,
        shadow and chain is not None,
    )
    if learned is None:
        evidence.acceptance.observe(trees, accepted_nodes, committed)
        evidence.sizes.observe(trees, accepted_nodes, committed)
    if top1 is None or not shadow:
        return
    if learned and chain is not None:  # (learned holds the two arrays: shadow was asked)
        evidence._observe_chain(*shadow_of(*learned, chain))
    else:
        evidence._observe_chain(*chain_shadow(trees, accepted_nodes, committed, top1))


def _space_probes(evidence: StepEvidence, probing: bool, faster: bool) -> None:
    """While AR stands, when the next probe comes after a drafted step (``faster``: than
    AR or not): no sooner than the drafted steps' mean loss pays off at PROBE_SHARE of AR's
    time, later after each probe that confirms AR, sooner after one that does not."""
    losses = evidence._losses
    paid = math.ceil(max(0.0, sum(losses) / len(losses)) / PROBE_SHARE)
    shortest, longest = evidence.probe_every, 64 * evidence.probe_every
    if not probing:  # AR has just come to stand
        evidence._probe_interval = min(max(shortest, paid), longest)
    elif faster:  # AR still stands, but this probe found speculation faster (the machine may
        # have changed: its evidence is then refreshed a probe at a time, every probe_every
        # steps, not ever more rarely)
        evidence._probe_interval = max(evidence._probe_interval // 2, shortest)
    else:  # … and this probe confirmed it: look again less often
        evidence._probe_interval = min(max(2 * evidence._probe_interval, paid), longest)


def _evidence_for(evidence: StepEvidence, bucket: int) -> None:
    """Make the evidence of batch bucket ``bucket`` the current one: the current bucket's is
    stored, the other's restored. A bucket never seen starts as a run does — untried
    speculation drafts until its own steps judge it — unless AR stands in the nearest bucket
    seen: then it starts by AR and drafts first after ``probe_every`` steps (its own drafted
    steps then judge it, as an untried bucket's do). A batch that shrinks by a request or two
    at the end of a run, where AR stood, so does not draft at once for a few last steps."""
    if bucket == evidence._bucket:
        return
    names = _BUCKET_STATE
    evidence._stored[evidence._bucket] = tuple(getattr(evidence, n) for n in names)
    evidence._bucket = bucket
    stored = evidence._stored.pop(bucket, None)
    for name, value in zip(names, stored or _state_copy(evidence._untried), strict=True):
        setattr(evidence, name, value)
    if stored is None:  # never seen: where AR stands in the nearest bucket seen, start by AR
        nearest = min(evidence._stored, key=lambda b: (abs(b - bucket), b))
        upper = evidence._stored[nearest][_UPPER]
        if isinstance(upper, float) and upper <= 1.0 + evidence.margin:
            evidence.speedup = evidence.speedup_upper = upper


def _state_copy(values: Iterable[object]) -> tuple[object, ...]:
    """A bucket's evidence state with its one list (the realised speedups) a list of its own."""
    return tuple(list(v) if isinstance(v, list) else v for v in values)
