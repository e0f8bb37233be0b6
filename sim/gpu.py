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

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bastion.cost.backends import register_backend
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.roofline import (
    DrafterPricer,
    LinearPricer,
    RooflineOptions,
    experts_touched,
)
from bastion.errors import ConfigError

__all__ = ["DEFAULT_PREFILL_CHUNK", "GroundTruth", "SimulatedGPU", "causal_chunk_pairs"]

_ATTENTION_OPS = ("attn_scores", "attn_values")

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
        self._noise_block: list[float] = []
        self._noise_next = 0
        # The target's per-operator counts, read off the masked LinearPricer (the unmasked one
        # differs only by a zero mask column, and an unmasked pass has a zero mask feature).
        # Rows: the features (1, T, padded T, attention pairs, KV tokens, mask elements,
        # experts touched); columns: compute seconds of every operator, then memory seconds.
        pricer = LinearPricer(self.model, self.device, self.options, masked=True)
        names = pricer.names
        self._ops = n_ops = len(names)
        self._peak, self._bw = pricer._peak, pricer._bw
        self._matrix = np.hstack(
            (
                np.vstack((pricer._f0, pricer._f)) / self._peak,
                np.vstack((pricer._b0, pricer._b)) / self._bw,
            )
        )
        attention = np.array([name in _ATTENTION_OPS for name in names], dtype=np.float64)
        lm_head = np.array([name == "lm_head" for name in names], dtype=np.float64)
        launch = np.asarray(pricer.launch_s, dtype=np.float64)
        penalty = t.tree_attention_penalty
        self._w_tree = 1.0 + penalty * attention  # per-operator factor of a tree pass
        self._w_plain = np.ones(n_ops)
        self._launch_tree = float(np.dot(launch, self._w_tree))
        self._launch_plain = float(launch.sum())
        self._launch_attention = float(np.dot(launch, attention))
        # mixed passes: Σ operators but the LM head, Σ attention operators, the LM head
        self._w_mixed = np.column_stack((1.0 - lm_head, attention, lm_head))
        self._tile = t.tile_tokens
        self._step_s = self.model.layers * t.tile_step_s if t.tile_tokens else 0.0
        m = self.model
        self._moe = m.is_moe
        self._experts, self._per_token = m.experts, m.experts_per_token
        self._saturating = self.options.expert_touch == "saturating"
        self._verify_cache: dict[int, Array] = {}
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

    def _features(self, tokens: float, pairs: float, kv: float, mask: float) -> list[float]:
        """The feature row of a pass (see ``_matrix``)."""
        tile = self._tile
        padded = math.ceil(tokens / tile) * tile if tile > 0 else tokens
        if not self._moe:
            touched = 0.0
        elif self._saturating:
            touched = min(float(self._experts), self._per_token * tokens)
        else:
            e = self._experts
            touched = e * (1.0 - (1.0 - self._per_token / e) ** tokens)
        return [1.0, tokens, padded, pairs, kv, mask, touched]

    def _tile_steps(self, tokens: float) -> float:
        """The per-layer step for every GEMM tile beyond the first (0 when steps are off)."""
        if not self._step_s:
            return 0.0
        return self._step_s * (math.ceil(tokens / self._tile) - 1.0)

    def _pass_s(self, tokens: float, pairs: float, kv: float, masked: bool) -> float:
        """Truth of a pass without prefill chunks whose every token produces logits."""
        tile = self._tile
        padded = math.ceil(tokens / tile) * tile if tile > 0 else tokens
        touched = self._features(tokens, 0.0, 0.0, 0.0)[6] if self._moe else 0.0
        x = [1.0, tokens, padded, pairs, kv, pairs if masked else 0.0, touched]
        y = np.dot(x, self._matrix)
        n = self._ops
        per_op = np.maximum(y[:n], y[n:])
        if masked:
            total = float(np.dot(per_op, self._w_tree)) + self._launch_tree
        else:
            total = float(np.dot(per_op, self._w_plain)) + self._launch_plain
        if self._step_s:  # padded / tile = ⌈T / tile⌉ exactly
            total += self._step_s * (padded / tile - 1.0)
        return total

    def _price_mixed(
        self,
        decode: tuple[int, float, float, float],
        chunks: _Chunks,
        masked: bool,
    ) -> float:
        """Truth of one pass of decode requests (``decode`` = count, tokens, pairs, KV tokens;
        the count may be 0) and prefill chunks (not empty; contexts not yet quantised)."""
        n_decode, tokens, decode_pairs, kv = decode
        new, ctx = chunks
        q = self.truth.context_quantum
        all_pairs = decode_pairs
        for n, c in zip(new, ctx, strict=True):
            cq = math.ceil(c / q) * q
            all_pairs += n * cq + n * (n + 1.0) / 2.0  # causal_chunk_pairs
            kv += cq + n
        total_tokens = tokens + sum(new)
        logit_rows = tokens + len(new)
        masked = masked and n_decode > 0
        # row 0: the whole pass; row 1: the LM head's rows only (other features zero)
        x = self._features(total_tokens, all_pairs, kv, decode_pairs if masked else 0.0)
        head = self._features(logit_rows, 0.0, 0.0, 0.0)
        y = np.dot([x, head], self._matrix)
        n_ops = self._ops
        per_op = np.maximum(y[:, :n_ops], y[:, n_ops:])
        sums: list[list[float]] = np.dot(per_op, self._w_mixed).tolist()
        (rest, attention, _), (_, _, lm_head) = sums
        share = decode_pairs / all_pairs if masked and all_pairs > 0 else 0.0
        scale = self.truth.tree_attention_penalty * share
        launches = self._launch_plain + scale * self._launch_attention
        return rest + lm_head + scale * attention + launches + self._tile_steps(total_tokens)

    def _decode_sums(
        self, sizes: IntArray, contexts: npt.ArrayLike
    ) -> tuple[int, float, float, float]:
        """(requests, Σ s, Σ s·(c + s), Σ (c + s)) of tree passes, contexts quantised.

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
            return 0, 0.0, 0.0, 0.0
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
        return b, tokens, q * s_k + s_sq, q * k_sum + tokens

    def _ar_sums(self, contexts: npt.ArrayLike) -> tuple[int, float, float, float]:
        """The same for one token per request (an autoregressive step)."""
        k = self._buckets(contexts)
        b = k.shape[0]
        kv = self.truth.context_quantum * float(np.add.reduce(k)) + b if b else 0.0
        return b, float(b), kv, kv

    def verify_curve(self, context_len: int) -> Array:
        """Noise-free truth of a batch-1 tree pass for s = 1 … max_tree_size at this context."""
        c = self._quantise_one(context_len)
        key = int(c)
        if key not in self._verify_cache:
            if c < 0:
                raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
            s = np.arange(1, self.max_tree_size + 1, dtype=np.float64)
            x = np.zeros((s.shape[0], 7))
            x[:, 0], x[:, 1], x[:, 4] = 1.0, s, c + s
            x[:, 3] = x[:, 5] = s * (c + s)
            tile = self._tile
            x[:, 2] = np.ceil(s / tile) * tile if tile > 0 else s
            if self._moe:
                m = self.model
                x[:, 6] = experts_touched(
                    s, m.experts, m.experts_per_token, self.options.expert_touch
                )
            y = x @ self._matrix
            per_op = np.maximum(y[:, : self._ops], y[:, self._ops :])
            total = per_op @ self._w_tree + self._launch_tree
            if self._step_s:
                total += self._step_s * (x[:, 2] / tile - 1.0)
            self._verify_cache[key] = total
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
        s = np.asarray(tree_sizes, dtype=np.int64)
        if s.ndim != 1:
            s = np.atleast_1d(s)
            if s.ndim != 1:
                raise ConfigError(f"tree sizes must be 1-D, got shape {s.shape}")
        chunks = _chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            return self._price_mixed(self._decode_sums(s, contexts), chunks, True)
        if s.shape[0] == 1:
            s0 = int(s[0])
            c = np.asarray(contexts)
            if c.size == 1 and 1 <= s0 <= self.max_tree_size:
                c0 = int(c.reshape(-1)[0])
                curve = self._verify_cache.get(int(self._quantise_one(c0)))
                if curve is None:
                    curve = self.verify_curve(c0)
                return float(curve[s0 - 1])
        b, tokens, pairs, kv = self._decode_sums(s, contexts)
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        return self._pass_s(tokens, pairs, kv, masked=True)

    def ar_truth(
        self,
        contexts: npt.ArrayLike,
        prefill_tokens: npt.ArrayLike = (),
        prefill_contexts: npt.ArrayLike = (),
    ) -> float:
        """Noise-free truth of one target-only autoregressive step for each request.

        Optional prefill chunks ride in the same pass, as in :meth:`verify_truth`.
        """
        chunks = _chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            return self._price_mixed(self._ar_sums(contexts), chunks, False)
        c = np.asarray(contexts)
        if c.size == 1:
            key = int(self._quantise_one(float(c.reshape(-1)[0])))
            hit = self._ar_cache.get(key)
            if hit is None:
                hit = self._ar_cache[key] = self._pass_s(*self._ar_sums(c)[1:], masked=False)
            return hit
        b, tokens, pairs, kv = self._ar_sums(c)
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        return self._pass_s(tokens, pairs, kv, masked=False)

    def prefill_truth(self, new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one prefill pass: request i processes ``new_tokens[i]`` new prompt
        tokens (causally, no tree mask) over ``contexts[i]`` tokens already in its KV cache.

        Contexts are priced at multiples of ``context_quantum``, as for decode steps."""
        chunks = _chunks(new_tokens, contexts)
        if not chunks[0]:
            raise ConfigError("a prefill pass needs at least one chunk of new tokens")
        return self._price_mixed((0, 0.0, 0.0, 0.0), chunks, False)

    def draft_truth(self, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one DFlash drafter pass over a batch."""
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
        return self._drafter.total_s(b, self.truth.context_quantum * float(np.add.reduce(buckets)))

    def prep_truth(self, tree_sizes: npt.ArrayLike, topk: bool = True) -> float:
        """Host preparation for one step: per request, plus per node when trees are built."""
        t = self.truth
        if isinstance(tree_sizes, np.ndarray) and tree_sizes.ndim == 1:
            n: int = tree_sizes.shape[0]
            nodes = float(np.add.reduce(tree_sizes)) if topk else 0.0
        else:
            s = np.atleast_1d(np.asarray(tree_sizes, dtype=np.float64))
            n, nodes = s.size, float(s.sum())
        if not topk:  # a chain needs the argmax only: no normalisation, no tree mask
            return n * t.prep_request_s * 0.5
        return n * t.prep_request_s + nodes * t.prep_node_s

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
