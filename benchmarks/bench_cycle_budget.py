"""Why a speculative policy is or is not 1.5× AR on this machine: its cycle, part by part.

A shipped demo pair decodes the held-out prompts at batch 1 with AR and the given speculative
policies, every policy's timed runs in lockstep (:mod:`bastion.backends.torch.lockstep`), and
each step's measured stages are summed per policy. For each policy it prints, as ratios to AR's
own step in the same run:

- τ: tokens delivered per step (output tokens after the first ÷ steps);
- the verify pass (the target's forward over the tree, its mask, acceptance and commit);
- the drafter's pass and the host's work (tree building and the loop outside the stages), and
  their shares of the cycle;
- the speedup that follows (τ ÷ cycle), next to the TPOT speedups;
- what 1.5× would need: τ at this cycle, or the cycle at this τ, or the verify ratio at this τ
  with the drafter and host as measured.

``--dtype bfloat16`` runs the pair in bf16 (its stored precision), where this CPU's
``avx512_bf16`` matrix kernels make a 16-token pass much cheaper beside a 1-token pass than in
fp32. bf16 outputs are not batch-invariant (AR's own output changes with the batch on some
prompts), so the demo runs fp32, the precision in which every policy's output equals AR's.

Run: ``python benchmarks/bench_cycle_budget.py [--pair base] [--policies fixed:8,fixed:16]
[--repeats 3] [--dtype float32|bfloat16]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import sys

import numpy as np
import torch
from _demo_pair import load_demo_pair  # type: ignore[import-not-found]

from bastion.backends.torch.cpu_linear import LINEAR_CHOICES
from bastion.demo import DEFAULT_PAIR, PAIRS
from bastion.demo.run import DEMO_DTYPES
from bastion.errors import ConfigError
from bastion.policies import make_policy

GOAL = 1.5  # the speedup over AR the budget is drawn for


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise ConfigError("--policies: give at least one speculative policy")
    for name in names:
        if name == "ar":
            raise ConfigError("--policies: AR is always run as the baseline; list the others")
        make_policy(name)  # raises the policy's own error on a bad name
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--policies", default="chain,fixed:8,fixed:16,fixed:32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=DEMO_DTYPES, default="float32")
    parser.add_argument(
        "--linears", choices=LINEAR_CHOICES, default="auto", help="CPU products (load_target)"
    )
    args = parser.parse_args()
    if not 1 <= args.prompts <= 64 or args.max_new_tokens < 2 or not 1 <= args.repeats <= 100:
        raise ConfigError("--prompts 1–64, --max-new-tokens ≥ 2, --repeats 1–100")
    policies = ["ar", *_policies(args.policies)]

    from bastion.backends.torch import DFlashDrafter
    from bastion.backends.torch.lockstep import Contender, generate_lockstep

    pair, target, prompts, eos = load_demo_pair(args.pair, args.dtype, args.prompts, args.linears)
    contenders = [
        Contender(p, None if p == "ar" else DFlashDrafter.from_pretrained(pair.drafter, target))
        for p in policies
    ]
    reports = generate_lockstep(
        target,
        contenders,
        prompts,
        batch_size=1,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=eos,
        repeats=args.repeats,
        warmup=1,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; pair {pair.name} in {args.dtype}; "
        f"{len(prompts)} prompts × {args.max_new_tokens} tokens, B = 1, "
        f"{args.repeats} timed runs in lockstep"
    )
    rows = {}
    for name, rep in zip(policies, reports, strict=True):
        samples = rep.samples
        tokens = sum(len(r.output_ids) - 1 for r in rep.records) * len(rep.runs)
        steps = len(samples)
        rows[name] = {
            "tau": tokens / steps,
            "draft": float(np.mean([s.draft_s for s in samples])),
            "verify": float(np.mean([s.verify_s for s in samples])),
            "host": float(np.mean([s.build_s + s.other_s for s in samples])),
            "tpot_mean": float(np.median([r.tpot_s for r in rep.runs])),
            "tpot_p50": float(rep.latency()["tpot_p50_s"]),
        }
    ar = rows["ar"]
    ar_step = ar["draft"] + ar["verify"] + ar["host"]
    print(
        f"AR step {ar_step * 1e3:.2f} ms (verify {ar['verify'] * 1e3:.2f}, host "
        f"{ar['host'] * 1e3:.2f}); τ {ar['tau']:.2f}\n"
    )
    print(
        "| policy | τ | verify ÷ AR step | drafter ÷ AR step | host ÷ AR step | cycle ÷ AR step "
        "| drafter share | host share | τ ÷ cycle | TPOT speedup (run means) | "
        "TPOT speedup (median request) | τ for 1.5× | cycle for 1.5× | verify for 1.5× |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in policies[1:]:
        r = rows[name]
        v, d, h = r["verify"] / ar_step, r["draft"] / ar_step, r["host"] / ar_step
        cycle = v + d + h
        need_tau = GOAL * cycle
        need_cycle = r["tau"] / GOAL
        need_verify = need_cycle - d - h
        print(
            f"| {name} | {r['tau']:.2f} | {v:.2f} | {d:.2f} | {h:.2f} | {cycle:.2f} | "
            f"{d / cycle:.0%} | {h / cycle:.0%} | {r['tau'] / cycle:.2f}× | "
            f"{ar['tpot_mean'] / r['tpot_mean']:.2f}× | {ar['tpot_p50'] / r['tpot_p50']:.2f}× | "
            f"{need_tau:.2f} | {need_cycle:.2f} | "
            + (f"{need_verify:.2f} |" if need_verify > 0 else "impossible |")
        )


if __name__ == "__main__":
    main()
