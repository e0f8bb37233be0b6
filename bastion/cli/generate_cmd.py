"""``bastion generate``: run one prompt through a real target (and DFlash drafter).

Prints the generated text (or ids) and the step statistics; ``--json`` prints one JSON object
with output_ids, acceptance_lengths, time_per_output_token and the other report fields. Torch is
imported only when the command runs, so ``bastion --help`` stays light.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bastion.errors import BudgetError, CheckpointError


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError as exc:
        raise BudgetError(
            f"--prompt-ids must be integers separated by commas; got {text!r}"
        ) from exc
    if not ids:
        raise BudgetError("--prompt-ids is empty")
    return ids


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate with a real target (torch backend)")
    p.add_argument("--target", required=True, help="Hugging Face model directory")
    p.add_argument("--drafter", help="DFlash drafter checkpoint directory (not needed for ar)")
    p.add_argument("--policy", default="bastion", help="bastion | chain | fixed:N | eagle | ar")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer in the target directory)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma separated")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--draft-top-k", type=int, default=16, help="candidates kept per position")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--record-trace", metavar="PATH", help="write a bastion trace (JSON) here")
    p.add_argument(
        "--dense-trace",
        action="store_true",
        help="with --record-trace: also record the drafter's marginals at every position, so "
        "the simulator can replay any policy",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bastion.backends.torch import DFlashDrafter, SamplingParams, generate, load_target

    if args.record_trace and Path(args.record_trace).is_dir():
        raise BudgetError(f"--record-trace {args.record_trace} is a directory; give a file path")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    target = load_target(args.target, args.device)
    tokenizer = None
    if args.prompt is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.target)
        except (OSError, ValueError) as exc:
            raise CheckpointError(
                f"no tokenizer in {args.target} ({exc}); pass --prompt-ids instead"
            ) from exc
        prompt_ids = list(tokenizer(args.prompt)["input_ids"])
    else:
        prompt_ids = _parse_ids(args.prompt_ids)
    drafter = None
    if args.policy.strip() != "ar":
        if not args.drafter:
            raise BudgetError(f"--policy {args.policy} needs --drafter DIR (only ar runs without)")
        drafter = DFlashDrafter.from_pretrained(args.drafter, target, top_k=args.draft_top_k)
    report = generate(
        target,
        drafter,
        args.policy,
        prompt_ids,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        record_trace=args.record_trace,
        trace_metadata={"target": args.target, "drafter": args.drafter, "prompt_id": 0},
        dense_trace=args.dense_trace,
    )
    if args.json:
        print(json.dumps(report.to_dict(with_trees=False)))
        return 0
    if tokenizer is not None:
        print(tokenizer.decode(report.output_ids))
    else:
        print(" ".join(map(str, report.output_ids)))
    stages = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in report.stage_times.items())
    print(
        f"policy {report.policy}: {report.num_output_tokens} tokens in "
        f"{len(report.acceptance_lengths)} steps, τ {report.tau:.2f}, "
        f"TTFT {report.time_to_first_token * 1e3:.2f} ms, "
        f"TPOT {report.time_per_output_token * 1e3:.2f} ms; stages: {stages}"
    )
    return 0
