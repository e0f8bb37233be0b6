"""The simulated GPU: ground-truth latency of draft, preparation and verification passes.

*Truth and belief are separate.* The truth here is the per-operator
roofline of :mod:`bastion.cost.roofline` evaluated with what real GPUs add and the bare roofline
does not know:

- achievable efficiencies below the profile's defaults (``compute_scale``, ``memory_scale``);
- tile/wave quantisation: GEMM token counts padded to a multiple of ``tile_tokens``, and a
  fixed ``tile_step_s`` per layer for every extra tile, so latency jumps in steps near
  multiples of 64 tokens even where the GEMMs are memory-bound (as measured GPUs do);
- per-kernel launch overhead (``launch_scale`` × the profile's);
- the tree mask's cost in attention kernels not built for it (``tree_attention_penalty`` on the
  attention operators of masked passes; paper Table 3: +15 % verification at batch ≈ 36);
- host-side preparation per request (top-K normalisation over the vocabulary, tree building,
  mask upload) and per tree node;
- seeded multiplicative log-normal noise per pass (``noise``).

The controller never reads any of this: its ``CostModel`` is calibrated by running the cost
model's profiling sweep against :meth:`SimulatedGPU.verify_s`, exactly as on real hardware
(registered as the ``sim`` calibration backend).

Passes are priced from the per-operator FLOP and byte counts of
:class:`~bastion.cost.roofline.LinearPricer` (built with the truth's device and options): every
count of a target pass is affine in seven features (1, T, padded T, attention pairs, KV tokens,
mask elements, experts touched), so one pass is one small matrix-vector product, the per-operator
max(compute, memory) and a weighted sum (the tree-attention penalty is a per-operator weight).
The batch's features come from one Gram matrix of the rows (1, s_i, ⌈c_i / quantum⌉) kept in a
reused buffer. A drafter pass over n requests is affine in Σ c_i for fixed n (tile padding and
experts touched depend on n alone), so its per-operator counts are read off
:func:`~bastion.cost.roofline.drafter_pass` at Σ c = 0 and Σ c = 1 once per batch size. Both routes
give the per-operator roofline's numbers to rounding (≪ 1e-12 relative; the tests compare them
with ``price_pass`` and ``drafter_pass``). Batch-1 truth curves are also cached per context bucket
(``context_quantum`` tokens); the bucket only coarsens the truth's dependence on context
(attention grows by well under 0.1 % per 16 tokens), not its dependence on the tree.

Noise: pass i is multiplied by exp(noise · z_i), z the standard normals of the GPU's generator
(seeded by ``seed``) in order, drawn 1024 at a time; the sequence is a function of the seed (and,
as the per-pass draws it replaced, the same z_i).

Prefill. :meth:`SimulatedGPU.prefill_truth` prices one pass that processes chunks of new prompt
tokens for several requests (causal attention, no tree mask), and ``verify_*`` / ``ar_*`` accept
optional prefill chunks riding in the same forward pass as the decode step (chunked prefill
mixed into decode, as Sarathi-Serve and vLLM do). In such a pass

- the token count T (every GEMM, norm, KV write, tile padding and tile step) counts the decode
  tokens and the chunk tokens together;
- a causal chunk of n new tokens over c cached ones computes Σ_{j=1..n} (c + j) =
  n·c + n(n+1)/2 (query, key) pairs (:func:`causal_chunk_pairs`; token j sees the c cached keys
  and the new keys up to itself — a causal kernel skips the masked upper triangle, unlike the
  tree pass's masked kernel that computes the whole s·(c+s) block), reads c + n keys/values per
  layer and no mask;
- the LM head runs on the rows whose logits are needed: every tree token (or the one AR token)
  of a decode request and one row per prefill chunk (its last token, as vLLM computes them);
- the tree-attention penalty scales the attention operators by 1 + penalty × (share of the
  pass's attention pairs that belong to trees): the causal chunk's part of the kernel is not
  slowed by the tree mask. A pass without chunks is priced exactly as before.

What this module does not do: decide anything or keep time; :mod:`sim.serving` owns the SimPy
environment and charges these durations as timeouts.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cost.backends import register_backend
from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import step_factors
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.roofline import DrafterPricer, LinearPricer, RooflineOptions
from bastion.errors import ConfigError
from bastion.guard import INT64_LIMIT, array, integer, number, public
from bastion.sim.measured import MeasuredCosts

__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "GroundTruth",
    "SimulatedGPU",
    "causal_chunk_pairs",
    "expected_experts",
    "routing_draws",
]

_ATTENTION_OPS = ("attn_scores", "attn_values")

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_NOISE_BLOCK = 1024  # standard normals drawn per numpy call for the pass noise
_min = np.minimum.reduce

DEFAULT_PREFILL_CHUNK = 512
"""Prompt tokens one request may put into one forward pass when prefill is chunked.

