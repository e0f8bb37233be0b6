"""The prior the learning controller corrects: its cost model's whole cycles, priced at anchors.

:class:`PricedPrior` is the part of :class:`bastion.learned.LearnedCostModel` that asks the prior
:class:`bastion.interfaces.CostModel` (the calibrated roofline) what a cycle costs: a tree of N
nodes at batch 1, a batch whose added nodes are spread evenly or along an allocation, an AR step
and a chain. The prior is dear (a whole roofline curve per call), so it is priced at contexts
that are multiples of :data:`ANCHOR_STEP` tokens, interpolated linearly to the middle of the mean
context's step of :data:`MODE_CONTEXT_STEP` tokens and cached: what a step observes is divided by
the same prior the decision multiplies by. The learned ratios that correct it live in
:class:`bastion.cycles.CycleTable`; the decision curves built from both in
:mod:`bastion.learned_curves`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cycles import CycleKind
from bastion.errors import BudgetError
from bastion.fastinit import trusted_init
from bastion.interfaces import CostCurve, CostModel, StepLoad

__all__: list[str] = []  # a part of bastion.learned's LearnedCostModel, public there

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
MODE_CONTEXT_STEP = 128  # the priors are priced per this step of (mean) context
SINGLE_PRIOR_SIZES = 1024  # batch 1: the prior is priced for N = 1 … this (or 2^k ×) at once
ANCHOR_STEP = 512  # … at contexts that are multiples of this, interpolated between
PRIMED_CONTEXT = 16384  # start-up prices the batch-1 anchors up to this context (prime)
MAX_PRIMED = 65536  # … and never beyond this (the anchor cache holds 256 entries)
PriceFn = Callable[[IntArray], FloatArray]


@dataclass(frozen=True)
class PriorCycle:
    """The prior's whole cycle along a batch's growth: totals M and cycle seconds."""

    totals: IntArray  # M for each entry
    cycle: FloatArray  # prior draft + prep + verify at M
    curve: CostCurve  # the prior's curve (draft, prep, L_AR)


@dataclass(frozen=True, eq=False)
class Lerp:
    """(1 − w)·lo + w·hi elementwise, formed where it is read: the even-spread prior runs to
    thousands of totals and each reader wants a few (a step's own total, the lattice points),
    so the interpolation between its two anchors is not formed whole. Any read gives the
    values forming the whole array would (the same two products and sum per element)."""

    lo: FloatArray  # the anchor below (read-only)
    hi: FloatArray  # the anchor above, as long
    w: float  # the weight of ``hi``

    def __len__(self) -> int:
        return int(self.lo.shape[0])

    def __getitem__(self, index: Any) -> Any:
        """A float at an integer index; an array at an index array or slice."""
        if type(index) is int or isinstance(index, np.integer):  # (the hot path: an int)
            return self.at(index)
        return (1.0 - self.w) * self.lo[index] + self.w * self.hi[index]

    def at(self, index: int | np.integer[Any]) -> float:
        """The value at one integer index (the same two products and sum as an array read)."""
        return (1.0 - self.w) * self.lo.item(index) + self.w * self.hi.item(index)

    def __array__(self, dtype: Any = None, copy: Any = None) -> FloatArray:
        whole: FloatArray = self[:]
        return whole if dtype is None else whole.astype(dtype, copy=False)


_lerp = trusted_init(Lerp)  # (a new context step's prior: no __post_init__ to skip)


class PricedPrior:
    """The prior :class:`CostModel`'s whole cycles, priced at context anchors and cached.

    ``prior`` is the cost model itself; its ``joint_cost_curve`` (when it has one) prices
    batches, else :func:`bastion.joint.joint_curve_from_cost_model` does. Every cached price is
    the one pricing it afresh would give at the same anchors (the caches only save host time).
    """

    def __init__(self, prior: CostModel) -> None:
        self.prior = prior
        self._joint = getattr(prior, "joint_cost_curve", None)
        if self._joint is not None and takes_growth(self._joint):  # priced entries only
            self._joint = functools.partial(self._joint, growth=False)
        # the priors, per (what, batch size, …) and context step / anchor (see anchored)
        self._lerped: dict[tuple[tuple[Any, ...], int], FloatArray] = {}
        self._anchors: dict[tuple[tuple[Any, ...], int], FloatArray] = {}
        self._ones: dict[tuple[tuple[Any, ...], int], float] = {}  # (see _anchored_one)
        self._ar_memo: dict[tuple[int, int], float] = {}  # the AR prior (see ar)
        # the prior's own store for its anchors, shared by every PricedPrior of that prior
        # object (RooflineCostModel.prior_memo), or None
        self._memo = getattr(prior, "prior_memo", None)

    def cycle(self, contexts: IntArray, sizes: IntArray | None, n: int) -> PriorCycle:
        """The prior's cycle as the batch grows: B = 1 along N = 1 … n; B > 1 along an even
        spread of the added nodes (``sizes`` None) or along the given allocation's growth."""
        b = contexts.shape[0]
        if b == 1 and sizes is None:
            cc = self.prior.cost_curve(n, StepLoad(int(contexts[0])))
            totals = np.arange(1, n + 1, dtype=np.int64)
            return PriorCycle(totals, cc.draft_s + cc.prep_s + cc.verify_s[:n], cc)
        if sizes is None:
            grow = np.arange(max(n - b, 0), dtype=np.int64) % b
        else:
            grow = np.repeat(np.arange(b, dtype=np.int64), np.maximum(sizes, 1) - 1)
        cc = self.joint(contexts, grow)
        totals = b + np.arange(grow.shape[0] + 1, dtype=np.int64)
        return PriorCycle(totals, cc.draft_s + cc.prep_s + cc.verify_s, cc)

    def joint(self, contexts: IntArray, grow: IntArray) -> CostCurve:
        """The prior's curve of the whole batch along ``grow`` (the joint protocol)."""
        if self._joint is not None:
            return self._joint(contexts, grow)  # type: ignore[no-any-return]
        from bastion.joint import joint_curve_from_cost_model

        return joint_curve_from_cost_model(self.prior, contexts)(grow)

    def even(self, ctx: IntArray, top: int) -> Lerp:
        """The prior's batch cycle for totals B … ``top`` along an even spread (formed where it
        is read: see :class:`Lerp`)."""
        key, mean = ("even", ctx.shape[0], top), mean_context(ctx)
        # a hot path (every batched step observes its cycle against it): a cached step is read
        # without building its price (_lerped_at's lookup, inline)
        hit = self._lerped.get((key, mean // MODE_CONTEXT_STEP))
        if hit is not None:
            return hit  # type: ignore[return-value]
        return self._anchored(  # type: ignore[return-value]
            key, ctx.shape[0], mean, lambda c: self.cycle(c, None, top).cycle, lazy=True
        )

    def even_at(self, ctx: IntArray, top: int, total: int) -> float:
        """``even(ctx, top)[total − B]``, a float: every batched step observes its cycle against
        it, so a cached step is read without the calls between (the same value: Lerp.at)."""
        hit = self._lerped.get(
            (("even", ctx.shape[0], top), mean_context(ctx) // MODE_CONTEXT_STEP)
        )
        lerp: Lerp = hit if hit is not None else self.even(ctx, top)  # type: ignore[assignment]
        return lerp.at(total - ctx.shape[0])

    def mode(self, kind: CycleKind, ctx: IntArray, depth: int) -> float:
        """The prior's cycle of a whole step of ``kind`` ("ar" or "chain" with ``depth`` draft
        positions per request) for requests with contexts ``ctx``."""
        b = ctx.shape[0]
        if kind == "ar":
            return self.ar(ctx)
        if b == 1:  # the chain's causal pass is priced as the tree of its size
            return float(self.single(int(ctx[0]), depth + 1)[0][depth])
        return self._anchored_one(
            ("chain", b, depth),
            b,
            mean_context(ctx),
            lambda c: self.cycle(c, np.full(b, depth + 1, np.int64), b * (depth + 1)).cycle[-1:],
        )

    def single(self, context_len: int, n: int) -> tuple[FloatArray, float]:
        """Batch 1: the prior's whole cycle for N = 1 … (at least) ``n`` and its AR cycle."""
        both = self.single_both(int(context_len), n)
        return both[:-1], float(both[-1])

    def single_both(self, context_len: int, n: int) -> FloatArray:
        """:meth:`single` as one array, the AR cycle last: a hot path (every batch-1 step
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
        """Price the batch-1 prior at every anchor up to ``max_context`` tokens now (see
        :meth:`bastion.learned.LearnedCostModel.prime`)."""
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 0:
            raise BudgetError(f"max_context must be an integer ≥ 0; got {max_context!r}")
        price = self._single_price(SINGLE_PRIOR_SIZES)
        for index in range(min(max_context, MAX_PRIMED) // ANCHOR_STEP + 2):
            self._anchor(("single", SINGLE_PRIOR_SIZES), index, 1, price)

    def ar(self, ctx: IntArray) -> float:
        """The prior's AR cycle (B requests, their mean context's step): a hot path, priced on
        every AR step and every decision, so memoised per (B, context step) — the value
        :meth:`_anchored` gives there, which never changes."""
        b = ctx.shape[0]
        mean = int(ctx[0]) if b == 1 else mean_context(ctx)
        key = (b, mean // MODE_CONTEXT_STEP)
        hit = self._ar_memo.get(key)
        if hit is not None:
            return hit
        if b == 1:
            value = self.single(mean, 1)[1]
        else:
            value = self._anchored_one(
                ("ar", b),
                b,
                mean,
                lambda c: np.array([self.joint(c, np.zeros(0, np.int64)).ar_step_s]),
            )
        if len(self._ar_memo) > 512:
            self._ar_memo.clear()
        self._ar_memo[key] = value
        return value

    def _anchored(
        self,
        key: tuple[Any, ...],
        b: int,
        mean_context: int,
        price: PriceFn,
        lazy: bool = False,
    ) -> FloatArray:
        """A prior quantity (``price`` of B requests' contexts, an array) at the middle of the
        mean context's step of :data:`MODE_CONTEXT_STEP` tokens, interpolated linearly
        between its values at the multiples of :data:`ANCHOR_STEP` tokens on either side.

        Cached per ``key`` and step, so what a step observes is divided by the same prior the
        decision multiplies by, and the prior — the dear part — is priced once per anchor:
        within an anchor step it is linear in the context but for the roofline's few
        compute/memory crossings (≤ 1.3 % off on the shipped models, tested).

        ``lazy``: the interpolation is a :class:`Lerp` (formed where read), not an array; the
        key's every call must ask the same."""
        step = mean_context // MODE_CONTEXT_STEP
        hit = self._lerped_at(key, mean_context)
        if hit is not None:
            return hit
        lo, w = _anchor_span(step)
        below, above = self._anchor(key, lo, b, price), self._anchor(key, lo + 1, b, price)
        made: Any = _lerp(below, above, w)
        if not lazy:  # formed whole (short curves, read whole)
            made = np.asarray(made)
            made.flags.writeable = False
        if len(self._lerped) > 512:
            self._lerped.clear()
        self._lerped[(key, step)] = made
        return made  # type: ignore[no-any-return]

    def _anchored_one(
        self, key: tuple[Any, ...], b: int, mean_context: int, price: PriceFn
    ) -> float:
        """:meth:`_anchored`'s first value of a price of one value (the AR and chain cycles of a
        batch), as a float: the same interpolation on floats (the same two products and sum as
        numpy's on one element), cached per ``key`` and step apart from the arrays."""
        step = mean_context // MODE_CONTEXT_STEP
        hit = self._ones.get((key, step))
        if hit is not None:
            return hit
        lo, w = _anchor_span(step)
        below = float(self._anchor(key, lo, b, price)[0])
        above = float(self._anchor(key, lo + 1, b, price)[0])
        value = (1.0 - w) * below + w * above
        if len(self._ones) > 512:
            self._ones.clear()
        self._ones[(key, step)] = value
        return value

    def _lerped_at(self, key: tuple[Any, ...], mean_context: int) -> FloatArray | None:
        """What :meth:`_anchored` holds for ``key`` at the mean context's step, or None (a
        caller whose price is dear to build looks here first)."""
        return self._lerped.get((key, mean_context // MODE_CONTEXT_STEP))

    def _anchor(self, key: tuple[Any, ...], index: int, b: int, price: PriceFn) -> FloatArray:
        hit = self._anchors.get((key, index))
        if hit is None:
            hit = self._shared_anchor(key, index, b, price)
            hit.flags.writeable = False  # (a Lerp reads it for as long as it is cached)
            if len(self._anchors) > 256:
                self._anchors.clear()
            self._anchors[(key, index)] = hit
        return hit

    def _shared_anchor(
        self, key: tuple[Any, ...], index: int, b: int, price: PriceFn
    ) -> FloatArray:
        """The prior at one anchor: priced, or read from the prior's own store where it keeps
        one (the same value: a pure function of the prior's correction and the anchor)."""
        if self._memo is None:
            return np.asarray(price(np.full(b, index * ANCHOR_STEP, np.int64)), dtype=np.float64)
        stamp, memo = self._memo()
        memo_key = (stamp, key, index)
        hit: FloatArray | None = memo.get(memo_key)
        if hit is None:
            value = price(np.full(b, index * ANCHOR_STEP, np.int64))
            hit = memo.put(memo_key, np.array(value, dtype=np.float64))
        return hit


def _anchor_span(step: int) -> tuple[int, float]:
    """The anchor below the middle of context step ``step`` (in units of ANCHOR_STEP) and the
    weight of the one above it there."""
    mid = step * MODE_CONTEXT_STEP + MODE_CONTEXT_STEP // 2
    lo = mid // ANCHOR_STEP
    return lo, (mid - lo * ANCHOR_STEP) / ANCHOR_STEP


def takes_growth(joint: Callable[..., Any]) -> bool:
    """Whether a prior's ``joint_cost_curve`` can skip its growth proof (``growth=False``, as
    :class:`bastion.cost.costmodel.RooflineCostModel`'s): the learned model never reads it."""
    try:
        parameter = inspect.signature(joint).parameters.get("growth")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY


try:  # mean_context's sum (bastion._bestfirst.mean_floor); Python ints without it
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the build without the extension
    _kernel = None
_mean_floor = getattr(_kernel, "mean_floor", None)

# mean_context's last read-only array and its mean (one tuple, so a reader never sees the
# array of one call with the mean of another)
_LAST_MEAN: tuple[IntArray | None, int] = (None, 0)  # the array, its mean


def mean_context(ctx: IntArray) -> int:
    """The mean context of a step's requests, rounded down.

    A hot path: the learning controller asks it of the same step's contexts several times (its
    decision, the AR and chain cycles, the step's observation). An array that owns its data and
    is read-only (the simulator's per-step contexts) cannot change, so its mean is remembered
    for the next call with the same array; any other array is summed every time."""
    global _LAST_MEAN
    if ctx.shape[0] == 1:
        return int(ctx[0])
    last_ctx, last_mean = _LAST_MEAN
    if ctx is last_ctx:
        return last_mean
    # the compiled exact floor (int64, None where the sum would leave it), else Python ints
    mean: int | None = None if _mean_floor is None else _mean_floor(ctx)
    if mean is None:
        mean = sum(ctx.tolist()) // int(ctx.shape[0])  # (Python ints: exact)
    if ctx.base is None and not ctx.flags.writeable:
        _LAST_MEAN = (ctx, mean)
    return mean
