"""The simulated GPU's memory: weights, activations and a paged KV cache (vLLM's layout).

A fraction ``utilization`` of the profile's ``memory_bytes`` is the server's (vLLM's
``--gpu-memory-utilization``, default 0.9). It holds, in this order:

- **weights**: the target's parameters (:meth:`bastion.cost.models.ModelSpec.param_count`) and,
  for a policy that drafts, the DFlash drafter's own (its layers, ``fc`` and two norms; it
  shares the target's embedding and LM head), each ``bytes_per_param`` bytes (the truth's
  ``weight_bytes``; 2, bf16, by default);
- **activations**: the peak of the largest pass the server plans for — ``prefill_chunk`` prompt
  tokens plus ``lookahead`` tokens for each of ``concurrency`` requests (1 for AR, the drafter's
  block of γ + 1 for a drafting policy: vLLM sizes it by profiling such a pass) —
  ``bytes_per_act`` × (2h + h_q + 2·h_kv + 3F) per token (the residual and its normed copy, q, k
  and v, and the FFN's gate, up and product, F the dense FFN width or K × an expert's), plus
  fp32 logits (4·V bytes) for every row that needs them (each decode token, one per chunk);
- **the KV cache**: the rest, in blocks of :data:`BLOCK_TOKENS` tokens. A token's K and V take
  2 · L · h_kv · ``bytes_per_act`` bytes in the target and, for a drafting policy, 2 · L_d ·
  h_kv,d · ``bytes_per_act`` in the drafter's cache (DFlash caches the projected context
  features of every committed token in each of its layers); one block table serves both, as
  vLLM's does for its drafters.

``blocks = ⌊(utilization · memory_bytes − weights − activations) / (16 · kv_token_bytes)⌋``, and
the capacity is 16 · blocks tokens. A model whose weights and activations leave no block is
refused with a :class:`bastion.errors.MemoryLimitError` that names what it needs.

With tensor parallelism N (``tp``), the server has N GPUs of the profile, N · memory_bytes in
all, and every term above is one GPU's share (:func:`bastion.cost.parallel.tp_shard`): its
1/N of the attention and FFN weights and of the embedding and LM head (norms replicated), its
activations (the residual stream whole, q/k/v and the FFN split; the logits whole, gathered on
one GPU), and its KV heads per token (n_kv / N, or one replicated head when n_kv < N, as vLLM
does). Every GPU holds its heads of every cached token, so the blocks of one GPU are the
group's: the capacity is that of one GPU's share.

:class:`KVCache` is the server's count of blocks (:mod:`bastion.sim.serving` says when it
allocates, preempts and admits); :func:`lookahead_tokens` is the tree a policy may verify per
request, which the server reserves before the step (vLLM's lookahead slots) unless the policy
sizes its own trees to the free blocks (the adaptive controllers: their KV room is the root).

What this module does not do: price anything, or schedule (the serving loop does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import check_tp, tp_shard
from bastion.errors import ConfigError, MemoryLimitError
from bastion.guard import integer, number, public
from bastion.policies import BeamPolicy, ChainPolicy, EaglePolicy, FixedPolicy
from bastion.sim.ground_truth import GroundTruth

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "KVCache",
    "MemoryPlan",
    "activation_token_bytes",
    "drafter_weight_params",
    "kv_token_bytes",
    "lookahead_tokens",
    "memory_of",
    "plan_memory",
    "within_lookahead",
]

BLOCK_TOKENS = 16
"""Tokens per KV-cache block (vLLM's default block size)."""
_SMALL = 16  # KVCache.blocks_of: up to so many requests summed as Python ints (cheaper)

try:  # the optional compiled kernel (setup.py): a step's block counts in one call each
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _kernel = None
_blocks = getattr(_kernel, "blocks", None)

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""The share of the device's memory the server takes (vLLM's default)."""

_GB = 1e9
_LOGIT_BYTES = 4  # fp32 logits per vocabulary entry


def _ffn_width(model: ModelSpec) -> int:
    return model.experts_per_token * model.expert_ffn if model.is_moe else model.ffn


@public(bytes_per_act=number(positive=True))
def kv_token_bytes(model: ModelSpec, bytes_per_act: float = 2.0) -> float:
    """K and V of one token in every layer of ``model``: 2 · L · h_kv · ``bytes_per_act``."""
    return 2.0 * model.layers * model.h_kv * bytes_per_act


@public(bytes_per_act=number(positive=True))
def activation_token_bytes(model: ModelSpec, bytes_per_act: float = 2.0) -> float:
    """One token's live activations in a layer of ``model`` (logits apart):
    ``bytes_per_act`` · (2h + h_q + 2·h_kv + 3F)."""
    width = 2 * model.hidden + model.h_q + 2 * model.h_kv + 3 * _ffn_width(model)
    return float(bytes_per_act) * width


@public
def drafter_weight_params(drafter: DrafterSpec) -> int:
    """Parameters the DFlash drafter adds to the target's: its layers, ``fc`` (taps·h → h) and
    its two norms (context and final); the embedding and LM head are the target's."""
    m = drafter.model
    return m.layers * m.layer_params() + drafter.taps * m.hidden * m.hidden + 2 * m.hidden


