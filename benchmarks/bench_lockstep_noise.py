"""How finely must two policies alternate to be timed fairly on this machine?

One stream of AR steps of the shipped demo target (batch 1, a KV cache, one token per step) is
timed step by step; its steps are then dealt to two pretend policies A and B in alternating
blocks of g steps, and the ratio of A's mean step time to B's is taken over windows of
``--window`` steps each. A and B are the same policy, so every departure of the ratio from 1 is
the machine's drift; its standard deviation over the windows, for each g, is what a comparison
alternating every g steps would suffer. g = the window is "one policy's whole run, then the
other's"; g = 96 is "in turns, prompt by prompt" (96-token prompts); g = 1 is lockstep
(:mod:`bastion.backends.torch.lockstep`).

Then (``--runs`` > 0) two identical AR contenders decode the demo's 8 held-out prompts × 96
tokens in lockstep, ``--runs`` timed runs, and two statistics of their TPOT are compared on
subsets of 9 runs (2000 seeded draws): the median over runs of each run's mean TPOT, and the
median over every request of the runs. Again the two are the same policy: the spread of the
ratio is what a comparison of two policies by that statistic suffers on this machine (a
negative control for the demo's 3 % line).

Run: ``python benchmarks/bench_lockstep_noise.py [--passes 40] [--window 768] [--runs 24]``.
Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

from bastion.backends.torch import load_target
from bastion.demo import TARGET_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=40, help="200-step decodes, one stream")
    parser.add_argument("--window", type=int, default=768, help="steps per policy and window")
    parser.add_argument("--runs", type=int, default=24, help="lockstep runs of AR against AR")
    args = parser.parse_args()
    if args.passes < 1 or args.window < 1 or args.runs < 0:
        parser.error("--passes and --window must be ≥ 1, --runs ≥ 0")
    if args.passes * 200 < 2 * args.window:
        parser.error("--passes × 200 steps must cover at least one window of each policy")
    target = load_target(TARGET_DIR, "cpu")
    times = []
    with torch.no_grad():
        for _ in range(args.passes):
            out = target(torch.arange(1, 9).unsqueeze(0), use_cache=True)
            cache = out.past_key_values
            for _ in range(200):
                t0 = time.perf_counter()
                out = target(torch.tensor([[5]]), past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t0)
                cache = out.past_key_values
    ts = np.asarray(times)
    w = args.window
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}")
    cv = ts.std() / ts.mean()
    print(f"{ts.size} AR steps, mean {ts.mean() * 1e3:.3f} ms, per-step CV {cv:.3f}")
    print("| alternating every g steps | windows | ratio A/B: std | max |1 − ratio| |")
    print("|---:|---:|---:|---:|")
    for g in sorted({1, 8, 96, w}):
        ratios = []
        for start in range(0, ts.size - 2 * w + 1, 2 * w):
            seg = ts[start : start + 2 * w]
            mine = (np.arange(2 * w) // g) % 2 == 0
            ratios.append(seg[mine].mean() / seg[~mine].mean())
        r = np.asarray(ratios)
        print(f"| {g} | {r.size} | {r.std():.4f} | {np.abs(r - 1).max():.4f} |")
    if args.runs:
        _ar_against_ar(target, args.runs)


def _ar_against_ar(target: torch.nn.Module, runs: int) -> None:
    from transformers import AutoTokenizer

    from bastion.backends.torch.lockstep import Contender, generate_lockstep
    from bastion.demo.run import load_prompts

    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    prompts = [list(tok(t)["input_ids"]) for t in load_prompts()[:8]]
    eos = int(tok.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[arg-type]
    a, b = (
        np.array([run.request_tpots for run in report.runs])
        for report in generate_lockstep(
            target,
            [Contender("ar"), Contender("ar")],
            prompts,
            max_new_tokens=96,
            eos_token_id=eos,
            repeats=runs,
            warmup=1,
        )
    )
    rng = np.random.default_rng(0)
    pick = min(9, runs)
    print(f"\nAR against AR in lockstep, {runs} runs; ratio B/A on {pick}-run subsets:")
    print("| statistic | std | 95th percentile of |1 − ratio| |")
    print("|---|---:|---:|")
    for name, stat in (
        ("median over runs of the run's mean TPOT", lambda x: np.median(x.mean(axis=1))),
        ("median over every request of the runs", np.median),
    ):
        ratios = []
        for _ in range(2000):
            k = rng.choice(runs, pick, replace=False)
            ratios.append(stat(b[k]) / stat(a[k]))
        r = np.asarray(ratios)
        print(f"| {name} | {r.std():.4f} | {np.percentile(np.abs(r - 1), 95):.4f} |")


if __name__ == "__main__":
    main()
