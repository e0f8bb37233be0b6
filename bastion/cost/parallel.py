"""Tensor parallelism (Megatron-LM's, as vLLM runs it): one model split over N GPUs.

With tensor parallelism N, every GPU of the group holds and runs 1/N of each layer:

- q/k/v projections column-parallel by heads: n_q / N query heads and n_kv / N KV heads per
  GPU; o_proj row-parallel over those heads;
- the FFN's gate and up projections column-parallel (F / N columns each), down_proj
  row-parallel (F / N rows); an MoE layer's experts each split the same way (vLLM's default,
  no expert parallelism), the router replicated;
- the embedding and the LM head vocabulary-parallel (⌈V / N⌉ rows each);
- norms, RoPE's and the residual stream's widths are the full hidden size on every GPU
  (replicated work).

When n_kv < N, each GPU holds one KV head and every KV head is replicated N / n_kv times, as
vLLM does (``QKVParallelLinear``: N must then be a multiple of n_kv). So the per-GPU pass is the
pass of the :func:`tp_shard` model, and its KV cache holds that model's KV heads.

Each layer then ends its attention (after o_proj) and its FFN (after down_proj) with an
all-reduce of the activations, S = T · h · ``bytes_per_act`` bytes for a pass of T tokens.
:func:`all_reduce_s` prices one as a ring all-reduce (reduce-scatter, then all-gather):

    t(S) = 2(N − 1)/N · S / B + 2(N − 1) · α,

B the link's bandwidth per GPU and direction, α its latency per ring step (the profile's
``[interconnect]``). Sources: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1), 2005 (the ring's 2(p − 1)α +
2(p − 1)/p · nβ); P. Patarasuk, X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters
of workstations", JPDC 69(2), 2009; NCCL's own tuning model counts 2(N − 1) ring steps per
all-reduce and its bus bandwidth is the algorithm bandwidth × 2(N − 1)/N
(NVIDIA/nccl ``src/graph/tuning.cc``, nccl-tests ``doc/PERFORMANCE.md``).

A pass of T tokens spends :func:`comm_line` = c₀ + c₁·T seconds on its 2L all-reduces. The
communication is *added* to the pass's compute (not overlapped): vLLM's tensor-parallel
layers call the all-reduce between the GEMMs that produce and consume it, on the same stream.

What this module does not model: pipeline parallelism; overlap of communication with compute;
the embedding's all-reduce and the LM head's gather of the logits (one collective each per
pass, beside the 2L of the layers); the fixed per-collective base latency of NCCL;
multi-node groups (a group spans at most the profile's ``max_gpus``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt

from bastion.cost.breakdown import OperatorCost
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import ModelSpec
from bastion.errors import ConfigError
from bastion.guard import array, number, public

__all__ = [
    "MAX_TP",
    "all_reduce_s",
    "check_tp",
    "comm_line",
    "comm_op",
    "kv_heads_per_gpu",
    "tp_shard",
]


MAX_TP = 1 << 16
"""The largest tensor parallelism accepted (a bound, so that every count stays a float)."""


def _tp_value(tp: object) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TP:
        raise ConfigError(
            f"tp (tensor parallelism) must be an integer ≥ 1 (at most {MAX_TP}); got {tp!r:.40}"
        )
    return tp


@public
def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each GPU holds with tensor parallelism ``tp``: n_kv / tp, or 1 when n_kv < tp
    (each KV head then replicated tp / n_kv times, as vLLM does)."""
    tp = _tp_value(tp)
    return max(1, model.kv_heads // tp)


@public
def check_tp(model: ModelSpec, tp: int, hardware: HardwareProfile | None = None) -> int:
    """``tp`` checked for ``model`` (and ``hardware``'s interconnect): a :class:`ConfigError`
    saying what is accepted unless ``tp`` is an integer ≥ 1 dividing the attention heads, with
    the KV heads divisible by it or it by them (KV heads replicated), the FFN width (every
    expert's, for an MoE model) divisible by it, and — for tp > 1 — a profile whose
    ``[interconnect]`` links at least ``tp`` GPUs."""
    tp = _tp_value(tp)
    if tp == 1:
        return tp
    name = model.name
    if model.q_heads % tp:
        raise ConfigError(
            f"--tp {tp} does not divide {name}'s {model.q_heads} attention heads; accepted: a "
            f"divisor of {model.q_heads}"
        )
    if model.kv_heads % tp and tp % model.kv_heads:
        raise ConfigError(
            f"--tp {tp} and {name}'s {model.kv_heads} KV heads: one must divide the other (a "
            f"divisor of {model.kv_heads} splits them; a multiple replicates each on tp / "
            f"{model.kv_heads} GPUs, as vLLM does)"
        )
    width, what = (
        (model.expert_ffn, "expert FFN width") if model.is_moe else (model.ffn, "FFN width")
    )
    if width % tp:
        raise ConfigError(f"--tp {tp} does not divide {name}'s {what} ({width})")
    if hardware is not None:
        link = hardware.interconnect
        if link is None or link.kind == "none":
            raise ConfigError(
                f"--tp {tp} needs GPUs linked to each other: profile {hardware.name!r} has "
                + ("no [interconnect] table" if link is None else 'interconnect kind "none"')
                + " (docs/hardware-profiles.md); accepted there: --tp 1"
            )
        if tp > link.max_gpus:
            raise ConfigError(
                f"--tp {tp} exceeds the interconnect of profile {hardware.name!r}: its "
                f"{link.kind} links at most {link.max_gpus} GPUs ([interconnect].max_gpus)"
            )
    return tp


@public
def tp_shard(model: ModelSpec, tp: int) -> ModelSpec:
    """The part of ``model`` one GPU holds and runs with tensor parallelism ``tp`` (see the
    module doc); ``model`` itself for tp = 1. Checked by :func:`check_tp`."""
    tp = check_tp(model, tp)
    if tp == 1:
        return model
    return replace(
        model,
        name=f"{model.name}/tp{tp}",
        q_heads=model.q_heads // tp,
        kv_heads=kv_heads_per_gpu(model, tp),
        ffn=model.ffn // tp,
        expert_ffn=model.expert_ffn // tp,
        vocab=-(-model.vocab // tp),
    )


@public(nbytes=number(lo=0.0))
def all_reduce_s(nbytes: float, tp: int, hardware: HardwareProfile) -> float:
    """Seconds of one ring all-reduce of ``nbytes`` bytes over ``tp`` GPUs linked by
    ``hardware``'s interconnect: 2(tp − 1)/tp · nbytes / bandwidth + 2(tp − 1) · latency
    (module doc); 0 for tp = 1."""
    tp = _tp_value(tp)
    if tp == 1:
        return 0.0
    link = hardware.interconnect
    if link is None or link.kind == "none":
        raise ConfigError(f"profile {hardware.name!r} has no interconnect; tp > 1 needs one")
    steps = 2.0 * (tp - 1)
    return steps / tp * float(nbytes) / link.bandwidth + steps * link.latency_s


@public(error=ConfigError, bytes_per_act=number(positive=True))
def comm_line(
    model: ModelSpec, hardware: HardwareProfile, tp: int, bytes_per_act: float
) -> tuple[float, float]:
    """(c₀, c₁): a pass of T tokens of ``model`` (unsharded) spends c₀ + c₁·T seconds in its
    2L all-reduces, each of T · h · ``bytes_per_act`` bytes; (0, 0) for tp = 1."""
    if _tp_value(tp) == 1:
        return 0.0, 0.0
    per_pass = 2.0 * model.layers
    const = per_pass * all_reduce_s(0.0, tp, hardware)  # the latency part
    link = hardware.interconnect
    assert link is not None  # all_reduce_s checked it
    steps = 2.0 * (tp - 1)
    slope = per_pass * steps / tp * model.hidden * bytes_per_act / link.bandwidth
    return const, slope


@public(error=ConfigError, bytes_per_act=number(positive=True), tokens=array(lo=0))
def comm_op(
    model: ModelSpec,
    hardware: HardwareProfile,
    tp: int,
    bytes_per_act: float,
    tokens: npt.ArrayLike,
) -> OperatorCost:
    """The ``all_reduce`` entry of a breakdown: the 2L all-reduces of a pass of ``tokens``
    tokens of ``model`` (:func:`comm_line`) as its ``comm_s``, no FLOPs, no device bytes."""
    const, slope = comm_line(model, hardware, tp, bytes_per_act)
    t = np.asarray(tokens, dtype=np.float64)
    zero = np.zeros_like(t)
    return OperatorCost(
        name="all_reduce",
        flops=zero,
        weight_bytes=zero,
        kv_bytes=zero,
        act_bytes=zero,
        kernels=2 * model.layers,
        compute_s=zero,
        memory_s=zero,
        launch_s=0.0,
        comm_s=const + slope * t,
    )
