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

The parts, each its own module: the truth's fields (:mod:`bastion.sim.ground_truth`), its MoE
routing model (:mod:`bastion.sim.routing`), prefill chunks riding in a pass
(:mod:`bastion.sim.prefill`), a batch reduced to its sums with contexts quantised
(:mod:`bastion.sim.batching`), one pass priced from those sums on the per-operator roofline
(:mod:`bastion.sim.pass_pricing`), a step's preparation (:mod:`bastion.sim.prep`), and a measured
truth's costs (:mod:`bastion.sim.measured_truth`). This module holds the GPU that ties them
together: it caches batch-1 truth curves per context bucket (``context_quantum`` tokens), prices
every pass through them, and draws the noise. A decode step (:meth:`SimulatedGPU.step_s`) is
priced on the passes' own paths, or — the same operations on the same numbers — at batch 1 from
the caches in one go (``_single_step``) and above it from one compiled call's sums shared by its
three passes (``_batch_step``).

Noise: pass i is multiplied by exp(noise · z_i), z the standard normals of the GPU's generator
(seeded by ``seed``) in order, drawn 1024 at a time; the sequence is a function of the seed (and,
as the per-pass draws it replaced, the same z_i).

Prefill. :meth:`SimulatedGPU.prefill_truth` prices one pass that processes chunks of new prompt
tokens for several requests, and ``verify_*`` / ``ar_*`` accept optional prefill chunks riding
in the same forward pass as the decode step (:mod:`bastion.sim.prefill` says how such a pass is
priced).

What this module does not do: decide anything or keep time; :mod:`sim.serving` owns the SimPy
environment and charges these durations as timeouts.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cost.backends import register_backend
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.errors import ConfigError
from bastion.guard import INT64_LIMIT, integer, public
from bastion.sim.batching import BatchSums, compiled_sums
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.measured_truth import ints, measured_pass, measured_prep, measured_step
from bastion.sim.pass_pricing import PassPricer
from bastion.sim.prefill import DEFAULT_PREFILL_CHUNK, causal_chunk_pairs, checked_chunks
from bastion.sim.prep import HostPrep
from bastion.sim.routing import expected_experts, routing_draws

__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "GroundTruth",
    "SimulatedGPU",
    "causal_chunk_pairs",
    "expected_experts",
    "routing_draws",
]

Array = npt.NDArray[np.float64]
T = TypeVar("T")

_NOISE_BLOCK = 1024  # standard normals drawn per numpy call for the pass noise
_SEQUENCES: tuple[type, ...] = (list, tuple)  # what prefill chunks the serving loop passes are


class _Shared:
    """What every simulated GPU of one (profile, model, drafter, roofline truth, N_max) shares:
    its pricer and host preparation, pure functions of those, and the noise-free truths it
    caches (batch-1 tree and causal curves, AR and drafter passes, per context bucket) — so a
    sweep's second run, or a policy's after AR's, does not price them again."""

    ENTRIES = 4096  # cached truths of one kind (cleared when full)

    def __init__(
        self,
        hardware: HardwareProfile,
        model: ModelSpec,
        drafter: DrafterSpec,
        t: GroundTruth,
        tp: int = 1,
    ) -> None:
        self.pricer = PassPricer(hardware, model, drafter, t, tp)
        self.prep = HostPrep(
            t, model, drafter, self.pricer.device, self.pricer.options, self.pricer.byte_rate
        )
        self.verify: dict[int, Array] = {}
        self.causal: dict[int, Array] = {}
        self.ar: dict[int, float] = {}
        self.draft: dict[int, float] = {}


_SHARED: dict[tuple[str, ...], _Shared] = {}  # by the reprs of what defines them
_SHARED_CONFIGS = 8  # configurations kept (the oldest dropped)


