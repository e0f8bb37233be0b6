"""The learning controller's host time per decode step, against the verify pass it sizes.

Times one serving step of the ``bastion`` policy as the engine runs it — ``choose_batch`` (the
calibrated marginals, the size choice or the joint budget, the chain candidate) plus
``observe_step`` (the cycle table, the acceptance and size calibrations) — on realistic inputs:

- marginals and the target's tokens: ``bastion.sim.synthetic.SyntheticSource`` (``math``),
  consecutive steps of B requests, the accepted paths walked exactly as the simulator does;
- the learned cost model: qwen3-8b with its DFlash drafter on a simulated h100-sxm, its prior
  the static calibrated roofline, its table filled by the start-up calibration
  (``bastion.sim.startup.learned_cost_model``), then learning along the timed steps.

In the same run, on the same marginals, the baseline is ``fixed:64``'s batched best-first build
(what a static policy spends). Reported per batch size: the median µs per step of each, their
ratio, the median chosen total size and the step's host time as a share of the simulated
verification pass of the chosen trees (the truth's ``verify_truth``; the issue's bound: 1 %).

Run: ``python benchmarks/bench_learning.py [--steps 300] [--repeats 5]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from bastion.batch import StepRequests
from bastion.bestfirst import accepted_paths
from bastion.controller import LearningPolicy
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.interfaces import BatchPolicyContext
from bastion.policies import FixedPolicy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model
from bastion.sim.startup import learned_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload


def run(batch: int, steps: int, repeats: int) -> dict[str, float]:
    model = get_model("qwen3-8b")
    gpu = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model))
    prior, _ = calibrated_cost_model(gpu)
    start = learned_cost_model(gpu, prior, concurrency=batch)
    policy, fixed = LearningPolicy(), FixedPolicy(64)
    ours, base, share, sizes = [], [], [], []
    for rep in range(repeats):
        learner = start.copy()
        source = SyntheticSource(get_workload("math"), rep)
        slots = np.arange(batch)
        for i in range(batch):
            source.admit(i, i)
        contexts = np.full(batch, 512, np.int64)
        previous = np.zeros(batch, np.int64)
        for _ in range(steps):
            marginals, target = source.draft(slots, contexts)
            req = StepRequests.of(slots, contexts, np.zeros(batch, np.int64), previous)
            context = BatchPolicyContext(req, learner)
            t0 = time.perf_counter()
            choice = policy.choose_batch(marginals, context)
            trees = choice.trees
            walked = accepted_paths(
                trees.parents, trees.tokens, trees.depths, trees.offsets, target
            )
            if walked is None:
                raise SystemExit("the compiled kernel is needed (pip install with a C compiler)")
            counts, _, _, nodes = walked
            t1 = time.perf_counter()
            verify = gpu.verify_truth(trees.sizes, contexts)
            cycle = gpu.draft_truth(contexts) + verify
            t2 = time.perf_counter()
            learner.observe_step(choice.kind or "tree", contexts, trees, counts + 1, nodes, cycle)
            t3 = time.perf_counter()
            fixed.choose_batch(marginals, context)
            t4 = time.perf_counter()
            host = (t1 - t0) + (t3 - t2)
            ours.append(host)
            base.append(t4 - t3)
            share.append(host / verify)
            sizes.append(int(trees.sizes.sum()))
            previous = trees.sizes
            contexts = contexts + counts + 1
    return {
        "ours_us": 1e6 * statistics.median(ours),
        "fixed_us": 1e6 * statistics.median(base),
        "ratio": statistics.median(o / b for o, b in zip(ours, base, strict=True)),
        "share": statistics.median(share),
        "total": statistics.median(sizes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", default="1,32")
    args = parser.parse_args()
    print(
        f"`python benchmarks/bench_learning.py --steps {args.steps} --repeats {args.repeats}` "
        f"on {platform.machine()} ({platform.processor() or 'cpu'}), Python "
        f"{platform.python_version()}\n"
    )
    print("| B | bastion µs/step | fixed:64 µs/step | bastion / fixed | median ΣN | % of verify |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in (int(x) for x in args.batches.split(",")):
        r = run(b, args.steps, args.repeats)
        print(
            f"| {b} | {r['ours_us']:.0f} | {r['fixed_us']:.0f} | {r['ratio']:.2f}× "
            f"| {r['total']:.0f} | {100 * r['share']:.2f} % |"
        )


if __name__ == "__main__":
    main()
