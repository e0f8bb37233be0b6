"""Calibration prompts against held-out prompts: acceptance, and what the drafter's intake costs.

A measured truth is fitted on calibration prompts (cut from training-split files) and predicts
runs on held-out prompts, so a gap between the two in acceptance, or a cost that follows the
acceptance, would carry into the prediction. A shipped demo pair decodes both prompt sets at
batch 1 (T = 0) with one fixed policy, alternating the sets over ``--rounds`` rounds, and per
set it prints: tokens per step over all steps; the mean context; the mean of each measured stage
(drafter, commit, forward pass, mask, acceptance walk, build, loop); a least-squares line of the
drafter's time on its intake (the target features it takes before its pass: the tokens the
step before committed; a request's first draft, which takes its prompt, left out) and on the
context, and of the commit stage on the tokens the step committed; and the drafter's median time
at each intake of 1–7 tokens.

Run: ``python benchmarks/bench_drafter_intake.py [--pair base] [--policy fixed:16]
[--prompts 8] [--rounds 2]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
from _demo_pair import load_demo_pair  # type: ignore[import-not-found]

from bastion.demo import CALIBRATION_PROMPTS_FILE, DEFAULT_PAIR, PAIRS
from bastion.errors import ConfigError
from bastion.policies import make_policy

FIRST = -1  # a request's first drafted step: its intake is the prompt


def _rows(report: Any) -> list[tuple[float, ...]]:
    """Per step of the first timed run: intake, committed, context and the stages (seconds)."""
    samples = [s for s in report.samples if s.run == 0]
    out: list[tuple[float, ...]] = []
    i = 0
    for rec in report.records:
        steps = rec.committed_per_step
        for k, committed in enumerate(steps):
            s = samples[i]
            i += 1
            intake = steps[k - 1] if k else FIRST
            stages = (s.draft_s, s.commit_s, s.forward_s, s.mask_s, s.accept_s, s.build_s)
            out.append((intake, committed, s.contexts[0], *stages, s.other_s))
    if i != len(samples):  # pragma: no cover - a report whose steps and records disagree
        raise ConfigError(f"{len(samples)} step samples for {i} recorded steps")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--policy", default="fixed:16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    if not 1 <= args.prompts <= 64 or not 1 <= args.rounds <= 50 or args.max_new_tokens < 2:
        raise ConfigError("--prompts 1–64, --rounds 1–50, --max-new-tokens ≥ 2")
    if make_policy(args.policy).name == "ar":
        raise ConfigError("--policy: a drafting policy (AR takes no intake)")

    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter
    from bastion.backends.torch.runner import generate_batch

    pair, target, held, eos = load_demo_pair(args.pair, "float32", args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    texts = json.loads(CALIBRATION_PROMPTS_FILE.read_text())[: args.prompts]
    calibration = [list(tokenizer(t)["input_ids"]) for t in texts]
    drafter = DFlashDrafter.from_pretrained(pair.drafter, target)
    rows: dict[str, list[tuple[float, ...]]] = {"held-out": [], "calibration": []}
    for r in range(args.rounds):
        for name, prompts in (("held-out", held), ("calibration", calibration)):
            report = generate_batch(
                target,
                drafter,
                args.policy,
                prompts,
                batch_size=1,
                max_new_tokens=args.max_new_tokens,
                eos_token_id=eos,
                warmup=1 if r == 0 else 0,
            )
            rows[name] += _rows(report)
    print(f"pair {pair.name}, {args.policy}, B = 1, {args.rounds} round(s), times in ms")
    for name, got in rows.items():
        a = np.array(got)
        later = a[a[:, 0] != FIRST]
        ms = [float(a[:, col].mean() * 1e3) for col in range(a.shape[1])]
        print(
            f"{name}: {len(a)} steps, tokens a step {a[:, 1].mean():.3f}, context "
            f"{a[:, 2].mean():.0f}; drafter {later[:, 3].mean() * 1e3:.3f} (first drafts "
            f"{a[a[:, 0] == FIRST, 3].mean() * 1e3:.3f}), commit {ms[4]:.3f}, forward "
            f"{ms[5]:.3f}, mask {ms[6]:.3f}, accept {ms[7]:.3f}, build {ms[8]:.3f}, "
            f"loop {ms[9]:.3f}"
        )
        x = np.stack([np.ones(len(later)), later[:, 0], later[:, 2]], axis=1)
        c = np.linalg.lstsq(x, later[:, 3], rcond=None)[0]
        print(
            f"  drafter ≈ {c[0] * 1e3:.3f} ms + {c[1] * 1e6:.1f} µs · intake + "
            f"{c[2] * 1e6:.2f} µs · context"
        )
        x = np.stack([np.ones(len(a)), a[:, 1], a[:, 2]], axis=1)
        c = np.linalg.lstsq(x, a[:, 4], rcond=None)[0]
        print(
            f"  commit ≈ {c[0] * 1e3:.3f} ms + {c[1] * 1e6:.1f} µs · committed + "
            f"{c[2] * 1e6:.2f} µs · context"
        )
        for q in range(1, 8):
            at = later[later[:, 0] == q]
            if len(at) > 5:
                print(
                    f"  intake {q}: {len(at)} steps, drafter median {np.median(at[:, 3]) * 1e3:.3f}"
                )


if __name__ == "__main__":
    main()