def _shared(
    hardware: HardwareProfile,
    model: ModelSpec,
    drafter: DrafterSpec,
    t: GroundTruth,
    n: int,
    tp: int = 1,
) -> _Shared:
    """The shared part of a simulated GPU (a measured truth's is its own)."""
    if t.measured is not None:
        if tp != 1:
            raise ConfigError(
                f"truth {t.name!r} is measured on one machine's device; tensor parallelism "
                f"(tp {tp}) needs a roofline truth (hf-eager, cudagraph, builtin or a file "
                "without [measured])"
            )
        return _Shared(hardware, model, drafter, t)
    key: tuple[str, ...] = (repr(hardware), repr(model), repr(drafter), repr(t), str(n))
    if tp != 1:
        key += (f"tp{tp}",)
    hit = _SHARED.get(key)
    if hit is None:
        if len(_SHARED) >= _SHARED_CONFIGS:
            del _SHARED[next(iter(_SHARED))]
        hit = _SHARED[key] = _Shared(hardware, model, drafter, t, tp)
    return hit


def _remember(cache: dict[int, T], key: int, value: T) -> T:
    """``cache[key] = value``, the cache cleared first when full."""
    if len(cache) >= _Shared.ENTRIES:
        cache.clear()
    cache[key] = value
    return value


