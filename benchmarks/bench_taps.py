"""What the drafter's taps cost a target pass on the real backend.

A DFlash drafter reads the outputs of a few target layers (its ``target_layer_ids``) at every
token the target commits, so every pass of a speculative policy, and every AR step of the
learning controller (the drafter resumes from them after an AR stretch), asks the target for
its hidden states (:class:`bastion.backends.torch.verifier.TorchVerifier` with
``tap_layer_ids``); the ``ar`` policy's verifier does not. This times one-token passes of the
shipped demo target on CPU with a KV cache, the two verifiers side by side, each with its own
cache, one step of each in turn (the order alternating every step), so the machine's drift lands
on both alike. Reported: the tapped pass's median step over the untapped one's, per repetition
of ``--steps`` steps, and the median over ``--reps`` repetitions.

Run: ``python benchmarks/bench_taps.py [--reps 8] [--steps 400]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import DynamicCache

from bastion.backends.torch import DFlashDrafter, load_target
from bastion.backends.torch.verifier import TorchVerifier
from bastion.demo import DRAFTER_DIR, TARGET_DIR

CONTEXT = 64  # prompt tokens before the timed steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    if args.reps < 1 or args.steps < 1:
        parser.error("--reps and --steps must be ≥ 1")
    target = load_target(TARGET_DIR, "cpu")
    taps = DFlashDrafter.from_pretrained(DRAFTER_DIR, target).cfg.target_layer_ids
    modes = {"untapped": TorchVerifier(target), "tapped": TorchVerifier(target, tap_layer_ids=taps)}
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, int(target.config.vocab_size), (1, CONTEXT), generator=generator)
    token = prompt[:, -1:]
    ratios = []
    with torch.no_grad():
        for _ in range(args.reps):
            caches = {m: DynamicCache(config=target.config) for m in modes}
            for m, v in modes.items():
                v.forward(prompt, caches[m])
            times: dict[str, list[float]] = {m: [] for m in modes}
            order = list(modes)
            for step in range(args.steps):
                for m in order if step % 2 == 0 else order[::-1]:
                    t0 = time.perf_counter()
                    modes[m].forward(token, caches[m])
                    times[m].append(time.perf_counter() - t0)
            ratios.append(statistics.median(times["tapped"]) / statistics.median(times["untapped"]))
    print(
        f"`python benchmarks/bench_taps.py --reps {args.reps} --steps {args.steps}` on "
        f"{platform.machine()}, torch {torch.__version__}; taps {list(taps)} of "
        f"{target.config.num_hidden_layers} layers, {CONTEXT}-token context"
    )
    shown = ", ".join(f"{x:.4f}" for x in ratios)
    print(f"tapped / untapped median step: {statistics.median(ratios):.4f} (per rep: {shown})")


if __name__ == "__main__":
    main()
