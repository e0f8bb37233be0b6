"""The learning controller on the real backend (the shipped CPU demo pair), against AR.

The machine's speed drifts by several per cent within a minute, so one run per policy, one
after another, cannot tell a 3 % difference. Here every policy decodes the same held-out prompts
(batch 1, T = 0) ``--rounds`` times in lockstep (:func:`bastion.backends.torch.generate_lockstep`:
one step at a time, the next step to the policy whose own clock is furthest behind), so a drift
lands on all of them alike. Each round's TPOT of a policy (the median over its requests) is
divided by AR's in the same round; the report is the median over rounds of that ratio with a
bootstrap 90 % interval (2000 seeded resamples of the rounds), and the ratio of the medians over
every request of every round (the statistic of `bastion demo`). The cost model is calibrated on
this CPU once (roofline + drafter timing), the learning controller's start-up table timed once
(``calibrate_cycles_on_device``), and one learner is kept across the rounds (what a server
does); every policy has one untimed warm-up run first. ``--fresh``: instead, every round is its
own lockstep run with a new learner, its own start-up timing and warm-up run — what one
``bastion demo`` invocation does, so the cost of learning from scratch (the drafted steps that
gather evidence, the first probes) is in every round. ``--pinned-ar`` adds a contender that
runs ``bastion`` with a learner that cannot leave AR (``margin`` 10⁶, no probes, evidence from
two drafted steps, in its warm-up): what the learning controller costs when it decodes by AR,
without its probes — its draft + build column is then its steady-state host time before the
pass.

``--where`` lists, round by round, the steps where ``bastion`` drafted (its probes and
evidence steps) with their measured cycles.

Run: ``python benchmarks/bench_real_controller.py [--pair base|small] [--batch-size 1] [--rounds 8]
[--prompts 4] [--tokens 64]
[--fresh] [--pinned-ar] [--where]``.
Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics

from bastion.backends.torch import DFlashDrafter, load_target
from bastion.backends.torch.calibrate import (
    calibrate_cycles_on_device,
    calibrate_drafter,
    calibrate_target,
)
from bastion.backends.torch.lockstep import Contender, generate_lockstep
from bastion.backends.torch.runner import BatchGenerationReport
from bastion.backends.torch.timing import with_draft_timing
from bastion.cost.costmodel import RooflineCostModel
from bastion.demo import DEFAULT_PAIR, PAIRS, get_pair
from bastion.demo.run import CALIBRATION_CONTEXTS, CALIBRATION_TOKENS, load_prompts
from bastion.learned import LearnedCostModel

POLICIES = ("fixed:16", "bastion:paper", "bastion")
PINNED = "bastion, AR pinned"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--batch-size", type=int, default=1, help="requests decoded together")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="every round's bastion run starts from a new learner (as `bastion demo` does)",
    )
    parser.add_argument(
        "--where",
        action="store_true",
        help="also list, round by round, the steps where bastion drafted (step, B, kind, ms)",
    )
    parser.add_argument(
        "--pinned-ar",
        action="store_true",
        help="add bastion with a learner that cannot leave AR (its cost without probes)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.prompts < 1 or args.tokens < 1 or not 1 <= args.batch_size <= 64:
        parser.error("--rounds, --prompts and --tokens must be ≥ 1, --batch-size 1–64")
    pair = get_pair(args.pair)
    pair.require_installed()
    TARGET_DIR, DRAFTER_DIR = pair.target, pair.drafter
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

    contenders = ("ar", *POLICIES, *((PINNED,) if args.pinned_ar else ()))

    def pinned() -> LearnedCostModel:
        """A learner that stands by AR after two drafted steps and never probes."""
        model = LearnedCostModel(cost, margin=1e6, evidence=2, probe_every=10**9)
        calibrate_cycles_on_device(model, target, drafter)
        return model

    def run(learner: LearnedCostModel, repeats: int) -> list[BatchGenerationReport]:
        def models(name: str) -> Contender:
            own = None if name == "ar" else DFlashDrafter.from_pretrained(DRAFTER_DIR, target)
            if name == PINNED:
                return Contender("bastion", own, pinned(), policy_spec=name)
            model = learner if name == "bastion" else cost
            return Contender(name, own, model if name.startswith("bastion") else None)

        return generate_lockstep(
            target,
            [models(p) for p in contenders],
            prompts,
            batch_size=args.batch_size,
            max_new_tokens=args.tokens,
            eos_token_id=eos,
            repeats=repeats,
            warmup=1,
        )

    reports: list[list[BatchGenerationReport]] = []  # per lockstep run, per contender
    if args.fresh:  # learning from scratch every round, as `bastion demo` does
        for _ in range(args.rounds):
            fresh = LearnedCostModel(cost)
            calibrate_cycles_on_device(fresh, target, drafter)
            reports.append(run(fresh, 1))
    else:
        reports.append(run(learner, args.rounds))
    # each round's requests' TPOTs, per policy (a one-token request has none)
    tpots = {
        p: [[x for x in t.request_tpots if x > 0] for rep in reports for t in rep[i].runs]
        for i, p in enumerate(contenders)
    }
    host = {  # draft + build stages, µs per step, per lockstep run's first timed run
        p: [
            1e6 * (r[i].stage_times["draft"] + r[i].stage_times["build"]) / r[i].steps
            for r in reports
        ]
        for i, p in enumerate(contenders)
    }
    ar_ms = [1e3 * statistics.median(xs) for xs in tpots["ar"]]
    ratios = {
        p: [
            statistics.median(xs) / statistics.median(a)
            for xs, a in zip(tpots[p], tpots["ar"], strict=True)
        ]
        for p in contenders
    }
    pooled_ar = statistics.median(x for xs in tpots["ar"] for x in xs)
    pooled = {
        p: statistics.median(x for xs in tpots[p] for x in xs) / pooled_ar for p in contenders
    }
    print(
        f"`python benchmarks/bench_real_controller.py --pair {args.pair} --batch-size "
        f"{args.batch_size} --rounds {args.rounds} --prompts "
        f"{args.prompts} --tokens {args.tokens}{' --fresh' if args.fresh else ''}"
        f"{' --pinned-ar' if args.pinned_ar else ''}{' --where' if args.where else ''}` on "
        f"{platform.machine()}, Python "
        f"{platform.python_version()}; start-up: {startup['passes']} passes, "
        f"{startup['device_s']:.2f} s; AR TPOT median {statistics.median(ar_ms):.2f} ms\n"
    )
    print(
        "| policy | TPOT / AR's in the same round, median | 90 % interval | min | max | "
        "pooled over requests | draft + build µs/step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p, xs in ratios.items():
        lo, hi = median_interval(xs)
        print(
            f"| {p} | {statistics.median(xs):.3f} | {lo:.3f}–{hi:.3f} | {min(xs):.3f} | "
            f"{max(xs):.3f} | {pooled[p]:.3f} | {statistics.median(host[p]):.1f} |"
        )
    if args.where:
        drafted_steps(reports, contenders.index("bastion"))
    print(
        "\ndraft + build: the engine's stages before the verify pass, per step, median over "
        "lockstep runs of each one's first timed round (planning, the draft pass, the policy's "
        "choice; for `bastion` on its AR steps, the controller's time before the pass; its "
        "observe_step after the pass is not in it)"
    )


def drafted_steps(reports: list[list[BatchGenerationReport]], index: int) -> None:
    """Print, per timed round, where contender ``index`` drafted: each drafted step's index in
    its round, batch size, kind and measured cycle (draft + build + verify + the loop's rest),
    beside the round's median AR-step cycle of the same contender."""
    print("\nwhere `bastion` drafted (round: step/B/kind/ms …; its AR steps' median ms)")
    for rep in reports:
        samples = rep[index].samples
        for r in sorted({s.run for s in samples}):
            steps = [s for s in samples if s.run == r]
            ms = [1e3 * (s.draft_s + s.build_s + s.verify_s + s.other_s) for s in steps]
            ar = [m for s, m in zip(steps, ms, strict=True) if s.kind == "ar"]
            drafted = [
                f"{i}/{len(s.sizes)}/{s.kind}/{m:.1f}"
                for i, (s, m) in enumerate(zip(steps, ms, strict=True))
                if s.kind != "ar"
            ]
            median = f"{statistics.median(ar):.2f}" if ar else "–"
            print(f"- round {r + 1}: {' '.join(drafted) or 'none'}; AR steps {median} ms")


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
