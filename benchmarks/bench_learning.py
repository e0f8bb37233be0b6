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
(what a static policy spends). Reported per batch size, each the median over repeats of a
repeat's mean over its steps (the mean is what a serving loop pays: the controller refreshes
cached estimates every few steps and when a context crosses a step, which a per-step median
would hide): µs per step of each, their ratio, and the host time as a share of the simulated
verification pass of the chosen trees (the truth's ``verify_truth``; the issue's bound: 1 %);
beside them the per-step median and the median chosen total size.

``--every K``: the controller decides every K drafted steps and repeats the decision between
(``bastion:every=K``); the mean time of deciding and of repeating steps is shown apart.

``--standing``: instead, a step of a standing chain decision (the chain's argmax step) against
a repeated tree step, each forced to stand every step: the simulator charges the former as the
latter (``controller_repeat_*``), which this checks is an upper bound.

Run: ``python benchmarks/bench_learning.py [--steps 300] [--repeats 5] [--every K]
[--standing]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import numpy.typing as npt

from bastion.batch import StepRequests, TreeBatch
from bastion.bestfirst import accepted_paths
from bastion.controller import DECIDE_EVERY, LearningPolicy
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.interfaces import BatchPolicyContext
from bastion.learned import LearnedCostModel
from bastion.policies import FixedPolicy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model
from bastion.sim.startup import learned_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload

IntArray = npt.NDArray[np.int64]


def _started(batch: int) -> tuple[SimulatedGPU, LearnedCostModel]:
    """qwen3-8b on a simulated h100-sxm and a learned cost model after its start-up timing."""
    model = get_model("qwen3-8b")
    gpu = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model))
    prior, _ = calibrated_cost_model(gpu)
    return gpu, learned_cost_model(gpu, prior, concurrency=batch)


def _admitted(batch: int, seed: int) -> tuple[SyntheticSource, IntArray]:
    """A ``math`` source with ``batch`` requests admitted, and their slots."""
    source = SyntheticSource(get_workload("math"), seed)
    for i in range(batch):
        source.admit(i, i)
    return source, np.arange(batch)


def _walk(trees: TreeBatch, target: IntArray) -> tuple[IntArray, IntArray]:
    """(accepted draft tokens per request, accepted nodes) of the verified trees."""
    walked = accepted_paths(trees.parents, trees.tokens, trees.depths, trees.offsets, target)
    if walked is None:
        raise SystemExit("the compiled kernel is needed (pip install with a C compiler)")
    return walked[0], walked[3]


def run(batch: int, steps: int, repeats: int, every: int = DECIDE_EVERY) -> dict[str, float]:
    gpu, start = _started(batch)
    policy, fixed = LearningPolicy(decide_every=every), FixedPolicy(64)
    means: list[tuple[float, float, float]] = []  # per repeat: mean host, fixed, verify
    kinds: dict[bool, list[float]] = {False: [], True: []}  # per repeat: mean of decisions, …
    ours, sizes = [], []
    for rep in range(repeats):
        host_s, base_s, verify_s = [], [], []
        by_kind: dict[bool, list[float]] = {False: [], True: []}
        learner = start.copy()
        source, slots = _admitted(batch, rep)
        contexts = np.full(batch, 512, np.int64)
        previous = np.zeros(batch, np.int64)
        for _ in range(steps):
            marginals, target = source.draft(slots, contexts)
            req = StepRequests.of(slots, contexts, np.zeros(batch, np.int64), previous)
            context = BatchPolicyContext(req, learner)
            t0 = time.perf_counter()
            choice = policy.choose_batch(marginals, context)
            t1 = time.perf_counter()
            trees = choice.trees
            counts, nodes = _walk(trees, target)
            verify = gpu.verify_truth(trees.sizes, contexts)
            cycle = gpu.draft_truth(contexts) + verify
            t2 = time.perf_counter()
            learner.observe_step(choice.kind or "tree", contexts, trees, counts + 1, nodes, cycle)
            t3 = time.perf_counter()
            fixed.choose_batch(marginals, context)
            t4 = time.perf_counter()
            host = (t1 - t0) + (t3 - t2)
            host_s.append(host)
            by_kind[bool(getattr(choice.diagnostics, "repeated", False))].append(host)
            base_s.append(t4 - t3)
            verify_s.append(verify)
            sizes.append(int(trees.sizes.sum()))
            previous = trees.sizes
            contexts = contexts + counts + 1
        ours.extend(host_s)
        for k, v in by_kind.items():
            if v:
                kinds[k].append(statistics.fmean(v))
        means.append(
            (statistics.fmean(host_s), statistics.fmean(base_s), statistics.fmean(verify_s))
        )
    # per repeat the mean over its steps (what a serving loop pays: refreshes of cached
    # estimates every few steps or when a context crosses a step included), then the median
    # over repeats (a load spike on this shared machine moves one repeat, not the result)
    mean_host = statistics.median(m[0] for m in means)
    nan = float("nan")
    return {
        "ours_us": 1e6 * mean_host,
        "decide_us": 1e6 * statistics.median(kinds[False]) if kinds[False] else nan,
        "repeat_us": 1e6 * statistics.median(kinds[True]) if kinds[True] else nan,
        "ours_median_us": 1e6 * statistics.median(ours),
        "fixed_us": 1e6 * statistics.median(m[1] for m in means),
        "ratio": statistics.median(m[0] / m[1] for m in means),
        "share": statistics.median(m[0] / m[2] for m in means),
        "total": statistics.median(sizes),
    }


