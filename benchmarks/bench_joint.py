"""Joint-budget controller benchmark: the cost of one ``choose_joint`` call per serving step.

For B ∈ {1, 8, 32, 64} requests with the ``math`` workload's marginals (depth 15, K = 16; the
first step of ``bastion.sim.synthetic.SyntheticSource(get_workload("math"), seed)``), contexts ≈ 512
tokens, and a ``RooflineCostModel`` calibrated to a simulated H100 with Qwen3-8B and its DFlash
drafter (``bastion.sim.simulate.calibrated_cost_model``), it times ``choose_joint_batch`` end to end
(growing the merged chain with the forest heap, pricing it with ``joint_cost_curve``, the stop
rule, the ``TreeBatch``) and reports the chosen total M, how much of the chain was priced, and the
call's time as a share of the predicted cycle Ĉ at the chosen M (target: ≤ 1 % at B = 32).
The per-request first chunk is the adaptive policy's warm start: 4 × the mean tree size of a
first call (``--initial-budget`` for that first call).

Run: ``python benchmarks/bench_joint.py [--repeats 30] [--n-max 1024] [--mode auto]``.
Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from bastion.batch import BatchMarginals
from bastion.bestfirst import COMPILED
from bastion.budget import ControllerMode
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.interfaces import CostCurve
from bastion.joint import choose_joint_batch, joint_curve_from_cost_model
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload

BATCHES = (1, 8, 32, 64)


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median over ``repeats`` of the mean time of back-to-back calls filling ~20 ms (s)."""
    t0 = time.perf_counter()
    fn()
    inner = max(1, int(20e-3 / max(1e-6, time.perf_counter() - t0)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def batch_marginals(b: int, seed: int) -> BatchMarginals:
    source = SyntheticSource(get_workload("math"), seed)
    slots = np.arange(b)
    for i in range(b):
        source.admit(i, i)
    return source.draft(slots, slots)[0]


def row(
    cm: RooflineCostModel,
    b: int,
    args: argparse.Namespace,
) -> dict[str, float | int | str]:
    marginals = batch_marginals(b, args.seed)
    contexts = 512 + np.random.default_rng([args.seed, b]).integers(-32, 33, size=b)
    base = joint_curve_from_cost_model(cm, contexts)
    asked: list[int] = []

    def counted(grow: np.ndarray) -> CostCurve:
        asked.append(int(grow.size))
        return base(grow)

    mode: ControllerMode = args.mode

    def call(curve: Callable[[np.ndarray], CostCurve], start: int) -> tuple[object, object]:
        return choose_joint_batch(marginals, curve, args.n_max, mode, start)

    first, _ = call(base, args.initial_budget)
    start = max(8, 4 * int(first.sizes.mean()))  # type: ignore[attr-defined]
    trees, diag = call(counted, start)
    seconds = median_time(lambda: call(base, start), args.repeats)
    sizes = sorted(trees.sizes.tolist())
    cycle = float(diag.c_hat[diag.total_size - b])
    return {
        "B": b,
        "M": diag.total_size,
        "sizes": f"{sizes[0]}/{sizes[len(sizes) // 2]}/{sizes[-1]}",
        "rule": diag.mode,
        "rounds": len(asked),
        "priced": max(asked) + 1,
        "us": seconds * 1e6,
        "cycle_ms": cycle * 1e3,
        "pct": 100.0 * seconds / cycle,
        "speedup": diag.predicted_speedup,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-max", type=int, default=1024, help="cap on each tree (default 1024)")
    parser.add_argument("--mode", default="auto", choices=["auto", "first-decrease", "exhaustive"])
    parser.add_argument(
        "--initial-budget", type=int, default=64, help="per-request first chunk of the first call"
    )
    args = parser.parse_args()
    model = get_model("qwen3-8b")
    gpu = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model))
    cm, _ = calibrated_cost_model(gpu)
    print(f"# bench_joint — {platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(
        f"# qwen3-8b + DFlash on a simulated h100-sxm, cost model {cm.mode!r}; workload math; "
        f"contexts 512 ± 32; N_max {args.n_max}; mode {args.mode}; "
        f"initial budget {args.initial_budget}"
    )
    print(f"# medians of {args.repeats} repeats; compiled kernel: {'yes' if COMPILED else 'NO'}\n")
    print(
        "| B | chosen M | N min/med/max | rule | rounds | chain priced | µs per call "
        "| Ĉ(M) ms | % of Ĉ(M) | Ŝ(M) |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for b in BATCHES:
        r = row(cm, b, args)
        print(
            f"| {r['B']} | {r['M']} | {r['sizes']} | {r['rule']} | {r['rounds']} "
            f"| {r['priced']} | {r['us']:.0f} | {r['cycle_ms']:.2f} | {r['pct']:.2f} % "
            f"| {r['speedup']:.1f} |"
        )


if __name__ == "__main__":
    main()
