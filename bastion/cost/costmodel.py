"""The roofline ``CostModel`` shared by the simulator and the real backend (paper §3.4, §5.2).

``RooflineCostModel`` prices one speculative cycle, Ĉ(N) = T_draft + T_aux + T_verify(N), from a
hardware profile and a model spec, corrected in one of four modes:

- ``bare``: the per-operator roofline with the profile's default efficiencies;
- ``static``: the offline linear calibration (the paper's default);
- ``ema``: γ·bare, γ tracked online from ``observe``;
- ``ema+calib``: γ·static, the EMA as a residual on the calibrated curve.

With tensor parallelism (``options.tensor_parallel`` > 1) every pass is one GPU's share of the
model plus its all-reduces over the profile's interconnect (:mod:`bastion.cost.parallel`),
added outside the calibration: the calibration corrects the device's compute and memory
branches, the link's seconds are the profile's.

For a batched load, T_verify is the time of the whole batched pass (this request's tree plus the
co-batched requests' trees). T_draft is the DFlash drafter's bare roofline over the batch (0 when
no drafter is given); T_aux is a constant (``prep_s``, or the calibration record's). L_AR is the
same correction applied to a target-only step of one token (no tree mask) in the same situation.

``cost_curve`` keeps one priced curve per situation (:mod:`bastion.cost.curvecache`);
``joint_cost_curve`` prices a batch along a joint allocation from the shapes and bounds of
:mod:`bastion.cost.jointcurve`.

What this module does not do: choose N (the controller does), or measure anything.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from functools import partial
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cost.breakdown import PassShape, RooflineBreakdown
from bastion.cost.calibration import CalibrationRecord, EmaCorrection, LinearCalibration
from bastion.cost.curvecache import Memo, PricedCurve, cached_entry, check_seconds, memo_of
from bastion.cost.drafterpass import DrafterPricer, drafter_pass
from bastion.cost.hardware import HardwareProfile
from bastion.cost.jointcurve import growth_bound, joint_corrected, joint_priced_compiled
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.roofline import LinearPricer, verify_pass
from bastion.errors import BudgetError, ConfigError
from bastion.guard import array, integer, public
from bastion.interfaces import CostCurve, StepCost, StepLoad

__all__ = ["CostMode", "RooflineCostModel"]

CostMode = Literal["bare", "static", "ema", "ema+calib"]
Array = npt.NDArray[np.float64]
_CurveKey = tuple[int, tuple[tuple[int, int], ...]]  # (context bucket, co-batched (N, bucket))


def check_tree_size(value: object, name: str = "tree_size") -> int:
    """``value`` as an int in [1, MAX_TREE_SIZE] (the largest tree the library builds), or a
    :class:`BudgetError` saying so — before anything is allocated for it."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise BudgetError(f"{name} must be an integer in [1, {MAX_TREE_SIZE}]; got {value!r}")
    if not 1 <= int(value) <= MAX_TREE_SIZE:
        raise BudgetError(
            f"{name} must be in [1, MAX_TREE_SIZE = {MAX_TREE_SIZE}]; got {int(value)}"
        )
    return int(value)


