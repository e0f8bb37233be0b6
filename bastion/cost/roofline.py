"""Per-operator roofline of one forward pass (paper Appendix G), dense and Qwen3-MoE.

A verification pass processes a batch of requests; request i verifies s_i tokens (its tree, root
included) over c_i tokens already in its KV cache. For every operator of the target — norms,
q/k/v/o projections, RoPE, attention scores and values, the FFN (or router and active experts),
the LM head — we count the FLOPs and the bytes moved (weights, KV-cache reads and writes,
activations) and price it as

    t_op = max(FLOPs / (η_c · peak_flops), bytes / (η_m · bandwidth)) + kernels · launch_overhead.

All counts are written out below with the notation of the paper's Table 11: h (hidden), h_q = n_q·d,
h_kv = n_kv·d, f (FFN width, one expert's width for MoE), V (vocabulary), E experts, K active
per token, bp bytes per element. T = Σ s_i is the number of tokens in the pass.

Attention: a tree token sees the prefix and its ancestors, but the kernel the real backend runs
(SDPA with a 4-D additive mask) computes every (query, key) pair of its s_i × (c_i + s_i) block
and reads the mask, so that is what we count; the count is quadratic in s_i (Prop. 3.4's convex
premise). Every argument may be a numpy array: the whole curve N = 1 … N_max is one call.

What this module does not do: calibration (:mod:`bastion.cost.calibration`) or the
``CostModel`` protocol (:mod:`bastion.cost.costmodel`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import MAX_CONFIG_INT, DrafterSpec, ModelSpec
from bastion.errors import ConfigError
from bastion.guard import array, each, integer, number, public

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


@dataclass(frozen=True)
class PassShape:
    """Aggregate token counts of one batched pass (each field may be an array over N)."""

    tokens: Array  # T = Σ s_i
    attn_pairs: Array  # Σ s_i · (c_i + s_i): (query, key) pairs the attention kernel computes
    kv_tokens: Array  # Σ (c_i + s_i): cached + new keys/values read per layer
    mask_elems: Array  # Σ s_i · (c_i + s_i): the additive tree mask read (0 when unmasked)

    @classmethod
    @public(error=ConfigError)
    def of(cls, requests: Iterable[tuple[ArrayLike, ArrayLike]], masked: bool = True) -> PassShape:
        """From ``(s_i, c_i)`` pairs; ``masked=False`` for non-causal passes without a mask."""
        tokens: Array = np.zeros(())
        pairs: Array = np.zeros(())
        kv: Array = np.zeros(())
        mask: Array = np.zeros(())
        any_request = False
        try:
            for s_raw, c_raw in requests:
                any_request = True
                s = np.asarray(s_raw, dtype=np.float64)
                c = np.asarray(c_raw, dtype=np.float64)
                if not (np.all(np.isfinite(s)) and np.all(np.isfinite(c))):
                    raise ConfigError("every request's s and c must be finite numbers")
                if np.any(s < 1) or np.any(c < 0):
                    raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
                tokens = tokens + s
                pairs = pairs + s * (c + s)
                kv = kv + c + s
                if masked:
                    mask = mask + s * (c + s)
        except (TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(
                f"PassShape.of: requests must be (s, c) pairs of numbers or arrays that "
                f"broadcast together ({exc})"
            ) from None
        if not any_request:
            raise ConfigError("a pass needs at least one request")
        return cls(tokens=tokens, attn_pairs=pairs, kv_tokens=kv, mask_elems=mask)

    @classmethod
    @public(error=ConfigError, tokens=array(1, lo=1), contexts=array(1, lo=0))
    def of_batch(cls, tokens: ArrayLike, contexts: ArrayLike, masked: bool = True) -> PassShape:
        """The same aggregates from two equal-length 1-D arrays, summed in one numpy pass.

        For pricing one batched pass of many requests quickly (the simulator does this once per
        serving step); ``of`` is the general form that also accepts per-request arrays.
        """
        s = np.asarray(tokens, dtype=np.float64)
        c = np.asarray(contexts, dtype=np.float64)
        if s.ndim != 1 or s.shape != c.shape or s.size == 0:
            raise ConfigError("of_batch needs two equal-length, non-empty 1-D arrays")
        if np.any(s < 1) or np.any(c < 0):
            raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
        pairs = float(np.dot(s, c + s))
        return cls(
            tokens=np.asarray(float(s.sum())),
            attn_pairs=np.asarray(pairs),
            kv_tokens=np.asarray(float((c + s).sum())),
            mask_elems=np.asarray(pairs if masked else 0.0),
        )


@dataclass(frozen=True)
class OperatorCost:
    """One operator summed over the pass (all layers); fields are floats or arrays over N."""

    name: str
    flops: Array  # FLOPs
    weight_bytes: Array  # bytes of weights read
    kv_bytes: Array  # bytes of KV cache read and written
    act_bytes: Array  # bytes of activations (and masks) read and written
    kernels: int  # kernel launches
    compute_s: Array  # flops / (η_c · peak)
    memory_s: Array  # bytes / (η_m · bandwidth)
    launch_s: float  # kernels · launch overhead
    l2_s: Array | float = 0.0  # the part of memory_s spent on L2-resident bytes (l2_resident)

    @property
    def bytes(self) -> Array:
        return self.weight_bytes + self.kv_bytes + self.act_bytes

    @property
    def time_s(self) -> Array:
        return np.maximum(self.compute_s, self.memory_s) + self.launch_s

    def at(self, index: int) -> OperatorCost:
        def pick(a: Array) -> Array:
            arr = np.asarray(a)
            return arr if arr.ndim == 0 else arr[index]

        return replace(
            self,
            flops=pick(self.flops),
            weight_bytes=pick(self.weight_bytes),
            kv_bytes=pick(self.kv_bytes),
            act_bytes=pick(self.act_bytes),
            compute_s=pick(self.compute_s),
            memory_s=pick(self.memory_s),
            l2_s=pick(np.asarray(self.l2_s)),
        )


@dataclass(frozen=True)
class RooflineBreakdown:
    """Per-operator costs of one pass, with totals per branch (compute, memory, launch)."""

    operators: tuple[OperatorCost, ...]
    meta: Mapping[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> Array:
        """Σ_op max(compute, memory) + launches: the roofline prediction."""
        return sum((op.time_s for op in self.operators), np.zeros(()))

    @property
    def compute_s(self) -> Array:
        """The compute branch: Σ_op FLOPs / (η_c · peak)."""
        return sum((op.compute_s for op in self.operators), np.zeros(()))

    @property
    def memory_s(self) -> Array:
        """The memory branch: Σ_op bytes / (η_m · bandwidth)."""
        return sum((op.memory_s for op in self.operators), np.zeros(()))

    @property
    def launch_s(self) -> float:
        return float(sum(op.launch_s for op in self.operators))

    @property
    def flops(self) -> Array:
        return sum((op.flops for op in self.operators), np.zeros(()))

    @property
    def bytes(self) -> Array:
        return sum((op.bytes for op in self.operators), np.zeros(()))

    @property
    def weight_bytes(self) -> Array:
        return sum((op.weight_bytes for op in self.operators), np.zeros(()))

    def op(self, name: str) -> OperatorCost:
        for op in self.operators:
            if op.name == name:
                return op
        known = ", ".join(o.name for o in self.operators)
        raise KeyError(f"no operator {name!r}; known: {known}")

    def at(self, index: int) -> RooflineBreakdown:
        """The scalar breakdown of entry ``index`` of a vectorised one."""
        return RooflineBreakdown(tuple(op.at(index) for op in self.operators), self.meta)

    def seconds(self) -> dict[str, float]:
        """Operator name → seconds (scalar breakdowns only), plus the branch totals."""
        out = {op.name: float(op.time_s) for op in self.operators}
        out["branch.compute"] = float(self.compute_s)
        out["branch.memory"] = float(self.memory_s)
        out["branch.launch"] = self.launch_s
        return out

    def to_records(self) -> list[dict[str, float | str]]:
        """One JSON-ready row per operator (scalar breakdowns only)."""
        return [
            {
                "op": op.name,
                "time_s": float(op.time_s),
                "compute_s": float(op.compute_s),
                "memory_s": float(op.memory_s),
                "launch_s": op.launch_s,
                "flops": float(op.flops),
                "bytes": float(op.bytes),
                "weight_bytes": float(op.weight_bytes),
                "kv_bytes": float(op.kv_bytes),
                "act_bytes": float(op.act_bytes),
                "bound": "compute" if float(op.compute_s) >= float(op.memory_s) else "memory",
            }
            for op in self.operators
        ]


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
_Raw = tuple[str, Array, Array, Array, Array, int]


def _pad(tokens: Array, tile: int) -> Array:
    return np.ceil(tokens / tile) * tile if tile > 0 else tokens


def _gemm(name: str, t: Array, tp: Array, k_in: int, n_out: int, kernels: int = 1) -> _Raw:
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


def _layer_ops(
    m: ModelSpec,
    shape: PassShape,
    opt: RooflineOptions,
    masked: bool,
    tp: Array | None = None,
    u: Array | None = None,
) -> list[_Raw]:
    """Per-layer raw terms. ``tp`` (padded tokens) and ``u`` (experts touched) default to their
    values at ``shape.tokens``; :class:`LinearPricer` passes them as independent features."""
    t = shape.tokens
    tp = _pad(t, opt.tile_tokens) if tp is None else tp
    h, hq, hkv = m.hidden, m.h_q, m.h_kv
    zero = np.zeros(())
    ops: list[_Raw] = [("input_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1)]
    if opt.fused_qkv:
        ops.append(_gemm("qkv_proj", t, tp, h, hq + 2 * hkv))
    else:
        ops += [
            _gemm("q_proj", t, tp, h, hq),
            _gemm("k_proj", t, tp, h, hkv),
            _gemm("v_proj", t, tp, h, hkv),
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
    ops.append(_gemm("o_proj", t, tp, hq, h))
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
            ops.append(_gemm("gate_up_proj", t, tp, h, 2 * f))
        else:
            ops += [_gemm("gate_proj", t, tp, h, f), _gemm("up_proj", t, tp, h, f)]
        ops.append(("act", 5.0 * t * f, zero, zero, 3.0 * t * f, 1))  # SiLU(gate)·up, fused
        ops.append(_gemm("down_proj", t, tp, f, h))
    ops.append(("residual_add", 2.0 * t * h, zero, zero, 6.0 * t * h, 2))
    return ops


def _wave_flops(tokens: Array, k_in: int, n_out: int, sm_count: int, tile_n: int) -> Array:
    """FLOPs a tiled GEMM y[T, n] = x[T, k]·W executes in whole waves: tiles of tile_m × tile_n
    outputs (tile_m the power of two ≥ T, clipped to 16 … 128), ⌈tiles / SMs⌉ waves, each
    running every SM on a full tile: waves · SMs · tile_m · tile_n · 2k."""
    t = np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)
    tile_m = np.clip(2.0 ** np.ceil(np.log2(t)), 16.0, 128.0)
    tiles = np.ceil(t / tile_m) * math.ceil(n_out / tile_n)
    waves = np.ceil(tiles / sm_count)
    out: Array = waves * sm_count * tile_m * tile_n * 2.0 * k_in
    return out


def _price(
    raws: list[tuple[_Raw, int]],
    hw: HardwareProfile,
    opt: RooflineOptions,
    tokens: Array | None = None,
    dims: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[OperatorCost, ...]:
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
            waved = _wave_flops(tokens, k_in, n_out, hw.sm_count, opt.wave_tile_n) * times
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
    """(k_in, n_out) of every dense GEMM of a target pass, by operator name."""
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


def _check_layers(model: ModelSpec) -> None:
    if model.layers < 1:
        raise ConfigError(f"model {model.name!r} has no layers")


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
    _check_layers(model)
    raws = _pass_raws(model, shape, opt, masked)
    tokens = _pad(shape.tokens, opt.tile_tokens)
    priced = _price(raws, hw, opt, tokens, gemm_dims(model, opt))
    return RooflineBreakdown(priced, meta={"layers": float(model.layers)})


def _pass_raws(
    model: ModelSpec,
    shape: PassShape,
    opt: RooflineOptions,
    masked: bool,
    tp: Array | None = None,
    u: Array | None = None,
) -> list[tuple[_Raw, int]]:
    """Raw terms of a whole target pass: embedding, the layers, final norm, LM head."""
    t = shape.tokens
    tp = _pad(t, opt.tile_tokens) if tp is None else tp
    zero = np.zeros(())
    h, v = model.hidden, model.vocab
    if opt.full_embedding_table:
        embed: _Raw = ("embedding", zero, np.asarray(float(v * h)), zero, t * h, 1)
    else:  # gathered rows only: T·h elements read, T·h written
        embed = ("embedding", zero, zero, zero, 2.0 * t * h, 1)
    raws: list[tuple[_Raw, int]] = [(embed, 1)]
    layer = _layer_ops(model, shape, opt, masked=masked, tp=tp, u=u)
    raws += [(op, model.layers) for op in layer]
    raws.append((("final_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1), 1))
    raws.append((_gemm("lm_head", t, tp, h, v), 1))
    return raws


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
        _check_layers(model)
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
        raws = _pass_raws(model, shape, opt, masked, tp=basis[:, 1], u=basis[:, 5])
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
            t, _pad(t, self.options.tile_tokens), shape.attn_pairs, shape.kv_tokens, mask, u
        )
        return np.stack(cols, axis=-1)

    def branches(self, shape: PassShape) -> tuple[Array, Array]:
        """Per-operator (compute seconds, memory seconds), each [..., ops]."""
        x = self.features(shape)
        return (self._f0 + x @ self._f) / self._peak, (self._b0 + x @ self._b) / self._bw

    def total_s(self, shape: PassShape, op_scale: Array | None = None) -> Array:
        """Σ_op max(compute, memory) + launches; ``op_scale`` multiplies each operator's time."""
        c, mem = self.branches(shape)
        per_op = np.maximum(c, mem) + self.launch_s
        if op_scale is not None:
            per_op = per_op * op_scale
        return np.asarray(per_op.sum(axis=-1))


