"""Simulator speed: simulated seconds per wall second (issue: simulator performance target).

For qwen3-8b on h100-sxm with the ``math`` workload, serves the same requests with each policy
at batch 1 and at concurrency C = 32 and reports, per policy, simulated time / wall time of the
serving loop (the one-off calibration sweep is reported separately). Also checks that the same
seed gives identical results. Reports medians over ``--repeats``.

Run: ``python benchmarks/bench_sim.py [--repeats 3]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.policies import make_policy
from sim.gpu import SimulatedGPU
from sim.serving import serve
from sim.simulate import calibrated_cost_model
from sim.workloads import SyntheticRequest, get_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = get_model("qwen3-8b")
    hw = get_profile("h100-sxm")
    drafter = DrafterSpec.dflash_for(model)
    t0 = time.perf_counter()
    cost_model, _ = calibrated_cost_model(SimulatedGPU(hw, model, drafter))
    calib_s = time.perf_counter() - t0
    print(f"# bench_sim — qwen3-8b · h100-sxm · math; calibration sweep + fit: {calib_s:.2f} s\n")
    print("| C | policy | requests × tokens | simulated s | wall s | simulated / wall |")
    print("|---:|---|---:|---:|---:|---:|")
    for concurrency, requests, out_len in ((1, 8, 512), (32, 64, 256)):
        workload = get_workload("math").with_(output_len=out_len)

        def new(i: int, w=workload) -> SyntheticRequest:  # type: ignore[no-untyped-def]
            return SyntheticRequest(w, np.random.default_rng([0, i]), request_id=i)

        for spec in ("ar", "chain", "fixed:64", "bastion"):
            ratios, walls, sims, taus = [], [], [], []
            for _ in range(args.repeats):
                gpu = SimulatedGPU(hw, model, drafter)
                cm = cost_model if spec == "bastion" else None
                start = time.perf_counter()
                r = serve(make_policy(spec), gpu, new, requests, concurrency, cm)
                wall = time.perf_counter() - start
                walls.append(wall)
                sims.append(r.elapsed_s)
                ratios.append(r.elapsed_s / wall)
                taus.append(r.tau)
            assert len(set(sims)) == 1 and len(set(taus)) == 1, "same seed, different result"
            print(
                f"| {concurrency} | {spec} | {requests} × {out_len} | {sims[0]:.2f} | "
                f"{statistics.median(walls):.2f} | {statistics.median(ratios):.0f}× |"
            )


if __name__ == "__main__":
    main()
