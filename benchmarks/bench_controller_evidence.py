"""What the learning controller sees, step by step, on a real pair at batch 1.

A shipped demo pair decodes the held-out prompts with `bastion` (the cost model calibrated on
this CPU and the start-up table timed first, as the demo does), ``--runs`` times with one
learner kept across them. Every step the learner is told about is logged: its kind (AR, chain,
tree), nodes, committed tokens, measured cycle, the step's realised speedup over AR (committed
× the paired AR cycle ÷ the cycle, the evidence the controller keeps) and the evidence's mean
after it (:attr:`speedup`; AR stands while it, plus one standard error, is ≤ 1 + margin).

Printed per run: TPOT, the steps by kind with their mean committed tokens, cycle and realised
speedup, and the run's steps as a string (``.`` AR, ``c`` chain, ``T`` tree), where the
stretches of AR between sparse probes are visible. ``--csv FILE`` writes every step.

Run: ``python benchmarks/bench_controller_evidence.py [--pair base] [--dtype bfloat16]
[--runs 2] [--csv steps.csv]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from typing import Any

import numpy as np
from _demo_pair import load_demo_pair  # type: ignore[import-not-found]

from bastion.demo import DEFAULT_PAIR, PAIRS
from bastion.demo.run import DEMO_DTYPES
from bastion.files import write_text_atomic

SYMBOL = {"ar": ".", "chain": "c", "tree": "T"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--dtype", choices=DEMO_DTYPES, default="float32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--csv", metavar="FILE", help="write every step (written atomically)")
    args = parser.parse_args()
    if not 1 <= args.prompts <= 64 or args.max_new_tokens < 2 or not 1 <= args.runs <= 100:
        parser.error("--prompts 1–64, --max-new-tokens ≥ 2, --runs 1–100")

    import bastion.learned_evidence as evidence
    from bastion.backends.torch import DFlashDrafter, generate_batch
    from bastion.demo.run import calibrated_beliefs

    pair, target, prompts, eos = load_demo_pair(args.pair, args.dtype, args.prompts)
    drafter = DFlashDrafter.from_pretrained(pair.drafter, target)
    _, learned, _ = calibrated_beliefs(target, drafter, ["bastion"], True)

    log: list[tuple[Any, ...]] = []
    observe = evidence.StepEvidence.observe_step

    def logged(
        self: Any,
        kind: str,
        contexts: Any,
        trees: Any,
        committed: Any,
        accepted: Any,
        cycle_s: float,
        preparation: str = "topk",
    ) -> None:
        observe(self, kind, contexts, trees, committed, accepted, cycle_s, preparation)
        nodes = 1 if kind == "ar" else int(trees.offsets[-1])
        realised = math.nan if kind == "ar" else self._realised[-1]
        log.append(
            (run, kind, nodes, int(np.add.reduce(committed)), cycle_s, realised, self.speedup)
        )

    evidence.StepEvidence.observe_step = logged  # type: ignore[method-assign]
    rows = ["run,kind,nodes,committed,cycle_s,realised_speedup,evidence_speedup"]
    for run in range(args.runs):
        start = len(log)
        report = generate_batch(
            target,
            DFlashDrafter.from_pretrained(pair.drafter, target),
            "bastion",
            prompts,
            batch_size=1,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=eos,
            cost_model=learned,
        )
        steps = log[start:]
        kinds = Counter(s[1] for s in steps)
        print(f"run {run}: TPOT {report.tpot_s * 1e3:.2f} ms, steps {dict(kinds)}")
        for kind in ("ar", "chain", "tree"):
            mine = [s for s in steps if s[1] == kind]
            if mine:
                real = [s[5] for s in mine if not math.isnan(s[5])]
                print(
                    f"  {kind:<5} {len(mine):>4} steps: nodes {np.median([s[2] for s in mine]):.0f}"
                    f" (median), committed {np.mean([s[3] for s in mine]):.2f}, cycle "
                    f"{np.median([s[4] for s in mine]) * 1e3:.2f} ms (median)"
                    + (f", realised speedup {np.mean(real):.2f}" if real else "")
                )
        print("  " + "".join(SYMBOL[s[1]] for s in steps))
        rows += [",".join(str(x) for x in s) for s in steps]
    if args.csv:
        write_text_atomic(args.csv, "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
