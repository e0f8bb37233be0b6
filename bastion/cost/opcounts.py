"""Per-operator FLOPs and bytes of a forward pass (paper Table 11), priced on a hardware profile.

For every operator of a layer — norms, q/k/v/o projections, RoPE, attention scores and values,
the FFN (or router and active experts) — and of the pass around the layers (embedding, final
norm, LM head), a *raw term* ``(name, FLOPs, weight elements, KV elements, activation elements,
kernels)`` is written out with the notation of the paper's Table 11 (h, h_q = n_q·d,
h_kv = n_kv·d, f, V, E experts, K active per token). :func:`price_raws` turns raw terms into
seconds on a :class:`~bastion.cost.hardware.HardwareProfile`:

    t_op = max(FLOPs / (η_c · peak_flops), bytes / (η_m · bandwidth)) + kernels · launch_overhead,

with the opt-in per-operator refinements of :class:`RooflineOptions` (L2-resident activations,
GEMMs on whole waves of tiles). Every count may be a numpy array over N.

What this module does not do: assemble the public passes (:mod:`bastion.cost.roofline`,
:mod:`bastion.cost.drafterpass`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from bastion.cost.breakdown import OperatorCost, PassShape
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import MAX_CONFIG_INT, ModelSpec
from bastion.cost.parallel import tp_shard
from bastion.errors import ConfigError
from bastion.guard import array, integer, public

__all__ = ["RooflineOptions", "experts_touched", "gemm_dims"]

Array = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike
ExpertTouch = Literal["saturating", "uniform"]


@public
@dataclass(frozen=True)
class RooflineOptions:
    """Counting choices; the defaults follow the paper (bp = 2, whole embedding table read)."""

    bytes_per_param: float = 2.0  # bp for weights (bf16)
    bytes_per_act: float = 2.0  # bp for activations and the KV cache
    dtype: str = "bf16"  # which peak FLOP/s column of the profile
    full_embedding_table: bool = True  # paper: count the whole table; False: gathered rows only
    fused_qkv: bool = False  # one q/k/v GEMM (vLLM) instead of three (transformers)
    fused_gate_up: bool = False  # one gate+up GEMM instead of two
    expert_touch: ExpertTouch = "saturating"  # U(T): paper's min(E, K·T) or uniform routing
    tile_tokens: int = 0  # pad the GEMM token count to a multiple of this (0: off)
    # Per-operator refinements (off by default: they are not affine in the pass's features, so
    # LinearPricer and the cost model's curves cannot use them; validation and calibration can)
    l2_resident: bool = False  # activations of a kernel whose working set fits in L2: L2 speed
    gemm_waves: bool = False  # GEMM compute on whole waves of (tile_m × tile_n) tiles over SMs
    wave_tile_n: int = 128  # output columns per tile (tile_m: next power of two ≥ T in 16…128)
    # tensor parallelism: the pass one GPU of a group of this many runs (bastion.cost.parallel:
    # the model's heads, FFN and vocabulary split; its all-reduces priced apart, see roofline)
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.bytes_per_param <= 0 or self.bytes_per_act <= 0:
            raise ConfigError("bytes_per_param and bytes_per_act must be positive")
        if self.expert_touch not in ("saturating", "uniform"):
            raise ConfigError(
                f"expert_touch {self.expert_touch!r}; accepted: 'saturating', 'uniform'"
            )
        if self.tile_tokens < 0:
            raise ConfigError(f"tile_tokens must be ≥ 0, got {self.tile_tokens}")
        if self.wave_tile_n < 1:
            raise ConfigError(f"wave_tile_n must be ≥ 1, got {self.wave_tile_n}")
        tp = self.tensor_parallel
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1 << 16:
            raise ConfigError(f"tensor_parallel must be an integer in [1, 65536], got {tp!r:.40}")


@public(
    error=ConfigError,
    tokens=array(lo=0),
    experts=integer(1, MAX_CONFIG_INT),
    per_token=integer(1, MAX_CONFIG_INT),
)
def experts_touched(tokens: ArrayLike, experts: int, per_token: int, form: ExpertTouch) -> Array:
    """Expected distinct experts U(s) that ``tokens`` tokens route to in one layer.

    ``saturating`` (the paper's): U = min(E, K·s), which saturates at s = E/K;
    ``uniform``: the expectation under independent uniform top-K routing, E·(1 − (1 − K/E)^s).
    """
    if per_token > experts:
        raise ConfigError(f"per_token ({per_token}) must be ≤ experts ({experts})")
    s = np.asarray(tokens, dtype=np.float64)
    if form == "saturating":
        return np.minimum(float(experts), per_token * s)
    if form == "uniform":
        return experts * (1.0 - (1.0 - per_token / experts) ** s)
    raise ConfigError(f"expert_touch {form!r}; accepted: 'saturating', 'uniform'")


# (name, flops, weight elements, kv elements, activation elements, kernels) for one layer or pass
Raw = tuple[str, Array, Array, Array, Array, int]


def pad_tokens(tokens: Array, tile: int) -> Array:
    """``tokens`` rounded up to a multiple of ``tile`` (the GEMM's padded T; 0: unpadded)."""
    return np.ceil(tokens / tile) * tile if tile > 0 else tokens


def gemm_op(name: str, t: Array, tp: Array, k_in: int, n_out: int, kernels: int = 1) -> Raw:
    """y[T, n_out] = x[T, k_in] · W[k_in, n_out]: 2·T·k·n FLOPs; reads W and x, writes y."""
    zero = np.zeros(())
    return (
        name,
        2.0 * tp * k_in * n_out,
        np.asarray(float(k_in * n_out)),
        zero,
        t * (k_in + n_out),
        kernels,
    )


def layer_ops(
    m: ModelSpec,
    shape: PassShape,
    opt: RooflineOptions,
    masked: bool,
    tp: Array | None = None,
    u: Array | None = None,
) -> list[Raw]:
    """Per-layer raw terms. ``tp`` (padded tokens) and ``u`` (experts touched) default to their
    values at ``shape.tokens``; :class:`LinearPricer` passes them as independent features."""
    t = shape.tokens
    tp = pad_tokens(t, opt.tile_tokens) if tp is None else tp
    h, hq, hkv = m.hidden, m.h_q, m.h_kv
    zero = np.zeros(())
    ops: list[Raw] = [("input_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1)]
    if opt.fused_qkv:
        ops.append(gemm_op("qkv_proj", t, tp, h, hq + 2 * hkv))
    else:
        ops += [
            gemm_op("q_proj", t, tp, h, hq),
            gemm_op("k_proj", t, tp, h, hkv),
            gemm_op("v_proj", t, tp, h, hkv),
        ]
    if m.qk_norm:
        ops.append(
            (
                "qk_norm",
                4.0 * t * (hq + hkv),
                np.asarray(2.0 * m.head_dim),
                zero,
                2.0 * t * (hq + hkv),
                2,
            )
        )
    ops.append(("rope", 3.0 * t * (hq + hkv), zero, zero, 2.0 * t * (hq + hkv), 1))
    ops.append(("kv_cache_write", zero, zero, 2.0 * t * hkv, 2.0 * t * hkv, 1))
    # scores: Q·Kᵀ over s_i × (c_i + s_i) pairs per head (2·d FLOPs each) + softmax (~5 per score)
    n_q = m.q_heads
    mask = shape.mask_elems if masked else zero
    score_flops = (2.0 * hq + 5.0 * n_q) * shape.attn_pairs
    ops.append(("attn_scores", score_flops, zero, shape.kv_tokens * hkv, t * hq + mask, 1))
    ops.append(
        ("attn_values", 2.0 * hq * shape.attn_pairs, zero, shape.kv_tokens * hkv, t * hq, 0)
    )  # kernel shared with the scores
    ops.append(gemm_op("o_proj", t, tp, hq, h))
    ops.append(("post_attn_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1))
    if m.is_moe:
        e, k, f = m.experts, m.experts_per_token, m.expert_ffn
        u = experts_touched(t, e, k, opt.expert_touch) if u is None else u
        tk = t * k
        ops.append(
            (
                "router",
                2.0 * tp * h * e + 5.0 * t * e,
                np.asarray(float(h * e)),
                zero,
                t * (h + 2 * e),
                2,
            )
        )
        ops.append(
            ("experts_gate_up", 2.0 * tk * h * 2 * f, u * h * 2 * f, zero, tk * (h + 2 * f), 1)
        )
        ops.append(("experts_act", 5.0 * tk * f, zero, zero, 3.0 * tk * f, 1))
        ops.append(("experts_down", 2.0 * tk * f * h, u * f * h, zero, tk * (f + 2 * h), 1))
    else:
        f = m.ffn
        if opt.fused_gate_up:
            ops.append(gemm_op("gate_up_proj", t, tp, h, 2 * f))
        else:
            ops += [gemm_op("gate_proj", t, tp, h, f), gemm_op("up_proj", t, tp, h, f)]
        ops.append(("act", 5.0 * t * f, zero, zero, 3.0 * t * f, 1))  # SiLU(gate)·up, fused
        ops.append(gemm_op("down_proj", t, tp, f, h))
    ops.append(("residual_add", 2.0 * t * h, zero, zero, 6.0 * t * h, 2))
    return ops


def wave_flops(tokens: Array, k_in: int, n_out: int, sm_count: int, tile_n: int) -> Array:
    """FLOPs a tiled GEMM y[T, n] = x[T, k]·W executes in whole waves: tiles of tile_m × tile_n
    outputs (tile_m the power of two ≥ T, clipped to 16 … 128), ⌈tiles / SMs⌉ waves, each
    running every SM on a full tile: waves · SMs · tile_m · tile_n · 2k."""
    t = np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)
    tile_m = np.clip(2.0 ** np.ceil(np.log2(t)), 16.0, 128.0)
    tiles = np.ceil(t / tile_m) * math.ceil(n_out / tile_n)
    waves = np.ceil(tiles / sm_count)
    out: Array = waves * sm_count * tile_m * tile_n * 2.0 * k_in
    return out


def price_raws(
    raws: list[tuple[Raw, int]],
    hw: HardwareProfile,
    opt: RooflineOptions,
    tokens: Array | None = None,
    dims: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[OperatorCost, ...]:
    """Each raw term × its repeat count, priced on ``hw``: one :class:`OperatorCost` per term.

    ``tokens`` (the padded T) and ``dims`` (:func:`gemm_dims`) are what ``gemm_waves`` needs;
    without them every GEMM is priced by its FLOPs alone."""
    peak = hw.peak_flops(opt.dtype) * hw.compute_efficiency
    bandwidth = hw.memory_bandwidth * hw.memory_efficiency
    # L2 bandwidth where the profile gives a sourced one; otherwise L2-resident bytes are priced
    # at DRAM speed (the split is kept, so a calibration can still give them their own slope)
    l2_bandwidth = (hw.l2_bandwidth or hw.memory_bandwidth) * hw.memory_efficiency
    bw_, ba_ = opt.bytes_per_param, opt.bytes_per_act
    out = []
    for (name, flops, w, kv, act, kernels), times in raws:
        f = flops * times
        wb, kb, ab = w * bw_ * times, kv * ba_ * times, act * ba_ * times
        compute_s = f / peak
        if opt.gemm_waves and dims is not None and tokens is not None and name in dims:
            k_in, n_out = dims[name]
            waved = wave_flops(tokens, k_in, n_out, hw.sm_count, opt.wave_tile_n) * times
            compute_s = np.maximum(f, waved) / peak
        l2_s: Array | float = 0.0
        if opt.l2_resident:
            # one kernel's activation working set (one layer's instance, all its kernels)
            resident = act * ba_ <= hw.l2_bytes
            l2_s = np.where(resident, ab, 0.0) / l2_bandwidth
            memory_s = (wb + kb + np.where(resident, 0.0, ab)) / bandwidth + l2_s
        else:
            memory_s = (wb + kb + ab) / bandwidth
        out.append(
            OperatorCost(
                name=name,
                flops=f,
                weight_bytes=wb,
                kv_bytes=kb,
                act_bytes=ab,
                kernels=kernels * times,
                compute_s=compute_s,
                memory_s=memory_s,
                launch_s=kernels * times * hw.launch_overhead_s,
                l2_s=l2_s,
            )
        )
    return tuple(out)


@public
def gemm_dims(model: ModelSpec, opt: RooflineOptions) -> dict[str, tuple[int, int]]:
    """(k_in, n_out) of every dense GEMM of a target pass, by operator name (one GPU's share
    with ``opt.tensor_parallel`` > 1)."""
    model = per_gpu(model, opt)
    h, hq, hkv = model.hidden, model.h_q, model.h_kv
    dims = {"o_proj": (hq, h), "lm_head": (h, model.vocab)}
    if opt.fused_qkv:
        dims["qkv_proj"] = (h, hq + 2 * hkv)
    else:
        dims.update(q_proj=(h, hq), k_proj=(h, hkv), v_proj=(h, hkv))
    if not model.is_moe:
        f = model.ffn
        if opt.fused_gate_up:
            dims["gate_up_proj"] = (h, 2 * f)
        else:
            dims.update(gate_proj=(h, f), up_proj=(h, f))
        dims["down_proj"] = (f, h)
    return dims


def per_gpu(model: ModelSpec, opt: RooflineOptions) -> ModelSpec:
    """The part of ``model`` one GPU runs under ``opt.tensor_parallel`` (``model`` at 1)."""
    if opt.tensor_parallel == 1:
        return model
    return tp_shard(model, opt.tensor_parallel)


def check_layers(model: ModelSpec) -> None:
    """A :class:`ConfigError` for a model without layers (nothing to price)."""
    if model.layers < 1:
        raise ConfigError(f"model {model.name!r} has no layers")


def pass_raws(
    model: ModelSpec,
    shape: PassShape,
    opt: RooflineOptions,
    masked: bool,
    tp: Array | None = None,
    u: Array | None = None,
) -> list[tuple[Raw, int]]:
    """Raw terms of a whole target pass: embedding, the layers, final norm, LM head (one GPU's
    share with ``opt.tensor_parallel`` > 1: :func:`bastion.cost.parallel.tp_shard`)."""
    model = per_gpu(model, opt)
    t = shape.tokens
    tp = pad_tokens(t, opt.tile_tokens) if tp is None else tp
    zero = np.zeros(())
    h, v = model.hidden, model.vocab
    if opt.full_embedding_table:
        embed: Raw = ("embedding", zero, np.asarray(float(v * h)), zero, t * h, 1)
    else:  # gathered rows only: T·h elements read, T·h written
        embed = ("embedding", zero, zero, zero, 2.0 * t * h, 1)
    raws: list[tuple[Raw, int]] = [(embed, 1)]
    layer = layer_ops(model, shape, opt, masked=masked, tp=tp, u=u)
    raws += [(op, model.layers) for op in layer]
    raws.append((("final_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1), 1))
    raws.append((gemm_op("lm_head", t, tp, h, v), 1))
    return raws
