"""Tree-construction and controller benchmark (issue: core performance targets).

Times, on identical marginals in the same run, Bastion's best-first builder against a
plain heapq lazy best-first (pop a node, push its next sibling and first child), asserts that
the trees are identical, and reports medians and same-run speed ratios:

1. single request, depth 15, K ∈ {8, N}, N ∈ {16, 64, 256, 1024};
2. one serving step: B = 32 requests, N = 64 each, batched builder vs 32 heap calls;
3. the adaptive controller's per-step overhead where it settles at N ≈ 100–200, as a fraction
   of a 10 ms verification pass.

Run: ``python benchmarks/bench_tree.py [--repeats 30] [--markdown]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from bastion.bestfirst import COMPILED, best_first, best_first_heap, best_first_many
from bastion.budget import choose_tree
from bastion.cli.tree_cmd import sample_marginals
from bastion.interfaces import CostCurve

DEPTH = 15


def median_time(fn: Callable[[], object], repeats: int, inner: int) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` back-to-back calls (seconds)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def paired(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median times of a and b, measured interleaved so machine noise hits both alike."""
    inner = max(1, int(2e-3 / max(1e-6, _once(a))))
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(median_time(a, 1, inner))
        tb.append(median_time(b, 1, inner))
    return statistics.median(ta), statistics.median(tb)


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def same(x: tuple[np.ndarray, ...], y: tuple[np.ndarray, ...]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(x, y, strict=True))


def single_rows(repeats: int, rng: np.random.Generator) -> list[dict[str, object]]:
    rows = []
    for n in (16, 64, 256, 1024):
        for k in sorted({8, n}):
            probs = sample_marginals(rng, DEPTH, k, top1=0.8, decay=0.95).probs
            assert same(best_first_heap(probs, n), best_first(probs, n)), (n, k)
            t_heap, t_vec = paired(
                lambda p=probs, n=n: best_first_heap(p, n),
                lambda p=probs, n=n: best_first(p, n),
                repeats,
            )
            rows.append({"N": n, "K": k, "heap_us": t_heap * 1e6, "vec_us": t_vec * 1e6})
    return rows


def batch_rows(repeats: int, rng: np.random.Generator) -> list[dict[str, object]]:
    rows = []
    b, n = 32, 64
    for k in (8, 64):
        probs = np.stack(
            [sample_marginals(rng, DEPTH, k, top1=0.8, decay=0.95).probs for _ in range(b)]
        )
        got = best_first_many(probs, n)
        assert all(same(best_first_heap(probs[j], n), got[j]) for j in range(b))
        t_heap, t_vec = paired(
            lambda p=probs: [best_first_heap(p[j], n) for j in range(b)],
            lambda p=probs: best_first_many(p, n),
            repeats,
        )
        rows.append({"B": b, "N": n, "K": k, "heap_us": t_heap * 1e6, "vec_us": t_vec * 1e6})
    return rows


def controller_rows(repeats: int, rng: np.random.Generator) -> list[dict[str, object]]:
    """Controller overhead: a cost curve whose optimum lands near N = 100–200."""
    rows = []
    n_max = 1024
    sizes = np.arange(1, n_max + 1)
    verify_s = 10e-3 * (1.0 + sizes / 1500.0) ** 2  # convex; 10 ms at small N
    curve = CostCurve(draft_s=1e-3, prep_s=1e-4, verify_s=verify_s, ar_step_s=10e-3)
    for k in (8, 32):
        m = sample_marginals(rng, DEPTH, k, top1=0.85, decay=0.97)
        for mode in ("first-decrease", "auto"):
            tree, diag = choose_tree(m, curve, n_max, mode)  # type: ignore[arg-type]
            t = median_time(lambda m=m, mode=mode: choose_tree(m, curve, n_max, mode), repeats, 5)
            rows.append(
                {
                    "K": k,
                    "chosen_N": tree.size,
                    "mode": f"{mode} ({diag.mode})",
                    "us": t * 1e6,
                    "of_10ms": t / 10e-3,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"# bench_tree — {platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(f"# medians of {args.repeats} interleaved repeats; trees asserted identical")
    print(f"# compiled kernel: {'yes' if COMPILED else 'NO (pure-Python fallback)'}\n")
    print("Single request (depth 15):\n")
    print("| N | K | heapq µs | bastion µs | heapq / bastion |")
    print("|---:|---:|---:|---:|---:|")
    for r in single_rows(args.repeats, rng):
        ratio = float(r["heap_us"]) / float(r["vec_us"])  # type: ignore[arg-type]
        print(f"| {r['N']} | {r['K']} | {r['heap_us']:.0f} | {r['vec_us']:.0f} | {ratio:.2f}× |")
    print("\nOne serving step (depth 15):\n")
    print("| B | N | K | B heapq calls µs | batched µs | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in batch_rows(args.repeats, rng):
        ratio = float(r["heap_us"]) / float(r["vec_us"])  # type: ignore[arg-type]
        print(
            f"| {r['B']} | {r['N']} | {r['K']} | {r['heap_us']:.0f} | {r['vec_us']:.0f} "
            f"| {ratio:.2f}× |"
        )
    print("\nAdaptive controller per step (N_max = 1024, depth 15):\n")
    print("| K | chosen N | mode (rule) | µs per step | fraction of a 10 ms verify |")
    print("|---:|---:|---|---:|---:|")
    for r in controller_rows(args.repeats, rng):
        print(
            f"| {r['K']} | {r['chosen_N']} | {r['mode']} | {r['us']:.0f} "
            f"| {100 * float(r['of_10ms']):.2f} % |"  # type: ignore[arg-type]
        )


if __name__ == "__main__":
    main()