The default of the serving configuration's ``prefill_chunk_tokens``: a prompt longer than this
is prefilled over several passes, each of which may also carry the decode step of the running
requests (Sarathi-Serve's chunked prefill; vLLM's ``max_num_batched_tokens`` plays a similar
role). The value is a conventional choice, not a tuned one: 512 tokens fill the GEMM tiles of a
pass, and with the default GroundTruth for Qwen3-8B on an H100 SXM a 512-token chunk riding with a
32-request verification step (trees of 16, contexts of 1000) takes it from ≈ 21 ms to ≈ 36 ms."""


@public(
    new_tokens=array(lo=0, hi=2.0**53),
    contexts=array(lo=0, hi=2.0**53),
    broadcast=("new_tokens", "contexts"),
)
def causal_chunk_pairs(new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> Array:
    """(query, key) pairs a causal attention kernel computes for prefill chunks.

    A chunk of n new tokens over c tokens already cached: token j (j = 1 … n) sees the c cached
    keys and the j new keys up to and including itself, so the chunk computes
    Σ_j (c + j) = n·c + n(n + 1)/2 pairs (elementwise over the arguments).
    """
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    return np.asarray(n * c + n * (n + 1.0) / 2.0, dtype=np.float64)


_Chunks = tuple[list[float], list[float]]


def _chunks(new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> _Chunks:
    """Validated prefill chunks as two equal-length lists of floats (possibly empty).

    Lists or tuples of Python ints (what the serving loop passes) are checked in Python; anything
    else goes through numpy.
    """
    if isinstance(new_tokens, list | tuple) and isinstance(contexts, list | tuple):
        if not new_tokens and not contexts:
            return [], []  # the common case (no prefill)
        if all(type(x) is int for x in new_tokens) and all(type(x) is int for x in contexts):
            if len(new_tokens) != len(contexts):
                raise ConfigError(
                    f"prefill chunks need equal-length 1-D token counts and contexts; got "
                    f"{len(new_tokens)} and {len(contexts)}"
                )
            if min(new_tokens) < 1 or min(contexts) < 0:
                raise ConfigError(
                    "every prefill chunk needs a whole number ≥ 1 of new tokens and a whole "
                    f"context ≥ 0; got tokens {list(new_tokens)}, contexts {list(contexts)}"
                )
            return [float(x) for x in new_tokens], [float(x) for x in contexts]
    n = np.atleast_1d(np.asarray(new_tokens, dtype=np.float64))
    c = np.atleast_1d(np.asarray(contexts, dtype=np.float64))
    if n.ndim != 1 or n.shape != c.shape:
        raise ConfigError(
            f"prefill chunks need equal-length 1-D token counts and contexts; got shapes "
            f"{n.shape} and {c.shape}"
        )
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(c))):
        raise ConfigError("prefill token counts and contexts must be finite")
    if np.any(n < 1) or np.any(c < 0) or np.any(n != np.round(n)) or np.any(c != np.round(c)):
        raise ConfigError(
            "every prefill chunk needs a whole number ≥ 1 of new tokens and a whole context ≥ 0; "
            f"got tokens {n.tolist()}, contexts {c.tolist()}"
        )
    return n.tolist(), c.tolist()


# (drafter, device, options) reprs → the drafter's pass pricer (see SimulatedGPU.__post_init__)
_DRAFTERS: dict[tuple[str, str, str], DrafterPricer] = {}

# (model, profile, options) reprs → the kernel-aware step factors [T, operators]
_STEP_FACTORS: dict[tuple[str, str, str], Array] = {}

# Operators that are GEMMs over the pass's tokens (the measured shape factor applies to them)
_GEMM_OPS = frozenset(
    (
        "q_proj",
        "k_proj",
        "v_proj",
        "qkv_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "gate_up_proj",
        "down_proj",
        "lm_head",
        "router",
    )
)
_EXPERT_OPS = frozenset(("experts_gate_up", "experts_act", "experts_down"))


def _floats(values: object, where: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ConfigError(
            f"ground truth {where} must be a list of numbers; got {values!r}"
        ) from None
    return out


_MAX_ELEMENT_BYTES = 16.0  # a truth's weight_bytes / activation_bytes: fp4 0.5 … fp64 8, and room

_UNMEASURED = {  # −1 allowed: not measured (see GroundTruth)
    "controller_repeat_single_s",
    "controller_repeat_step_s",
    "controller_repeat_request_s",
    "controller_chain_single_s",
    "controller_chain_step_s",
    "controller_chain_request_s",
}


@public
@dataclass(frozen=True)
class GroundTruth:
    """How the simulated device and its serving framework depart from the bare roofline.

    The defaults are the *builtin* truth (the roofline × constant efficiencies, 64-token tile
    steps, 1.5× launch cost, +50 % on masked attention, no framework overhead, no routing skew);
    the shipped truth files (``sim/truths/*.toml``, see :mod:`sim.truth`) set the rest. Every
    field is documented in ``docs/simulator.md`` ("The ground truth").
    """

    name: str = "builtin"
    # the device
    compute_scale: float = 0.85  # truth η_c = profile η_c × this
    memory_scale: float = 0.90  # truth η_m = profile η_m × this
    launch_scale: float = 1.5  # truth GPU-side gap per kernel = profile's launch overhead × this
    tile_tokens: int = 64  # GEMM token counts padded to a multiple of this (0: no steps)
    tile_step_s: float = 3e-6  # per layer and per extra tile: kernel/wave switches (steps)
    # bytes per weight and per activation / KV-cache element (0: the roofline's 2, bf16;
    # 4: an fp32 model); FLOPs still run at the profile's bf16_flops
    weight_bytes: float = 0.0
    activation_bytes: float = 0.0
    gemm_shape_tokens: tuple[float, ...] = ()  # token counts of the measured GEMM shape factor
    gemm_shape_factor: tuple[float, ...] = ()  # measured / smooth roofline at those counts
    gemm_shape_model: str = ""  # "kernel": each GEMM's factor from bastion.cost.kernels, per GPU
    # attention
    tree_attention_penalty: float = 0.5  # attention kernels reading a mask are this much slower
    causal_reads_mask: bool = False  # True: a multi-token causal pass also runs the masked kernel
    # the serving framework (host)
    pass_overhead_s: float = 0.0  # fixed host time per forward pass (scheduling, sampling, sync)
    host_layer_s: float = 0.0  # host time to dispatch one layer's kernels (eager; 0: graphs)
    host_expert_s: float = 0.0  # … plus this per expert touched per layer (eager expert loop)
    host_kernel_s: float = 0.0  # host time per kernel launched outside a graph (preparation)
    # True: host dispatch and device work add (a CPU runs both); False: they overlap (a GPU)
    host_adds: bool = False
    # MoE routing and grouped GEMMs
    routing_skew: float = 0.0  # Zipf exponent of expert popularity (0: uniform routing)
    routing_correlation: float = 0.0  # share of a token's routing repeated from its request
    moe_half_occupancy_per_sm: float = 0.0  # grouped-GEMM bandwidth halves at this many experts/SM
    moe_block_tokens: int = 0  # rows per expert padded to a multiple of this (0: none)
    # preparation (see prep_truth)
    prep_topk_bytes: float = 10.0  # bytes moved per logit for softmax + top-K (trees)
    prep_argmax_bytes: float = 2.0  # bytes moved per logit for the argmax (chain)
    prep_tree_kernels: int = 4  # kernels of the tree's vocabulary pass (softmax, top-K, copies)
    prep_chain_kernels: int = 1  # kernels of the chain's argmax
    mask_bytes: float = 3.0  # bytes written and read on the device per tree-mask element
    mask_kernels: int = 6  # kernels that build the mask on the device
    compaction_kernels_per_layer: float = 0.0  # KV compaction after acceptance (trees)
    d2h_latency_s: float = 0.0  # one device→host copy of the top-K (a synchronisation)
    h2d_bandwidth: float = 25e9  # bytes/s of the mask upload (host → device)
    h2d_latency_s: float = 0.0  # latency of one upload
    tree_step_s: float = 0.0  # host best-first: per step
    tree_request_s: float = 30e-6  # … per request
    tree_node_s: float = 0.25e-6  # … per node
    mask_host_request_s: float = 0.0  # host ancestor matrix: per tree
    mask_host_element_s: float = 0.0  # … per element of the N × N matrix
    controller_single_s: float = 0.0  # adaptive controller's host time at batch 1
    controller_step_s: float = 0.0  # … per batched step (the joint chooser)
    controller_request_s: float = 0.0  # … per request of a batched step
    # a step that repeats the controller's last decision (calibrated marginals, the tree of
    # the decided size, learning): at batch 1, per batched step, per request; −1: not
    # measured, charged as a decision
    controller_repeat_single_s: float = -1.0
    controller_repeat_step_s: float = -1.0
    controller_repeat_request_s: float = -1.0
    # a step of a chain decision that stood (the argmax path: no top-K, no decision; the
    # chain's acceptance learned): at batch 1, per batched step, per request; −1: not
    # measured, charged as a repeated decision (controller_repeat_*)
    controller_chain_single_s: float = -1.0
    controller_chain_step_s: float = -1.0
    controller_chain_request_s: float = -1.0
    noise: float = 0.02  # σ of the log-normal noise per pass
    context_quantum: int = 16  # contexts are priced at multiples of this (cache granularity)
    # a measured truth ([measured], bastion.sim.measured): every pass and host cost from times
    # measured on the machine itself; the roofline fields above are then unused
    measured: MeasuredCosts | None = None

    def __post_init__(self) -> None:
        positive = {
            "compute_scale": self.compute_scale,
            "memory_scale": self.memory_scale,
            "launch_scale": self.launch_scale,
            "context_quantum": self.context_quantum,
            "h2d_bandwidth": self.h2d_bandwidth,
        }
        bad = [k for k, v in positive.items() if not v > 0]
        skip = {"name", "causal_reads_mask", "gemm_shape_tokens", "gemm_shape_factor"}
        skip |= {"gemm_shape_model", "measured", "host_adds"}
        if self.measured is not None and not isinstance(self.measured, MeasuredCosts):
            raise ConfigError(
                f"ground truth {self.name!r}: measured must be a MeasuredCosts or None; got "
                f"{type(self.measured).__name__}"
            )
        skip |= set(positive)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in skip and not (value >= 0 or (f.name in _UNMEASURED and value == -1)):
                bad.append(f.name)
        if not self.routing_correlation < 1:
            bad.append("routing_correlation")
        if bad:
            raise ConfigError(
                f"ground truth {self.name!r} has out-of-range fields: {', '.join(bad)} (scales, "
                "bandwidths and the context quantum must be > 0, controller_repeat_* and "
                "controller_chain_* ≥ 0 or −1 "
                "(not measured), everything else ≥ 0, routing_correlation < 1)"
            )
        for key in ("weight_bytes", "activation_bytes"):
            width = getattr(self, key)
            if not (width == 0 or 0 < width <= _MAX_ELEMENT_BYTES):
                raise ConfigError(
                    f"ground truth {self.name!r}: {key} must be 0 (the roofline's 2 bytes) or "
                    f"bytes per element in (0, {_MAX_ELEMENT_BYTES:g}]; got {width!r}"
                )
        tokens = _floats(self.gemm_shape_tokens, "gemm_shape_tokens")
        factor = _floats(self.gemm_shape_factor, "gemm_shape_factor")
        object.__setattr__(self, "gemm_shape_tokens", tokens)
        object.__setattr__(self, "gemm_shape_factor", factor)
        if len(tokens) != len(factor):
            raise ConfigError(
                f"ground truth {self.name!r}: gemm_shape_tokens and gemm_shape_factor need the "
                f"same length; got {len(tokens)} and {len(factor)}"
            )
        if self.gemm_shape_model not in ("", "kernel"):
            raise ConfigError(
                f"ground truth {self.name!r}: gemm_shape_model {self.gemm_shape_model!r}; "
                "accepted: 'kernel' (the kernel-aware model's steps for each GPU) or '' (none)"
            )
        if self.gemm_shape_model and tokens:
            raise ConfigError(
                f"ground truth {self.name!r}: give either a measured GEMM shape (tokens, factor) "
                "or gemm_shape_model = 'kernel', not both"
            )
        if tokens and (
            any(b <= a for a, b in itertools.pairwise(tokens)) or tokens[0] < 1 or min(factor) <= 0
        ):
            raise ConfigError(
                f"ground truth {self.name!r}: gemm_shape_tokens must rise strictly from ≥ 1 and "
                "every gemm_shape_factor must be > 0"
            )

    def expert_popularity(self, experts: int) -> Array:
        """p_e ∝ (e + 1)^−skew over the experts, normalised (uniform at skew 0)."""
        p = np.arange(1, experts + 1, dtype=np.float64) ** -self.routing_skew
        return np.asarray(p / p.sum(), dtype=np.float64)


@public(
    tokens=array(lo=0),
    requests=array(lo=0),
    correlation=number(0.0, 1.0),
    broadcast=("tokens", "requests"),
)
def routing_draws(tokens: npt.ArrayLike, requests: npt.ArrayLike, correlation: float) -> Array:
    """Independent routing draws of a pass: each request's first token routes afresh, each
    further token repeats its request's routing with probability ``correlation``:
    requests + (tokens − requests)·(1 − correlation)."""
    t = np.asarray(tokens, dtype=np.float64)
    r = np.asarray(requests, dtype=np.float64)
    return np.asarray(r + (t - r) * (1.0 - correlation), dtype=np.float64)


@public(
    draws=array(lo=0),
    experts=integer(1, 1 << 20),
    per_token=integer(1, 1 << 20),
    popularity=array(1, lo=0.0, hi=1.0),
)
def expected_experts(
    draws: npt.ArrayLike, experts: int, per_token: int, popularity: npt.ArrayLike | None = None
) -> Array:
    """Expected distinct experts a layer reads for ``draws`` independent top-K routings.

    Expert e is among a token's K with probability π_e = min(1, K·p_e) (p_e its popularity);
    over x draws it is touched with probability 1 − (1 − π_e)^x, so E[U] = Σ_e 1 − (1 − π_e)^x.
    Uniform routing (p_e = 1/E) gives E·(1 − (1 − K/E)^x).
    """
    x = np.asarray(draws, dtype=np.float64)
    if popularity is None:
        return np.asarray(experts * (1.0 - (1.0 - per_token / experts) ** x), dtype=np.float64)
    pi = np.minimum(1.0, per_token * np.asarray(popularity, dtype=np.float64))
    miss = np.log1p(-np.minimum(pi, 1.0 - 1e-12))  # log(1 − π_e)
    return np.asarray(experts - np.exp(np.multiply.outer(x, miss)).sum(axis=-1), dtype=np.float64)


_KERNEL_KEYS = ("sm_clock_hz", "max_threads_per_sm")
_NO_KERNEL_MODEL: set[tuple[str, str | None]] = set()  # profiles already warned about


def _kernel_model_applies(hw: HardwareProfile) -> bool:
    """Whether the kernel-aware GEMM model (``[gemm_shape] model = "kernel"``) can price
    ``hw``: it models GPU kernels (tiles and waves over SMs at the SM clock, resident threads),
    so it needs the profile's ``[peak] sm_clock_hz`` and ``max_threads_per_sm``. A profile
    without them — every ``bastion hw probe`` profile (a CPU has neither), or a GPU profile
    that omits them — gets no kernel steps: its GEMMs are priced on the smooth roofline
    (factor 1), with one warning per profile and process saying which keys would apply it."""
    missing = [k for k in _KERNEL_KEYS if getattr(hw, k) is None]
    if not missing:
        return True
    if (hw.name, hw.path) not in _NO_KERNEL_MODEL:
        _NO_KERNEL_MODEL.add((hw.name, hw.path))
        log.warning(
            'profile %r%s has no %s: the truth\'s [gemm_shape] model = "kernel" (GPU GEMM '
            "tiles and waves) is not applied to it, its GEMMs are priced on the smooth roofline "
            "(factor 1). A GPU: add those keys to the profile's [peak] table; a CPU: a truth "
            "without [gemm_shape] says the same without this warning",
            hw.name,
            f" ({hw.path})" if hw.path else "",
            " and ".join(f"[peak].{k}" for k in missing),
        )
    return False


@public(seed=integer(0, INT64_LIMIT - 1), max_tree_size=integer(1, MAX_TREE_SIZE))
@dataclass
class SimulatedGPU:
    """Ground-truth pass latencies for one target (and its DFlash drafter) on one device."""

    hardware: HardwareProfile  # the nominal profile (what a cost model would be given)
    model: ModelSpec
    drafter: DrafterSpec
    truth: GroundTruth = field(default_factory=GroundTruth)
    seed: int = 0
    max_tree_size: int = 1024

    def __post_init__(self) -> None:
        t = self.truth
        hw = self.hardware
        eff_c = min(1.0, hw.compute_efficiency * t.compute_scale)
        eff_m = min(1.0, hw.memory_efficiency * t.memory_scale)
        self.device = hw.with_efficiency(eff_c, eff_m, hw.launch_overhead_s * t.launch_scale)
        plain = RooflineOptions()  # 0 widths: the roofline's (2 bytes)
        self.options = RooflineOptions(
            tile_tokens=t.tile_tokens,
            bytes_per_param=float(t.weight_bytes or plain.bytes_per_param),
            bytes_per_act=float(t.activation_bytes or plain.bytes_per_act),
        )
        self.rng = np.random.default_rng([self.seed, 0x6775])
        self._noise_block: list[float] = []
        self._noise_next = 0
        # The target's per-operator counts, read off the masked LinearPricer (the unmasked one
        # differs only by a zero mask column, and an unmasked pass has a zero mask feature).
        # Rows: the features (1, T, padded T, attention pairs, KV tokens, mask elements,
        # experts touched); columns: compute seconds of every operator, then memory seconds.
        pricer = LinearPricer(self.model, self.device, self.options, masked=True)
        names = pricer.names
        self._ops = len(names)
        self._peak, self._bw = pricer.flop_rate, pricer.byte_rate
        self._matrix = np.hstack(
            (
                np.vstack(pricer.flops) / self._peak,
                np.vstack(pricer.nbytes) / self._bw,
            )
        )
        self._attention = np.array([n in _ATTENTION_OPS for n in names], dtype=np.float64)
        self._gemm = np.array([n in _GEMM_OPS for n in names], dtype=np.float64)
        self._expert_idx = np.array([i for i, n in enumerate(names) if n in _EXPERT_OPS], int)
        self._lm = names.index("lm_head")
        self._launch = np.asarray(pricer.launch_s, dtype=np.float64)
        self._launch_plain = float(self._launch.sum())
        self._launch_attention = float(np.dot(self._launch, self._attention))
        self._tile = t.tile_tokens
        self._step_s = self.model.layers * t.tile_step_s if t.tile_tokens else 0.0
        self._shape_t = np.asarray(t.gemm_shape_tokens, dtype=np.float64)
        self._shape_f = np.asarray(t.gemm_shape_factor, dtype=np.float64)
        self._shape_list = list(t.gemm_shape_tokens)
        # the kernel-aware model's step factor of every operator at T = 1 … its length (ones
        # for the non-GEMMs), for this GPU, model and kernel layout; shared like the drafter's
        self._phi: Array | None = None
        # (not for a profile without an SM clock, a probed CPU's: factor 1, one warning)
        if t.gemm_shape_model == "kernel" and _kernel_model_applies(hw):
            phi_key = (repr(self.model), repr(hw), repr(self.options))
            if phi_key not in _STEP_FACTORS:
                phi_names, table = step_factors(self.model, hw, self.options)
                if phi_names != names:
                    raise ConfigError("internal: kernel step factors out of operator order")
                _STEP_FACTORS[phi_key] = table
            self._phi = _STEP_FACTORS[phi_key]
        m = self.model
        self._moe = m.is_moe
        self._experts, self._per_token = m.experts, m.experts_per_token
        self._popularity = t.expert_popularity(m.experts) if m.is_moe and t.routing_skew else None
        self._half = t.moe_half_occupancy_per_sm * hw.sm_count
        self._layers = float(m.layers)
        self._host = t.host_layer_s > 0 or t.host_expert_s > 0
        self._verify_cache: dict[int, Array] = {}
        self._causal_cache: dict[int, Array] = {}
        self._ar_cache: dict[int, float] = {}
        self._draft_cache: dict[int, float] = {}
        # shared by every simulated GPU of the same drafter, device and options: its lines are
        # a pure function of them, and each costs two full roofline evaluations to read off
        key = (repr(self.drafter), repr(self.device), repr(self.options))
        if key not in _DRAFTERS:
            _DRAFTERS[key] = DrafterPricer(self.drafter, self.device, self.options)
        self._drafter = _DRAFTERS[key]
        self._quantum = float(t.context_quantum)
        self._rows = np.ones((3, 64))  # scratch rows (1, s, ⌈c / quantum⌉) of a tree pass
        self._depth = float(self.drafter.block_size - 1)  # draft positions per request
        self._measured = t.measured
        # seconds of the last step_s that a real engine's clock does not show its cost model
        # (a measured truth's decode-loop time after the pass); 0 under a roofline truth
        self.unobserved_s = 0.0
        # a measured truth: its terms are mean times, so its noise has mean 1 (E e^{σz} = e^{σ²/2})
        self._unbias = math.exp(-0.5 * t.noise**2)

    # -- truth without noise ------------------------------------------------------------------

    def _quantise(self, contexts: npt.ArrayLike) -> Array:
        q = self.truth.context_quantum
        return np.ceil(np.asarray(contexts, dtype=np.float64) / q) * q

    def _quantise_one(self, context: float) -> float:
        q = self.truth.context_quantum
        return float(math.ceil(context / q) * q)

    def _buckets(self, contexts: npt.ArrayLike) -> Array:
        """⌈c / context_quantum⌉ per request as a 1-D float array (validated: ≥ 0)."""
        c = np.asarray(contexts)
        if c.ndim != 1:
            c = np.atleast_1d(c)
            if c.ndim != 1:
                raise ConfigError(f"contexts must be 1-D, got shape {c.shape}")
        k = c / self._quantum
        if k.dtype != np.float64:
            k = k.astype(np.float64)
        np.ceil(k, out=k)
        if k.shape[0] and _min(k) < 0:
            raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
        return k

    def experts_touched(self, tokens: npt.ArrayLike, requests: npt.ArrayLike = 1) -> Array:
        """The truth's expected distinct experts per layer for a pass of ``tokens`` tokens from
        ``requests`` requests (its own routing model, not the cost model's)."""
        draws = routing_draws(tokens, requests, self.truth.routing_correlation)
        return expected_experts(draws, self._experts, self._per_token, self._popularity)

    def _touched(self, draws: float) -> float:
        if not self._moe:
            return 0.0
        if self._popularity is None:
            e = self._experts
            return float(e * (1.0 - (1.0 - self._per_token / e) ** draws))
        return float(expected_experts(draws, self._experts, self._per_token, self._popularity))

    def _shape(self, tokens: float) -> float:
        """The measured GEMM shape factor at ``tokens`` (that of the next measured count)."""
        if not self._shape_list:
            return 1.0
        i = bisect.bisect_left(self._shape_list, tokens)
        return float(self._shape_f[min(i, len(self._shape_list) - 1)])

    def _price(
        self,
        x: Array,
        tokens: Array,
        touched: Array,
        share: Array | float,
        head: tuple[Array, Array] | None = None,
    ) -> Array:
        """Truth of passes with feature rows ``x`` [n, 7] (``tokens`` [n] = column 1, ``touched``
        [n] = column 6), ``share`` of their attention pairs behind a masked kernel, and optionally
        the LM head priced on other rows (``head`` = its feature rows and token counts)."""
        n_ops = self._ops
        y = x @ self._matrix
        comp, mem = y[:, :n_ops], y[:, n_ops:]
        if self._moe and self._expert_idx.size:
            self._moe_efficiency(comp, mem, tokens, touched)
        per_op = np.maximum(comp, mem)
        if self._shape_list:
            idx = np.minimum(np.searchsorted(self._shape_t, tokens), self._shape_t.size - 1)
            phi = self._shape_f[idx]
            per_op = per_op * (1.0 + np.multiply.outer(phi - 1.0, self._gemm))
        elif self._phi is not None:
            if tokens.shape[0] == 1:  # one pass (the per-step path): a row, no index arrays
                row = min(max(round(float(tokens[0])) - 1, 0), self._phi.shape[0] - 1)
                per_op = per_op * self._phi[row]
            else:
                per_op = per_op * self._phi[self._phi_rows(tokens)]
        pen = self.truth.tree_attention_penalty * np.asarray(share, dtype=np.float64)
        total = per_op.sum(axis=1) + pen * (per_op @ self._attention)
        if head is not None:
            hx, ht = head
            hy = hx @ self._matrix[:, [self._lm, n_ops + self._lm]]
            lm = np.maximum(hy[:, 0], hy[:, 1])
            if self._shape_list:
                hidx = np.minimum(np.searchsorted(self._shape_t, ht), self._shape_t.size - 1)
                lm = lm * self._shape_f[hidx]
            elif self._phi is not None:
                lm = lm * self._phi[self._phi_rows(ht), self._lm]
            total = total - per_op[:, self._lm] + lm
        total = total + self._launch_plain + pen * self._launch_attention
        if self._step_s:
            total = total + self._step_s * (np.ceil(tokens / self._tile) - 1.0)
        return self._with_host(total, touched)

    def _phi_rows(self, tokens: Array) -> IntArray:
        """Rows of the kernel step table for these token counts (beyond it: its last row)."""
        assert self._phi is not None
        rows = np.rint(np.asarray(tokens, dtype=np.float64)).astype(np.int64) - 1
        return np.clip(rows, 0, self._phi.shape[0] - 1)

    def _moe_efficiency(self, comp: Array, mem: Array, tokens: Array, touched: Array) -> None:
        """Grouped-GEMM effects on the expert operators, in place: every touched expert's rows
        padded to ``moe_block_tokens`` (compute), and bandwidth that reaches its achievable
        level only when enough experts fill the SMs: × U / (U + U½), U½ = per-SM value × SMs."""
        t = self.truth
        idx = self._expert_idx
        u = np.maximum(touched, 1e-9)
        if t.moe_block_tokens:
            rows = tokens * self._per_token
            b = float(t.moe_block_tokens)
            padded = u * np.ceil(rows / u / b) * b
            comp[:, idx] *= (padded / np.maximum(rows, 1e-9))[:, None]
        if self._half > 0:
            mem[:, idx] *= ((u + self._half) / u)[:, None]

    def _with_host(self, gpu: Array, touched: Array) -> Array:
        """The framework's part: the host dispatches every layer's kernels (eager) while the
        GPU runs them, so a pass takes the longer of the two — or, with ``host_adds`` (a CPU,
        where one set of cores does both), their sum — plus a fixed per-pass overhead."""
        t = self.truth
        if self._host:
            host = self._layers * (t.host_layer_s + t.host_expert_s * touched)
            gpu = gpu + host if t.host_adds else np.maximum(gpu, host)
        return gpu + t.pass_overhead_s if t.pass_overhead_s else gpu

    def _pass_s(
        self, requests: int, tokens: float, pairs: float, kv: float, tree: bool, causal_pairs: float
    ) -> float:
        """Truth of a decode pass without prefill chunks whose every token produces logits.

        ``tree``: the pass reads a tree mask (``pairs`` = the full s·(c + s) blocks); otherwise
        it is causal (``causal_pairs``), and the masked kernel runs only where the framework
        materialises the causal mask of a multi-token pass (``causal_reads_mask``)."""
        tile = self._tile
        padded = math.ceil(tokens / tile) * tile if tile > 0 else tokens
        masked = tree or (self.truth.causal_reads_mask and tokens > requests)
        p = pairs if masked else causal_pairs
        draws = routing_draws_one(tokens, requests, self.truth)
        touched = self._touched(draws) if self._moe else 0.0
        x = np.array([[1.0, tokens, padded, p, kv, p if masked else 0.0, touched]])
        return float(
            self._price(x, np.array([tokens]), np.array([touched]), 1.0 if masked else 0.0)[0]
        )

    def _price_mixed(
        self,
        decode: tuple[int, float, float, float],
        chunks: _Chunks,
        tree: bool,
        causal_pairs: float = 0.0,
    ) -> float:
        """Truth of one pass of decode requests (``decode`` = count, tokens, pairs, KV tokens;
        the count may be 0) and prefill chunks (not empty; contexts not yet quantised)."""
        n_decode, tokens, decode_pairs, kv = decode
        new, ctx = chunks
        q = self.truth.context_quantum
        masked = n_decode > 0 and (tree or (self.truth.causal_reads_mask and tokens > n_decode))
        masked_pairs = decode_pairs if masked else 0.0
        all_pairs = decode_pairs if masked else causal_pairs
        draws = routing_draws_one(tokens, n_decode, self.truth) if n_decode else 0.0
        for n, c in zip(new, ctx, strict=True):
            cq = math.ceil(c / q) * q
            all_pairs += n * cq + n * (n + 1.0) / 2.0  # causal_chunk_pairs
            kv += cq + n
            draws += routing_draws_one(n, 1, self.truth)
        total_tokens = tokens + sum(new)
        logit_rows = tokens + len(new)
        tile = self._tile
        padded = math.ceil(total_tokens / tile) * tile if tile > 0 else total_tokens
        touched = self._touched(draws)
        x = np.array([[1.0, total_tokens, padded, all_pairs, kv, masked_pairs, touched]])
        h_pad = math.ceil(logit_rows / tile) * tile if tile > 0 else logit_rows
        head = np.array([[1.0, logit_rows, h_pad, 0.0, 0.0, 0.0, 0.0]])
        share = masked_pairs / all_pairs if all_pairs > 0 else 0.0
        return float(
            self._price(
                x,
                np.array([total_tokens]),
                np.array([touched]),
                share,
                (head, np.array([float(logit_rows)])),
            )[0]
        )

    def _decode_sums(
        self, sizes: IntArray, contexts: npt.ArrayLike
    ) -> tuple[int, float, float, float, float]:
        """(requests, Σ s, Σ s·(c + s), Σ (c + s), Σ s·c + s(s + 1)/2) of decode passes,
        contexts quantised: the tree blocks' pairs and the causal pairs.

        The rows (1, s, ⌈c / quantum⌉) go into a reused buffer; their Gram matrix holds every
        sum at once (whole numbers, so exact) and one reduction their minima."""
        c = np.asarray(contexts)
        b = sizes.shape[0]
        if c.shape != (b,):
            c = np.atleast_1d(c)
            if c.ndim != 1:
                raise ConfigError(f"contexts must be 1-D, got shape {c.shape}")
            if c.shape[0] != b:
                raise ConfigError(f"{b} tree sizes but {c.shape[0]} contexts; give one each")
        if b == 0:
            return 0, 0.0, 0.0, 0.0, 0.0
        if b > self._rows.shape[1]:
            self._rows = np.ones((3, max(b, 2 * self._rows.shape[1])))
        rows = self._rows[:, :b]
        rows[1] = sizes
        k = rows[2]
        np.divide(c, self._quantum, out=k)
        np.ceil(k, out=k)
        _, s_min, k_min = _min(rows, axis=1).tolist()
        if s_min < 1 or k_min < 0:
            raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
        (_, tokens, k_sum), (_, s_sq, s_k), _ = np.dot(rows, rows.T).tolist()
        q = self.truth.context_quantum
        return b, tokens, q * s_k + s_sq, q * k_sum + tokens, q * s_k + (s_sq + tokens) / 2.0

    def _ar_sums(self, contexts: npt.ArrayLike) -> tuple[int, float, float, float]:
        """The same for one token per request (an autoregressive step)."""
        k = self._buckets(contexts)
        b = k.shape[0]
        kv = self.truth.context_quantum * float(np.add.reduce(k)) + b if b else 0.0
        return b, float(b), kv, kv

    def _curve(self, context_len: int, tree: bool) -> Array:
        """Noise-free truth of a batch-1 pass for s = 1 … max_tree_size at this context."""
        c = self._quantise_one(context_len)
        cache = self._verify_cache if tree else self._causal_cache
        key = int(c)
        if key not in cache:
            if c < 0:
                raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
            s = np.arange(1, self.max_tree_size + 1, dtype=np.float64)
            x = np.zeros((s.shape[0], 7))
            x[:, 0], x[:, 1], x[:, 4] = 1.0, s, c + s
            masked = np.full_like(s, 1.0 if tree else 0.0)
            if not tree and self.truth.causal_reads_mask:
                masked[1:] = 1.0  # the framework's materialised causal mask (s > 1)
            pairs = np.where(masked > 0, s * (c + s), s * c + s * (s + 1.0) / 2.0)
            x[:, 3] = pairs
            x[:, 5] = pairs * masked
            tile = self._tile
            x[:, 2] = np.ceil(s / tile) * tile if tile > 0 else s
            touched = np.zeros_like(s)
            if self._moe:
                touched = self.experts_touched(s, 1)
                x[:, 6] = touched
            cache[key] = self._price(x, s, touched, masked)
        return cache[key]

    def verify_curve(self, context_len: int) -> Array:
        """Noise-free truth of a batch-1 tree pass for s = 1 … max_tree_size at this context."""
        return self._curve(context_len, True)

    def verify_truth(
        self,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
        tree: bool = True,
    ) -> float:
        """Noise-free truth of one batched verification pass.

        ``tree``: the requests verify trees (a tree mask, every s·(c + s) pair); ``False``: they
        verify chains (a causal mask, s·c + s(s + 1)/2 pairs — the DFlash chain).
        ``prefill_tokens[j]`` new prompt tokens of another request over its
        ``prefill_contexts[j]`` cached ones ride in the same pass (see the module docstring);
        with chunks, ``tree_sizes`` may be empty (the pass is then :meth:`prefill_truth`).
        """
        if self._measured is not None:
            return self._measured_pass(
                "tree" if tree else "chain", tree_sizes, contexts, prefill_tokens, prefill_contexts
            )
        s = np.asarray(tree_sizes, dtype=np.int64)
        if s.ndim != 1:
            s = np.atleast_1d(s)
            if s.ndim != 1:
                raise ConfigError(f"tree sizes must be 1-D, got shape {s.shape}")
        chunks = _chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            b, tokens, pairs, kv, causal = self._decode_sums(s, contexts)
            return self._price_mixed((b, tokens, pairs, kv), chunks, tree, causal)
        if s.shape[0] == 1:
            s0 = int(s[0])
            c = np.asarray(contexts)
            if c.size == 1 and 1 <= s0 <= self.max_tree_size:
                c0 = int(c.reshape(-1)[0])
                cache = self._verify_cache if tree else self._causal_cache
                curve = cache.get(int(self._quantise_one(c0)))
                if curve is None:
                    curve = self._curve(c0, tree)
                return float(curve[s0 - 1])
        b, tokens, pairs, kv, causal = self._decode_sums(s, contexts)
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        return self._pass_s(b, tokens, pairs, kv, tree, causal)

    def ar_truth(
        self,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
    ) -> float:
        """Noise-free truth of one target-only autoregressive step for each request.

        Optional prefill chunks ride in the same pass, as in :meth:`verify_truth`.
        """
        if self._measured is not None:
            ones = np.ones(np.atleast_1d(np.asarray(contexts)).shape[0], np.int64)
            return self._measured_pass("ar", ones, contexts, prefill_tokens, prefill_contexts)
        chunks = _chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            b, tokens, pairs, kv = self._ar_sums(contexts)
            return self._price_mixed((b, tokens, pairs, kv), chunks, False, pairs)
        c = np.asarray(contexts)
        if c.size == 1:
            key = int(self._quantise_one(float(c.reshape(-1)[0])))
            hit = self._ar_cache.get(key)
            if hit is None:
                b, tokens, pairs, kv = self._ar_sums(c)
                hit = self._ar_cache[key] = self._pass_s(b, tokens, pairs, kv, False, pairs)
            return hit
        b, tokens, pairs, kv = self._ar_sums(c)
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        return self._pass_s(b, tokens, pairs, kv, False, pairs)

    def prefill_truth(self, new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one prefill pass: request i processes ``new_tokens[i]`` new prompt
        tokens (causally, no tree mask) over ``contexts[i]`` tokens already in its KV cache.

        Contexts are priced at multiples of ``context_quantum``, as for decode steps."""
        chunks = _chunks(new_tokens, contexts)
        if not chunks[0]:
            raise ConfigError("a prefill pass needs at least one chunk of new tokens")
        if self._measured is not None:
            return self._measured.prefill_s(*chunks)
        return self._price_mixed((0, 0.0, 0.0, 0.0), chunks, False)

    def draft_truth(self, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one DFlash drafter pass over a batch (its roofline, plus the
        framework's per-pass overhead and, in eager mode, the host's dispatch of its layers)."""
        if self._measured is not None:
            return self._measured.draft_s("topk", _ints(contexts, "contexts"))
        c = np.asarray(contexts)
        if c.size == 1:
            key = int(self._quantise_one(float(c.reshape(-1)[0])))
            hit = self._draft_cache.get(key)
            if hit is None:
                hit = self._draft_cache[key] = self._draft_from(self._buckets(c))
            return hit
        return self._draft_from(self._buckets(c))

    def _draft_from(self, buckets: Array) -> float:
        b = buckets.shape[0]
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        gpu = self._drafter.total_s(b, self.truth.context_quantum * float(np.add.reduce(buckets)))
        t = self.truth
        if t.host_layer_s:
            host = self.drafter.model.layers * t.host_layer_s
            gpu = gpu + host if t.host_adds else max(gpu, host)
        return gpu + t.pass_overhead_s

    def prep_truth(
        self,
        tree_sizes: npt.ArrayLike,
        topk: bool = True,
        contexts: npt.ArrayLike | None = None,
        controller: bool | str = False,
        path: bool = False,
    ) -> float:
        """Host and device preparation of one step, from its operations (``docs/simulator.md``).

        Trees (``topk``): softmax and top-K over the full vocabulary at every draft position of
        every request (``prep_topk_bytes`` per logit), one device→host copy of the top-K, the
        best-first builder and the ancestor matrices on the host, the upload of the N × N
        matrices, the device-side mask over every (node, key) pair, and the KV compaction after
        acceptance. The chain (``topk=False``): an argmax per position and its copy back (plus,
        for the learning controller's chain decision that stood, ``"repeat"``, its host time on
        that path, ``controller_chain_*``, or as a repeated decision where not measured).
        ``controller``: the adaptive controller's host time (which includes growing the trees)
        replaces the fixed builder's; ``"repeat"``: a step that repeated the learning
        controller's last decision, charged ``controller_repeat_*`` where measured.
        ``path``: the trees are chains (a decision chose the chain after top-K drafting): the
        top-K pass and its copy back, and the controller, but no tree work — a chain is
        verified by a causal pass (no mask to build or upload) and its rejected suffix is cut
        off (no KV compaction), as for the chain policy.
        """
        if self._measured is not None:
            kind = "chain" if not topk or path else "tree"
            return sum(self._measured.host_s(kind, _control(controller), _ints(tree_sizes, "sz")))
        t = self.truth
        if isinstance(tree_sizes, np.ndarray) and tree_sizes.ndim == 1:
            s = tree_sizes.astype(np.float64, copy=False)
        else:
            s = np.atleast_1d(np.asarray(tree_sizes, dtype=np.float64))
        b = s.shape[0]
        logits = b * self._depth * self.model.vocab
        bw = self._bw
        if not topk or path:  # chains: the argmax, or a decision's top-K pass; no tree work
            per_logit, launches = (
                (t.prep_topk_bytes, t.prep_tree_kernels)
                if topk
                else (t.prep_argmax_bytes, t.prep_chain_kernels)
            )
            seconds = logits * per_logit / bw
            seconds += launches * (t.host_kernel_s + self.device.launch_overhead_s)
            seconds += t.d2h_latency_s
            if controller == "repeat":  # a chain decision that stood (argmax), or a repeat
                seconds += self._chain_s(b) if not topk else self._repeat_s(b)
            elif controller and topk:
                seconds += self._decision_s(b)
        else:
            nodes = float(np.add.reduce(s))
            square = float(np.dot(s, s))
            if contexts is None:
                pairs = square
            else:
                c = self._quantise(contexts)
                pairs = float(np.dot(s, c)) + square
            layers = self.model.layers
            moved = min(self._depth + 1.0, nodes / max(b, 1)) * b  # tokens compacted, at most
            # read + write K and V, each element bytes_per_act (2 unless the truth says)
            kv_bytes = 4.0 * layers * moved * self.model.h_kv * self.options.bytes_per_act
            kernels = t.prep_tree_kernels + t.mask_kernels + t.compaction_kernels_per_layer * layers
            seconds = (logits * t.prep_topk_bytes + pairs * t.mask_bytes + kv_bytes) / bw
            seconds += kernels * (t.host_kernel_s + self.device.launch_overhead_s)
            seconds += t.d2h_latency_s + t.h2d_latency_s + square / t.h2d_bandwidth
            seconds += b * t.mask_host_request_s + square * t.mask_host_element_s
            if controller == "repeat":  # the path taken: a repeated decision …
                seconds += self._repeat_s(b)
            elif controller:  # … a decision; its measured time includes growing the trees
                seconds += self._decision_s(b)
            else:
                seconds += t.tree_step_s + b * t.tree_request_s + nodes * t.tree_node_s
        return float(seconds)

    def _decision_s(self, b: int) -> float:
        """The controller's host time for a full decision of ``b`` requests: the
        single-request controller at batch 1, the joint chooser above."""
        t = self.truth
        if b == 1:
            return t.controller_single_s
        return t.controller_step_s + b * t.controller_request_s

    def _repeat_s(self, b: int) -> float:
        """The learning controller's host time for a step that repeats its last decision, as
        measured (``controller_repeat_*``), or as a decision where the truth has no measurement
        (−1)."""
        t = self.truth
        return self._measured_s(
            b,
            (t.controller_repeat_single_s, t.controller_repeat_step_s),
            t.controller_repeat_request_s,
            self._decision_s,
        )

    def _chain_s(self, b: int) -> float:
        """The learning controller's host time for a step of a chain decision that stood, as
        measured (``controller_chain_*``), or as a repeated decision where the truth has no
        measurement (−1)."""
        t = self.truth
        return self._measured_s(
            b,
            (t.controller_chain_single_s, t.controller_chain_step_s),
            t.controller_chain_request_s,
            self._repeat_s,
        )

    @staticmethod
    def _measured_s(
        b: int, single_step: tuple[float, float], request: float, otherwise: Callable[[int], float]
    ) -> float:
        """A host time measured at batch 1 (``single_step[0]``) and above it as step +
        B·request (``single_step[1]``, ``request``); a −1 (not measured): ``otherwise(b)``."""
        single, step = single_step
        if b == 1 and single >= 0:
            return single
        if b > 1 and step >= 0:
            return step + b * max(request, 0)
        return otherwise(b)

    # -- what a run observes ------------------------------------------------------------------

    def _noisy(self, seconds: float) -> float:
        """``seconds`` × exp(noise · z), z the next standard normal of this GPU's generator.

        The normals are drawn ``_NOISE_BLOCK`` at a time (one numpy call per block, not per
        pass); the sequence is the generator's, so it is a function of the seed alone."""
        sigma = self.truth.noise
        if sigma == 0:
            return seconds
        i = self._noise_next
        if i == len(self._noise_block):
            self._noise_block = np.exp(sigma * self.rng.standard_normal(_NOISE_BLOCK)).tolist()
            i = 0
        self._noise_next = i + 1
        return seconds * self._noise_block[i]

    def verify_s(
        self,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
        tree: bool = True,
    ) -> float:
        return self._noisy(
            self.verify_truth(tree_sizes, contexts, prefill_tokens, prefill_contexts, tree)
        )

    def ar_s(
        self,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
    ) -> float:
        return self._noisy(self.ar_truth(contexts, prefill_tokens, prefill_contexts))

    def prefill_s(self, new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        return self._noisy(self.prefill_truth(new_tokens, contexts))

    def draft_s(self, contexts: npt.ArrayLike) -> float:
        return self._noisy(self.draft_truth(contexts))

    def prep_s(
        self,
        tree_sizes: npt.ArrayLike,
        topk: bool = True,
        contexts: npt.ArrayLike | None = None,
        controller: bool | str = False,
        path: bool = False,
    ) -> float:
        return self._noisy(self.prep_truth(tree_sizes, topk, contexts, controller, path))

    def step_s(
        self,
        kind: str,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        topk: bool = True,
        controller: bool | str = False,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
        builder: str = "",
    ) -> tuple[float, float, float]:
        """(draft, preparation, verification) seconds of one decode step verified as ``kind``:
        "ar" is one unmasked pass and nothing else; "chain" and "tree" pay the drafter, the
        preparation (``topk``: top-K normalisation and tree work, else an argmax; a chain chosen
        after top-K drafting keeps its top-K pass but has no tree work) and a pass — causal for
        the chain, masked for a tree. Prefill chunks ride in the pass. Noisy, drawn in that
        order."""
        if self._measured is not None:  # ``builder``: the tree policy's own (a measured term)
            return self._measured_step(
                kind,
                tree_sizes,
                contexts,
                topk,
                controller,
                prefill_tokens,
                prefill_contexts,
                builder,
            )
        if kind == "ar":
            return 0.0, 0.0, self.ar_s(contexts, prefill_tokens, prefill_contexts)
        draft = self.draft_s(contexts)
        prep = self.prep_s(tree_sizes, topk, contexts, controller, kind == "chain")
        tree = kind == "tree"
        return (
            draft,
            prep,
            self.verify_s(tree_sizes, contexts, prefill_tokens, prefill_contexts, tree),
        )

    # -- a measured truth (bastion.sim.measured) ----------------------------------------------

    def _measured_pass(
        self,
        kind: str,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike,
        prefill_contexts: npt.ArrayLike,
    ) -> float:
        """The measured verifier's call, plus each prefill chunk prefilled alone."""
        sizes = _ints(tree_sizes, "tree sizes")
        ctx = _ints(contexts, "contexts", sizes) if sizes else []
        return self._measured_verify(kind, sizes, ctx, _chunks(prefill_tokens, prefill_contexts))

    def _measured_verify(
        self, kind: str, sizes: list[int], contexts: list[int], chunks: _Chunks
    ) -> float:
        """:meth:`_measured_pass` on checked sizes, contexts and chunks."""
        assert self._measured is not None
        seconds = self._measured.prefill_s(*chunks) if chunks[0] else 0.0
        if sizes:
            seconds += self._measured.verify_s(kind, sizes, contexts)
        elif not chunks[0]:
            raise ConfigError("a pass needs at least one request")
        return seconds

    def _measured_step(
        self,
        kind: str,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        topk: bool,
        controller: bool | str,
        prefill_tokens: npt.ArrayLike,
        prefill_contexts: npt.ArrayLike,
        builder: str = "",
    ) -> tuple[float, float, float]:
        """:meth:`step_s` under a measured truth: (draft, host, verify), each measured for the
        step's kind, preparation and control; noisy, drawn in that order."""
        assert self._measured is not None
        m = self._measured
        sizes = _ints(tree_sizes, "tree sizes")
        ctx = _ints(contexts, "contexts", sizes)
        if kind not in ("ar", "chain", "tree"):
            raise ConfigError(f"unknown step kind {kind!r}; accepted: ar, chain, tree")
        unbias = self._unbias
        draft = 0.0
        if kind != "ar":
            draft = self._noisy(m.draft_s("topk" if topk else "argmax", ctx)) * unbias
        build, loop = m.host_s(kind, _control(controller), sizes, builder)
        host = self._noisy(build + loop) * unbias
        chunks = _chunks(prefill_tokens, prefill_contexts)
        verify = self._noisy(self._measured_verify(kind, sizes, ctx, chunks)) * unbias
        self.unobserved_s = host * loop / (build + loop) if build + loop > 0 else 0.0
        return draft, host, verify


def _ints(values: npt.ArrayLike, what: str, like: list[int] | None = None) -> list[int]:
    """A 1-D list of whole numbers ≥ 0 (one per request of ``like``, when given)."""
    a = np.atleast_1d(np.asarray(values))
    if a.ndim != 1:
        raise ConfigError(f"{what} must be 1-D, got shape {a.shape}")
    if a.size and (not np.all(np.isfinite(a)) or np.min(a) < 0):
        raise ConfigError(f"{what} must be finite and ≥ 0")
    out = [math.ceil(v) for v in a.tolist()]
    if like is not None and len(out) != len(like):
        raise ConfigError(f"{len(like)} tree sizes but {len(out)} contexts; give one each")
    return out


def _control(controller: bool | str) -> str:
    """The measured truth's control of a step: static, decide, or repeat."""
    return "repeat" if controller == "repeat" else "decide" if controller else "static"


def routing_draws_one(tokens: float, requests: float, truth: GroundTruth) -> float:
    """:func:`routing_draws` for scalars (the per-step path)."""
    return requests + (tokens - requests) * (1.0 - truth.routing_correlation)


def _sim_backend(model: ModelSpec, hw: HardwareProfile, seed: int = 0):  # type: ignore[no-untyped-def]
    """Calibration backend ``sim``: times verification passes on the simulated GPU."""
    gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), seed=seed)

    def verify(s: int, c: int) -> float:
        return gpu.verify_s([s], [c])

    return verify


register_backend("sim", _sim_backend, replace=True)
