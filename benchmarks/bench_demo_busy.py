"""Does the learning controller follow the machine when it gets busy, and back?

The shipped CPU demo pair decodes the held-out prompts (batch 1, T = 0) with AR, two fixed
trees, the paper's controller and ``bastion``, in lockstep (``generate_lockstep``), in three
phases: quiet, busy (``--busy`` processes spinning on the CPU, started before the phase's timed
runs and stopped after them), quiet again. One learner is kept through the phases, as in a
server; only the first phase has a warm-up run. Per phase: each policy's median TPOT over the
requests of its ``--repeats`` timed runs, and ``bastion``'s over the fastest other policy's.
On this repository's 2-core machine a busy core slows AR's small steps more than the drafted
ones, so speculation may win while the machine is busy, and AR when it is quiet.

Run: ``python benchmarks/bench_demo_busy.py [--busy 1] [--repeats 4] [--prompts 8]
[--tokens 96]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import statistics

from bastion.backends.torch import DFlashDrafter, load_target
from bastion.backends.torch.calibrate import (
    calibrate_cycles_on_device,
    calibrate_drafter,
    calibrate_target,
)
from bastion.backends.torch.lockstep import Contender, generate_lockstep
from bastion.backends.torch.timing import with_draft_timing
from bastion.cost.costmodel import RooflineCostModel
from bastion.demo import DRAFTER_DIR, TARGET_DIR
from bastion.demo.run import CALIBRATION_CONTEXTS, CALIBRATION_TOKENS, load_prompts
from bastion.learned import LearnedCostModel

POLICIES = ("ar", "fixed:16", "fixed:32", "bastion:paper", "bastion")


def _spin() -> None:  # pragma: no cover - a child process that only burns CPU
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="spinning processes while busy")
    parser.add_argument("--repeats", type=int, default=4, help="timed runs per phase")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    if args.busy < 1 or args.repeats < 1 or args.prompts < 1 or args.tokens < 1:
        parser.error("--busy, --repeats, --prompts and --tokens must be ≥ 1")
    from transformers import AutoTokenizer

    target = load_target(TARGET_DIR, "cpu")
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    prompts = [list(tok(t)["input_ids"]) for t in load_prompts()[: args.prompts]]
    eos = int(tok.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[arg-type]
    drafters = {
        p: None if p == "ar" else DFlashDrafter.from_pretrained(DRAFTER_DIR, target)
        for p in POLICIES
    }
    record, hw, spec = calibrate_target(
        target, tokens=CALIBRATION_TOKENS, contexts=CALIBRATION_CONTEXTS, repeats=3
    )
    probe = drafters["fixed:16"]
    assert probe is not None
    cost = with_draft_timing(
        RooflineCostModel(hw, spec, calibration=record), calibrate_drafter(target, probe)
    )
    learner = LearnedCostModel(cost)
    calibrate_cycles_on_device(learner, target, probe)
    models = {"bastion": learner, "bastion:paper": cost}
    print(
        f"`python benchmarks/bench_demo_busy.py --busy {args.busy} --repeats {args.repeats} "
        f"--prompts {args.prompts} --tokens {args.tokens}` on {platform.machine()}, "
        f"{multiprocessing.cpu_count()} CPUs\n"
    )
    print("| phase | " + " | ".join(POLICIES) + " | bastion τ | bastion / fastest other |")
    print("|---|" + "---:|" * (len(POLICIES) + 2))
    for phase, busy in (("quiet", 0), ("busy", args.busy), ("quiet again", 0)):
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
        for s in spinners:
            s.start()
        try:
            reports = generate_lockstep(
                target,
                [Contender(p, drafters[p], models.get(p), predict_cycles=cost) for p in POLICIES],
                prompts,
                max_new_tokens=args.tokens,
                eos_token_id=eos,
                repeats=args.repeats,
                warmup=1 if phase == "quiet" else 0,
            )
        finally:
            for s in spinners:
                s.terminate()
                s.join()
        tpot = {p: r.latency()["tpot_p50_s"] for p, r in zip(POLICIES, reports, strict=True)}
        fastest = min(tpot[p] for p in POLICIES if p != "bastion")
        tau = statistics.mean(r.tau for r in reports[-1].records)
        print(
            f"| {phase} | "
            + " | ".join(f"{tpot[p] * 1e3:.2f}" for p in POLICIES)
            + f" | {tau:.2f} | {tpot['bastion'] / fastest:.3f} |"
        )
    print(
        "\nmedian TPOT over the requests of the phase's timed runs, ms; bastion τ: its first "
        "timed run of the phase"
    )


if __name__ == "__main__":
    main()