@public(
    error=ConfigError,
    memory_bytes=number(positive=True),
    utilization=number(hi=1.0, positive=True),
    weight_bytes=number(lo=0.0),
    activation_bytes=number(lo=0.0),
    kv_token_bytes=number(positive=True),
    blocks=integer(lo=1),
    block_tokens=integer(1, 1 << 20),
    gpus=integer(1, 1 << 16),
)
@dataclass(frozen=True)
class MemoryPlan:
    """Where the server's share of device memory goes (bytes), and the KV cache it leaves."""

    memory_bytes: float  # the profile's device memory
    utilization: float  # the server's share of it
    weight_bytes: float  # the target's weights, and the drafter's own
    activation_bytes: float  # the planned pass's peak activations
    kv_token_bytes: float  # K and V of one token: the target's, and the drafter's cache
    blocks: int  # KV-cache blocks
    block_tokens: int = BLOCK_TOKENS
    gpus: int = 1  # tensor parallelism: GPUs of the group; the bytes above are one GPU's

    @property
    def usable_bytes(self) -> float:
        return self.utilization * self.memory_bytes

    @property
    def block_bytes(self) -> float:
        return self.block_tokens * self.kv_token_bytes

    @property
    def capacity_tokens(self) -> int:
        """Tokens the KV cache holds: blocks × block_tokens."""
        return self.blocks * self.block_tokens

    def describe(self) -> str:
        group = f"per GPU of {self.gpus} (tensor parallelism): " if self.gpus > 1 else ""
        return group + (
            f"{self.usable_bytes / _GB:.2f} GB usable ({self.utilization:g} of "
            f"{self.memory_bytes / _GB:.2f} GB): weights {self.weight_bytes / _GB:.2f} GB, "
            f"activations {self.activation_bytes / _GB:.2f} GB, KV cache {self.blocks} blocks of "
            f"{self.block_tokens} tokens = {self.capacity_tokens} tokens "
            f"({self.kv_token_bytes / 1024:.1f} KiB per token)"
        )


