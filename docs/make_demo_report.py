"""Regenerate the numbers of docs/demo.md:
`python docs/make_demo_report.py [--pair base|small] [--batch-size 1,2,4,8] [--repeats 10]
[--dtype float32|bfloat16] [--linears auto|stream|torch]`.

Runs the demo with the chosen shipped pair at each batch size (one warm-up run, then
``--repeats`` timed runs per policy, every policy's runs in lockstep with the others') with
dense traces recorded at the first, then replays every recorded policy's traces in the simulator
with every other policy, and prints: the target's measured pass time by tokens (its cost curve
on this machine); per batch size and policy τ / mean N / median TPOT over the requests of every
run / the runs' mean TPOTs / speedup over AR; every run's median TPOT per policy at the first
batch size with the learning controller's ratio to the fastest other policy (overall with a 90 %
bootstrap interval over the runs), the calibration RMSE, and for each (recorded, replayed) pair
the mean τ of the real run vs the replay and the share of steps whose committed length differs
(floating-point near-ties between the dense recording's pass shapes and the real run's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from math import nan
from pathlib import Path

import numpy as np

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.demo import DEFAULT_PAIR, PAIRS, get_pair
from bastion.demo.run import DEMO_DTYPES, PolicyRow, load_prompts, run_demo
from bastion.policies import make_policy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.replay import trace_source
from bastion.sim.serving import serve

POLICIES = (
    "ar",
    "chain",
    "fixed:8",
    "fixed:16",
    "fixed:32",
    "fixed:64",
    "fixed:128",
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


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"--batch-size takes integers, e.g. 1,2,4,8; got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--batch-size takes integers ≥ 1, e.g. 1,2,4,8; got {text!r}")
    return sizes


def cost_curve(
    target_dir: Path,
    tokens: tuple[int, ...],
    context: int,
    rounds: int,
    dtype: str = "float32",
    linears: str = "auto",
) -> None:
    """The target's verification pass time by tokens over ``context`` cached tokens: the median
    of ``rounds`` rounds, each timing every size once (interleaved, so drift reaches all)."""
    import torch

    from bastion.backends.torch import load_target
    from bastion.backends.torch.timing import verify_timer

    target = load_target(target_dir, "cpu", dtype=getattr(torch, dtype), linears=linears)
    timer = verify_timer(target, repeats=1)
    times: dict[int, list[float]] = {s: [] for s in tokens}
    for _ in range(rounds):
        for s in tokens:
            times[s].append(timer(s, context))
    base = float(np.median(times[tokens[0]]))
    print(f"\n| tokens per pass | pass ms (median of {rounds}) | × one token |")
    print("|---:|---:|---:|")
    for s in tokens:
        med = float(np.median(times[s]))
        print(f"| {s} | {med * 1e3:.2f} | {med / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--num-prompts", "--prompts", dest="prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch-size", default="1,2,4,8", help="e.g. 1,2,4,8")
    parser.add_argument("--no-curve", action="store_true", help="skip the pass-time curve")
    parser.add_argument("--dtype", choices=DEMO_DTYPES, default="float32")
    parser.add_argument("--linears", choices=("auto", "stream", "torch"), default="auto")
    args = parser.parse_args()
    sizes = _sizes(args.batch_size)
    pair = get_pair(args.pair)
    print(f"pair: {pair.name} in {args.dtype}")
    if not args.no_curve:
        cost_curve(pair.target, (1, 2, 4, 8, 16, 32, 64, 128), 256, 15, args.dtype, args.linears)
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp)
        result = run_demo(
            load_prompts()[: args.prompts],
            args.max_new_tokens,
            POLICIES,
            record_dir=traces,
            target_dir=pair.target,
            drafter_dir=pair.drafter,
            batch_sizes=sizes,
            repeats=args.repeats,
            dtype=args.dtype,
            linears=args.linears,
            progress=lambda message: print(message, file=sys.stderr, flush=True),
        )
        print(f"\nidentical outputs: {result.identical}; calibration: {result.calibration}\n")
        print(
            "| B | policy | τ | mean N | median TPOT ms | run means ms (min–max) | speedup vs AR "
            "| Ĉ ms | cycle ms |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in result.rows:
            print(
                f"| {r.batch_size} | {r.policy} | {r.tau:.2f} | {r.mean_tree_size:.1f} | "
                f"{r.tpot_p50_s * 1e3:.2f} | {r.tpot_s * 1e3:.2f} "
                f"({r.tpot_min_s * 1e3:.2f}–{r.tpot_max_s * 1e3:.2f}) | "
                f"{r.speedup:.2f}× | {r.cycle_predicted_s * 1e3:.2f} | "
                f"{r.cycle_observed_s * 1e3:.2f} |"
            )
        for b in sizes:
            print(f"\nbatch {b}:", end="")
            _print_runs([r for r in result.rows if r.batch_size == b], result.request_tpots[b])
        spec = ModelSpec.from_hf_config(pair.target / "config.json", name="demo")
        layers = int(json.loads((pair.drafter / "config.json").read_text())["num_hidden_layers"])
        gpu = SimulatedGPU(
            get_profile("h100-sxm"), spec, DrafterSpec.dflash_for(spec, layers=layers)
        )
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
