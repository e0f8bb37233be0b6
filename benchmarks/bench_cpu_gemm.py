"""Is a verification pass on this CPU bound by reading the weights or by arithmetic?

Two measurements of ``torch.nn.functional.linear`` with the demo target's FFN shape
(hidden 384 → 1536), on the threads torch uses:

1. **Rows.** A stack of weight matrices larger than the last-level cache is multiplied by M rows
   (M = 1 … 64: the tokens of a pass) in fp32 and in bf16; per dtype, the time per product, its
   ratio to one row's, and the arithmetic rate. One row is bound by reading the weights; where
   the ratio climbs, the product has become bound by arithmetic.
2. **Working set.** One row against stacks of 4 … 144 MB of bf16 weights: the rate at which the
   weights stream, inside and beyond the cache.

Both dtypes and all sizes are timed in one run (ratios within it). Run:
``python benchmarks/bench_cpu_gemm.py [--repeats 200]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

HIDDEN, FFN = 384, 1536  # the base demo target's (bastion/demo/models/base/target/config.json)


def _products(x: torch.Tensor, weights: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: [F.linear(x, w) for w in weights]


def _time(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(max(5, repeats // 10)):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def _stack(megabytes: float, dtype: torch.dtype) -> list[torch.Tensor]:
    per = FFN * HIDDEN * torch.finfo(dtype).bits // 8
    return [
        torch.randn(FFN, HIDDEN, dtype=dtype) for _ in range(max(1, int(megabytes * 1e6 / per)))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if not 1 <= args.repeats <= 100_000:
        parser.error("--repeats must be 1–100000")
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print("\n| dtype | rows | µs per product | × one row | GFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        weights = _stack(56 if dtype == torch.float32 else 28, dtype)  # 56 MB fp32 either way
        base = 0.0
        for rows in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(rows, HIDDEN, dtype=dtype)
            s = _time(_products(x, weights), args.repeats) / len(weights)
            base = base or s
            rate = 2 * rows * HIDDEN * FFN / s / 1e9
            name = str(dtype).removeprefix("torch.")
            print(f"| {name} | {rows} | {s * 1e6:.1f} | {s / base:.2f} | {rate:.1f} |")
    print("\n| bf16 weights MB | GB/s (one row) | µs per product |")
    print("|---:|---:|---:|")
    for mb in (4, 12, 24, 36, 72, 144):
        weights = _stack(mb, torch.bfloat16)
        x = torch.randn(1, HIDDEN, dtype=torch.bfloat16)
        s = _time(_products(x, weights), args.repeats)
        size = sum(w.numel() * 2 for w in weights)
        print(f"| {mb} | {size / s / 1e9:.1f} | {s / len(weights) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
