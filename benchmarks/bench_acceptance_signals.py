"""How much a drafter's acceptance moves with the text, and what an AR step could see of it.

A shipped demo pair decodes the held-out prompts with a fixed best-first size at batch 1 (T = 0)
and, per step, the committed tokens are set beside two signals an AR step has for free: whether
the last n tokens occurred earlier in the context (n = 2, 3, 4), and the target's own confidence
(its top probability, mean over the 4 positions before the step, from one teacher-forced pass
afterwards). Printed: each request's steps and mean committed tokens; the lag-1
autocorrelation of committed tokens within requests; mean committed tokens with and without an
n-gram repeat; by confidence band; and the correlation of confidence with committed tokens.
With ``--dtype bfloat16`` the pair runs in bf16.

Run: ``python benchmarks/bench_acceptance_signals.py [--pair base] [--policy fixed:16]``.
Never part of the tests (no timing: these are counts).
"""

from __future__ import annotations

import argparse

import numpy as np
from _demo_pair import load_demo_pair  # type: ignore[import-not-found]

from bastion.demo import DEFAULT_PAIR, PAIRS
from bastion.demo.run import DEMO_DTYPES
from bastion.policies import make_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--dtype", choices=DEMO_DTYPES, default="float32")
    parser.add_argument("--policy", default="fixed:16")
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    if not 1 <= args.prompts <= 64:
        parser.error("--prompts 1–64")
    make_policy(args.policy)  # a bad spec fails here, before loading

    import torch

    from bastion.backends.torch import DFlashDrafter, generate_batch

    pair, target, prompts, eos = load_demo_pair(args.pair, args.dtype, args.prompts)
    drafter = DFlashDrafter.from_pretrained(pair.drafter, target)
    report = generate_batch(
        target, drafter, args.policy, prompts, batch_size=1, max_new_tokens=96, eos_token_id=eos
    )
    records = report.records
    print(
        "per request (steps, mean committed):",
        [
            (len(r.committed_per_step), round(float(np.mean(r.committed_per_step)), 2))
            for r in records
        ],
    )
    prev = [c for r in records for c in r.committed_per_step[:-1]]
    nxt = [c for r in records for c in r.committed_per_step[1:]]
    print(f"lag-1 autocorrelation of committed tokens: {np.corrcoef(prev, nxt)[0, 1]:.2f}")
    for n in (2, 3, 4):
        hit: list[int] = []
        miss: list[int] = []
        for p, r in zip(prompts, records, strict=True):
            ctx, pos = [*p, r.output_ids[0]], 1
            for c in r.committed_per_step:
                last = tuple(ctx[-n:])
                seen = any(tuple(ctx[i : i + n]) == last for i in range(len(ctx) - n))
                (hit if seen else miss).append(c)
                ctx += r.output_ids[pos : pos + c]
                pos += c
        print(
            f"last {n} tokens seen before: {len(hit)} steps, mean committed "
            f"{np.mean(hit):.2f}; not: {len(miss)} steps, {np.mean(miss):.2f}"
        )
    confidence: list[float] = []
    committed: list[int] = []
    with torch.no_grad():
        for p, r in zip(prompts, records, strict=True):
            logits = target(torch.tensor([[*p, *r.output_ids]])).logits[0].float()
            top = torch.softmax(logits, -1).max(-1).values
            pos = len(p)
            for c in r.committed_per_step:
                confidence.append(float(top[max(0, pos - 4) : pos].mean()))
                committed.append(c)
                pos += c
    conf, got = np.array(confidence), np.array(committed)
    for lo, hi in ((0.0, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 0.95), (0.95, 1.01)):
        band = (conf >= lo) & (conf < hi)
        if band.any():
            print(
                f"confidence [{lo}, {hi}): {band.sum()} steps, "
                f"mean committed {got[band].mean():.2f}"
            )
    print(f"correlation of confidence with committed tokens: {np.corrcoef(conf, got)[0, 1]:.2f}")


if __name__ == "__main__":
    main()
