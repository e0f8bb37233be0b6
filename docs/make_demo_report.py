"""Regenerate the numbers of docs/demo.md: `python docs/make_demo_report.py [--repeats 9]`.

Runs the demo at batch 1 (one warm-up run, then ``--repeats`` timed runs per policy, every
policy's runs in lockstep with the others') with dense traces recorded in the first, then
replays every recorded policy's traces in the simulator with every other policy, and prints:
per-policy τ / mean N / median TPOT over the requests of every run / the runs' mean TPOTs /
speedup, every run's median TPOT per policy with the learning controller's ratio to the fastest
other policy (overall with a 90 % bootstrap interval over the runs), the calibration RMSE, and
for each (recorded, replayed) pair the mean τ of the real run vs the replay and the share of
steps whose committed length differs (floating-point near-ties between the dense recording's
pass shapes and the real run's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from math import nan
from pathlib import Path

import numpy as np

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.demo import TARGET_DIR
from bastion.demo.run import PolicyRow, load_prompts, run_demo
from bastion.policies import make_policy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.replay import trace_source
from bastion.sim.serving import serve

POLICIES = (
    "ar",
    "chain",
    "fixed:16",
    "fixed:32",
    "fixed:64",
    "beam:4x15",
    "bastion:paper",
    "bastion",
)


def _pooled(runs: list[tuple[float, ...]]) -> float:
    """The median TPOT over every request of the given runs."""
    return float(np.median([t for run in runs for t in run if t > 0]))


def _print_runs(rows: list[PolicyRow], tpots: dict[str, list[tuple[float, ...]]]) -> None:
    """Every timed run's median TPOT over its requests per policy (the runs went in lockstep),
    the learning controller's over the fastest other policy's in each run, and overall: by the
    median over every request of every run (with a 90 % bootstrap interval over the runs) and
    by the median over runs of the runs' mean TPOT."""
    others = [p for p in tpots if p != "bastion"]
    runs = len(tpots["ar"])
    print("\n| run | " + " | ".join(tpots) + " | bastion / fastest other |")
    print("|---:|" + "---:|" * (len(tpots) + 1))
    for i in range(runs):
        med = {p: _pooled([t[i]]) for p, t in tpots.items()}
        ratio = med["bastion"] / min(med[p] for p in others) if "bastion" in med else nan
        print(f"| {i + 1} | " + " | ".join(f"{m * 1e3:.2f}" for m in med.values()), end="")
        print(f" | {ratio:.3f} |")
    if "bastion" not in tpots:
        return
    fastest = min(others, key=lambda p: _pooled(tpots[p]))
    ratio = _pooled(tpots["bastion"]) / _pooled(tpots[fastest])
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(2000):
        pick = rng.integers(0, runs, runs)
        b = _pooled([tpots["bastion"][k] for k in pick])
        boot.append(b / min(_pooled([tpots[p][k] for k in pick]) for p in others))
    low, high = np.percentile(boot, [5, 95])
    means = {r.policy: float(np.median(r.tpot_runs_s)) for r in rows}
    by_means = means["bastion"] / min(means[p] for p in others)
    print(
        f"\nmedian TPOT over requests: bastion / fastest other ({fastest}) = {ratio:.3f} "
        f"(90 % bootstrap over runs {low:.3f}–{high:.3f}); by the median over runs of the "
        f"runs' mean TPOT: {by_means:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-prompts", "--prompts", dest="prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp)
        result = run_demo(
            load_prompts()[: args.prompts],
            args.max_new_tokens,
            POLICIES,
            record_dir=traces,
            repeats=args.repeats,
            progress=lambda message: print(message, file=sys.stderr, flush=True),
        )
        print(f"identical outputs: {result.identical}; calibration: {result.calibration}\n")
        print(
            "| policy | τ | mean N | median TPOT ms | run means ms (min–max) | speedup vs AR "
            "| Ĉ ms | cycle ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in result.rows:
            print(
                f"| {r.policy} | {r.tau:.2f} | {r.mean_tree_size:.1f} | "
                f"{r.tpot_p50_s * 1e3:.2f} | {r.tpot_s * 1e3:.2f} "
                f"({r.tpot_min_s * 1e3:.2f}–{r.tpot_max_s * 1e3:.2f}) | "
                f"{r.speedup:.2f}× | {r.cycle_predicted_s * 1e3:.2f} | "
                f"{r.cycle_observed_s * 1e3:.2f} |"
            )
        _print_runs(result.rows, result.request_tpots[1])
        spec = ModelSpec.from_hf_config(TARGET_DIR / "config.json", name="demo")
        gpu = SimulatedGPU(get_profile("h100-sxm"), spec, DrafterSpec.dflash_for(spec, layers=2))
        print("\n| recorded | replayed | real τ | replay τ | steps differing |")
        print("|---|---|---:|---:|---:|")
        for recorded in ("chain", "fixed:32"):
            files = sorted(traces.glob(f"{recorded.replace(':', '-')}-*.json"))
            for other in POLICIES[1:-2]:  # the adaptive ones need a cost model
                real = result.acceptance[other]
                sim = [
                    serve(make_policy(other), gpu, trace_source(f), 1).requests[0].committed
                    for f in files
                ]
                diff = sum(
                    a != b
                    for r, s in zip(real, sim, strict=True)
                    for a, b in zip(r[:-1], s[:-1], strict=False)
                )
                steps = sum(len(r) - 1 for r in real)
                rt = np.mean([np.mean(r[:-1]) for r in real])
                st = np.mean([np.mean(s[:-1]) for s in sim])
                print(f"| {recorded} | {other} | {rt:.3f} | {st:.3f} | {diff}/{steps} |")


if __name__ == "__main__":
    main()
