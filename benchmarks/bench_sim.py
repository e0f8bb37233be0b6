"""Simulator speed and batched serving: simulated seconds per wall second, per policy and C.

For qwen3-8b on h100-sxm with the ``math`` workload (closed loop, prompts prefilled in 512-token
chunks), serves the same seeded requests with each policy at each concurrency C and reports,
per (C, policy): throughput (generated tokens per simulated second), τ, mean tree size, and the
simulator's speed — simulated time / wall time of the serving loop (the one-off calibration
sweep is reported separately), and simulated time / CPU time of the process over the same loop
(what the wall ratio would be on an idle core: on a shared machine the wall time also counts
other processes' turns). Each is the median over ``--repeats``; every repeat must give
identical simulated results (asserted). Requests: 8 at C = 1, otherwise 2·C (at least 16),
with the workload's own prompt and output lengths (log-normal, median 256 and 512 tokens).

The GPU's memory is modelled as ``bastion simulate`` does by default (0.9 of it: weights,
activations, a paged KV cache; admission, lookahead reserved per step, trees cut to the free
blocks); ``--memory off`` serves without a memory limit (its use still counted).

``--best`` adds a column: simulated time / CPU time of the fastest repeat, a steadier read on
a shared machine (other processes only ever add time; take more repeats with it); the medians
stay the figures reported.

``--fingerprint`` adds a column: a short hash of the cell's simulated results (elapsed time, τ,
mean N, throughput, steps and every request's TTFT, TPOT and E2E, exactly as floats), so two
versions of the code can be checked bit-identical cell by cell (a speed change must not move
it, or must say why).

Run: ``python benchmarks/bench_sim.py [--repeats 3] [--concurrency 1,4,8,16,32,64]
[--policies ar,chain,...] [--memory on|off] [--model NAME] [--tp N] [--best]
[--fingerprint]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.policies import make_policy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.serving import ServingResult, serve
from bastion.sim.simulate import SimSpec, calibrated_cost_model, request_source

POLICIES = "ar,chain,fixed:16,fixed:64,beam:4x15,eagle,bastion:paper,bastion:per-request,bastion"


def requests_at(concurrency: int) -> int:
    """The requests a cell serves: 8 at C = 1, else 2·C (at least 16)."""
    return 8 if concurrency == 1 else max(16, 2 * concurrency)


class Cells:
    """A bundled model on h100-sxm with the ``math`` workload, its cost model calibrated once
    (``calibration_s``): :meth:`serve` serves one cell, as this benchmark times it."""

    def __init__(self, model_name: str = "qwen3-8b", tp: int = 1, memory: bool = True) -> None:
        self.model_name, self.tp, self.memory = model_name, tp, memory
        self.model = get_model(model_name)
        self.hw = get_profile("h100-sxm")
        self.drafter = DrafterSpec.dflash_for(self.model)
        t0 = time.perf_counter()
        self.cost_model, _ = calibrated_cost_model(self.gpu())
        self.calibration_s = time.perf_counter() - t0

    def gpu(self) -> SimulatedGPU:
        return SimulatedGPU(self.hw, self.model, self.drafter, tp=self.tp)

    def serve(self, policy_name: str, concurrency: int) -> tuple[ServingResult, float, float]:
        """One serve of the cell with a fresh policy: its result and the serving loop's wall
        and CPU seconds (set-up outside them)."""
        requests = requests_at(concurrency)
        spec = SimSpec(
            model=self.model_name,
            tp=self.tp,
            concurrency=concurrency,
            requests=requests,
            gpu_memory_utilization=0.9 if self.memory else None,
        )
        policy = make_policy(policy_name)
        cm = self.cost_model if getattr(policy, "uses_cost_model", False) else None
        memory = spec.memory_plan(getattr(policy, "uses_drafter", True))
        source, gpu = request_source(spec), self.gpu()
        start, cpu = time.perf_counter(), time.process_time()
        r = serve(policy, gpu, source, requests, concurrency, cm, memory=memory)
        return r, time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,8,16,32,64")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--memory", choices=("on", "off"), default="on")
    parser.add_argument("--model", default="qwen3-8b", help="a bundled model (default qwen3-8b)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    parser.add_argument(
        "--best",
        action="store_true",
        help="add a column: simulated / CPU of the fastest repeat (steadier on a busy machine)",
    )
    parser.add_argument(
        "--fingerprint",
        action="store_true",
        help="add a column: a hash of each cell's simulated results (to compare versions)",
    )
    args = parser.parse_args()
    cells = Cells(args.model, args.tp, args.memory == "on")
    print(
        f"# bench_sim — {args.model} · h100-sxm × {args.tp} · math, memory {args.memory}; "
        f"calibration sweep + "
        f"fit: {cells.calibration_s:.2f} s\n"
    )
    extra = (" best simulated / CPU |" if args.best else "") + (
        " results |" if args.fingerprint else ""
    )
    print(
        "| C | policy | requests | throughput tok/s | τ | mean N | simulated s | "
        "wall s | simulated / wall | simulated / CPU |" + extra
    )
    rule = ("---:|" if args.best else "") + ("---|" if args.fingerprint else "")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" + rule)
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        for name in args.policies.split(","):
            walls, cpus, results = [], [], []
            for _ in range(args.repeats):
                r, wall, cpu = cells.serve(name, concurrency)
                walls.append(wall)
                cpus.append(cpu)
                results.append(
                    (
                        r.elapsed_s,
                        r.tau,
                        r.mean_tree_size,
                        r.throughput,
                        r.steps,
                        tuple((q.ttft_s, q.tpot_s, q.e2e_s) for q in r.requests),
                    )
                )
            assert len(set(results)) == 1, "same seed, different result"
            sim_s, tau, mean_n, tput = results[0][:4]
            digest = hashlib.sha256(repr(results[0]).encode()).hexdigest()[:12]
            wall, cpu_s = statistics.median(walls), statistics.median(cpus)
            print(
                f"| {concurrency} | {name} | {requests_at(concurrency)} | {tput:.0f} | "
                f"{tau:.2f} | {mean_n:.1f} | {sim_s:.2f} | {wall:.3f} | {sim_s / wall:.0f}× | "
                f"{sim_s / cpu_s:.0f}× |"
                + (f" {sim_s / min(cpus):.0f}× |" if args.best else "")
                + (f" `{digest}` |" if args.fingerprint else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