@public(
    seed=integer(0, INT64_LIMIT - 1),
    max_tree_size=integer(1, MAX_TREE_SIZE),
    tp=integer(1, 1 << 16),
)
@dataclass
class SimulatedGPU:
    """Ground-truth pass latencies for one target (and its DFlash drafter) on one device."""

    hardware: HardwareProfile  # the nominal profile (what a cost model would be given)
    model: ModelSpec
    drafter: DrafterSpec
    truth: GroundTruth = field(default_factory=GroundTruth)
    seed: int = 0
    max_tree_size: int = 1024
    # tensor parallelism: the model split over this many GPUs of the profile, linked by its
    # [interconnect] (bastion.cost.parallel); every pass is one GPU's share + its all-reduces
    tp: int = 1

    def __post_init__(self) -> None:
        t = self.truth
        shared = _shared(self.hardware, self.model, self.drafter, t, self.max_tree_size, self.tp)
        self.pricer, self.prep = shared.pricer, shared.prep
        self.device, self.options = self.pricer.device, self.pricer.options
        self.rng = np.random.default_rng([self.seed, 0x6775])
        self._noise: Iterator[float] = iter(())  # the factors exp(noise · z) not yet used
        self.sums = BatchSums(t.context_quantum)
        self._verify_cache, self._causal_cache = shared.verify, shared.causal
        self._ar_cache, self._draft_cache = shared.ar, shared.draft
        self._measured = t.measured
        # seconds of the last step_s that a real engine's clock does not show its cost model
        # (a measured truth's decode-loop time after the pass); 0 under a roofline truth
        self.unobserved_s = 0.0
        # a measured truth: its terms are mean times, so its noise has mean 1 (E e^{σz} = e^{σ²/2})
        self._unbias = math.exp(-0.5 * t.noise**2)

    # -- truth without noise ------------------------------------------------------------------

    def experts_touched(self, tokens: npt.ArrayLike, requests: npt.ArrayLike = 1) -> Array:
        """The truth's expected distinct experts per layer for a pass of ``tokens`` tokens from
        ``requests`` requests (its own routing model, not the cost model's)."""
        return self.pricer.experts_touched(tokens, requests)

    def _curve(self, context_len: int, tree: bool) -> Array:
        """Noise-free truth of a batch-1 pass for s = 1 … max_tree_size at this context."""
        c = self.sums.quantise_one(context_len)
        cache = self._verify_cache if tree else self._causal_cache
        key = int(c)
        if key not in cache:
            if c < 0:
                raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
            return _remember(cache, key, self.pricer.price_curve(c, tree, self.max_tree_size))
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
            return measured_pass(
                self._measured,
                "tree" if tree else "chain",
                tree_sizes,
                contexts,
                prefill_tokens,
                prefill_contexts,
            )
        s = np.asarray(tree_sizes, dtype=np.int64)
        if s.ndim != 1:
            s = np.atleast_1d(s)
            if s.ndim != 1:
                raise ConfigError(f"tree sizes must be 1-D, got shape {s.shape}")
        chunks = checked_chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            b, tokens, pairs, kv, causal = self.sums.decode_sums(s, contexts)
            return self.pricer.price_mixed((b, tokens, pairs, kv), chunks, tree, causal)
        if s.shape[0] == 1:
            s0 = int(s[0])
            c = np.asarray(contexts)
            if c.size == 1 and 1 <= s0 <= self.max_tree_size:
                c0 = int(c.reshape(-1)[0])
                cache = self._verify_cache if tree else self._causal_cache
                curve = cache.get(int(self.sums.quantise_one(c0)))
                if curve is None:
                    curve = self._curve(c0, tree)
                return float(curve[s0 - 1])
        b, tokens, pairs, kv, causal = self.sums.decode_sums(s, contexts)
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        return self.pricer.price_pass(b, tokens, pairs, kv, tree, causal)

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
            return measured_pass(
                self._measured, "ar", ones, contexts, prefill_tokens, prefill_contexts
            )
        chunks = checked_chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            b, tokens, pairs, kv = self.sums.ar_sums(contexts)
            return self.pricer.price_mixed((b, tokens, pairs, kv), chunks, False, pairs)
        c = np.asarray(contexts)
        if c.size == 1:
            key = int(self.sums.quantise_one(float(c.reshape(-1)[0])))
            hit = self._ar_cache.get(key)
            if hit is None:
                b, tokens, pairs, kv = self.sums.ar_sums(c)
                hit = _remember(
                    self._ar_cache, key, self.pricer.price_pass(b, tokens, pairs, kv, False, pairs)
                )
            return hit
        b, tokens, pairs, kv = self.sums.ar_sums(c)
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        return self.pricer.price_pass(b, tokens, pairs, kv, False, pairs)

    def prefill_truth(self, new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one prefill pass: request i processes ``new_tokens[i]`` new prompt
        tokens (causally, no tree mask) over ``contexts[i]`` tokens already in its KV cache.

        Contexts are priced at multiples of ``context_quantum``, as for decode steps."""
        chunks = checked_chunks(new_tokens, contexts)
        if not chunks[0]:
            raise ConfigError("a prefill pass needs at least one chunk of new tokens")
        if self._measured is not None:
            return self._measured.prefill_s(*chunks)
        return self.pricer.price_mixed((0, 0.0, 0.0, 0.0), chunks, False)

    def draft_truth(self, contexts: npt.ArrayLike) -> float:
        """Noise-free truth of one DFlash drafter pass over a batch (its roofline, plus the
        framework's per-pass overhead and, in eager mode, the host's dispatch of its layers)."""
        if self._measured is not None:
            return self._measured.draft_s("topk", ints(contexts, "contexts"))
        c = np.asarray(contexts)
        if c.size == 1:
            key = int(self.sums.quantise_one(float(c.reshape(-1)[0])))
            hit = self._draft_cache.get(key)
            if hit is None:
                hit = _remember(
                    self._draft_cache, key, self.pricer.price_draft(self.sums.buckets(c))
                )
            return hit
        return self.pricer.price_draft_sum(*self.sums.bucket_sum(c))

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
            return measured_prep(self._measured, tree_sizes, topk, controller, path)
        return self.prep.seconds(tree_sizes, topk, contexts, controller, path)

    # -- what a run observes ------------------------------------------------------------------

    def _noisy(self, seconds: float) -> float:
        """``seconds`` × exp(noise · z), z the next standard normal of this GPU's generator.

        The normals are drawn ``_NOISE_BLOCK`` at a time (one numpy call per block, not per
        pass) and their factors taken from an iterator over the block; the sequence is the
        generator's, so it is a function of the seed alone."""
        factor = next(self._noise, None)
        if factor is None:  # the block used up (or none drawn yet), or no noise
            sigma = self.truth.noise
            if sigma == 0:
                return seconds
            self._noise = iter(np.exp(sigma * self.rng.standard_normal(_NOISE_BLOCK)).tolist())
            factor = next(self._noise)
        return seconds * factor

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
        appended: int | None = None,
    ) -> tuple[float, float, float]:
        """(draft, preparation, verification) seconds of one decode step verified as ``kind``:
        "ar" is one unmasked pass and nothing else; "chain" and "tree" pay the drafter, the
        preparation (``topk``: top-K normalisation and tree work, else an argmax; a chain chosen
        after top-K drafting keeps its top-K pass but has no tree work) and a pass — causal for
        the chain, masked for a tree. Prefill chunks ride in the pass. Noisy, drawn in that
        order. ``appended``: the target features the drafter takes into its requests' contexts
        before its pass, summed (a measured truth prices them; None: its mean per request)."""
        if self._measured is not None:  # ``builder``: the tree policy's own (a measured term)
            draft, host, verify, self.unobserved_s = measured_step(
                self._measured,
                self._noisy,
                self._unbias,
                kind,
                tree_sizes,
                contexts,
                topk,
                controller,
                prefill_tokens,
                prefill_contexts,
                builder,
                appended,
            )
            return draft, host, verify
        if kind == "ar":
            return 0.0, 0.0, self.ar_s(contexts, prefill_tokens, prefill_contexts)
        # batch 1 from its caches, B > 1 from one call's sums (else each pass on its own path)
        one = type(tree_sizes) is np.ndarray and tree_sizes.shape == (1,)
        fused = (_single_step if one else _batch_step)(
            self, kind, tree_sizes, contexts, topk, controller, prefill_tokens, prefill_contexts
        )
        if fused is not None:
            return fused
        draft = self.draft_s(contexts)
        prep = self.prep_s(tree_sizes, topk, contexts, controller, kind == "chain")
        tree = kind == "tree"
        return (
            draft,
            prep,
            self.verify_s(tree_sizes, contexts, prefill_tokens, prefill_contexts, tree),
        )


