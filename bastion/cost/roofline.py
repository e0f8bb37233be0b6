"""Per-operator roofline of one forward pass (paper Appendix G), dense and Qwen3-MoE.

A verification pass processes a batch of requests; request i verifies s_i tokens (its tree, root
included) over c_i tokens already in its KV cache. For every operator of the target — norms,
q/k/v/o projections, RoPE, attention scores and values, the FFN (or router and active experts),
the LM head — we count the FLOPs and the bytes moved (weights, KV-cache reads and writes,
activations) and price it as

    t_op = max(FLOPs / (η_c · peak_flops), bytes / (η_m · bandwidth)) + kernels · launch_overhead.

All counts are written out (:mod:`bastion.cost.opcounts`) with the notation of the paper's
Table 11: h (hidden), h_q = n_q·d, h_kv = n_kv·d, f (FFN width, one expert's width for MoE),
V (vocabulary), E experts, K active per token, bp bytes per element. T = Σ s_i is the number of
tokens in the pass.

Tensor parallelism (``RooflineOptions.tensor_parallel`` = N > 1): every count is one GPU's
share (:func:`bastion.cost.parallel.tp_shard`), and the pass gains an ``all_reduce`` entry: its
2L ring all-reduces of T·h activations over the profile's interconnect
(:func:`bastion.cost.parallel.comm_line`), whose seconds (``comm_s``) are added to the
operators' sum, outside their max(compute, memory).

Attention: a tree token sees the prefix and its ancestors, but the kernel the real backend runs
(SDPA with a 4-D additive mask) computes every (query, key) pair of its s_i × (c_i + s_i) block
and reads the mask, so that is what we count; the count is quadratic in s_i (Prop. 3.4's convex
premise). Every argument may be a numpy array: the whole curve N = 1 … N_max is one call.

This module prices the target's passes (:func:`verify_pass`, :func:`price_pass`,
:func:`ar_step`, :func:`weight_bytes`) and their matrix form (:class:`LinearPricer`); it also
re-exports the roofline's other names from where they live: the options and the counts
(:mod:`bastion.cost.opcounts`), the shapes and breakdowns (:mod:`bastion.cost.breakdown`), the
drafter's pass (:mod:`bastion.cost.drafterpass`).

What this module does not do: calibration (:mod:`bastion.cost.calibration`) or the
``CostModel`` protocol (:mod:`bastion.cost.costmodel`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from bastion.cost.breakdown import OperatorCost, PassShape, RooflineBreakdown
from bastion.cost.drafterpass import DrafterPricer, drafter_pass
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import ModelSpec
from bastion.cost.opcounts import (
    RooflineOptions,
    check_layers,
    experts_touched,
    gemm_dims,
    pad_tokens,
    pass_raws,
    price_raws,
)
from bastion.cost.parallel import comm_line, comm_op
from bastion.errors import ConfigError
from bastion.guard import public

__all__ = [
    "DrafterPricer",
    "LinearPricer",
    "OperatorCost",
    "PassShape",
    "RooflineBreakdown",
    "RooflineOptions",
    "ar_step",
    "drafter_pass",
    "experts_touched",
    "gemm_dims",
    "price_pass",
    "verify_pass",
    "weight_bytes",
]

Array = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike


@public
def verify_pass(
    model: ModelSpec,
    hw: HardwareProfile,
    requests: Iterable[tuple[ArrayLike, ArrayLike]],
    options: RooflineOptions | None = None,
    masked: bool = True,
) -> RooflineBreakdown:
    """Roofline of one target pass over ``requests`` = ``[(s_i, c_i), …]`` (arrays allowed).

    Every request's s_i tokens produce logits (tree verification needs all of them).
    ``masked``: the pass reads a 4-D tree mask (every tree verification, even of the root alone,
    so that the cost stays convex in s); a plain autoregressive step does not.
    """
    return price_pass(model, hw, PassShape.of(requests, masked=masked), options, masked)


@public
def price_pass(
    model: ModelSpec,
    hw: HardwareProfile,
    shape: PassShape,
    options: RooflineOptions | None = None,
    masked: bool = True,
) -> RooflineBreakdown:
    """Roofline of one target pass with the aggregate ``shape`` (see :func:`verify_pass`)."""
    opt = options or RooflineOptions()
    check_layers(model)
    raws = pass_raws(model, shape, opt, masked)
    tokens = pad_tokens(shape.tokens, opt.tile_tokens)
    priced = price_raws(raws, hw, opt, tokens, gemm_dims(model, opt))
    if opt.tensor_parallel > 1:
        priced = (*priced, comm_op(model, hw, opt.tensor_parallel, opt.bytes_per_act, shape.tokens))
    return RooflineBreakdown(priced, meta={"layers": float(model.layers)})


# Features of a pass that every raw term is linear in: T, padded T, attention pairs, KV tokens,
# mask elements, experts touched (MoE).
_N_FEATURES = 6


@public
class LinearPricer:
    """The roofline of :func:`price_pass` as matrices: identical numbers, a few numpy calls.

    Every FLOP and byte count of a target pass is an affine function of six features of its
    shape (T, padded T, attention pairs, KV tokens, mask elements, experts touched), so the
    per-operator counts are read off once, by evaluating the raw terms at the zero point and the
    six unit points, and a pass is then priced as ``max(F·x / peak, B·x / bw) + launches`` per
    operator. This is what makes cost curves and the simulator's truth cheap per step.
    """

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareProfile,
        options: RooflineOptions | None = None,
        masked: bool = True,
    ) -> None:
        self.model, self.hw = model, hw
        self.options = opt = options or RooflineOptions()
        self.masked = masked
        check_layers(model)
        if opt.l2_resident or opt.gemm_waves:
            raise ConfigError(
                "LinearPricer prices passes that are affine in their features; "
                "l2_resident and gemm_waves are not (accepted: both False)"
            )
        basis = np.vstack((np.zeros(_N_FEATURES), np.eye(_N_FEATURES)))  # [7, 6]
        shape = PassShape(
            tokens=basis[:, 0],
            attn_pairs=basis[:, 2],
            kv_tokens=basis[:, 3],
            mask_elems=basis[:, 4],
        )
        raws = pass_raws(model, shape, opt, masked, tp=basis[:, 1], u=basis[:, 5])
        bw_, ba_ = opt.bytes_per_param, opt.bytes_per_act
        flops, nbytes, kernels = [], [], []
        for (_, f, w, kv, act, k), times in raws:
            flops.append(np.broadcast_to(f * times, (basis.shape[0],)))
            nbytes.append(np.broadcast_to((w * bw_ + (kv + act) * ba_) * times, (basis.shape[0],)))
            kernels.append(k * times)
        f_mat, b_mat = np.array(flops), np.array(nbytes)  # [ops, 7]
        self.names = tuple(r[0][0] for r in raws)
        self._f0, self._f = f_mat[:, 0], (f_mat[:, 1:] - f_mat[:, :1]).T  # [ops], [6, ops]
        self._b0, self._b = b_mat[:, 0], (b_mat[:, 1:] - b_mat[:, :1]).T
        for a in (self._f0, self._f, self._b0, self._b):
            a.flags.writeable = False  # shared with readers of .flops / .nbytes
        self._peak = hw.peak_flops(opt.dtype) * hw.compute_efficiency
        self._bw = hw.memory_bandwidth * hw.memory_efficiency
        self.launch_s = np.array(kernels, dtype=np.float64) * hw.launch_overhead_s  # [ops]
        # tensor parallelism's all-reduces: comm_const + comm_slope · T seconds, added to the
        # operators' sum (both 0 on one GPU)
        self.comm_const, self.comm_slope = comm_line(
            model, hw, opt.tensor_parallel, opt.bytes_per_act
        )

    @property
    def has_comm(self) -> bool:
        """Whether passes spend time on the link between GPUs (tensor parallelism > 1)."""
        return self.options.tensor_parallel > 1

    def comm_s(self, tokens: npt.ArrayLike) -> Array:
        """Seconds of the all-reduces of passes of ``tokens`` tokens (0 on one GPU)."""
        return self.comm_const + self.comm_slope * np.asarray(tokens, dtype=np.float64)

    @property
    def flops(self) -> tuple[Array, Array]:
        """Per-operator FLOPs as (constant [ops], per feature [6, ops]): a pass of features x
        (:meth:`features`) does ``constant + x @ per_feature`` FLOPs per operator. Read-only."""
        return self._f0, self._f

    @property
    def nbytes(self) -> tuple[Array, Array]:
        """Per-operator bytes moved, as :attr:`flops` (constant, per feature). Read-only."""
        return self._b0, self._b

    @property
    def flop_rate(self) -> float:
        """The FLOP/s a pass achieves: the profile's peak at the dtype × compute efficiency."""
        return float(self._peak)

    @property
    def byte_rate(self) -> float:
        """The bytes/s a pass achieves: memory bandwidth × memory efficiency."""
        return float(self._bw)

    def features(self, shape: PassShape) -> Array:
        """[..., 6] features of ``shape`` (whose fields may be arrays over N)."""
        t = np.asarray(shape.tokens, dtype=np.float64)
        m = self.model
        u = (
            experts_touched(t, m.experts, m.experts_per_token, self.options.expert_touch)
            if m.is_moe
            else np.zeros_like(t)
        )
        mask = shape.mask_elems if self.masked else np.zeros_like(t)
        cols = np.broadcast_arrays(
            t, pad_tokens(t, self.options.tile_tokens), shape.attn_pairs, shape.kv_tokens, mask, u
        )
        return np.stack(cols, axis=-1)

    def branches(self, shape: PassShape) -> tuple[Array, Array]:
        """Per-operator (compute seconds, memory seconds), each [..., ops]."""
        x = self.features(shape)
        return (self._f0 + x @ self._f) / self._peak, (self._b0 + x @ self._b) / self._bw

    def total_s(self, shape: PassShape, op_scale: Array | None = None) -> Array:
        """Σ_op max(compute, memory) + launches (+ the all-reduces with tensor parallelism);
        ``op_scale`` multiplies each operator's time."""
        c, mem = self.branches(shape)
        per_op = np.maximum(c, mem) + self.launch_s
        if op_scale is not None:
            per_op = per_op * op_scale
        total = np.asarray(per_op.sum(axis=-1))
        if self.has_comm:
            total = total + self.comm_s(shape.tokens)
        return np.asarray(total)


@public
def ar_step(
    model: ModelSpec,
    hw: HardwareProfile,
    context: ArrayLike,
    options: RooflineOptions | None = None,
) -> RooflineBreakdown:
    """L_AR: one target-only autoregressive step (s = 1) over ``context`` cached tokens."""
    return verify_pass(model, hw, [(1, context)], options, masked=False)


@public
def weight_bytes(
    model: ModelSpec, hw: HardwareProfile, tokens: int = 1, options: RooflineOptions | None = None
) -> float:
    """Bytes of weights one pass of ``tokens`` tokens reads (s = 1: a decode step)."""
    return float(verify_pass(model, hw, [(tokens, 0)], options).weight_bytes)
