"""The roofline ``CostModel`` shared by the simulator and the real backend (paper §3.4, §5.2).

``RooflineCostModel`` prices one speculative cycle, Ĉ(N) = T_draft + T_aux + T_verify(N), from a
hardware profile and a model spec, corrected in one of four modes:

- ``bare``: the per-operator roofline with the profile's default efficiencies;
- ``static``: the offline linear calibration (the paper's default);
- ``ema``: γ·bare, γ tracked online from ``observe``;
- ``ema+calib``: γ·static, the EMA as a residual on the calibrated curve.

For a batched load, T_verify is the time of the whole batched pass (this request's tree plus the
co-batched requests' trees). T_draft is the DFlash drafter's bare roofline over the batch (0 when
no drafter is given); T_aux is a constant (``prep_s``, or the calibration record's). L_AR is the
same correction applied to a target-only step of one token (no tree mask) in the same situation.

What this module does not do: choose N (the controller does), or measure anything.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cost.calibration import CalibrationRecord, EmaCorrection, LinearCalibration
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.roofline import (
    DrafterPricer,
    LinearPricer,
    PassShape,
    RooflineBreakdown,
    RooflineOptions,
    drafter_pass,
    verify_pass,
)
from bastion.errors import BudgetError, ConfigError, CostModelError
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


class _PricedCurve:
    """``cost_curve``'s cache entry for one situation: priced for N = 1 … ``length``.

    Each N is priced elementwise (its price does not depend on which other sizes are priced in
    the same call), so the curve for N ≤ n is the first n entries of a longer one: the roofline
    runs once per situation at a power-of-two length, grown by doubling. The corrected curve,
    how many of its leading entries pass the check, and the ``CostCurve`` of each asked length
    are kept until the correction changes (``stamp``: mode, γ, T_aux).
    """

    __slots__ = ("ar", "ar_base", "base", "curves", "draft_s", "length", "stamp", "valid", "verify")

    def __init__(
        self, length: int, base: tuple[Array, Array], ar_base: tuple[Array, Array], draft_s: float
    ) -> None:
        self.length = length
        self.base = base  # bare, calibrated-or-bare verification seconds, [length]
        self.ar_base = ar_base  # the same for L_AR, [1]
        self.draft_s = draft_s
        self.stamp: tuple[object, ...] | None = None
        self.verify: Array = base[0]  # corrected, read-only
        self.valid = 0  # leading entries of ``verify`` that are finite and > 0
        self.ar: float | None = None  # corrected L_AR, None when it fails the check
        self.curves: dict[int, CostCurve] = {}


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
        if self.calibration is None:
            return bare_s, bare_s
        if self._tiled is not None:
            compute = self._pricer(masked, tiled=True).branches(shape)[0]
        cal = self.calibration.predict(compute.sum(axis=-1), memory.sum(axis=-1))
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

    @staticmethod
    def _check(values: Array, what: str) -> Array:
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise CostModelError(
                f"{what}: predicted times must be positive and finite; check the calibration"
            )
        return values

    # ---------------------------------------------------------------------------------------
    # CostModel protocol
    # ---------------------------------------------------------------------------------------

    _curves: OrderedDict[_CurveKey, _PricedCurve]  # cost_curve's cache, made on first use

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
        entry = cache.get(key)
        if entry is None or entry.length < max_tree_size:
            entry = self._price_curve(max_tree_size, load)
            cache[key] = entry
            if len(cache) > self._cache_size:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        stamp = (self.mode, self.ema.gamma, self.prep_s)
        if entry.stamp != stamp:
            self._correct_curve(entry, stamp)
        curve = entry.curves.get(max_tree_size)
        if curve is None:
            if max_tree_size > entry.valid:
                self._check(entry.verify[:max_tree_size], "verify")  # raises
            if entry.ar is None:
                self._check(self._correct(*entry.ar_base), "L_AR")  # raises
                raise AssertionError("unreachable")  # pragma: no cover
            curve = CostCurve(
                draft_s=entry.draft_s,
                prep_s=self.prep_s,
                verify_s=entry.verify[:max_tree_size],
                ar_step_s=entry.ar,
            )
            if len(entry.curves) >= 64:
                entry.curves.clear()
            entry.curves[max_tree_size] = curve
        return curve

    def _price_curve(self, max_tree_size: int, load: StepLoad) -> _PricedCurve:
        """Price a situation for N = 1 … the power of two ≥ ``max_tree_size`` (at least 64)."""
        length = max(64, 1 << (max_tree_size - 1).bit_length())
        n = np.arange(1, length + 1, dtype=np.float64)
        return _PricedCurve(
            length,
            self._base(n, load),
            self._base(np.ones(1), load, masked=False),
            self.draft_s(load),
        )

    def _correct_curve(self, entry: _PricedCurve, stamp: tuple[object, ...]) -> None:
        """Apply the current correction to ``entry`` and check it once."""
        verify = self._correct(*entry.base)  # bare / static modes: the base array itself
        verify.flags.writeable = False
        ok = np.isfinite(verify) & (verify > 0)
        ar = self._correct(*entry.ar_base)
        entry.verify = verify
        entry.valid = int(np.argmin(ok)) if not ok.all() else verify.size
        entry.ar = float(ar[0]) if bool(np.isfinite(ar[0]) and ar[0] > 0) else None
        entry.curves = {}
        entry.stamp = stamp

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
        ctx = np.asarray(context_lens)
        g = np.asarray(grow)
        if g.size == 0:
            g = g.astype(np.int64)  # no additions (an empty list is float64 to numpy)
        if ctx.ndim != 1 or ctx.size == 0 or ctx.dtype.kind not in "iu" or np.any(ctx < 0):
            raise BudgetError("context_lens must be a non-empty 1-D array of integers ≥ 0")
        n_req = ctx.size
        try:
            if g.ndim != 1 or (g.size and g.dtype.kind not in "iu"):
                raise ValueError
            counts = np.bincount(g, minlength=n_req)  # ValueError on a negative index
            if counts.size > n_req:
                raise ValueError
        except ValueError:
            raise BudgetError(
                f"grow must be a 1-D array of request indices in [0, {n_req})"
            ) from None
        step = self.context_bucket
        buckets = -(-ctx.astype(np.int64) // step) * step
        c = buckets.astype(np.float64)
        g = g.astype(np.int64)
        # stable sort by request (radix sort on 16-bit keys): each request's additions in order
        order = np.argsort(g.astype(np.int16) if n_req < 1 << 15 else g, kind="stable")
        held = np.empty(g.size, dtype=np.float64)  # nodes request g[j] holds before node j
        held[order] = np.arange(g.size) - np.repeat(np.cumsum(counts) - counts, counts) + 1.0
        added = np.arange(g.size + 1, dtype=np.float64)
        pairs0 = float(np.sum(c + 1.0))
        pairs = np.empty(g.size + 1)
        pairs[0] = pairs0
        np.cumsum(c[g] + 2.0 * held + 1.0, out=pairs[1:])
        pairs[1:] += pairs0

        def price(shape: PassShape, masked: bool) -> Array:
            """``_correct`` of ``_base``'s two branches, computing only the one the mode reads."""
            pricer = self._pricer(masked, tiled=False)
            if self.mode in ("bare", "ema") or self.calibration is None:
                compute, memory = pricer.branches(shape)
                bare_s = (np.maximum(compute, memory) + pricer.launch_s).sum(axis=-1)
                return self._correct(bare_s, bare_s)  # these modes never read the calibrated
            # The calibration reads only Σ_op of each branch, affine in the features: one
            # matrix-vector product each instead of the [len, ops] per-operator matrices.
            x = pricer.features(shape)
            b0, b = pricer.nbytes
            memory_s = (b0.sum() + x @ b.sum(axis=1)) / pricer.byte_rate
            if self._tiled is not None:
                pricer = self._pricer(masked, tiled=True)
                x = pricer.features(shape)
            f0, f = pricer.flops
            compute_s = (f0.sum() + x @ f.sum(axis=1)) / pricer.flop_rate
            cal_s = np.asarray(self.calibration.predict(compute_s, memory_s), dtype=np.float64)
            return self._correct(cal_s, cal_s)  # these modes never read the bare branch

        # the tree passes and, as a last row, L_AR's pass (B tokens, no mask): the masked and
        # unmasked pricers differ only in the mask-element coefficient, so one pricing does both
        both = PassShape(
            tokens=np.append(n_req + added, float(n_req)),
            attn_pairs=np.append(pairs, pairs0),
            kv_tokens=np.append(pairs0 + added, pairs0),
            mask_elems=np.append(pairs, 0.0),
        )
        priced = price(both, masked=True)
        verify = self._check(priced[:-1], "verify")
        ar_s = self._check(priced[-1:], "L_AR")
        draft = 0.0
        if self.drafter is not None:  # as ``draft_s``
            draft = self._drafter_pricer().total_s(n_req, float(buckets.sum()))
        end = PassShape(
            tokens=n_req + added[-1:],
            attn_pairs=pairs[-1:],
            kv_tokens=pairs0 + added[-1:],
            mask_elems=pairs[-1:],
        )
        rise = self._growth_beyond(end, float(c.min())) if growth else 0.0
        return CostCurve(
            draft_s=draft,
            prep_s=self.prep_s,
            verify_s=verify,
            ar_step_s=float(ar_s[0]),
            growth_s=rise,
        )

    def _growth_beyond(self, end: PassShape, c_min: float) -> float:
        """A lower bound on how much the joint Ĉ grows per node added after the pass ``end``
        (one row), for any request: 0 when none can be proved.

        Adding a node raises the features by at least: T by 1, the attention pairs and mask
        elements by c_min + 3 (c_min the smallest bucketed context; the request already holds
        n ≥ 1 nodes), the KV tokens by 1; the padded T and the experts touched never fall.
        Every FLOP and byte coefficient is ≥ 0 (checked), so each branch rises by at least its
        coefficients times those increments. Ĉ is a max of branches (calibrated: of the two
        calibrated branches, α ≥ 0 checked; bare: Σ over operators of each one's max), and a
        max never falls below the branch that attains it at ``end``, so Ĉ(end + k) ≥ Ĉ(end) +
        k·(the rise of the branches that attain the max at ``end``); the EMA modes scale by γ.
        """
        inc = np.array([1.0, 0.0, c_min + 3.0, 1.0, c_min + 3.0, 0.0])  # the feature order
        pricer = self._pricer(True, tiled=False)
        (f0, f), (b0, b) = pricer.flops, pricer.nbytes
        peak, bw = pricer.flop_rate, pricer.byte_rate
        if np.any(f < 0) or np.any(b < 0):
            return 0.0
        x = pricer.features(end)[0]
        if self.mode in ("bare", "ema") or self.calibration is None:
            compute = (f0 + x @ f) / peak  # per operator
            memory = (b0 + x @ b) / bw
            op_rise_c, op_rise_m = inc @ f / peak, inc @ b / bw
            step = float(np.where(compute >= memory, op_rise_c, op_rise_m).sum())
        else:
            cal = self.calibration
            if cal.compute.alpha < 0 or cal.memory.alpha < 0:
                return 0.0
            memory_s = float(b0.sum() + x @ b.sum(axis=1)) / bw
            rise_m = float(inc @ b.sum(axis=1)) / bw
            if self._tiled is not None:
                pricer = self._pricer(True, tiled=True)
                (f0, f), peak = pricer.flops, pricer.flop_rate
                if np.any(f < 0):
                    return 0.0
                x = pricer.features(end)[0]
            compute_s = float(f0.sum() + x @ f.sum(axis=1)) / peak
            rise_c = float(inc @ f.sum(axis=1)) / peak
            branch_c = float(cal.compute.alpha * compute_s + cal.compute.beta)
            branch_m = float(cal.memory.alpha * memory_s + cal.memory.beta)
            rises: list[float] = []
            if branch_c >= branch_m:
                rises.append(float(cal.compute.alpha * rise_c))
            if branch_m >= branch_c:
                rises.append(float(cal.memory.alpha * rise_m))
            step = max(rises)
        if self.mode in ("ema", "ema+calib"):
            step *= self.ema.gamma
        return max(step, 0.0)
