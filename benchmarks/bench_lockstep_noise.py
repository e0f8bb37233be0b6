"""How finely must two policies alternate to be timed fairly on this machine?

One stream of AR steps of the shipped demo target (batch 1, a KV cache, one token per step) is
timed step by step; its steps are then dealt to two pretend policies A and B in alternating
blocks of g steps, and the ratio of A's mean step time to B's is taken over windows of
``--window`` steps each. A and B are the same policy, so every departure of the ratio from 1 is
the machine's drift; its standard deviation over the windows, for each g, is what a comparison
alternating every g steps would suffer. g = the window is "one policy's whole run, then the
other's"; g = 96 is "in turns, prompt by prompt" (96-token prompts); g = 1 is lockstep
(:mod:`bastion.backends.torch.lockstep`).

Run: ``python benchmarks/bench_lockstep_noise.py [--passes 40] [--window 768]``.
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
    args = parser.parse_args()
    if args.passes < 1 or args.window < 1:
        parser.error("--passes and --window must be ≥ 1")
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


if __name__ == "__main__":
    main()