@public
def ar_step(
    model: ModelSpec,
    hw: HardwareProfile,
    context: ArrayLike,
    options: RooflineOptions | None = None,
) -> RooflineBreakdown:
    """L_AR: one target-only autoregressive step (s = 1) over ``context`` cached tokens."""
    return verify_pass(model, hw, [(1, context)], options, masked=False)


@public(contexts=each(number(lo=0.0)), new_context_tokens=integer(lo=0))
def drafter_pass(
    drafter: DrafterSpec,
    hw: HardwareProfile,
    contexts: Iterable[ArrayLike],
    options: RooflineOptions | None = None,
    new_context_tokens: int | None = None,
) -> RooflineBreakdown:
    """One DFlash draft for each request of a batch (``contexts`` = their cached lengths).

    Per request: ``fc`` projects the newly committed tokens' tapped features (``taps·h → h``,
    default: a full block of new tokens, an upper bound) and each layer appends their K/V to the
    drafter cache; then the block of ``block_size`` tokens runs through the drafter's layers,
    attending (non-causally, no mask) to the cached context and to the block; the target's LM head
    produces logits for the ``block_size − 1`` masked slots. Embedding: gathered rows only.
    """
    opt = options or RooflineOptions()
    m = drafter.model
    _check_layers(m)
    b = drafter.block_size
    new = b if new_context_tokens is None else new_context_tokens
    ctx = list(contexts)
    n_req = float(len(ctx))
    shape = PassShape.of_batch(np.full(len(ctx), float(b)), np.asarray(ctx, float), masked=False)
    t = shape.tokens
    zero = np.zeros(())
    h, v = m.hidden, m.vocab
    new_t = np.asarray(n_req * new)
    fc_in = drafter.taps * h
    raws: list[tuple[_Raw, int]] = [
        (("embedding", zero, zero, zero, 2.0 * t * h, 1), 1),
        (_gemm("ctx_fc", new_t, new_t, fc_in, h), 1),
        (("ctx_norm", 4.0 * new_t * h, np.asarray(float(h)), zero, 2.0 * new_t * h, 1), 1),
        # K/V of the new context tokens; weights are those of k_proj/v_proj, counted there
        (
            ("ctx_kv_proj", 2.0 * new_t * h * 2 * m.h_kv, zero, 2.0 * new_t * m.h_kv, new_t * h, 2),
            m.layers,
        ),
    ]
    raws += [(op, m.layers) for op in _layer_ops(m, shape, opt, masked=False)]
    logit_rows = np.asarray(n_req * (b - 1))
    raws.append((("final_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1), 1))
    raws.append((_gemm("lm_head", logit_rows, logit_rows, h, v), 1))
    return RooflineBreakdown(_price(raws, hw, opt), meta={"layers": float(m.layers)})


@public
def weight_bytes(
    model: ModelSpec, hw: HardwareProfile, tokens: int = 1, options: RooflineOptions | None = None
) -> float:
    """Bytes of weights one pass of ``tokens`` tokens reads (s = 1: a decode step)."""
    return float(verify_pass(model, hw, [(tokens, 0)], options).weight_bytes)


@public
class DrafterPricer:
    """:func:`drafter_pass` of a whole batch in a few numpy calls, with identical numbers.

    For a fixed number n of requests every FLOP and byte count of a drafter pass is affine in
    the sum of their contexts Σc (attention pairs b·Σc + n·b², KV tokens Σc + n·b); everything
    else (tile padding, experts touched, the LM head's rows) depends on n alone. So each
    operator's compute and memory seconds are read off two evaluations of :func:`drafter_pass`
    the first time a batch size is seen (Σc = 0 and Σc = 1), and a pass then costs
    Σ_op max(compute_op(Σc), memory_op(Σc)) + launches.
    """

    def __init__(
        self, drafter: DrafterSpec, hw: HardwareProfile, options: RooflineOptions | None = None
    ) -> None:
        self.drafter, self.hw = drafter, hw
        self.options = options or RooflineOptions()
        self._lines: dict[int, tuple[Array, Array, float]] = {}

    def line(self, requests: int) -> tuple[Array, Array, float]:
        """(per-operator [compute…, memory…] seconds at Σc = 0, their change per context
        token, the launch seconds) for a pass over ``requests`` requests."""
        line = self._lines.get(requests)
        if line is None:
            if requests < 1:
                raise ConfigError(f"a drafter pass needs at least one request; got {requests}")
            zero = [0.0] * requests
            at0 = drafter_pass(self.drafter, self.hw, zero, self.options)
            at1 = drafter_pass(self.drafter, self.hw, [1.0, *zero[1:]], self.options)

            def seconds(b: RooflineBreakdown) -> Array:
                return np.array(
                    [float(op.compute_s) for op in b.operators]
                    + [float(op.memory_s) for op in b.operators]
                )

            c0 = seconds(at0)
            line = (c0, seconds(at1) - c0, float(at0.launch_s))
            self._lines[requests] = line
        return line

    def total_s(self, requests: int, context_sum: float) -> float:
        """Seconds of one drafter pass over ``requests`` requests holding ``context_sum``
        cached tokens in all."""
        at0, slope, launch_s = self.line(requests)
        y = at0 + float(context_sum) * slope
        n = y.shape[0] // 2
        return float(np.add.reduce(np.maximum(y[:n], y[n:]))) + launch_s
