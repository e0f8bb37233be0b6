"""``bastion hw probe``: measure this machine and write a hardware profile.

Two numpy microbenchmarks: a large array copy (memory bandwidth: bytes read + written per second)
and a square float32 matrix product (GEMM throughput: 2·n³ FLOPs per product), plus a tiny
operation's cost as the per-kernel overhead. The measured numbers are already what is achievable,
so the profile's efficiencies are 1. numpy has no bf16 GEMM; the float32 figure stands in for it,
and the profile says so in its sources.

What this module does not do: anything at import time, or touch a GPU.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bastion.cost.hardware import HardwareProfile, Interconnect
from bastion.guard import integer, public

__all__ = ["measure_bandwidth", "measure_gemm", "measure_overhead", "probe_profile"]


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@public(nbytes=integer(1, 1 << 34), repeats=integer(1, 10_000))
def measure_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes/s of ``np.copyto`` between two ``nbytes`` arrays (read + write counted)."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    t = _best(lambda: np.copyto(dst, src), repeats)
    return 2.0 * src.nbytes / t


@public(n=integer(1, 1 << 15), repeats=integer(1, 10_000))
def measure_gemm(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n×n float32 matrix product."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    t = _best(lambda: a @ b, repeats)
    return 2.0 * n**3 / t


@public(repeats=integer(1, 1_000_000))
def measure_overhead(repeats: int = 200) -> float:
    """Seconds of one tiny numpy operation (stands in for a kernel launch)."""
    x = np.ones(8, dtype=np.float32)
    t = _best(lambda: [np.add(x, x) for _ in range(100)], max(1, repeats // 100))
    return t / 100


def _cache_bytes() -> float:
    for index in (3, 2):
        p = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        try:
            text = p.read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        return float(int(text.rstrip("KMG")) * mult)
    return float(32 << 20)


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float(16 << 30)


@public
def probe_profile(name: str = "this-machine", quick: bool = False) -> HardwareProfile:
    """Measure this machine; ``quick`` uses small sizes (seconds, less accurate)."""
    bw = measure_bandwidth(32 << 20 if quick else 512 << 20, repeats=3 if quick else 5)
    flops = measure_gemm(512 if quick else 2048, repeats=3 if quick else 5)
    overhead = measure_overhead()
    stamp = time.strftime("%Y-%m-%d")
    probe = f"bastion hw probe on {platform.node() or 'this machine'}, {stamp}"
    return HardwareProfile(
        name=name,
        description=f"{platform.processor() or platform.machine()} (measured by bastion hw probe)",
        bf16_flops=flops,
        memory_bandwidth=bw,
        memory_bytes=_memory_bytes(),
        l2_bytes=_cache_bytes(),
        sm_count=os.cpu_count() or 1,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        launch_overhead_s=overhead,
        interconnect=Interconnect(kind="none", max_gpus=1),
        sources={
            "bf16_flops": f"{probe}: numpy float32 GEMM (no bf16 GEMM in numpy)",
            "memory_bandwidth": f"{probe}: numpy copy, read + write bytes",
            "memory_bytes": "os.sysconf physical pages × page size",
            "l2_bytes": "/sys/devices/system/cpu/cpu0/cache (last level found), else 32 MiB",
            "sm_count": "os.cpu_count()",
            "compute": "measured throughput is already achievable: 1.0",
            "memory": "measured bandwidth is already achievable: 1.0",
            "launch_overhead_s": f"{probe}: one tiny numpy operation",
            "interconnect_kind": f"{probe}: one device measured, no link between devices",
            "interconnect_max_gpus": "one device: tensor parallelism (--tp > 1) is refused",
        },
    )
