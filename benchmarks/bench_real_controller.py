"""The learning controller on the real backend (the shipped CPU demo pair), against AR.

The machine's speed drifts by several per cent within a minute, so one run per policy (what
`bastion demo` prints) cannot tell a 3 % difference. Here the policies run in alternation,
``--rounds`` times, on the same held-out prompts (batch 1, T = 0), and the report is the median
over rounds of each policy's TPOT over AR's TPOT *in the same round*. The cost model is
calibrated on this CPU once (roofline + drafter timing), the learning controller's start-up
table timed once (``calibrate_cycles_on_device``), and one learner is kept across the rounds
(what a server does); its first round includes an untimed warm-up run.

Run: ``python benchmarks/bench_real_controller.py [--rounds 8] [--prompts 4] [--tokens 64]``.
Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics

from bastion.backends.torch import DFlashDrafter, generate_batch, load_target
from bastion.backends.torch.calibrate import (
    calibrate_cycles_on_device,
    calibrate_drafter,
    calibrate_target,
)
from bastion.backends.torch.timing import with_draft_timing
from bastion.cost.costmodel import RooflineCostModel
from bastion.demo import DRAFTER_DIR, TARGET_DIR
from bastion.demo.run import CALIBRATION_CONTEXTS, CALIBRATION_TOKENS, load_prompts
from bastion.learned import LearnedCostModel

POLICIES = ("fixed:16", "bastion:paper", "bastion")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    target = load_target(TARGET_DIR, "cpu")
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    drafter = DFlashDrafter.from_pretrained(DRAFTER_DIR, target)
    prompts = [list(tok(t)["input_ids"]) for t in load_prompts()[: args.prompts]]
    eos = int(tok.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[arg-type]
    record, hw, spec = calibrate_target(
        target, tokens=CALIBRATION_TOKENS, contexts=CALIBRATION_CONTEXTS, repeats=3
    )
    cost = with_draft_timing(
        RooflineCostModel(hw, spec, calibration=record), calibrate_drafter(target, drafter)
    )
    learner = LearnedCostModel(cost)
    startup = calibrate_cycles_on_device(learner, target, drafter)

    def tpot(policy: str, warmup: int) -> float:
        model = learner if policy == "bastion" else cost
        report = generate_batch(
            target,
            None if policy == "ar" else drafter,
            policy,
            prompts,
            max_new_tokens=args.tokens,
            eos_token_id=eos,
            cost_model=model if policy.startswith("bastion") else None,
            warmup=warmup,
        )
        return float(report.to_dict()["repeats"]["tpot_s"]["median"])

    ratios: dict[str, list[float]] = {p: [] for p in POLICIES}
    ar_ms = []
    for r in range(args.rounds):
        ar = tpot("ar", 0)
        ar_ms.append(1e3 * ar)
        for p in POLICIES:
            ratios[p].append(tpot(p, 1 if r == 0 else 0) / ar)
    print(
        f"`python benchmarks/bench_real_controller.py --rounds {args.rounds} --prompts "
        f"{args.prompts} --tokens {args.tokens}` on {platform.machine()}, Python "
        f"{platform.python_version()}; start-up: {startup['passes']} passes, "
        f"{startup['device_s']:.2f} s; AR TPOT median {statistics.median(ar_ms):.2f} ms\n"
    )
    print("| policy | TPOT / AR's in the same round, median | min | max |")
    print("|---|---:|---:|---:|")
    for p, xs in ratios.items():
        print(f"| {p} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} |")


if __name__ == "__main__":
    main()
