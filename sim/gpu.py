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

Passes are priced with :class:`~bastion.cost.roofline.LinearPricer` (one per masked flag, built
with the truth's device and options): the same per-operator roofline as ``price_pass``, as two
small matrix products, with the tree-attention penalty applied per operator. Batch-1 truth
curves are also cached per context bucket (``context_quantum`` tokens); the bucket only coarsens
the truth's dependence on context (attention grows by well under 0.1 % per 16 tokens), not its
dependence on the tree.

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

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bastion.cost.backends import register_backend
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.roofline import LinearPricer, PassShape, RooflineOptions, drafter_pass
from bastion.errors import ConfigError

__all__ = ["DEFAULT_PREFILL_CHUNK", "GroundTruth", "SimulatedGPU", "causal_chunk_pairs"]

_ATTENTION_OPS = ("attn_scores", "attn_values")

Array = npt.NDArray[np.float64]

DEFAULT_PREFILL_CHUNK = 512
"""Prompt tokens one request may put into one forward pass when prefill is chunked.

The default of the serving configuration's ``prefill_chunk_tokens``: a prompt longer than this
is prefilled over several passes, each of which may also carry the decode step of the running
requests (Sarathi-Serve's chunked prefill; vLLM's ``max_num_batched_tokens`` plays a similar
role). The value is a conventional choice, not a tuned one: 512 tokens fill the GEMM tiles of a
pass, and with the default GroundTruth for Qwen3-8B on an H100 SXM a 512-token chunk riding with a
32-request verification step (trees of 16, contexts of 1000) takes it from ≈ 21 ms to ≈ 36 ms."""


def causal_chunk_pairs(new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> Array:
    """(query, key) pairs a causal attention kernel computes for prefill chunks.

    A chunk of n new tokens over c tokens already cached: token j (j = 1 … n) sees the c cached
    keys and the j new keys up to and including itself, so the chunk computes
    Σ_j (c + j) = n·c + n(n + 1)/2 pairs (elementwise over the arguments).
    """
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    return np.asarray(n * c + n * (n + 1.0) / 2.0, dtype=np.float64)


_NO_CHUNKS = (np.zeros(0), np.zeros(0))


def _chunks(new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> tuple[Array, Array]:
    """Validated prefill chunks as two equal-length float arrays (possibly empty)."""
    if (
        isinstance(new_tokens, tuple | list)
        and isinstance(contexts, tuple | list)
        and not new_tokens
        and not contexts
    ):
        return _NO_CHUNKS  # the common case (no prefill), without numpy conversions
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
    return n, c


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
        self._pricers = {
            masked: LinearPricer(self.model, self.device, self.options, masked=masked)
            for masked in (True, False)
        }
        names = self._pricers[True].names
        self._attention = np.array([name in _ATTENTION_OPS for name in names])
        self._lm_head = names.index("lm_head")
        self._tree_scale = np.where(self._attention, 1.0 + t.tree_attention_penalty, 1.0)
        self._verify_cache: dict[int, Array] = {}
        self._ar_cache: dict[int, float] = {}
        self._draft_cache: dict[int, float] = {}

    # -- truth without noise ------------------------------------------------------------------

    def _quantise(self, contexts: npt.ArrayLike) -> Array:
        q = self.truth.context_quantum
        return np.ceil(np.asarray(contexts, dtype=np.float64) / q) * q

    def _tile_steps(self, tokens: npt.ArrayLike) -> Array | float:
        """The per-layer step for every GEMM tile beyond the first (0 when steps are off)."""
        t = self.truth
        if not (t.tile_tokens and t.tile_step_s):
            return 0.0
        extra_tiles = np.ceil(np.asarray(tokens, dtype=np.float64) / t.tile_tokens) - 1.0
        return np.asarray(self.model.layers * t.tile_step_s * extra_tiles, dtype=np.float64)

    def _price(self, shape: PassShape, masked: bool) -> Array:
        """Truth of a pass without prefill chunks (``shape``'s fields may be arrays over N)."""
        scale = self._tree_scale if masked else None
        total = self._pricers[masked].total_s(shape, op_scale=scale)
        return np.asarray(total + self._tile_steps(shape.tokens), dtype=np.float64)

    def _price_mixed(
        self, tokens: Array, contexts: Array, masked: bool, chunks: Array, chunk_ctx: Array
    ) -> float:
        """Truth of one pass of decode requests (``tokens`` over ``contexts``, either may be
        empty) and prefill chunks (``chunks`` new tokens over ``chunk_ctx``; not empty)."""
        decode_pairs = float(np.dot(tokens, contexts + tokens))
        all_pairs = decode_pairs + float(causal_chunk_pairs(chunks, chunk_ctx).sum())
        total_tokens = float(tokens.sum() + chunks.sum())
        logit_rows = float(tokens.sum() + chunks.size)
        kv = float((contexts + tokens).sum() + (chunk_ctx + chunks).sum())
        masked = masked and tokens.size > 0
        # row 0: the whole pass; row 1: the LM head's rows only (other features zero)
        both = PassShape(
            tokens=np.array([total_tokens, logit_rows]),
            attn_pairs=np.array([all_pairs, 0.0]),
            kv_tokens=np.array([kv, 0.0]),
            mask_elems=np.array([decode_pairs if masked else 0.0, 0.0]),
        )
        pricer = self._pricers[masked]
        compute, memory = pricer.branches(both)
        per_op = np.maximum(compute, memory) + pricer.launch_s
        row = per_op[0].copy()
        row[self._lm_head] = per_op[1, self._lm_head]
        if masked and all_pairs > 0:
            share = decode_pairs / all_pairs
            row[self._attention] *= 1.0 + self.truth.tree_attention_penalty * share
        return float(row.sum() + self._tile_steps(total_tokens))

    def verify_curve(self, context_len: int) -> Array:
        """Noise-free truth of a batch-1 tree pass for s = 1 … max_tree_size at this context."""
        c = float(self._quantise(context_len))
        key = int(c)
        if key not in self._verify_cache:
            s = np.arange(1, self.max_tree_size + 1, dtype=np.float64)
            shape = PassShape.of([(s, c)], masked=True)
            self._verify_cache[key] = self._price(shape, masked=True)
        return self._verify_cache[key]

    def verify_truth(
        self,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
    ) -> float:
        """Noise-free truth of one batched tree-verification pass.

        ``prefill_tokens[j]`` new prompt tokens of another request over its
        ``prefill_contexts[j]`` cached ones ride in the same pass (see the module docstring);
        with chunks, ``tree_sizes`` may be empty (the pass is then :meth:`prefill_truth`).
        """
        s = np.atleast_1d(np.asarray(tree_sizes, dtype=np.int64))
        c = np.atleast_1d(np.asarray(contexts))
        chunks, chunk_ctx = _chunks(prefill_tokens, prefill_contexts)
        if chunks.size:
            if s.size != c.size:
                raise ConfigError(f"{s.size} tree sizes but {c.size} contexts; give one each")
            if np.any(s < 1) or np.any(c < 0):
                raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
            return self._price_mixed(
                s.astype(np.float64), self._quantise(c), True, chunks, self._quantise(chunk_ctx)
            )
        if s.size == 1 and 1 <= s[0] <= self.max_tree_size:
            return float(self.verify_curve(int(c[0]))[s[0] - 1])
        shape = PassShape.of_batch(s, self._quantise(c), masked=True)
        return float(self._price(shape, masked=True))

    def ar_truth(
        self,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
    ) -> float:
        """Noise-free truth of one target-only autoregressive step for each request.

        Optional prefill chunks ride in the same pass, as in :meth:`verify_truth`.
        """
        c = np.atleast_1d(self._quantise(contexts))
        chunks, chunk_ctx = _chunks(prefill_tokens, prefill_contexts)
        if chunks.size:
            if np.any(c < 0):
                raise ConfigError("every request needs a context c ≥ 0")
            return self._price_mixed(np.ones(c.size), c, False, chunks, self._quantise(chunk_ctx))
        if c.size == 1:
            key = int(c[0])
            if key not in self._ar_cache:
                shape = PassShape.of([(1, c[0])], masked=False)
                self._ar_cache[key] = float(self._price(shape, masked=False))
            return self._ar_cache[key]
        return float(self._price(PassShape.of_batch(np.ones(c.size), c, masked=False), False))

    def prefill_truth(self, new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one prefill pass: request i processes ``new_tokens[i]`` new prompt
        tokens (causally, no tree mask) over ``contexts[i]`` tokens already in its KV cache.

        Contexts are priced at multiples of ``context_quantum``, as for decode steps."""
        chunks, chunk_ctx = _chunks(new_tokens, contexts)
        if chunks.size == 0:
            raise ConfigError("a prefill pass needs at least one chunk of new tokens")
        empty = np.zeros(0)
        return self._price_mixed(empty, empty, False, chunks, self._quantise(chunk_ctx))

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

    def verify_s(
        self,
        tree_sizes: npt.ArrayLike,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
    ) -> float:
        return self._noisy(
            self.verify_truth(tree_sizes, contexts, prefill_tokens, prefill_contexts)
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

    def prep_s(self, tree_sizes: npt.ArrayLike, topk: bool = True) -> float:
        return self._noisy(self.prep_truth(tree_sizes, topk))


def _sim_backend(model: ModelSpec, hw: HardwareProfile, seed: int = 0):  # type: ignore[no-untyped-def]
    """Calibration backend ``sim``: times verification passes on the simulated GPU."""
    gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), seed=seed)

    def verify(s: int, c: int) -> float:
        return gpu.verify_s([s], [c])

    return verify


register_backend("sim", _sim_backend, replace=True)
