"""Validate `bastion workload fit` on the demo pair: fit on half the held-out prompts, predict
the other half.

1. Records a dense T = 0 trace (chain policy; dense traces replay any policy) of every distinct
   held-out prompt of the demo corpus (``bastion.demo.corpus.heldout_prompts``; 28 distinct
   prompts of the standard library's held-out files), ``--max-new-tokens`` tokens each, with
   ``bastion generate --record-trace PATH --dense-trace`` (skipped for traces already there).
2. Splits them by position in that list, decided before any fit: even positions fit, odd
   positions validate.
3. Runs ``bastion workload fit`` on the fit half, then compares τ(N) for
   N ∈ {1, 16, 32, 64, 128, 256} (and the chain) predicted by the fitted workload (2048
   synthetic requests × 32 steps) with trace replay of the validation half, and prints the
   table of docs/workloads.md.

Run: ``python docs/make_workload_report.py [--dir DIR] [--max-new-tokens 256]`` (needs
bastion[torch]; about 2 minutes on 2 CPU cores). Not part of the tests.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bastion.demo.corpus import heldout_prompts, load_corpus
from bastion.sim.workload_fit import replay_tau, synthetic_tau
from bastion.sim.workloads import load_workload
from bastion.trace import read_trace

MODELS = Path(__file__).resolve().parents[1] / "bastion" / "demo" / "models"
SIZES = ("chain", 1, 16, 32, 64, 128, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("workload-fit-demo"))
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    prompts = list(dict.fromkeys(heldout_prompts(load_corpus(), n=64)))  # distinct, in order
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = [args.dir / f"prompt-{i:02d}.json" for i in range(len(prompts))]
    for prompt, path in zip(prompts, paths, strict=True):
        if path.exists():
            continue
        subprocess.run(
            [
                "bastion", "generate", "--target", str(MODELS / "target"),
                "--drafter", str(MODELS / "drafter"), "--policy", "chain",
                "--prompt", prompt, "--max-new-tokens", str(args.max_new_tokens),
                "--record-trace", str(path), "--dense-trace", "--warmup", "0",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
    fit, held = paths[0::2], paths[1::2]
    out = args.dir / "fitted.toml"
    cmd = ["bastion", "workload", "fit", *map(str, fit), "--out", str(out), "--name", "demo-fit"]
    subprocess.run(cmd, check=True)
    workload = load_workload(out)
    replayed = replay_tau([read_trace(p) for p in held], SIZES)
    predicted = synthetic_tau(workload, SIZES, requests=2048, steps=32, seed=1)
    print(f"\n{len(prompts)} prompts × {args.max_new_tokens} tokens; fit on {len(fit)}, "
          f"validate on {len(held)}\n")  # fmt: skip
    print("| N | τ replayed (validation half) | τ predicted (fitted workload) | error |")
    print("|---|---:|---:|---:|")
    worst = 0.0
    for n in SIZES:
        err = predicted[n] / replayed[n] - 1
        worst = max(worst, abs(err)) if n != "chain" else worst
        print(f"| {n} | {replayed[n]:.3f} | {predicted[n]:.3f} | {100 * err:+.1f} % |")
    print(f"\nlargest |error| over N ∈ {{1, 16, 32, 64, 128, 256}}: {100 * worst:.1f} %")
    sys.exit(0)


if __name__ == "__main__":
    main()
