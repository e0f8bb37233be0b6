"""The simulated GPU: ground-truth latency of draft, preparation and verification passes.

*Truth and belief are separate* (DESIGN.md, decision 1). The truth here is the per-operator
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

Truth curves are cached per context bucket (``context_quantum`` tokens) so that a simulated step
costs microseconds; the bucket only coarsens the truth's dependence on context (attention
grows by well under 0.1 % per 16 tokens), not its dependence on the tree.

What this module does not do: decide anything or keep time; :mod:`sim.serving` owns the SimPy
environment and charges these durations as timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bastion.cost.backends import register_backend
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.roofline import PassShape, RooflineOptions, drafter_pass, price_pass
from bastion.errors import ConfigError

__all__ = ["GroundTruth", "SimulatedGPU"]

_ATTENTION_OPS = ("attn_scores", "attn_values")


@dataclass(frozen=True)
class GroundTruth:
    """How the simulated device departs from the bare roofline (all configurable)."""

    compute_scale: float = 0.85  # truth η_c = profile η_c × this
    memory_scale: float = 0.90  # truth η_m = profile η_m × this
    launch_scale: float = 1.5  # truth launch overhead = profile's × this
    tile_tokens: int = 64  # GEMM token counts padded to a multiple of this (0: no steps)
    tile_step_s: float = 3e-6  # per layer and per extra tile: kernel/wave switches (steps)
    tree_attention_penalty: float = 0.5  # masked attention kernels are this much slower
    prep_request_s: float = 30e-6  # host preparation per request and step (top-K, tree, mask)
    prep_node_s: float = 0.25e-6  # … plus this per tree node
    noise: float = 0.02  # σ of the log-normal noise per pass
    context_quantum: int = 16  # contexts are priced at multiples of this (cache granularity)

    def __post_init__(self) -> None:
        positive = {
            "compute_scale": self.compute_scale,
            "memory_scale": self.memory_scale,
            "launch_scale": self.launch_scale,
            "context_quantum": self.context_quantum,
        }
        bad = [k for k, v in positive.items() if not v > 0]
        non_negative = {
            "tile_tokens": self.tile_tokens,
            "tile_step_s": self.tile_step_s,
            "tree_attention_penalty": self.tree_attention_penalty,
            "prep_request_s": self.prep_request_s,
            "prep_node_s": self.prep_node_s,
            "noise": self.noise,
        }
        bad += [k for k, v in non_negative.items() if not v >= 0]
        if bad:
            raise ConfigError(f"ground truth has out-of-range fields: {', '.join(bad)}")


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
        self.options = RooflineOptions(tile_tokens=t.tile_tokens)
        self.rng = np.random.default_rng([self.seed, 0x6775])
        self._verify_cache: dict[int, npt.NDArray[np.float64]] = {}
        self._ar_cache: dict[int, float] = {}
        self._draft_cache: dict[int, float] = {}

    # -- truth without noise ------------------------------------------------------------------

    def _quantise(self, contexts: npt.ArrayLike) -> npt.NDArray[np.float64]:
        q = self.truth.context_quantum
        return np.ceil(np.asarray(contexts, dtype=np.float64) / q) * q

    def _price(self, shape: PassShape, masked: bool) -> npt.NDArray[np.float64]:
        ops = price_pass(self.model, self.device, shape, self.options, masked=masked).operators
        total = np.zeros(np.shape(shape.tokens))
        for op in ops:
            t = op.time_s
            if masked and op.name in _ATTENTION_OPS:
                t = t * (1.0 + self.truth.tree_attention_penalty)
            total = total + t
        if self.truth.tile_tokens and self.truth.tile_step_s:
            extra_tiles = np.ceil(np.asarray(shape.tokens) / self.truth.tile_tokens) - 1.0
            total = total + self.model.layers * self.truth.tile_step_s * extra_tiles
        return np.asarray(total, dtype=np.float64)

    def verify_curve(self, context_len: int) -> npt.NDArray[np.float64]:
        """Noise-free truth of a batch-1 tree pass for s = 1 … max_tree_size at this context."""
        c = float(self._quantise(context_len))
        key = int(c)
        if key not in self._verify_cache:
            s = np.arange(1, self.max_tree_size + 1, dtype=np.float64)
            shape = PassShape.of([(s, c)], masked=True)
            self._verify_cache[key] = self._price(shape, masked=True)
        return self._verify_cache[key]

    def verify_truth(self, tree_sizes: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one batched tree-verification pass."""
        s = np.atleast_1d(np.asarray(tree_sizes, dtype=np.int64))
        c = np.atleast_1d(np.asarray(contexts))
        if s.size == 1 and 1 <= s[0] <= self.max_tree_size:
            return float(self.verify_curve(int(c[0]))[s[0] - 1])
        shape = PassShape.of_batch(s, self._quantise(c), masked=True)
        return float(self._price(shape, masked=True))

    def ar_truth(self, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one target-only autoregressive step for each request."""
        c = np.atleast_1d(self._quantise(contexts))
        if c.size == 1:
            key = int(c[0])
            if key not in self._ar_cache:
                shape = PassShape.of([(1, c[0])], masked=False)
                self._ar_cache[key] = float(self._price(shape, masked=False))
            return self._ar_cache[key]
        return float(self._price(PassShape.of_batch(np.ones(c.size), c, masked=False), False))

    def draft_truth(self, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one DFlash drafter pass over a batch."""
        c = np.atleast_1d(self._quantise(contexts))
        if c.size == 1:
            key = int(c[0])
            if key not in self._draft_cache:
                b = drafter_pass(self.drafter, self.device, [c[0]], self.options)
                self._draft_cache[key] = float(b.total_s)
            return self._draft_cache[key]
        return float(drafter_pass(self.drafter, self.device, list(c), self.options).total_s)

    def prep_truth(self, tree_sizes: npt.ArrayLike, topk: bool = True) -> float:
        """Host preparation for one step: per request, plus per node when trees are built."""
        s = np.atleast_1d(np.asarray(tree_sizes, dtype=np.float64))
        t = self.truth
        if not topk:  # a chain needs the argmax only: no normalisation, no tree mask
            return float(s.size * t.prep_request_s * 0.5)
        return float(s.size * t.prep_request_s + s.sum() * t.prep_node_s)

    # -- what a run observes ------------------------------------------------------------------

    def _noisy(self, seconds: float) -> float:
        if self.truth.noise == 0:
            return seconds
        return seconds * float(np.exp(self.truth.noise * self.rng.standard_normal()))

    def verify_s(self, tree_sizes: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        return self._noisy(self.verify_truth(tree_sizes, contexts))

    def ar_s(self, contexts: npt.ArrayLike) -> float:
        return self._noisy(self.ar_truth(contexts))

    def draft_s(self, contexts: npt.ArrayLike) -> float:
        return self._noisy(self.draft_truth(contexts))

    def prep_s(self, tree_sizes: npt.ArrayLike, topk: bool = True) -> float:
        return self._noisy(self.prep_truth(tree_sizes, topk))


def _sim_backend(model: ModelSpec, hw: HardwareProfile, seed: int = 0):  # type: ignore[no-untyped-def]
    """Calibration backend ``sim``: times verification passes on the simulated GPU."""
    gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), seed=seed)

    def verify(s: int, c: int) -> float:
        return gpu.verify_s([s], [c])

    return verify


register_backend("sim", _sim_backend, replace=True)
