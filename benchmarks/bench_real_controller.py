"""The learning controller on the real backend (the shipped CPU demo pair), against AR.

The machine's speed drifts by several per cent within a minute, so one run per policy (what
`bastion demo` prints) cannot tell a 3 % difference. Here the policies run in alternation,
``--rounds`` times, on the same held-out prompts (batch 1, T = 0), and the report is the median
over rounds of each policy's TPOT over AR's TPOT *in the same round*, with a bootstrap 90 %
interval of that median (2000 resamples of the rounds, seeded). AR and ``bastion`` run next to
each other, in the order AB in even rounds and BA in odd ones, so a drift within a round
favours neither; the other policies follow. The cost model is
calibrated on this CPU once (roofline + drafter timing), the learning controller's start-up
table timed once (``calibrate_cycles_on_device``), and one learner is kept across the rounds
(what a server does); its first round includes an untimed warm-up run. ``--fresh``: instead,
every round's ``bastion`` run starts from a new learner, with its own start-up timing and
warm-up run — what one ``bastion demo`` invocation does, so the cost of learning from scratch
(the drafted steps that gather evidence, the first probes) is in every round.

Run: ``python benchmarks/bench_real_controller.py [--rounds 8] [--prompts 4] [--tokens 64]
[--fresh]``.
Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import random
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
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="every round's bastion run starts from a new learner (as `bastion demo` does)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.prompts < 1 or args.tokens < 1:
        parser.error("--rounds, --prompts and --tokens must be ≥ 1")
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

    host: dict[str, list[float]] = {}  # per policy and round: draft + build stages, µs/step

    def tpot(policy: str, warmup: int) -> float:
        model = learner if policy == "bastion" else cost
        if policy == "bastion" and args.fresh:  # learning from scratch, as `bastion demo` does
            model = LearnedCostModel(cost)
            calibrate_cycles_on_device(model, target, drafter)
            warmup = 1
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
        stages = report.stage_times
        host.setdefault(policy, []).append(1e6 * (stages["draft"] + stages["build"]) / report.steps)
        return float(report.to_dict()["repeats"]["tpot_s"]["median"])

    ratios: dict[str, list[float]] = {p: [] for p in POLICIES}
    ar_ms = []
    others = [p for p in POLICIES if p != "bastion"]
    for r in range(args.rounds):
        times: dict[str, float] = {}
        for p in ("ar", "bastion") if r % 2 == 0 else ("bastion", "ar"):
            times[p] = tpot(p, 1 if r == 0 and p != "ar" else 0)
        for p in others:
            times[p] = tpot(p, 1 if r == 0 else 0)
        ar_ms.append(1e3 * times["ar"])
        for p in POLICIES:
            ratios[p].append(times[p] / times["ar"])
    print(
        f"`python benchmarks/bench_real_controller.py --rounds {args.rounds} --prompts "
        f"{args.prompts} --tokens {args.tokens}{' --fresh' if args.fresh else ''}` on "
        f"{platform.machine()}, Python "
        f"{platform.python_version()}; start-up: {startup['passes']} passes, "
        f"{startup['device_s']:.2f} s; AR TPOT median {statistics.median(ar_ms):.2f} ms\n"
    )
    print(
        "| policy | TPOT / AR's in the same round, median | 90 % interval | min | max | "
        "draft + build µs/step |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for p, xs in {"ar": [1.0] * args.rounds, **ratios}.items():
        lo, hi = median_interval(xs)
        print(
            f"| {p} | {statistics.median(xs):.3f} | {lo:.3f}–{hi:.3f} | {min(xs):.3f} | "
            f"{max(xs):.3f} | {statistics.median(host[p]):.1f} |"
        )
    print(
        "\ndraft + build: the engine's stages before the verify pass, per step, median over "
        "rounds (planning, the draft pass, the policy's choice; for `bastion` on its AR steps, "
        "the controller's time before the pass; its observe_step after the pass is not in it)"
    )


def median_interval(
    xs: list[float], level: float = 0.90, resamples: int = 2000
) -> tuple[float, float]:
    """A percentile-bootstrap interval of the median of ``xs`` (seeded: the same rounds give
    the same interval)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    tail = (1.0 - level) / 2
    return meds[int(tail * resamples)], meds[min(resamples - 1, int((1 - tail) * resamples))]


if __name__ == "__main__":
    main()
