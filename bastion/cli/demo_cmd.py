"""``bastion train target|drafter`` and ``bastion demo``: the shipped CPU pair.

``bastion demo`` runs target-only AR, the DFlash chain, fixed-N best-first and Bastion's adaptive
controller on held-out prompts with the trained pair shipped in the package, at each
``--batch-size`` (continuous batching), checks that their outputs are identical at T = 0, and
prints τ, mean tree size, time per output token (median and spread over ``--repeats`` timed runs
after ``--warmup`` untimed ones), throughput, and the cost model's predicted vs measured cycle.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from bastion.cli import _checks as checks
from bastion.errors import BudgetError, ConfigError
from bastion.files import check_output_dir

MAX_BATCH = 4096  # requests decoded together
MAX_STEPS = 10_000_000  # optimizer steps of `bastion train`


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"this command runs real models and needs PyTorch and transformers ({exc}); "
            "install them with: pip install torch==2.13.0 'bastion[torch]'"
        ) from exc


def _say(enabled: bool):  # type: ignore[no-untyped-def]
    return (lambda msg: print(f"  {msg} …", file=sys.stderr, flush=True)) if enabled else None


def _batch_sizes(groups: list[str]) -> tuple[int, ...]:
    sizes = []
    for text in (x for g in groups for x in g.split(",") if x.strip()):
        try:
            b = int(text)
        except ValueError:
            raise BudgetError(
                f"--batch-size takes integers ≥ 1 (e.g. 1,2,4,8); got {text!r}"
            ) from None
        if b < 1:
            raise BudgetError(f"--batch-size must be ≥ 1; got {b}")
        if b > MAX_BATCH:
            raise BudgetError(f"--batch-size must be ≤ {MAX_BATCH}; got {b}")
        if b not in sizes:
            sizes.append(b)
    if groups and not sizes:
        raise BudgetError(f"--batch-size lists no size ({groups!r}); e.g. 1,2,4,8")
    return tuple(sizes) or (1,)


def run_demo_cmd(args: argparse.Namespace) -> int:
    sizes = _batch_sizes(args.batch_size)
    for flag, value, least, most in (
        ("--num-prompts", args.prompts, 1, None),
        ("--max-new-tokens", args.max_new_tokens, 1, 1 << 20),
        ("--repeats", args.repeats, 1, 1000),
        ("--warmup", args.warmup, 0, 1000),
    ):
        checks.int_in(flag, value, least, most)
    if args.record_traces:
        check_output_dir(args.record_traces, "--record-trace")
    from bastion.demo.run import DEMO_POLICIES  # torch-free at import
    from bastion.policies import policy_labels, split_policy_specs

    policies = tuple(p for group in args.policy for p in split_policy_specs(group))
    if args.policy and not policies:
        raise BudgetError(f"--policy lists no policy ({args.policy!r}); e.g. ar,chain,bastion")
    policies = policies or DEMO_POLICIES
    if policies[0] != "ar":
        policies = ("ar", *[p for p in policies if p != "ar"])
    policy_labels(policies)  # an unknown, malformed or repeated spec fails here, before loading
    _need_torch()
    from bastion.demo.run import load_prompts, run_demo

    shipped = load_prompts()
    if args.prompts > len(shipped):
        raise BudgetError(f"--num-prompts must be ≤ {len(shipped)} (the shipped held-out prompts)")
    prompts = shipped[: args.prompts]
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and not args.json)
    from bastion.demo import get_pair

    pair = get_pair(args.pair)
    pair.require_installed()
    result = run_demo(
        prompts,
        target_dir=pair.target,
        drafter_dir=pair.drafter,
        max_new_tokens=args.max_new_tokens,
        policies=policies,
        calibrate=not args.no_calibration,
        record_dir=Path(args.record_traces) if args.record_traces else None,
        progress=_say(show),
        batch_sizes=sizes,
        repeats=args.repeats,
        warmup=args.warmup,
        dtype=args.dtype,
        linears=args.linears,
    )
    # bf16 sums depend on the pass's shape: near-ties may decode differently, so a difference
    # there is the precision's, not a lossless violation (float32 is the lossless check)
    tolerated = args.dtype != "float32"
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0 if result.identical or tolerated else 1
    print(
        f"the {pair.name} pair in {args.dtype}; "
        f"{len(prompts)} held-out prompts × {args.max_new_tokens} new tokens, T = 0, CPU; "
        f"{args.repeats} timed run(s) after {args.warmup} warm-up run(s), the policies in "
        "lockstep; TPOT: the median over every run's requests, and the runs' mean TPOTs"
    )
    if result.calibration:
        c = result.calibration
        print(
            f"cost model calibrated on this CPU ({int(c['points'])} points): RMSE "
            f"{c['rmse_bare_s'] * 1e3:.3f} ms bare → {c['rmse_calibrated_s'] * 1e3:.3f} ms; "
            f"T_draft = {c['draft_d0_s'] * 1e3:.2f} + {c['draft_d_batch_s'] * 1e3:.3f}·B + "
            f"{c['draft_d_context_s'] * 1e6:.3f}e-3·ΣC ms"
        )
    print(
        f"{'policy':<10} {'B':>3} {'τ':>6} {'mean N':>7} {'TPOT ms':>8} {'runs: min–max':>13} "
        f"{'tok/s':>7} {'speedup':>8} {'Ĉ pred ms':>10} {'cycle ms':>9}"
    )
    for r in result.rows:
        spread = f"{r.tpot_min_s * 1e3:.2f}–{r.tpot_max_s * 1e3:.2f}"
        print(
            f"{r.policy:<10} {r.batch_size:>3} {r.tau:>6.2f} {r.mean_tree_size:>7.1f} "
            f"{r.tpot_p50_s * 1e3:>8.2f} {spread:>13} {r.throughput_tok_s:>7.1f} "
            f"{r.speedup:>7.2f}× {r.cycle_predicted_s * 1e3:>10.2f} "
            f"{r.cycle_observed_s * 1e3:>9.2f}"
        )
    if result.identical:
        verdict = "identical"
    elif tolerated:
        verdict = (
            f"different on some prompts — expected in {args.dtype}, whose sums depend on the "
            "pass's shape (AR's own output changes with the batch size); --dtype float32 is "
            "the lossless check"
        )
    else:
        verdict = "DIFFERENT — losslessness violated"
    print(f"outputs of all policies vs AR: {verdict}")
    return 0 if result.identical or tolerated else 1


def run_train(args: argparse.Namespace) -> int:
    checks.int_in("--steps", args.steps, 1, MAX_STEPS)
    checks.seed(args.seed)
    _need_torch()
    from bastion.demo import get_pair
    from bastion.demo.train import (
        DRAFTER_PRESETS,
        TARGET_PRESETS,
        train_drafter,
        train_target,
    )

    pair = get_pair(args.pair)
    out = Path(args.out) if args.out else (pair.target if args.what == "target" else pair.drafter)
    check_output_dir(out, "--out")  # before training, not after it
    if out.exists() and any(out.iterdir()) and not args.force:
        raise ConfigError(f"{out} is not empty; pass --force to overwrite or --out DIR")
    # the model is written to a sibling directory and renamed into place: a kill during
    # training or saving leaves the old model (or nothing), never a half-written one
    if args.what == "target":
        cfg = replace(TARGET_PRESETS[args.pair], seed=args.seed)
        cfg = replace(cfg, steps=args.steps) if args.steps is not None else cfg
        report = train_target(out, cfg, progress=args.progress)
    else:
        target = Path(args.target) if args.target else pair.target
        if not (target / "config.json").is_file():
            raise ConfigError(f"--target {target} lacks config.json (a trained demo target)")
        dcfg = replace(DRAFTER_PRESETS[args.pair], seed=args.seed)
        dcfg = replace(dcfg, steps=args.steps) if args.steps is not None else dcfg
        report = train_drafter(target, out, dcfg, progress=args.progress)
    print(json.dumps(report, indent=2))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="the real pipeline on CPU with the shipped trained pair (needs bastion[torch])",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--num-prompts",
        "--prompts",  # the earlier name
        dest="prompts",
        type=int,
        default=4,
        help="how many held-out prompts to decode",
    )
    p.add_argument(
        "--pair",
        choices=("small", "base"),
        default="base",
        help="the shipped pair: base (a target beyond the CPU's cache; default) or small",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--policy", action="append", default=[], help="default: ar,chain,fixed:32,bastion"
    )
    p.add_argument(
        "--batch-size",
        action="append",
        default=[],
        help="requests decoded together; a list (1,2,4,8) runs each; default 1",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="timed runs per policy and batch size (lockstep)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs before timing")
    p.add_argument("--no-calibration", action="store_true", help="skip the CPU calibration")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the models' precision (default float32, where every policy's output equals AR's; "
        "bfloat16 is faster on CPUs with bf16 matrix instructions but not batch-invariant)",
    )
    p.add_argument(
        "--linears",
        choices=("auto", "stream", "torch"),
        default="auto",
        help="the matrix products: auto (default) streams fp32 weights with Bastion's "
        "batch-invariant CPU kernel where the CPU has AVX-512 or AVX2; torch keeps PyTorch's",
    )
    p.add_argument(
        "--record-trace",
        "--record-traces",  # the earlier name
        dest="record_traces",
        metavar="DIR",
        help="write dense traces of every run into this directory",
    )
    p.add_argument("--json", action="store_true", help="one record per policy and `identical`")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.set_defaults(func=run_demo_cmd)

    t = sub.add_parser("train", help="train the demo target or drafter on CPU (deterministic)")
    t.add_argument("what", choices=("target", "drafter"))
    t.add_argument("--out", help="output directory (default: the package's demo models)")
    t.add_argument("--target", help="with drafter: the target directory (default: shipped)")
    t.add_argument(
        "--pair",
        choices=("small", "base"),
        default="small",
        help="which shipped pair's recipe to train (default: small)",
    )
    t.add_argument("--steps", type=int, help="optimizer steps (default: the pair's recipe)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    t.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="a progress bar"
    )
    t.add_argument("--quiet", dest="progress", action="store_false", help=argparse.SUPPRESS)
    t.set_defaults(func=run_train)