@public(
    error=ConfigError,
    utilization=number(hi=1.0, positive=True),
    concurrency=integer(lo=1),
    prefill_chunk=integer(lo=0),
    lookahead=integer(lo=1),
    bytes_per_param=number(positive=True),
    bytes_per_act=number(positive=True),
)
def plan_memory(
    hardware: HardwareProfile,
    model: ModelSpec,
    drafter: DrafterSpec | None = None,
    *,
    utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    concurrency: int = 1,
    prefill_chunk: int = 0,
    lookahead: int = 1,
    bytes_per_param: float = 2.0,
    bytes_per_act: float = 2.0,
    tp: int = 1,
) -> MemoryPlan:
    """The memory plan of ``model`` (with ``drafter``, when the policy drafts) on ``hardware``
    (see the module doc), one GPU's share of ``tp`` with tensor parallelism; a
    :class:`MemoryLimitError` naming the memory needed when the weights and activations leave
    no KV block."""
    tp = check_tp(model, tp)
    part = tp_shard(model, tp)  # one GPU's share (the model itself at tp 1)
    draft = None
    if drafter is not None:
        draft = replace(drafter, model=tp_shard(drafter.model, tp)) if tp > 1 else drafter
    params = part.param_count() + (drafter_weight_params(draft) if draft else 0)
    weights = float(params) * bytes_per_param
    rows = concurrency * lookahead + (1 if prefill_chunk else 0)
    per_token = activation_token_bytes(part, bytes_per_act)
    activations = (prefill_chunk + concurrency * lookahead) * per_token
    activations += rows * _LOGIT_BYTES * model.vocab  # whole: gathered on one GPU
    per_kv = kv_token_bytes(part, bytes_per_act)
    if draft is not None:
        per_kv += kv_token_bytes(draft.model, bytes_per_act)
    usable = utilization * hardware.memory_bytes
    left = usable - weights - activations
    block = BLOCK_TOKENS * per_kv
    blocks = int(left // block) if left > 0 else 0
    if blocks < 1:
        need = weights + activations + block
        what = model.name + (" with its drafter" if drafter is not None else "")
        where = hardware.name if tp == 1 else f"{tp} × {hardware.name} (tensor parallelism)"
        each = "" if tp == 1 else " per GPU"
        total = "" if tp == 1 else f", {tp * need / _GB:.2f} GB over the {tp} GPUs"
        raise MemoryLimitError(
            f"{what} does not fit on {where}: it needs {need / _GB:.2f} GB{each} ({need:.0f} "
            f"bytes: weights {weights / _GB:.2f} GB + activations {activations / _GB:.2f} GB at "
            f"concurrency {concurrency} + one {BLOCK_TOKENS}-token KV block {block / 1e6:.2f} "
            f"MB{total}) of {usable / _GB:.2f} GB usable{each} ({utilization:g} × "
            f"{hardware.memory_bytes / _GB:.2f} GB); raise --gpu-memory-utilization or --tp, "
            "lower --concurrency or --prefill-chunk, or use a larger GPU"
        )
    return MemoryPlan(
        memory_bytes=float(hardware.memory_bytes),
        utilization=float(utilization),
        weight_bytes=weights,
        activation_bytes=activations,
        kv_token_bytes=per_kv,
        blocks=blocks,
        gpus=tp,
    )


@public(
    error=ConfigError,
    utilization=number(hi=1.0, positive=True),
    concurrency=integer(lo=1),
    prefill_chunk=integer(lo=0),
)
def memory_of(
    hardware: HardwareProfile,
    model: ModelSpec,
    drafter: DrafterSpec | None,
    truth: GroundTruth,
    utilization: float,
    concurrency: int,
    prefill_chunk: int,
    tp: int = 1,
) -> MemoryPlan:
    """:func:`plan_memory` for a simulation: element sizes from ``truth`` (its ``weight_bytes``
    and ``activation_bytes``; 0: bf16's 2), a drafting policy's pass planned with the drafter's
    block per request, AR's with one token; ``tp`` GPUs (tensor parallelism)."""
    plain = RooflineOptions()
    return plan_memory(
        hardware,
        model,
        drafter,
        utilization=utilization,
        concurrency=concurrency,
        prefill_chunk=prefill_chunk,
        lookahead=drafter.block_size if drafter is not None else 1,
        bytes_per_param=float(truth.weight_bytes or plain.bytes_per_param),
        bytes_per_act=float(truth.activation_bytes or plain.bytes_per_act),
        tp=tp,
    )


@public(depth=integer(lo=1))
def lookahead_tokens(policy: object, depth: int) -> int:
    """Token slots per request the server reserves before a step of ``policy`` (the largest
    tree it verifies; the drafter drafts ``depth`` positions): 1 for AR and for the policies
    that size their trees to the KV room themselves (``uses_cost_model``: the adaptive
    controllers, whose trees the engine fits to the free blocks); a fixed N, a chain's depth
    + 1, a beam's 1 + w·d, EAGLE's total; any other policy the drafter's block (its larger
    trees are cut to the room by the engine)."""
    return _lookahead(policy, depth)[0]


@public
def within_lookahead(policy: object) -> bool:
    """Whether ``policy``'s trees never exceed its :func:`lookahead_tokens` (AR and the
    built-in fixed, chain, beam and EAGLE policies): its steps need no KV room, their slots
    are reserved before they run."""
    return _lookahead(policy, 1)[1]


def _lookahead(policy: object, depth: int) -> tuple[int, bool]:
    if not getattr(policy, "uses_drafter", True):
        return 1, True
    if getattr(policy, "uses_cost_model", False):
        return 1, False
    if isinstance(policy, FixedPolicy):
        return int(policy.tree_size), True
    if isinstance(policy, ChainPolicy):
        return 1 + (depth if policy.depth is None else min(depth, policy.depth)), True
    if isinstance(policy, BeamPolicy):
        return 1 + policy.width * min(depth, policy.depth), True
    if isinstance(policy, EaglePolicy):
        return int(policy.total), True
    return depth + 1, False


IntArray = npt.NDArray[np.int64]


@public
class KVCache:
    """The server's count of KV-cache blocks: what is held, the peak, preemptions.

    ``capacity`` blocks (None: unlimited — counted, never binding). A request holds
    ⌈tokens / block_tokens⌉ blocks for the tokens in its cache; :meth:`blocks` is that map."""

    def __init__(self, plan: MemoryPlan | None) -> None:
        self.plan = plan
        self.block_tokens = plan.block_tokens if plan is not None else BLOCK_TOKENS
        self.capacity = plan.blocks if plan is not None else None
        self.used = 0  # blocks held
        self.peak = 0  # the most blocks held at once (a step's trees included)
        self.preemptions = 0
        self.max_running = 0

    @property
    def limited(self) -> bool:
        return self.capacity is not None

    def blocks(self, tokens: int) -> int:
        return -(-int(tokens) // self.block_tokens)

    def blocks_one(self, tokens: int, add: int = 0, size: int | None = None) -> int:
        """:meth:`blocks_of` of one request, on Python ints: ⌈(tokens + max(size, add)) /
        block_tokens⌉ (``size`` None: ⌈(tokens + add) / block_tokens⌉)."""
        extra = add if size is None else max(size, add)
        return -(-(tokens + extra) // self.block_tokens)

    def blocks_of(self, tokens: IntArray, add: int = 0, sizes: IntArray | None = None) -> int:
        """Σ ⌈(tokens_i + add) / block_tokens⌉ over an array; with ``sizes``, Σ ⌈(tokens_i +
        max(sizes_i, add)) / block_tokens⌉ (a step's trees beyond each lookahead of ``add``).
        One compiled call where the arrays are C-contiguous int64 (several calls a step); one
        request's on Python ints (:meth:`blocks_one`)."""
        bt = self.block_tokens
        if tokens.shape == (1,) and (sizes is None or sizes.shape == (1,)):
            return self.blocks_one(int(tokens[0]), add, None if sizes is None else int(sizes[0]))
        if _blocks is not None:
            count = _blocks(tokens, add, bt, sizes, add)
            if count is not None:
                return int(count)
        if sizes is not None:
            tokens = tokens + np.maximum(sizes, add)
        elif add:
            tokens = tokens + add
        if tokens.shape[0] <= _SMALL:  # a few requests: Python's ints, the same whole numbers
            # without numpy's per-call cost
            return sum([(t + (bt - 1)) // bt for t in tokens.tolist()])
        return int(np.add.reduce((tokens + (bt - 1)) // bt))

    def blocks_two(
        self, tokens: IntArray, add: int, sizes: IntArray, sizes2: IntArray
    ) -> tuple[int, int]:
        """(:meth:`blocks_of` ``(tokens, add, sizes)``, :meth:`blocks_of` ``(tokens, 0,
        sizes2)``): a step's trees and its committed tokens counted in one compiled call (the
        server's two counts of one step's contexts), else as those two calls."""
        if _blocks is not None and tokens.shape[0] > 1:
            counts = _blocks(tokens, add, self.block_tokens, sizes, add, sizes2, 0)
            if counts is not None:
                return int(counts[0]), int(counts[1])
        return self.blocks_of(tokens, add, sizes), self.blocks_of(tokens, 0, sizes2)

    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.used

    def fits(self, blocks: int) -> bool:
        return self.capacity is None or self.used + blocks <= self.capacity

    def hold(self, blocks: int) -> None:
        """Take (or, negative, give back) ``blocks``; the peak follows."""
        self.used += blocks
        if self.used > self.peak:
            self.peak = self.used

    def touch(self, blocks: int) -> None:
        """``blocks`` more held for a moment (a step's tree slots): the peak only."""
        if self.used + blocks > self.peak:
            self.peak = self.used + blocks

    def running(self, count: int) -> None:
        if count > self.max_running:
            self.max_running = count

    @property
    def capacity_tokens(self) -> int | None:
        return None if self.capacity is None else self.capacity * self.block_tokens

    @property
    def peak_tokens(self) -> int:
        return self.peak * self.block_tokens