def _noisy_step(
    gpu: SimulatedGPU, draft: float, prep: float, verify: float
) -> tuple[float, float, float]:
    """:meth:`SimulatedGPU._noisy` of a step's three passes, drawn in that order (one call
    for three: _single_step's and _batch_step's)."""
    noise = gpu._noise
    a, b, c = next(noise, None), next(noise, None), next(noise, None)
    if c is None or b is None or a is None:  # the block ran out among them (its iterator
        # then stays empty), or no noise
        return (
            gpu._noisy(draft) if a is None else draft * a,
            gpu._noisy(prep) if b is None else prep * b,
            gpu._noisy(verify),
        )
    return draft * a, prep * b, verify * c


def _single_step(
    gpu: SimulatedGPU,
    kind: str,
    tree_sizes: npt.ArrayLike,
    contexts: npt.ArrayLike,
    topk: bool,
    controller: bool | str,
    prefill_tokens: npt.ArrayLike,
    prefill_contexts: npt.ArrayLike,
) -> tuple[float, float, float] | None:
    """:meth:`SimulatedGPU.step_s` of a drafted batch-1 step under a roofline truth without a
    prefill chunk (every decode step at C = 1): the one tree size and context read once, the
    drafter's pass and the verification from their caches (:meth:`SimulatedGPU.draft_truth`'s
    and ``verify_truth``'s batch-1 paths), the preparation's sums on Python floats
    (``prep.tree_sums_at``); None where a path would do more (a drafter price not cached
    yet, a size beyond the curves, other arrays, a chunk): the passes' own paths then run.
    The same operations, noise drawn in the same order: the same seconds."""
    if (
        type(tree_sizes) is not np.ndarray
        or type(contexts) is not np.ndarray
        or tree_sizes.shape != (1,)
        or contexts.shape != (1,)
        or tree_sizes.dtype != np.int64
        or contexts.dtype != np.int64
        or type(prefill_tokens) not in _SEQUENCES
        or type(prefill_contexts) not in _SEQUENCES
        or prefill_tokens
        or prefill_contexts
    ):
        return None
    s0, c0 = int(tree_sizes[0]), int(contexts[0])
    # the context's bucket: BatchSums.quantise_one's whole number (the caches' key)
    q = gpu.sums.context_quantum
    key = math.ceil(c0 / q) * q
    draft = gpu._draft_cache.get(key)
    if draft is None or not 1 <= s0 <= gpu.max_tree_size:
        return None
    tree = kind == "tree"
    curve = (gpu._verify_cache if tree else gpu._causal_cache).get(key)
    if curve is None:
        curve = gpu._curve(c0, tree)
    path = kind == "chain"
    sums = None
    if topk and not path:  # prep.tree_sums_at(s0, c0, q) of the one tree
        n = float(s0)
        square = n * n
        sums = n, square, n * float(key) + square
    prep = gpu.prep.from_sums(1, sums, topk, controller, path)
    return _noisy_step(gpu, draft, prep, float(curve[s0 - 1]))


