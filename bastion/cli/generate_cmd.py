"""``bastion generate``: run prompts through a real target (and DFlash drafter), batched.

``--prompt`` / ``--prompt-ids`` may be repeated; up to ``--batch-size`` requests decode together
(continuous batching: a finished request leaves the batch and the next prompt joins after its
prefill). Prints each generated text (or ids) and the step statistics; ``--json`` prints one
JSON object with a ``records`` list (one per prompt: output_ids, committed_per_step, ttft_s,
tpot_s … — the vocabulary of :mod:`bastion.records`) and the aggregates (throughput, repeats). Torch
is imported only when the command runs, so ``bastion --help`` stays light.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bastion.cli import _checks as checks
from bastion.errors import BudgetError, CheckpointError
from bastion.files import check_output_file
from bastion.records import json_safe as _json_safe

#: Most new tokens one request may ask for.
MAX_NEW_TOKENS = 1 << 20


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError as exc:
        raise BudgetError(
            f"--prompt-ids must be integers separated by commas; got {text!r}"
        ) from exc
    if not ids:
        raise BudgetError("--prompt-ids is empty")
    bad = [t for t in ids if not 0 <= t < 2**63]
    if bad:
        raise BudgetError(f"--prompt-ids must be token ids in [0, 2**63); got {bad[0]}")
    return ids


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate with a real target (torch backend)")
    p.add_argument("--target", required=True, help="Hugging Face model directory")
    p.add_argument("--drafter", help="DFlash drafter checkpoint directory (not needed for ar)")
    p.add_argument(
        "--policy",
        default="bastion",
        help="bastion | chain | fixed:N | eagle | ar | package.module:Name[:ARGS] (a plug-in)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt",
        action="append",
        help="prompt text (needs a tokenizer in the target directory); repeat for several",
    )
    src.add_argument(
        "--prompt-ids", action="append", help="prompt token ids, comma separated; repeatable"
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--batch-size", type=int, default=1, help="requests decoded together (continuous batching)"
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--draft-top-k", type=int, default=16, help="candidates kept per position")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument(
        "--repeats", type=int, default=1, help="timed runs of the whole workload (median, spread)"
    )
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up runs first (a few tokens each)"
    )
    p.add_argument(
        "--record-trace",
        metavar="PATH",
        action="append",
        help="write a bastion trace (JSON) here; one per prompt, in prompt order",
    )
    p.add_argument(
        "--dense-trace",
        action="store_true",
        help="with --record-trace: also record the drafter's marginals at every position, so "
        "the simulator can replay any policy",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag in range, before any model is loaded (one-line errors)."""
    for flag, value, least, most in (
        ("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS),
        ("--batch-size", args.batch_size, 1, 4096),
        ("--repeats", args.repeats, 1, 1000),
        ("--warmup", args.warmup, 0, 1000),
        ("--draft-top-k", args.draft_top_k, 1, 2**31 - 1),
        ("--top-k", args.top_k, 0, 2**31 - 1),
    ):
        checks.int_in(flag, value, least, most)
    checks.seed(args.seed)
    checks.float_in("--temperature", args.temperature, 0.0, 1e4)
    checks.float_in("--top-p", args.top_p, 0.0, 1.0, open_low=True)
    n = len(args.prompt or args.prompt_ids)
    traces = args.record_trace or []
    if traces and len(traces) != n:
        raise BudgetError(
            f"{len(traces)} --record-trace paths for {n} prompts; give one per prompt"
        )
    for t in traces:
        check_output_file(t, "--record-trace")
    if args.dense_trace and not traces:
        raise BudgetError("--dense-trace needs --record-trace PATH")


def run(args: argparse.Namespace) -> int:
    _check_flags(args)
    from bastion.policies import make_policy

    policy = make_policy(args.policy)  # a bad spec or plug-in fails before any model loads
    prompts = [_parse_ids(text) for text in args.prompt_ids] if args.prompt_ids else []
    from bastion.backends.torch import DFlashDrafter, SamplingParams, generate_batch, load_target

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
        prompts = [list(tokenizer(text)["input_ids"]) for text in args.prompt]
        for i, ids in enumerate(prompts):
            if not ids:
                raise BudgetError(f"--prompt number {i + 1} tokenises to nothing")
    drafter = None
    if getattr(policy, "uses_drafter", True):
        if not args.drafter:
            raise BudgetError(f"--policy {args.policy} needs --drafter DIR (only ar runs without)")
        drafter = DFlashDrafter.from_pretrained(args.drafter, target, top_k=args.draft_top_k)
    report = generate_batch(
        target,
        drafter,
        policy,
        prompts,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        record_traces=args.record_trace,
        trace_metadata={"target": args.target, "drafter": args.drafter},
        dense_trace=args.dense_trace,
        repeats=args.repeats,
        warmup=args.warmup,
        policy_spec=args.policy.strip(),
    )
    if args.json:
        print(json.dumps(_json_safe(report.to_dict(with_trees=False))))
        return 0
    for rec in report.records:
        if tokenizer is not None:
            print(tokenizer.decode(rec.output_ids))
        else:
            print(" ".join(map(str, rec.output_ids)))
        stages = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in rec.stage_times.items())
        print(
            f"policy {rec.policy}: {rec.output_len} tokens in "
            f"{len(rec.committed_per_step)} steps, τ {rec.tau:.2f}, "
            f"TTFT {rec.ttft_s * 1e3:.2f} ms, "
            f"TPOT {rec.tpot_s * 1e3:.2f} ms; stages: {stages}"
        )
    d = report.to_dict()
    tpot = d["repeats"]["tpot_s"]
    print(
        f"{len(report.records)} prompts, batch {report.batch_size}: "
        f"{report.tokens} tokens, {report.throughput_tok_s:.1f} tokens/s, "
        f"TPOT median {tpot['median'] * 1e3:.2f} ms (min {tpot['min'] * 1e3:.2f}, "
        f"max {tpot['max'] * 1e3:.2f}) over {len(report.runs)} run(s)"
    )
    return 0
