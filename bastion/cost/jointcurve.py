"""Ĉ of a whole batch along a joint allocation: its pass shapes, their seconds, a growth bound.

Also :func:`joint_pricing`: the coefficients with which the compiled joint budget
(``paper()``, ``_bestfirst_paper.c``) prices the same curve itself.

:meth:`bastion.cost.costmodel.RooflineCostModel.joint_cost_curve` prices a batch whose trees
grow one node at a time (:class:`bastion.joint.JointCostModel`). Adding a node to a request that
has n raises T by 1, the attention pairs (and mask elements) by c_i + 2n + 1 and the KV tokens
by 1, so the passes' shapes are cumulative sums (:func:`joint_shapes`); they are priced from the
affine pricers' coefficients (:func:`joint_seconds`), and :func:`growth_bound` proves how much
Ĉ rises at least per node added beyond the last pass. The cost model applies its correction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cost.breakdown import PassShape
from bastion.cost.calibration import LinearCalibration
from bastion.cost.curvecache import memo_of
from bastion.cost.opcounts import pad_tokens
from bastion.cost.roofline import LinearPricer
from bastion.errors import BudgetError

try:
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the extension is optional
    _compiled = None

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class JointShapes:
    """The passes of one joint allocation and what the rest of its pricing reads."""

    # the tree passes after 0 … len(grow) additions and, as a last row, L_AR's pass (B tokens,
    # no mask): the masked and unmasked pricers differ only in the mask-element coefficient,
    # so one pricing does both
    both: PassShape
    end: PassShape  # the last tree pass (one row)
    requests: int  # B
    context_sum: float  # Σ of the bucketed contexts (the drafter's pass)
    c_min: float  # the smallest bucketed context


def joint_shapes(
    context_lens: npt.NDArray[np.int64], grow: npt.NDArray[np.int64], context_bucket: int
) -> JointShapes:
    """The pass shapes of a batch whose request i holds ``context_lens[i]`` cached tokens (a
    multiple of ``context_bucket`` above) and its root, as ``grow[j]`` receives the j-th added
    node; a :class:`BudgetError` for a malformed ``context_lens`` or ``grow``."""
    ctx = np.asarray(context_lens)
    g = np.asarray(grow)
    if g.size == 0:
        g = g.astype(np.int64)  # no additions (an empty list is float64 to numpy)
    if ctx.ndim != 1 or ctx.size == 0 or ctx.dtype.kind not in "iu" or np.any(ctx < 0):
        raise BudgetError("context_lens must be a non-empty 1-D array of integers ≥ 0")
    n_req = ctx.size
    even = _round_robin(g, n_req)  # the nodes spread evenly (the learned prior's anchors)
    if even is None:
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
    step = context_bucket
    buckets = -(-ctx.astype(np.int64) // step) * step
    c = buckets.astype(np.float64)
    g = g.astype(np.int64)
    if even is not None:  # node j is request j mod B's (j // B + 1)-th: no sort needed
        held = even
    else:
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
    both = PassShape(
        tokens=np.append(n_req + added, float(n_req)),
        attn_pairs=np.append(pairs, pairs0),
        kv_tokens=np.append(pairs0 + added, pairs0),
        mask_elems=np.append(pairs, 0.0),
    )
    end = PassShape(
        tokens=n_req + added[-1:],
        attn_pairs=pairs[-1:],
        kv_tokens=pairs0 + added[-1:],
        mask_elems=pairs[-1:],
    )
    return JointShapes(both, end, n_req, float(buckets.sum()), float(c.min()))


_EVEN: dict[tuple[int, int], tuple[npt.NDArray[np.int64], Array]] = {}


def _round_robin(g: npt.NDArray[Any], n_req: int) -> Array | None:
    """For ``grow`` = 0, 1, …, B − 1, 0, 1, … (whole numbers, 1-D, any length ≥ 1): the nodes
    each request holds before every addition (j // B + 1, as joint_shapes' sort computes them,
    read-only); else None."""
    size = g.shape[0] if g.ndim == 1 else 0
    if size == 0 or g.dtype.kind not in "iu" or int(g[0]) != 0 or int(g[-1]) != (size - 1) % n_req:
        return None
    hit = _EVEN.get((size, n_req))
    if hit is None:
        j = np.arange(size, dtype=np.int64)
        pattern, held = j % n_req, (j // n_req + 1).astype(np.float64)
        pattern.flags.writeable = held.flags.writeable = False
        if len(_EVEN) > 256:
            _EVEN.clear()
        hit = _EVEN[(size, n_req)] = (pattern, held)
    return hit[1] if np.array_equal(g, hit[0]) else None


def joint_seconds(
    shape: PassShape,
    bare: LinearPricer,
    tiled: LinearPricer | None,
    calibration: LinearCalibration | None,
) -> Array:
    """Uncorrected seconds of ``shape``'s passes: the bare roofline (``calibration`` None), or
    the calibrated one (its compute branch from ``tiled`` when the calibration pads tokens),
    computing only the branches that reading needs."""
    pricer = bare
    if calibration is None:
        compute, memory = pricer.branches(shape)
        bare_s: Array = (np.maximum(compute, memory) + pricer.launch_s).sum(axis=-1)
        if pricer.has_comm:  # tensor parallelism's all-reduces (as the cost model's _base)
            bare_s = bare_s + pricer.comm_s(shape.tokens)
        return bare_s
    # The calibration reads only Σ_op of each branch, affine in the features: one
    # matrix-vector product each instead of the [len, ops] per-operator matrices.
    x = pricer.features(shape)
    b0, b = pricer.nbytes
    memory_s = (b0.sum() + x @ b.sum(axis=1)) / pricer.byte_rate
    if tiled is not None:
        pricer = tiled
        if _same_but_tile(bare, tiled):  # the same features but the padded T: that column
            x = x.copy()
            x[..., 1] = pad_tokens(np.asarray(shape.tokens, np.float64), tiled.options.tile_tokens)
        else:
            x = pricer.features(shape)
    f0, f = pricer.flops
    compute_s = (f0.sum() + x @ f.sum(axis=1)) / pricer.flop_rate
    cal = calibration.predict(compute_s, memory_s)
    if bare.has_comm:  # the link's seconds beside the calibrated device's (as _base)
        cal = cal + bare.comm_s(shape.tokens)
    return np.asarray(cal, dtype=np.float64)


def _same_but_tile(bare: LinearPricer, tiled: LinearPricer) -> bool:
    """Whether ``tiled``'s features are ``bare``'s but for the padded T (column 1)."""
    return (
        tiled.model is bare.model
        and tiled.masked == bare.masked
        and tiled.options.expert_touch == bare.options.expert_touch
    )


def growth_bound(
    end: PassShape,
    c_min: float,
    bare: LinearPricer,
    tiled: LinearPricer | None,
    calibration: LinearCalibration | None,
    gamma: float | None,
) -> float:
    """A lower bound on how much the joint Ĉ grows per node added after the pass ``end``
    (one row), for any request: 0 when none can be proved.

    Adding a node raises the features by at least: T by 1, the attention pairs and mask
    elements by c_min + 3 (c_min the smallest bucketed context; the request already holds
    n ≥ 1 nodes), the KV tokens by 1; the padded T and the experts touched never fall.
    Every FLOP and byte coefficient is ≥ 0 (checked), so each branch rises by at least its
    coefficients times those increments. Ĉ is a max of branches (calibrated: of the two
    calibrated branches, α ≥ 0 checked; bare: Σ over operators of each one's max), and a
    max never falls below the branch that attains it at ``end``, so Ĉ(end + k) ≥ Ĉ(end) +
    k·(the rise of the branches that attain the max at ``end``); the EMA modes scale by γ
    (``gamma``; None outside them). Pricers and calibration as in :func:`joint_seconds`.
    """
    inc = np.array([1.0, 0.0, c_min + 3.0, 1.0, c_min + 3.0, 0.0])  # the feature order
    pricer = bare
    (f0, f), (b0, b) = pricer.flops, pricer.nbytes
    peak, bw = pricer.flop_rate, pricer.byte_rate
    if np.any(f < 0) or np.any(b < 0):
        return 0.0
    x = pricer.features(end)[0]
    if calibration is None:
        compute = (f0 + x @ f) / peak  # per operator
        memory = (b0 + x @ b) / bw
        op_rise_c, op_rise_m = inc @ f / peak, inc @ b / bw
        step = float(np.where(compute >= memory, op_rise_c, op_rise_m).sum())
    else:
        cal = calibration
        if cal.compute.alpha < 0 or cal.memory.alpha < 0:
            return 0.0
        memory_s = float(b0.sum() + x @ b.sum(axis=1)) / bw
        rise_m = float(inc @ b.sum(axis=1)) / bw
        if tiled is not None:
            pricer = tiled
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
    if bare.has_comm:  # each node adds a token to every all-reduce
        step += bare.comm_slope
    if gamma is not None:
        step *= gamma
    return max(step, 0.0)


def joint_pricing(model: Any, b: int) -> tuple[Array, int, Any, Any, float] | None:
    """What ``paper()`` prices a :class:`~bastion.cost.costmodel.RooflineCostModel`'s joint
    curve from (see ``_bestfirst_paper.c``) for a step of ``b`` requests: the 28 numbers
    :func:`joint_seconds` and :func:`growth_bound` read in the calibrated modes (static,
    ema+calib) of a dense target, where every count is a whole number, tensor parallelism's
    all-reduces included, with T_aux at 23 (read-only, kept on the model); the model's context
    bucket, to which the kernel rounds the contexts up; and the drafter pass's line for ``b``
    requests (:meth:`~bastion.cost.drafterpass.DrafterPricer.line`: its operators' seconds at
    Σc = 0, their change per context token, its launch seconds — empty without a drafter),
    from which the kernel prices T_draft at the bucketed contexts' sum as ``joint_cost_curve``
    does. None where the model is not such a model, and the caller prices the curve as the
    model does."""
    fixed = _joint_fixed(model)  # (None unless calibrated_dense(model))
    if fixed is None:
        return None
    step = model.context_bucket
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 1:
        return None
    step = int(step)
    if model.drafter is None:  # no drafter pass: T_draft is 0
        return fixed, step, b"", b"", 0.0
    at0, slope, launch = model._drafter_pricer().line(b)
    return fixed, step, at0, slope, float(launch)


def calibrated_dense(model: Any) -> bool:
    """Whether ``model`` is a calibrated roofline (modes static, ema+calib) of a dense target:
    what the compiled pricing of the joint and per-request rules reads (its counts whole)."""
    mode = getattr(model, "mode", None)
    cal = getattr(model, "calibration", None)
    if mode not in ("static", "ema+calib") or not isinstance(cal, LinearCalibration):
        return False
    return getattr(model, "model", None) is not None and not model.model.is_moe


def _joint_fixed(model: Any) -> Array | None:
    """:func:`joint_pricing`'s 28 numbers, kept on the model per correction (and T_aux), or
    None where the compiled pricing does not apply."""
    if not calibrated_dense(model):
        return None
    mode, cal = model.mode, model.calibration
    stamp = (mode, model.ema.gamma, model.prep_s)
    memo = memo_of(model)
    fixed: Array | None = memo.get(("joint-pricing", stamp))
    if fixed is None:
        bare = model._pricer(True, tiled=False)
        tiled = model._pricer(True, tiled=True) if model._tiled is not None else None
        compute = tiled if tiled is not None else bare
        (f0, f), (b0, b) = compute.flops, bare.nbytes
        sums = np.array([f0.sum(), *f.sum(axis=1), b0.sum(), *b.sum(axis=1)], np.float64)
        if not np.array_equal(sums, np.floor(sums)) or np.any(sums < 0):
            return None  # counts that are not whole non-negative numbers: numpy's order matters
        rates = [compute.flop_rate, compute.options.tile_tokens]
        memory = [bare.byte_rate, bare.options.tile_tokens]
        coefficients = np.concatenate((sums[:7], rates, sums[7:], memory))
        no_growth = (
            bool(np.any(bare.flops[1] < 0) or np.any(b < 0))
            or (tiled is not None and bool(np.any(f < 0)))
            or cal.compute.alpha < 0
            or cal.memory.alpha < 0
        )
        gamma = model.ema.gamma if mode == "ema+calib" else 0.0
        fixed = np.concatenate(
            (
                coefficients,
                [cal.compute.alpha, cal.compute.beta, cal.memory.alpha, cal.memory.beta, gamma],
                [float(model.prep_s), 1.0 if no_growth else 0.0],  # T_aux (paper() adds T_draft)
                # tensor parallelism's all-reduces (as joint_seconds and growth_bound add them)
                [1.0 if bare.has_comm else 0.0, bare.comm_const, bare.comm_slope],
            )
        ).astype(np.float64)
        fixed.flags.writeable = False
        fixed = memo.put(("joint-pricing", stamp), fixed)
    return fixed


Bound = tuple[PassShape, float, LinearPricer, LinearPricer | None, LinearCalibration | None]


def joint_corrected(
    model: Any, context_lens: npt.NDArray[Any], grow: npt.NDArray[Any]
) -> tuple[Array, int, float, Bound | None]:
    """``model.joint_cost_curve``'s corrected seconds (the passes after 0 … len(grow) additions,
    then L_AR) in numpy, B, the bucketed context sum, and what its growth bound reads (the last
    pass, the smallest context, the pricers and the calibration)."""
    shapes = joint_shapes(context_lens, grow, model.context_bucket)
    # the modes that read the calibrated branch (``_correct``); the tiled compute with it
    cal = None if model.mode in ("bare", "ema") else model.calibration
    bare = model._pricer(True, tiled=False)
    tiled = None
    if cal is not None and model._tiled is not None:
        tiled = model._pricer(True, tiled=True)
    seconds = joint_seconds(shapes.both, bare, tiled, cal)
    priced = model._correct(seconds, seconds)  # the mode reads only the branch priced
    bound = (shapes.end, shapes.c_min, bare, tiled, cal)
    return priced, shapes.requests, shapes.context_sum, bound


def joint_priced_compiled(
    model: Any, context_lens: npt.NDArray[Any], grow: npt.NDArray[Any]
) -> tuple[Array, int, float, None] | None:
    """:func:`joint_corrected`'s numbers (no growth bound) priced in one compiled call
    (``joint_price()``, ``_bestfirst_paper.c``), or None where it does not apply (no kernel,
    not a calibrated roofline of a dense target, counts that are not exact, inputs that
    joint_shapes refuses): the caller then prices them in numpy."""
    kernel = getattr(_compiled, "joint_price", None)
    if kernel is None:
        return None
    ctx, g = np.asarray(context_lens), np.asarray(grow)
    if ctx.ndim != 1 or ctx.size == 0 or ctx.dtype.kind not in "iu" or g.ndim != 1:
        return None
    if g.size and g.dtype.kind not in "iu":
        return None
    fixed = _joint_fixed(model)
    if fixed is None or ctx.min() < 0:
        return None
    step = model.context_bucket
    buckets = -(-ctx.astype(np.int64) // step) * step
    status, out = kernel(buckets.astype(np.float64), np.ascontiguousarray(g, np.int64), fixed)
    if status != 0:
        return None
    return np.frombuffer(out, np.float64), int(ctx.shape[0]), float(buckets.sum()), None
