"""Simulated GPU truth per call: the current ``SimulatedGPU`` against the previous routes.

For qwen3-8b on h100-sxm (default GroundTruth, noise on) and B ∈ {1, 8, 32, 64} requests per
step (tree sizes random in 1 … 64, contexts random in 256 … 4096), times every method the serving
loop calls per step — ``draft_s``, ``prep_s``, ``verify_s``, ``ar_s`` and ``verify_s`` with one
512-token prefill chunk riding along (the mixed pass) — and the same through the previous
implementation, kept below as ``Previous`` (``drafter_pass`` per draft, ``PassShape.of_batch`` +
``LinearPricer.total_s`` per pass, numpy for prep, one normal drawn per pass), in the same run.
Per (B, method): the median over ``--repeats`` of the mean µs per call over ``--batches``
distinct batches, and previous / current. Both routes' noise-free truths are checked to agree to
1e-12 relative before timing.

Run: ``python benchmarks/bench_truth.py [--repeats 7] [--batches 200]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.cost.roofline import LinearPricer, PassShape, drafter_pass
from bastion.sim.gpu import SimulatedGPU, causal_chunk_pairs

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Batch = tuple[IntArray, IntArray]  # tree sizes, contexts
BATCHES = (1, 8, 32, 64)
CHUNK = ([512], [1024])  # one prefill chunk: 512 new tokens over 1024 cached


class Previous:
    """The routes of sim/gpu.py before the fast path (same device, options and truth)."""

    def __init__(self, gpu: SimulatedGPU) -> None:
        self.g = gpu
        self.rng = np.random.default_rng([gpu.seed, 0x6775])
        self.pricers = {
            masked: LinearPricer(gpu.model, gpu.device, gpu.options, masked=masked)
            for masked in (True, False)
        }
        names = self.pricers[True].names
        self.attention = np.array([n in ("attn_scores", "attn_values") for n in names])
        self.lm_head = names.index("lm_head")
        self.tree_scale = np.where(self.attention, 1.0 + gpu.truth.tree_attention_penalty, 1.0)

    def quantise(self, contexts: npt.ArrayLike) -> Array:
        q = self.g.truth.context_quantum
        return np.ceil(np.asarray(contexts, dtype=np.float64) / q) * q

    def tile_steps(self, tokens: npt.ArrayLike) -> Array | float:
        t = self.g.truth
        if not (t.tile_tokens and t.tile_step_s):
            return 0.0
        extra = np.ceil(np.asarray(tokens, dtype=np.float64) / t.tile_tokens) - 1.0
        return np.asarray(self.g.model.layers * t.tile_step_s * extra, dtype=np.float64)

    def price(self, shape: PassShape, masked: bool) -> Array:
        scale = self.tree_scale if masked else None
        total = self.pricers[masked].total_s(shape, op_scale=scale)
        return np.asarray(total + self.tile_steps(shape.tokens), dtype=np.float64)

    def price_mixed(
        self, tokens: Array, contexts: Array, masked: bool, chunks: Array, chunk_ctx: Array
    ) -> float:
        decode_pairs = float(np.dot(tokens, contexts + tokens))
        all_pairs = decode_pairs + float(causal_chunk_pairs(chunks, chunk_ctx).sum())
        total_tokens = float(tokens.sum() + chunks.sum())
        logit_rows = float(tokens.sum() + chunks.size)
        kv = float((contexts + tokens).sum() + (chunk_ctx + chunks).sum())
        masked = masked and tokens.size > 0
        both = PassShape(
            tokens=np.array([total_tokens, logit_rows]),
            attn_pairs=np.array([all_pairs, 0.0]),
            kv_tokens=np.array([kv, 0.0]),
            mask_elems=np.array([decode_pairs if masked else 0.0, 0.0]),
        )
        pricer = self.pricers[masked]
        compute, memory = pricer.branches(both)
        per_op = np.maximum(compute, memory) + pricer.launch_s
        row = per_op[0].copy()
        row[self.lm_head] = per_op[1, self.lm_head]
        if masked and all_pairs > 0:
            row[self.attention] *= 1.0 + self.g.truth.tree_attention_penalty * (
                decode_pairs / all_pairs
            )
        return float(row.sum() + self.tile_steps(total_tokens))

    def verify_truth(
        self, sizes: npt.ArrayLike, contexts: npt.ArrayLike, chunks: npt.ArrayLike = ()
    ) -> float:
        s = np.atleast_1d(np.asarray(sizes, dtype=np.int64))
        c = np.atleast_1d(np.asarray(contexts))
        if len(chunks):  # type: ignore[arg-type]
            n = np.asarray(CHUNK[0], dtype=np.float64)
            cc = self.quantise(CHUNK[1])
            return self.price_mixed(s.astype(np.float64), self.quantise(c), True, n, cc)
        if s.size == 1 and 1 <= s[0] <= self.g.max_tree_size:
            return float(self.g.verify_curve(int(c[0]))[s[0] - 1])  # cached in both versions
        return float(self.price(PassShape.of_batch(s, self.quantise(c), masked=True), True))

    def ar_truth(self, contexts: npt.ArrayLike) -> float:
        c = np.atleast_1d(self.quantise(contexts))
        if c.size == 1:
            return self.g.ar_truth(c)  # a dict lookup in both versions
        return float(self.price(PassShape.of_batch(np.ones(c.size), c, masked=False), False))

    def draft_truth(self, contexts: npt.ArrayLike) -> float:
        c = np.atleast_1d(self.quantise(contexts))
        if c.size == 1:
            return self.g.draft_truth(c)  # a dict lookup in both versions
        return float(drafter_pass(self.g.drafter, self.g.device, list(c), self.g.options).total_s)

    def prep_truth(self, sizes: npt.ArrayLike, topk: bool = True) -> float:
        # the two-constant model of before the operation-based one (30 µs per request, 0.25 µs
        # per node): timed only, not compared (the current model prices other operations)
        s = np.atleast_1d(np.asarray(sizes, dtype=np.float64))
        if not topk:
            return float(s.size * 30e-6 * 0.5)
        return float(s.size * 30e-6 + s.sum() * 0.25e-6)

    def noisy(self, seconds: float) -> float:
        return seconds * float(np.exp(self.g.truth.noise * self.rng.standard_normal()))


def methods(
    new: SimulatedGPU, old: Previous
) -> dict[str, tuple[Callable[[IntArray, IntArray], float], Callable[[IntArray, IntArray], float]]]:
    """Method name → (current, previous), each called as f(tree sizes, contexts)."""
    return {
        "draft_s": (lambda s, c: new.draft_s(c), lambda s, c: old.noisy(old.draft_truth(c))),
        "prep_s": (lambda s, c: new.prep_s(s), lambda s, c: old.noisy(old.prep_truth(s))),
        "verify_s": (
            lambda s, c: new.verify_s(s, c),
            lambda s, c: old.noisy(old.verify_truth(s, c)),
        ),
        "ar_s": (lambda s, c: new.ar_s(c), lambda s, c: old.noisy(old.ar_truth(c))),
        "verify_s + chunk": (
            lambda s, c: new.verify_s(s, c, *CHUNK),
            lambda s, c: old.noisy(old.verify_truth(s, c, CHUNK[0])),
        ),
    }


def check(new: SimulatedGPU, old: Previous, batches: list[Batch]) -> float:
    """Largest relative difference of the noise-free truths over ``batches`` (must be ≤ 1e-12)."""
    worst = 0.0
    for s, c in batches:
        pairs = [
            (new.draft_truth(c), old.draft_truth(c)),
            (new.verify_truth(s, c), old.verify_truth(s, c)),
            (new.ar_truth(c), old.ar_truth(c)),
            (new.verify_truth(s, c, *CHUNK), old.verify_truth(s, c, CHUNK[0])),
        ]
        worst = max(worst, *(abs(a - b) / abs(b) for a, b in pairs))
    if worst > 1e-12:
        raise SystemExit(f"current and previous truths differ by {worst:.2e} relative")
    return worst


def per_call_us(f: Callable[[IntArray, IntArray], float], batches: list[Batch]) -> float:
    start = time.perf_counter()
    for s, c in batches:
        f(s, c)
    return (time.perf_counter() - start) / len(batches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    model = get_model("qwen3-8b")
    new = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model))
    old = Previous(new)
    rng = np.random.default_rng(0)
    print("# bench_truth — qwen3-8b · h100-sxm; median µs per call (previous / current)\n")
    print("| B | method | previous µs | current µs | ratio |")
    print("|---:|---|---:|---:|---:|")
    worst = 0.0
    for b in BATCHES:
        batches = [
            (rng.integers(1, 65, b), rng.integers(256, 4097, b)) for _ in range(args.batches)
        ]
        worst = max(worst, check(new, old, batches))
        for name, (cur, prev) in methods(new, old).items():
            times: dict[str, list[float]] = {"cur": [], "prev": []}
            for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both
                times["prev"].append(per_call_us(prev, batches))
                times["cur"].append(per_call_us(cur, batches))
            p, c = statistics.median(times["prev"]), statistics.median(times["cur"])
            print(f"| {b} | {name} | {p:.1f} | {c:.1f} | {p / c:.1f}× |")
    print(f"\nlargest relative difference of the noise-free truths: {worst:.1e}")


if __name__ == "__main__":
    main()