def _batch_step(
    gpu: SimulatedGPU,
    kind: str,
    tree_sizes: npt.ArrayLike,
    contexts: npt.ArrayLike,
    topk: bool,
    controller: bool | str,
    prefill_tokens: npt.ArrayLike,
    prefill_contexts: npt.ArrayLike,
) -> tuple[float, float, float] | None:
    """:meth:`SimulatedGPU.step_s` of a drafted step of B > 1 requests under a roofline truth,
    its three passes priced from one compiled call's sums (Σ s, Σ s², Σ⌈c / q⌉, Σ s·⌈c / q⌉,
    which the drafter's, the preparation's and the verification's paths each compute again);
    None where that call does not answer (other arrays, batch 1, values out of its range): the
    passes' own paths then run. The same whole numbers, the same formulas
    (``BatchSums.bucket_sum`` and ``decode_sums``, ``prep._tree_sums``) and the noise drawn in
    the same order: the same seconds (the fingerprints of ``benchmarks/bench_sim.py``)."""
    if type(tree_sizes) is not np.ndarray or tree_sizes.ndim != 1 or tree_sizes.shape[0] < 2:
        return None
    q = gpu.sums.context_quantum
    got = compiled_sums(tree_sizes, contexts, q)
    if got is None:
        return None
    b, s_sum, s_sq, k_sum, s_k = got
    draft = gpu.pricer.price_draft_sum(b, float(k_sum))
    square = float(s_sq)  # prep.tree_sums_of(got, q)
    sums = float(s_sum), square, float(q * s_k) + square
    prep = gpu.prep.from_sums(b, sums, topk, controller, kind == "chain")
    # batching.decode_terms(got, q)
    tokens, s_sq_f, k_sum_f, s_k_f = float(s_sum), square, float(k_sum), float(s_k)
    pairs, kv = q * s_k_f + s_sq_f, q * k_sum_f + tokens
    causal = q * s_k_f + (s_sq_f + tokens) / 2.0
    tree = kind == "tree"
    if (
        type(prefill_tokens) in _SEQUENCES
        and type(prefill_contexts) in _SEQUENCES
        and not prefill_tokens
        and not prefill_contexts
    ):  # no chunk (checked_chunks' first case, without its call)
        verify = gpu.pricer.price_pass(b, tokens, pairs, kv, tree, causal)
    else:
        chunks = checked_chunks(prefill_tokens, prefill_contexts)
        if chunks[0]:
            verify = gpu.pricer.price_mixed((b, tokens, pairs, kv), chunks, tree, causal)
        else:
            verify = gpu.pricer.price_pass(b, tokens, pairs, kv, tree, causal)
    return _noisy_step(gpu, draft, prep, verify)


def _sim_backend(model: ModelSpec, hw: HardwareProfile, seed: int = 0):  # type: ignore[no-untyped-def]
    """Calibration backend ``sim``: times verification passes on the simulated GPU."""
    gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model), seed=seed)

    def verify(s: int, c: int) -> float:
        return gpu.verify_s([s], [c])

    return verify


register_backend("sim", _sim_backend, replace=True)
