"""What the roofline reads and returns: a pass's aggregate shape and its per-operator breakdown.

:class:`PassShape` sums a batch's ``(s_i, c_i)`` into the four counts every operator of a pass is
priced from (tokens, attention pairs, KV tokens, mask elements); :class:`OperatorCost` is one
operator's FLOPs, bytes and seconds summed over the layers, and :class:`RooflineBreakdown` the
whole pass, with its totals per branch (compute, memory, launch). Every field may be an array
over N (a whole curve in one call).

What this module does not do: count or price operators (:mod:`bastion.cost.opcounts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import array, public

__all__ = ["OperatorCost", "PassShape", "RooflineBreakdown"]

Array = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike


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
    # seconds on the link between GPUs (tensor parallelism's all-reduces), added to the max of
    # compute and memory (not overlapped); 0 on one GPU
    comm_s: Array | float = 0.0

    @property
    def bytes(self) -> Array:
        return self.weight_bytes + self.kv_bytes + self.act_bytes

    @property
    def time_s(self) -> Array:
        t = np.maximum(self.compute_s, self.memory_s) + self.launch_s
        c = self.comm_s
        return t if isinstance(c, float) and c == 0.0 else t + c

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
            comm_s=pick(np.asarray(self.comm_s)),
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
    def comm_s(self) -> Array:
        """Seconds on the link between GPUs (tensor parallelism's all-reduces; 0 on one)."""
        return sum((np.asarray(op.comm_s) for op in self.operators), np.zeros(()))

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
        comm = float(self.comm_s)
        if comm:
            out["branch.comm"] = comm
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
