"""The learning controller with and without the batch-1 restart of its evidence, in lockstep.

At batch 1 a new request restarts the controller's evidence while AR stands
(:meth:`bastion.learned_evidence.StepEvidence.wants_draft_for`). Here AR, fixed:16 and
`bastion` twice — once as shipped, once with a learner whose ``wants_draft_for`` is its plain
``wants_draft`` (the rule before the restart) — decode the held-out prompts in one lockstep run
(one learner each, copied from the same start-up table). Printed per contender: the median TPOT
over every request of every run and its speedup over AR's, and the runs' mean TPOTs with the
median over runs of their ratio to AR's in the same run.

Run: ``python benchmarks/bench_controller_restart.py [--pair base] [--batch-size 1]
[--repeats 4] [--dtype float32]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _demo_pair import load_demo_pair  # type: ignore[import-not-found]

from bastion.demo import DEFAULT_PAIR, PAIRS
from bastion.demo.run import DEMO_DTYPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--dtype", choices=DEMO_DTYPES, default="float32")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    if not 1 <= args.prompts <= 64 or not 1 <= args.repeats <= 100 or args.batch_size < 1:
        parser.error("--prompts 1–64, --repeats 1–100, --batch-size ≥ 1")

    from bastion.backends.torch import DFlashDrafter
    from bastion.backends.torch.lockstep import Contender, generate_lockstep
    from bastion.demo.run import calibrated_beliefs

    pair, target, prompts, eos = load_demo_pair(args.pair, args.dtype, args.prompts)

    def drafter() -> DFlashDrafter:
        return DFlashDrafter.from_pretrained(pair.drafter, target)

    cost, learned, _ = calibrated_beliefs(target, drafter(), ["bastion"], True)
    before = learned.copy()
    before.wants_draft_for = lambda ids: before.wants_draft(int(ids.shape[0]))  # type: ignore[method-assign]
    names = ["ar", "fixed:16", "bastion", "bastion (no restart)"]
    contenders = [
        Contender("ar"),
        Contender("fixed:16", drafter()),
        Contender("bastion", drafter(), learned.copy(), predict_cycles=cost),
        Contender("bastion", drafter(), before, predict_cycles=cost),
    ]
    reports = generate_lockstep(
        target,
        contenders,
        prompts,
        batch_size=args.batch_size,
        max_new_tokens=96,
        eos_token_id=eos,
        repeats=args.repeats,
        warmup=1,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    ar = reports[0]
    ar_p50 = ar.latency()["tpot_p50_s"]
    print(
        f"# pair {pair.name} in {args.dtype}, B = {args.batch_size}, {len(prompts)} prompts × 96, "
        f"{args.repeats} timed runs in lockstep"
    )
    print("| policy | median TPOT ms | speedup | run means ms | speedup (run means) |")
    print("|---|---:|---:|---|---:|")
    for name, rep in zip(names, reports, strict=True):
        p50 = rep.latency()["tpot_p50_s"]
        means = [r.tpot_s for r in rep.runs]
        ratio = statistics.median(
            a.tpot_s / r.tpot_s for a, r in zip(ar.runs, rep.runs, strict=True)
        )
        print(
            f"| {name} | {p50 * 1e3:.2f} | {ar_p50 / p50:.3f}× | "
            f"{', '.join(f'{m * 1e3:.2f}' for m in means)} | {ratio:.3f}× |"
        )


if __name__ == "__main__":
    main()
