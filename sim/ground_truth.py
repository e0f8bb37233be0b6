"""GroundTruth: how the simulated device and its serving framework depart from the bare roofline.

:class:`GroundTruth` holds what :class:`~bastion.sim.gpu.SimulatedGPU` adds to the per-operator
roofline of :mod:`bastion.cost.roofline` (efficiencies, tile steps, launch cost, the tree mask's
penalty, host and preparation costs, MoE routing skew, noise) and checks every field; the shipped
truth files (:mod:`bastion.sim.truth`) set them. Every field is documented in
``docs/simulator.md`` ("The ground truth").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.measured import MeasuredCosts

__all__ = ["GroundTruth"]

Array = npt.NDArray[np.float64]


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
    # truth link bandwidth between GPUs = the profile's [interconnect] bandwidth × this (the
    # all-reduces of tensor parallelism; unused on one GPU)
    interconnect_scale: float = 1.0
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
            "interconnect_scale": self.interconnect_scale,
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