def standing(
    batch: int, steps: int, repeats: int, kinds: tuple[str, ...] = ("chain", "tree")
) -> dict[str, float]:
    """µs per step of a standing decision, chain against tree (``plan_step``, ``choose_batch``
    and ``observe_step``; the decision forced to stand every step), median over repeats of the
    per-repeat median (``chain_us``, ``tree_us``) and of the per-repeat mean (``chain_mean_us``,
    what a serving loop pays and the simulator's ``controller_chain_*`` charge; the first 20 %
    of the steps left out of both). At batch 1 only a chain decision stands."""
    _, start = _started(batch)
    out: dict[str, list[float]] = {k: [] for k in kinds}
    means: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(repeats):
        for kind in kinds:
            learner = start.copy()
            learner.explore_every = 0
            policy = LearningPolicy()
            source, slots = _admitted(batch, rep)
            contexts = np.full(batch, 512, np.int64)
            previous = np.zeros(batch, np.int64)
            times = []
            for _ in range(steps):
                marginals, target = source.draft(slots, contexts)
                req = StepRequests.of(slots, contexts, np.zeros(batch, np.int64), previous)
                for _ in range(2):  # two agreeing decisions: the next step stands
                    learner.decided(kind, batch, batch * (16 if kind == "chain" else 20), 0.01, 8)
                t0 = time.perf_counter()
                plan = policy.plan_step(req, learner)
                choice = policy.choose_batch(marginals, BatchPolicyContext(req, learner))
                t1 = time.perf_counter()
                if not getattr(choice.diagnostics, "repeated", False):
                    raise SystemExit("internal error: the decision did not stand")
                trees = choice.trees
                counts, nodes = _walk(trees, target)
                prep = "argmax" if plan == "chain" else "topk"
                t2 = time.perf_counter()
                learner.observe_step(kind, contexts, trees, counts + 1, nodes, 0.01, prep)
                t3 = time.perf_counter()
                times.append((t1 - t0) + (t3 - t2))
                previous = trees.sizes
                contexts = contexts + counts + 1
            out[kind].append(statistics.median(times[steps // 5 :]))
            means[kind].append(statistics.fmean(times[steps // 5 :]))
    result = {f"{k}_us": 1e6 * statistics.median(v) for k, v in out.items()}
    result |= {f"{k}_mean_us": 1e6 * statistics.median(v) for k, v in means.items()}
    if "chain" in out and "tree" in out:
        result["ratio"] = result["chain_us"] / result["tree_us"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument(
        "--every", type=int, default=DECIDE_EVERY, help="the controller decides every K steps"
    )
    parser.add_argument(
        "--standing",
        action="store_true",
        help="instead: a standing chain's step against a repeated tree step",
    )
    args = parser.parse_args()
    if args.standing:
        print(
            f"`python benchmarks/bench_learning.py --standing --steps {args.steps} --repeats "
            f"{args.repeats}` on {platform.machine()}, Python {platform.python_version()}\n"
        )
        print("| B | standing chain µs/step | repeated tree µs/step | chain / tree |")
        print("|---:|---:|---:|---:|")
        for b in (int(x) for x in args.batches.split(",")):
            if b == 1:  # at batch 1 only a chain decision stands
                r = standing(b, args.steps, args.repeats, ("chain",))
                print(f"| {b} | {r['chain_us']:.0f} | — | — |")
                continue
            r = standing(b, args.steps, args.repeats)
            print(f"| {b} | {r['chain_us']:.0f} | {r['tree_us']:.0f} | {r['ratio']:.2f} |")
        return
    if args.every < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--every, --steps and --repeats must be ≥ 1")
    print(
        f"`python benchmarks/bench_learning.py --steps {args.steps} --repeats {args.repeats} "
        f"--every {args.every}` on {platform.machine()} ({platform.processor() or 'cpu'}), "
        f"Python {platform.python_version()}\n"
    )
    print(
        "| B | bastion µs/step (mean) | deciding | repeating | (median) | fixed:64 µs/step "
        "| bastion / fixed | median ΣN | % of verify |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in (int(x) for x in args.batches.split(",")):
        r = run(b, args.steps, args.repeats, args.every)
        print(
            f"| {b} | {r['ours_us']:.0f} | {r['decide_us']:.0f} | {r['repeat_us']:.0f} "
            f"| {r['ours_median_us']:.0f} | {r['fixed_us']:.0f} | {r['ratio']:.2f}× "
            f"| {r['total']:.0f} | {100 * r['share']:.2f} % |"
        )


if __name__ == "__main__":
    main()