@public(error=ConfigError)
class RooflineCostModel:
    """Hardware-aware Ĉ(N); implements :class:`bastion.interfaces.CostModel`."""

    def __init__(
        self,
        hardware: HardwareProfile,
        model: ModelSpec,
        drafter: DrafterSpec | None = None,
        calibration: CalibrationRecord | LinearCalibration | None = None,
        mode: CostMode | None = None,
        *,
        options: RooflineOptions | None = None,
        prep_s: float | None = None,
        ema_alpha: float = 0.1,
        context_bucket: int = 64,
        cache_size: int = 256,
    ) -> None:
        if mode is None:
            mode = "static" if calibration is not None else "bare"
        if mode not in get_args(CostMode):
            raise ConfigError(f"cost mode {mode!r}; accepted: {', '.join(get_args(CostMode))}")
        if mode in ("static", "ema+calib") and calibration is None:
            raise ConfigError(f"cost mode {mode!r} needs a calibration; run `bastion calibrate`")
        record = calibration if isinstance(calibration, CalibrationRecord) else None
        self.hardware = hardware
        self.model = model
        self.drafter = drafter
        self.mode: CostMode = mode
        self.options = options or RooflineOptions()
        self.calibration: LinearCalibration | None = (
            record.calibration if record is not None else calibration  # type: ignore[assignment]
        )
        self.prep_s = float(prep_s if prep_s is not None else (record.prep_s if record else 0.0))
        if not (math.isfinite(self.prep_s) and self.prep_s >= 0):
            raise ConfigError(f"prep_s must be a finite number ≥ 0, got {self.prep_s}")
        self.ema = EmaCorrection(alpha=ema_alpha)
        self._tiled = (
            replace(self.options, tile_tokens=self.calibration.tile_tokens)
            if self.calibration is not None and self.calibration.tile_tokens
            else None
        )
        self._pricers: dict[tuple[bool, bool], LinearPricer] = {}
        self._drafter: DrafterPricer | None = None
        self._cache_size = cache_size
        if context_bucket < 1:
            raise ConfigError(f"context_bucket must be ≥ 1, got {context_bucket}")
        self.context_bucket = context_bucket

    # ---------------------------------------------------------------------------------------
    # Pieces
    # ---------------------------------------------------------------------------------------

    @public(error=BudgetError, context_len=integer(lo=0))
    def bucket(self, context_len: int) -> int:
        """The context length priced: rounded up to a multiple of ``context_bucket``.

        Rounding up keeps the estimate on the safe side and lets one cached curve serve about
        ``context_bucket / τ`` consecutive decode steps.
        """
        return self._bucket(context_len)

    def _bucket(self, context_len: int) -> int:
        """:meth:`bucket` for a ``context_len`` from a checked :class:`StepLoad`."""
        if context_len < 0:
            raise BudgetError(f"context_len must be ≥ 0, got {context_len}")
        b = self.context_bucket
        return -(-context_len // b) * b

    def _requests(
        self, tokens: npt.ArrayLike, load: StepLoad
    ) -> list[tuple[npt.ArrayLike, npt.ArrayLike]]:
        out: list[tuple[npt.ArrayLike, npt.ArrayLike]] = [(tokens, self._bucket(load.context_len))]
        for r in load.co_batched:
            if r.tree_size < 1:
                raise BudgetError(f"a co-batched request needs tree_size ≥ 1, got {r.tree_size}")
            out.append((r.tree_size, self._bucket(r.context_len)))
        return out

    @public(tree_size=array(lo=1))
    def roofline(self, tree_size: npt.ArrayLike, load: StepLoad) -> RooflineBreakdown:
        """The bare per-operator breakdown of the verification pass (arrays allowed)."""
        return verify_pass(self.model, self.hardware, self._requests(tree_size, load), self.options)

    def _pricer(self, masked: bool, tiled: bool) -> LinearPricer:
        key = (masked, tiled)
        if key not in self._pricers:
            opt = self._tiled if tiled and self._tiled is not None else self.options
            self._pricers[key] = LinearPricer(self.model, self.hardware, opt, masked=masked)
        return self._pricers[key]

    def _shape(self, tokens: Array, load: StepLoad, masked: bool) -> PassShape:
        """The pass's aggregate shape: this request's ``tokens`` (an array over N) plus the
        co-batched requests, summed in one vectorised pass (same numbers as ``_requests``)."""
        c = float(self._bucket(load.context_len))
        s_o = p_o = kv_o = 0.0
        if load.co_batched:
            sizes = np.array([r.tree_size for r in load.co_batched], dtype=np.float64)
            if np.any(sizes < 1):
                raise BudgetError(f"a co-batched request needs tree_size ≥ 1, got {sizes.min()}")
            ctx = np.array([r.context_len for r in load.co_batched], dtype=np.float64)
            if np.any(ctx < 0):
                raise BudgetError(f"context_len must be ≥ 0, got {ctx.min()}")
            ctx = np.ceil(ctx / self.context_bucket) * self.context_bucket
            s_o, p_o, kv_o = (
                float(sizes.sum()),
                float(sizes @ (ctx + sizes)),
                float((ctx + sizes).sum()),
            )
        pairs = tokens * (c + tokens) + p_o
        return PassShape(
            tokens=tokens + s_o,
            attn_pairs=pairs,
            kv_tokens=c + tokens + kv_o,
            mask_elems=pairs if masked else np.zeros_like(pairs),
        )

    def _base(self, tokens: Array, load: StepLoad, masked: bool = True) -> tuple[Array, Array]:
        """(bare, calibrated-or-bare) verification seconds for ``tokens`` (uncorrected by γ)."""
        shape = self._shape(tokens, load, masked)
        bare = self._pricer(masked, tiled=False)
        compute, memory = bare.branches(shape)
        bare_s = (np.maximum(compute, memory) + bare.launch_s).sum(axis=-1)
        comm = bare.comm_s(shape.tokens) if bare.has_comm else None
        if comm is not None:  # tensor parallelism's all-reduces, beside the device's time
            bare_s = bare_s + comm
        if self.calibration is None:
            return bare_s, bare_s
        if self._tiled is not None:
            compute = self._pricer(masked, tiled=True).branches(shape)[0]
        cal = self.calibration.predict(compute.sum(axis=-1), memory.sum(axis=-1))
        if comm is not None:  # the calibration fits the device's time; the link adds to it
            cal = cal + comm
        return bare_s, np.asarray(cal, dtype=np.float64)

    def _correct(self, bare_s: Array, cal_s: Array) -> Array:
        if self.mode == "bare":
            return bare_s
        if self.mode == "static":
            return cal_s
        if self.mode == "ema":
            return self.ema.gamma * bare_s
        return self.ema.gamma * cal_s

    def _uncorrected(self, bare_s: Array, cal_s: Array) -> Array:
        return bare_s if self.mode in ("bare", "ema") else cal_s

    @public
    def draft_s(self, load: StepLoad) -> float:
        """T_draft: the drafter's pass over every request of the batch (0 without a drafter)."""
        if self.drafter is None:
            return 0.0
        total = self._bucket(load.context_len) + sum(
            self._bucket(r.context_len) for r in load.co_batched
        )
        return self._drafter_pricer().total_s(1 + len(load.co_batched), total)

    def _drafter_pricer(self) -> DrafterPricer:
        """The drafter's pass priced by batch size and Σ contexts (identical to drafter_pass)."""
        if self._drafter is None:
            assert self.drafter is not None
            self._drafter = DrafterPricer(self.drafter, self.hardware, self.options)
        return self._drafter

    @public
    def draft_breakdown(self, load: StepLoad) -> RooflineBreakdown | None:
        if self.drafter is None:
            return None
        contexts = (
            self._bucket(load.context_len),
            *(self._bucket(r.context_len) for r in load.co_batched),
        )
        return drafter_pass(self.drafter, self.hardware, contexts, self.options)

    _check = staticmethod(check_seconds)

    # ---------------------------------------------------------------------------------------
    # CostModel protocol
    # ---------------------------------------------------------------------------------------

    _curves: OrderedDict[_CurveKey, PricedCurve]  # cost_curve's cache, made on first use

    @public(error=BudgetError, own=("max_tree_size",))
    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        """Ĉ(N) for N = 1 … ``max_tree_size``, one vectorised roofline evaluation (cached).

        The controller calls this every step, so a hit is a dictionary lookup that returns the
        same read-only ``CostCurve``: per situation (context bucket, co-batched load) the curve
        is priced once for a power-of-two number of sizes and sliced, and it is corrected and
        checked once per correction (in the ema modes γ moves with every ``observe``).
        """
        max_tree_size = check_tree_size(max_tree_size, "max_tree_size")
        co = load.co_batched
        key: _CurveKey = (
            self._bucket(load.context_len),
            tuple((r.tree_size, self._bucket(r.context_len)) for r in co) if co else (),
        )
        try:
            cache = self._curves
        except AttributeError:
            cache = self._curves = OrderedDict()
        price = partial(self._price_curve, max_tree_size, load)
        entry = cached_entry(cache, key, max_tree_size, self._cache_size, price)
        stamp = (self.mode, self.ema.gamma, self.prep_s)
        if entry.stamp != stamp:
            entry.correct(stamp, self._correct)
        return entry.curve(max_tree_size, self.prep_s, self._correct)

    def _price_curve(self, max_tree_size: int, load: StepLoad) -> PricedCurve:
        """Price a situation for N = 1 … the power of two ≥ ``max_tree_size`` (at least 64)."""
        length = max(64, 1 << (max_tree_size - 1).bit_length())
        n = np.arange(1, length + 1, dtype=np.float64)
        return PricedCurve(
            length,
            self._base(n, load),
            self._base(np.ones(1), load, masked=False),
            self.draft_s(load),
        )

    def prior_memo(self) -> tuple[tuple[object, ...], Memo]:
        """(its correction stamp, as ``cost_curve``'s, and this model's memo: see Memo)."""
        return (self.mode, self.ema.gamma, self.prep_s), memo_of(self)

    @public(error=BudgetError, own=("tree_size",))
    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        """One cycle's predicted cost, with per-operator seconds in ``breakdown``.

        Operator entries (``verify.<op>``) are the bare roofline's shares rescaled to sum to
        ``verify_s``; ``roofline.*`` entries are the bare totals and branches before correction.
        """
        tree_size = check_tree_size(tree_size, "tree_size")
        tokens = np.array([float(tree_size)])
        bare_s, cal_s = self._base(tokens, load)
        verify = float(self._check(self._correct(bare_s, cal_s), "verify")[0])
        rb = self.roofline(tree_size, load)
        scale = verify / float(rb.total_s)
        breakdown: dict[str, float] = {
            f"verify.{op.name}": float(op.time_s) * scale for op in rb.operators
        }
        breakdown["roofline.bare_s"] = float(rb.total_s)
        breakdown["roofline.compute_s"] = float(rb.compute_s)
        breakdown["roofline.memory_s"] = float(rb.memory_s)
        breakdown["roofline.launch_s"] = rb.launch_s
        db = self.draft_breakdown(load)
        if db is not None:
            breakdown.update({f"draft.{op.name}": float(op.time_s) for op in db.operators})
        return StepCost(
            draft_s=self.draft_s(load), prep_s=self.prep_s, verify_s=verify, breakdown=breakdown
        )

    @public(error=BudgetError, tree_size=integer(1, MAX_TREE_SIZE))
    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        """Fold a measured verification time into γ (modes ``ema`` and ``ema+calib`` only)."""
        if self.mode not in ("ema", "ema+calib"):
            return
        bare_s, cal_s = self._base(np.array([float(tree_size)]), load)
        self.ema.update(verify_s, float(self._uncorrected(bare_s, cal_s)[0]))

    @public(
        error=BudgetError,
        context_lens=array(1, lo=0, nonempty=True, whole=True),
        grow=array(1, lo=0, whole=True),
    )
    def joint_cost_curve(
        self,
        context_lens: npt.NDArray[np.int64],
        grow: npt.NDArray[np.int64],
        *,
        growth: bool = True,
    ) -> CostCurve:
        """Ĉ of a whole batch along a joint allocation (:class:`bastion.joint.JointCostModel`).

        Request i has ``context_lens[i]`` cached tokens and starts with its root; ``grow[j]`` is
        the request that receives the j-th added node. ``verify_s[m]`` (m = 0 … len(grow)) is
        the batch's pass after the first m additions. Adding a node to a request that has n
        raises T by 1, the attention pairs (and mask elements) by c_i + 2n + 1 and the KV
        tokens by 1, so the pass shapes are cumulative sums, priced exactly like ``cost_curve``
        (same context buckets, pricers, calibration and correction). L_AR is one unmasked step
        of the B roots; T_draft the drafter's pass over the batch. ``growth=False``: leave
        ``growth_s`` at 0 (a caller that reads only the priced entries saves its proof).
        """
        fast = None if growth else joint_priced_compiled(self, context_lens, grow)  # (compiled)
        priced, requests, context_sum, bound = fast or joint_corrected(self, context_lens, grow)
        verify = self._check(priced[:-1], "verify")
        ar_s = self._check(priced[-1:], "L_AR")
        draft = 0.0
        if self.drafter is not None:  # as ``draft_s``
            draft = self._drafter_pricer().total_s(requests, context_sum)
        rise = 0.0
        if growth and bound is not None:  # (always priced in numpy when growth is asked)
            gamma = self.ema.gamma if self.mode in ("ema", "ema+calib") else None
            rise = growth_bound(*bound, gamma)
        return CostCurve(
            draft_s=draft,
            prep_s=self.prep_s,
            verify_s=verify,
            ar_step_s=float(ar_s[0]),
            growth_s=rise,
        )
