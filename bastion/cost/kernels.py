"""Kernel-aware pricing: each operator of a pass timed from its shape the way GPU kernels run it.

The roofline (:mod:`bastion.cost.roofline`) prices an operator as max(FLOPs / peak, bytes /
bandwidth): smooth in the token count T. Measured GPUs are not: a GEMM library cuts the output
y[M, N] = x[M, K]·W[K, N] into tiles, runs them in waves over the SMs, and its time jumps where
one more row of tiles or one more wave is needed; a row-wise kernel (RMSNorm) runs one block per
token and jumps every time the rows outgrow one wave of resident blocks. This module prices
those mechanisms from the device's datasheet numbers (SMs, SM clock, resident threads per SM,
L2 size, DRAM bandwidth, dense tensor peak: ``hwprofiles/*.toml``) and a few efficiency
parameters the datasheet does not give (:class:`KernelParams`), which are either left at
documented round defaults or fitted on *other* GPUs' measured tables (``bastion validate
--transfer-from``, :mod:`bastion.cost.transfer`).

**GEMM** (``gemm_time``). For every tile configuration (BM × BN output tile, split-K s) of the
documented set :data:`TILE_CONFIGS` — the CTA shapes CUTLASS / cuBLAS ship for 16-bit tensor
cores, with split-K for short, deep products:

- tiles = ⌈M/BM⌉·⌈N/BN⌉·s, waves of ``sm_count`` tiles, the last one partial;
- one tile computes 2·BM·BN·K/s FLOPs (padding included) at ``tensor_efficiency`` × the SM's
  share of the peak, while it streams (rows + BN)·K/s operand elements from L2 (rows = the
  tile's real rows of x, M / ⌈M/BM⌉: padding rows are not loaded) at
  ``l2_bytes_per_flop`` per FLOP of the SM's peak (a memory system balanced to its tensor
  cores), plus ``tile_cycles`` fixed cycles (prologue,
  epilogue): t_tile = max(compute, operand feed) + cycles / clock;
- DRAM traffic with L2 reuse: the weights are read once (the tiles of one weight column block
  run in the same wave), the activations once if they fit in ``l2_fraction`` of the L2 and
  once per wave otherwise, the output written once, split-K partials (fp32) written and read
  back through DRAM only if they do not fit in ``l2_fraction`` of the L2 (a library's split-K
  workspace is written and reduced at once, so while it fits it never leaves the L2);
- compute runs in whole waves (the partial last wave takes a whole tile time: its SMs are busy
  for a tile while the others idle) and overlaps the DRAM stream:
  t = max(waves · t_tile, DRAM bytes / (``dram_efficiency`` × bandwidth));
- the library's choice: the cheapest configuration (each is a kernel the library has; its
  heuristic aims at the fastest). Time = that + ``kernel_s`` (+ one more for a split-K
  reduction).

Grouped (MoE) GEMMs are the same with ``groups`` independent problems sharing the waves.

**Row-wise kernels** (vLLM's RMSNorm, SiLU·mul and RoPE: one block of min(elements, 1024)
threads per token, 512 for RoPE): blocks resident per SM = ⌊max_threads_per_sm / threads⌋,
waves = ⌈T / (SMs × resident)⌉, the last partial; a wave of r rows takes ``row_cycles`` /
clock plus the longer of ⌈r / SMs⌉ rows × bytes per row at one SM's streaming rate
(``sm_bytes_per_clock`` × clock) and r rows × bytes per row at ``stream_efficiency`` × the
DRAM bandwidth (a partial wave moves only its own rows' bytes, so a DRAM-bound row kernel grows
inside a wave and steps at its end); plus ``kernel_s``. The steps fall every SMs × resident
tokens (A40: 84, A100: 216, H100: 264), as the measured norms show.

**Streaming kernels** (residual add): ``kernel_s`` + the part of the bytes that fits in
``l2_fraction`` of the L2 at the L2 bandwidth (``l2_bytes_per_flop`` × tensor peak; a re-run on
the same tensors, as in a profiling loop, hits L2) + the rest at ``stream_efficiency`` × the
DRAM bandwidth.
**Embedding** (a row gather): ``kernel_s`` + T·``gather_cycles`` / clock (latency-bound).
Attention and the KV-cache write stay on the roofline (their time at T ≤ 1024 is not measured
in the shipped tables, so nothing here would be validated).

Pure numpy, no torch, nothing runs at import.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import ModelSpec
from bastion.cost.opcounts import RooflineOptions, gemm_dims
from bastion.cost.roofline import verify_pass
from bastion.errors import ConfigError
from bastion.guard import array, integer, is_finite, number, public

__all__ = [
    "GEMM_KINDS",
    "KIND_PARAMS",
    "TILE_CONFIGS",
    "KernelDevice",
    "KernelParams",
    "KernelPricer",
    "TileConfig",
    "gemm_time",
    "kernel_pass",
    "operator_kind",
    "row_kernel_time",
    "step_factors",
    "streaming_time",
]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TileConfig:
    """One GEMM kernel: an m × n output tile per CTA, the K dimension split ``split_k`` ways."""

    m: int
    n: int
    split_k: int = 1


#: The tile set: CUTLASS's default 16-bit tensor-core CTA shapes on Ampere/Hopper
#: (64×64 … 256×128) and a 32-row tile for short products, each with split-K 1, 2 and 4.
TILE_CONFIGS: tuple[TileConfig, ...] = tuple(
    TileConfig(m, n, s)
    for m, n in ((32, 128), (64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
    for s in (1, 2, 4)
)


@public(error=ConfigError)
@dataclass(frozen=True)
class KernelParams:
    """The efficiency parameters a datasheet does not give (all positive).

    The defaults are the fit on all three shipped tables (A100, A40, H100; ``python
    docs/make_transfer_table.py --all``), rounded: so they are *not* independent of those
    tables, and the leave-one-GPU-out numbers never use them (each fold fits its own, starting
    from :data:`bastion.cost.transfer.FIT_START`).
    """

    dram_efficiency: float = 0.74  # achieved fraction of the DRAM bandwidth in a GEMM
    stream_efficiency: float = 0.86  # … in an elementwise or row-wise kernel
    tensor_efficiency: float = 0.81  # achieved fraction of an SM's tensor peak in a full tile
    l2_bytes_per_flop: float = 0.0088  # operand bytes an SM receives from L2 per FLOP of its peak
    tile_cycles: float = 2400.0  # fixed cycles per tile (prologue, epilogue)
    kernel_s: float = 2.0e-6  # fixed seconds per kernel (launch, ramp-up, tail)
    row_cycles: float = 1400.0  # fixed cycles of one wave of a row-wise kernel
    sm_bytes_per_clock: float = 8.8  # bytes one SM streams per clock in a row-wise kernel
    l2_fraction: float = 0.72  # share of the L2 a working set may fill and still stay resident
    gather_cycles: float = 70.0  # cycles per gathered row of the embedding

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not is_finite(v):
                raise ConfigError(f"kernel parameter {f.name} must be a finite number, got {v!r}")
            if v <= 0:
                raise ConfigError(f"kernel parameter {f.name} must be > 0, got {v!r}")
        for name in ("dram_efficiency", "stream_efficiency", "tensor_efficiency", "l2_fraction"):
            if getattr(self, name) > 1.0:
                raise ConfigError(
                    f"kernel parameter {name} is a fraction in (0, 1], got {getattr(self, name)}"
                )

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    @public(error=ConfigError)
    def from_dict(cls, data: Mapping[str, Any], origin: str = "kernel parameters") -> KernelParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            accepted = ", ".join(sorted(known))
            names = ", ".join(unknown)
            raise ConfigError(f"{origin}: unknown key(s) {names}; accepted: {accepted}")
        return cls(**{k: data[k] for k in data})

    def as_vector(self) -> Array:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    @classmethod
    @public(error=ConfigError, v=array(1))
    def from_vector(cls, v: npt.ArrayLike) -> KernelParams:
        vals = np.asarray(v, dtype=np.float64).tolist()
        names = [f.name for f in fields(cls)]
        if len(vals) != len(names):
            raise ConfigError(
                f"KernelParams.from_vector: v must hold {len(names)} numbers "
                f"({', '.join(names)}); got {len(vals)}"
            )
        return cls(**{f.name: x for f, x in zip(fields(cls), vals, strict=True)})


@dataclass(frozen=True)
class KernelDevice:
    """The datasheet numbers the kernel model reads from a profile."""

    name: str
    sms: int
    clock_hz: float
    threads_per_sm: int
    l2_bytes: float
    dram_bandwidth: float
    peak_per_sm: float  # dense 16-bit tensor FLOP/s of one SM

    @classmethod
    @public(error=ConfigError)
    def of(cls, hw: HardwareProfile, dtype: str = "bf16") -> KernelDevice:
        missing = [k for k in ("sm_clock_hz", "max_threads_per_sm") if getattr(hw, k) is None]
        if missing:
            raise ConfigError(
                f"profile {hw.name!r} has no [peak].{' and [peak].'.join(missing)}; the "
                "kernel-aware model needs the SM clock (Hz) and resident threads per SM "
                "(each with a source in [sources])"
            )
        assert hw.sm_clock_hz is not None and hw.max_threads_per_sm is not None
        return cls(
            name=hw.name,
            sms=hw.sm_count,
            clock_hz=hw.sm_clock_hz,
            threads_per_sm=hw.max_threads_per_sm,
            l2_bytes=hw.l2_bytes,
            dram_bandwidth=hw.memory_bandwidth,
            peak_per_sm=hw.peak_flops(dtype) / hw.sm_count,
        )


_CFG = np.array([(c.m, c.n, c.split_k) for c in TILE_CONFIGS], dtype=np.float64)  # [c, 3]


@public
def gemm_time(
    tokens: npt.ArrayLike,
    k_in: int,
    n_out: int,
    dev: KernelDevice,
    params: KernelParams,
    bytes_per_elem: float = 2.0,
    groups: npt.ArrayLike = 1.0,
    return_config: bool = False,
) -> Array | tuple[Array, npt.NDArray[np.int64]]:
    """Seconds of y[M, N] = x[M, K]·W[K, N] for every M in ``tokens`` (see the module docstring).

    ``groups`` (MoE): that many independent problems of M rows each (M = rows per expert), each
    with its own weights, scheduled together. With ``return_config`` also the index into
    :data:`TILE_CONFIGS` of the cheapest configuration at each M.
    """
    m = np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)[..., None]  # [..., 1]
    g = np.asarray(groups, dtype=np.float64)[..., None]
    bm, bn, s = _CFG[:, 0], _CFG[:, 1], _CFG[:, 2]
    k_split = np.ceil(k_in / s)
    p, bp = params, bytes_per_elem
    clock = dev.clock_hz
    tiles = g * np.ceil(m / bm) * np.ceil(n_out / bn) * s
    compute = 2.0 * bm * bn * k_split / (p.tensor_efficiency * dev.peak_per_sm)
    rows = m / np.ceil(m / bm)  # the rows of x a tile loads (a short product pads the rest)
    feed = (rows + bn) * k_split * bp / (p.l2_bytes_per_flop * dev.peak_per_sm)
    t_tile = np.maximum(compute, feed) + p.tile_cycles / clock
    waves = np.ceil(tiles / dev.sms)
    act = g * m * k_in * bp
    usable = p.l2_fraction * dev.l2_bytes
    partials = np.where(s > 1, 4.0 * g * m * n_out * s, 0.0)  # fp32, written then read back
    dram = (
        g * k_in * n_out * bp
        + act * np.where(act <= usable, 1.0, waves)
        + g * m * n_out * bp
        + np.where(partials <= usable, 0.0, 2.0 * partials)
    )
    t = np.maximum(waves * t_tile, dram / (p.dram_efficiency * dev.dram_bandwidth))
    t = t + p.kernel_s * np.where(s > 1, 2.0, 1.0)
    best = np.argmin(t, axis=-1)
    out = np.take_along_axis(t, best[..., None], axis=-1)[..., 0]
    if return_config:
        return out, best.astype(np.int64)
    return out


@public
def row_kernel_time(
    rows: npt.ArrayLike,
    bytes_per_row: float,
    elements: int,
    dev: KernelDevice,
    params: KernelParams,
    max_threads: int = 1024,
) -> Array:
    """Seconds of a one-block-per-row kernel over ``rows`` rows of ``elements`` elements each
    (RMSNorm, SiLU·mul, RoPE in vLLM): blocks of min(elements, ``max_threads``) threads."""
    r = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    threads = min(max(elements, 32), max_threads)
    per_wave = dev.sms * max(1, dev.threads_per_sm // threads)
    full = np.floor(r / per_wave)
    rem = r - full * per_wave  # rows of the partial last wave
    # a wave's rows stream at one SM's own rate per SM, and all its rows together at most at
    # the DRAM's: a partial wave moves only its own rows' bytes
    sm_bw = params.sm_bytes_per_clock * dev.clock_hz
    dram_bw = params.stream_efficiency * dev.dram_bandwidth
    base = params.row_cycles / dev.clock_hz

    def wave(rows_in_wave: Array) -> Array:
        per_sm = np.ceil(rows_in_wave / dev.sms)
        return base + np.maximum(per_sm / sm_bw, rows_in_wave / dram_bw) * bytes_per_row

    t = full * wave(np.asarray(float(per_wave))) + np.where(rem > 0, wave(rem), 0.0)
    return np.asarray(t + params.kernel_s, dtype=np.float64)


@public
def streaming_time(nbytes: npt.ArrayLike, dev: KernelDevice, params: KernelParams) -> Array:
    """Seconds of an elementwise kernel moving ``nbytes`` (from L2 when its working set fits)."""
    b = np.asarray(nbytes, dtype=np.float64)
    l2_bw = params.l2_bytes_per_flop * dev.sms * dev.peak_per_sm
    dram_bw = params.stream_efficiency * dev.dram_bandwidth
    hit = np.minimum(b, params.l2_fraction * dev.l2_bytes)
    return np.asarray(params.kernel_s + hit / l2_bw + (b - hit) / dram_bw, dtype=np.float64)


#: How each roofline operator runs: "gemm", "rows" (row-wise), "gather", "stream", "roofline".
GEMM_KINDS = frozenset(
    {"q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj"}
    | {"gate_up_proj", "down_proj", "lm_head", "router"}
)
_ROWS = frozenset(("input_norm", "post_attn_norm", "final_norm", "qk_norm", "act", "rope"))
_STREAM = frozenset(("residual_add", "experts_act"))


#: The :class:`KernelParams` each kind's formula reads (what a per-operator calibration frees).
KIND_PARAMS: dict[str, tuple[str, ...]] = {
    "gemm": (
        "dram_efficiency",
        "tensor_efficiency",
        "l2_bytes_per_flop",
        "tile_cycles",
        "kernel_s",
        "l2_fraction",
    ),
    "rows": ("row_cycles", "sm_bytes_per_clock", "stream_efficiency", "kernel_s"),
    "stream": ("kernel_s", "l2_bytes_per_flop", "stream_efficiency", "l2_fraction"),
    "gather": ("kernel_s", "gather_cycles"),
    "roofline": (),
}


@public
def operator_kind(name: str) -> str:
    """How :func:`kernel_pass` prices operator ``name``."""
    if name in GEMM_KINDS or name in ("experts_gate_up", "experts_down"):
        return "gemm"
    if name in _ROWS:
        return "rows"
    if name in _STREAM:
        return "stream"
    if name == "embedding":
        return "gather"
    return "roofline"


@public(tokens=array(lo=1), context=number(lo=0.0))
class KernelPricer:
    """:func:`kernel_pass` with the shapes read once: ``seconds(params)`` for many parameter sets
    (what the cross-GPU fit evaluates thousands of times)."""

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareProfile,
        tokens: npt.ArrayLike,
        options: RooflineOptions | None = None,
        context: float = 0.0,
    ) -> None:
        self.model, self.hw = model, hw
        self.options = opt = options or RooflineOptions()
        self.device = KernelDevice.of(hw, opt.dtype)
        self.tokens = t = np.asarray(tokens, dtype=np.float64)
        self._roof = verify_pass(model, hw, [(t, context)], opt)
        self._dims = gemm_dims(model, opt)
        self.names = tuple(op.name for op in self._roof.operators)

    def seconds(
        self, params: KernelParams | None = None, ops: Collection[str] | None = None
    ) -> dict[str, Array]:
        """Operator name → seconds over the pass (all layers), arrays over the tokens; only the
        operators in ``ops`` if given."""
        p = params or KernelParams()
        m, opt, dev, t = self.model, self.options, self.device, self.tokens
        layers = float(m.layers)
        out: dict[str, Array] = {}
        for op in self._roof.operators:
            if ops is not None and op.name not in ops:
                continue
            times = 1.0 if op.name in ("embedding", "final_norm", "lm_head") else layers
            kind = operator_kind(op.name)
            if kind == "gemm" and op.name in self._dims:
                k_in, n_out = self._dims[op.name]
                sec = np.asarray(gemm_time(t, k_in, n_out, dev, p, opt.bytes_per_param))
            elif kind == "gemm" and m.is_moe and op.name.startswith("experts_"):
                sec = _expert_gemm(m, t, op.name, dev, p, opt)
            elif kind == "rows":
                sec = self._rows(op.name, p)
            elif kind == "stream":
                kernels = max(op.kernels / times, 1.0)
                per_kernel = np.asarray(op.bytes) / times / kernels
                sec = streaming_time(per_kernel, dev, p) * kernels
            elif kind == "gather":
                sec = p.kernel_s + t * p.gather_cycles / dev.clock_hz
            else:
                sec = np.asarray(op.time_s, dtype=np.float64) / times
            out[op.name] = np.broadcast_to(np.asarray(sec, dtype=np.float64) * times, t.shape)
        return out

    def _rows(self, name: str, p: KernelParams) -> Array:
        """A row-wise kernel: (rows, elements per row, bytes per row, threads per block)."""
        m, t, bp = self.model, self.tokens, self.options.bytes_per_act
        if name == "qk_norm":  # one row per head of q and of k, read twice, written once
            rows, elems, nbytes, threads = t * (m.q_heads + m.kv_heads), m.head_dim, 0.0, 1024
            nbytes = 2.0 * m.head_dim * bp
        elif name == "act":  # SiLU(gate)·up: reads 2f, writes f per token
            rows, elems, nbytes, threads = t, 3 * m.ffn, 3.0 * m.ffn * bp, 1024
        elif name == "rope":  # rotates q and k in place: (h_q + h_kv)/2 pairs per token
            rows, elems, threads = t, (m.h_q + m.h_kv) // 2, 512
            nbytes = 2.0 * (m.h_q + m.h_kv) * bp
        else:  # RMSNorm over the hidden size
            rows, elems, nbytes, threads = t, m.hidden, 2.0 * m.hidden * bp, 1024
        return row_kernel_time(rows, nbytes, elems, self.device, p, threads)


@public(tokens=array(lo=1), context=number(lo=0.0))
def kernel_pass(
    model: ModelSpec,
    hw: HardwareProfile,
    tokens: npt.ArrayLike,
    options: RooflineOptions | None = None,
    params: KernelParams | None = None,
    context: float = 0.0,
) -> dict[str, Array]:
    """Seconds of every operator of one target pass of ``tokens`` tokens (one request over
    ``context`` cached tokens), summed over the layers, by operator name.

    GEMMs, norms, elementwise kernels and the embedding come from their kernels (module
    docstring); attention and the KV-cache write from the roofline (the profile's
    efficiencies). Arrays over ``tokens``.
    """
    return KernelPricer(model, hw, tokens, options, context).seconds(params)


def _expert_gemm(
    model: ModelSpec,
    tokens: Array,
    name: str,
    dev: KernelDevice,
    p: KernelParams,
    opt: RooflineOptions,
) -> Array:
    """A grouped GEMM over the touched experts: U groups of T·K/U rows each."""
    from bastion.cost.opcounts import experts_touched

    e, k, f, h = model.experts, model.experts_per_token, model.expert_ffn, model.hidden
    u = np.maximum(experts_touched(tokens, e, k, opt.expert_touch), 1.0)
    rows = tokens * k / u
    k_in, n_out = (h, 2 * f) if name == "experts_gate_up" else (f, h)
    return np.asarray(gemm_time(rows, k_in, n_out, dev, p, opt.bytes_per_param, groups=u))


MAX_FACTOR_TOKENS = 1 << 17  # step_factors' longest table (≈ 350 MB of work at 1 << 17)


@public(max_tokens=integer(2, MAX_FACTOR_TOKENS), reference_tokens=integer(2, MAX_FACTOR_TOKENS))
def step_factors(
    model: ModelSpec,
    hw: HardwareProfile,
    options: RooflineOptions | None = None,
    params: KernelParams | None = None,
    max_tokens: int = 8192,
    reference_tokens: int = 4096,
) -> tuple[tuple[str, ...], Array]:
    """Each GEMM's kernel time over its smooth roofline, for T = 1 … ``max_tokens``.

    factor_op(T) = K_op(T) / max(K_op(1)·M_op(T)/M_op(1), K_op(T_ref)·F_op(T)/F_op(T_ref)):
    the kernel model's time K over the smooth max of a memory line through its one-token time
    (M: the operator's bytes) and a compute line through its time at ``reference_tokens``
    (F: its FLOPs), so it is 1 at both ends and shows only the steps and the bend between —
    what the measured ``[gemm_shape]`` factor of a truth file is, but for any GPU and model.
    Returns (operator names of a pass, [max_tokens, operators] factors; 1 for non-GEMMs).
    """
    opt = options or RooflineOptions()
    if max_tokens < reference_tokens or reference_tokens < 2:
        raise ConfigError(
            f"step_factors needs 2 ≤ reference_tokens ≤ max_tokens, got {reference_tokens} and "
            f"{max_tokens}"
        )
    t = np.arange(1, max_tokens + 1, dtype=np.float64)
    pricer = KernelPricer(model, hw, t, opt)
    dims = pricer._dims
    kernel = pricer.seconds(params, set(dims))
    plain = replace(opt, tile_tokens=0)
    roof = verify_pass(model, hw, [(t, 0.0)], plain)
    out = np.ones((t.size, len(pricer.names)))
    ref = reference_tokens - 1
    for j, name in enumerate(pricer.names):
        if name not in dims:
            continue
        op = roof.op(name)
        k, mem, flops = kernel[name], np.asarray(op.bytes), np.asarray(op.flops)
        smooth = np.maximum(k[0] * mem / mem[0], k[ref] * flops / flops[ref])
        out[:, j] = k / smooth
    return pricer.names, out
