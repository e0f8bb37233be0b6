"""``bastion train target|drafter`` and ``bastion demo``: the shipped CPU pair.

``bastion demo`` runs target-only AR, the DFlash chain, fixed-N best-first and Bastion's adaptive
controller on held-out prompts with the trained pair shipped in the package, checks that their
outputs are identical at T = 0, and prints τ, mean tree size and time per output token.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from bastion.errors import ConfigError


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


def run_demo_cmd(args: argparse.Namespace) -> int:
    _need_torch()
    from bastion.demo.run import DEMO_POLICIES, load_prompts, run_demo

    prompts = load_prompts()[: args.prompts]
    policies = tuple(p for group in args.policy for p in group.split(",") if p) or DEMO_POLICIES
    if policies[0] != "ar":
        policies = ("ar", *[p for p in policies if p != "ar"])
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and not args.json)
    result = run_demo(
        prompts,
        max_new_tokens=args.max_new_tokens,
        policies=policies,
        calibrate=not args.no_calibration,
        record_dir=Path(args.record_traces) if args.record_traces else None,
        progress=_say(show),
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0 if result.identical else 1
    print(f"{len(prompts)} held-out prompts × {args.max_new_tokens} new tokens, T = 0, CPU")
    if result.calibration:
        c = result.calibration
        print(
            f"cost model calibrated on this CPU ({int(c['points'])} points): RMSE "
            f"{c['rmse_bare_s'] * 1e3:.3f} ms bare → {c['rmse_calibrated_s'] * 1e3:.3f} ms"
        )
    print(f"{'policy':<10} {'τ':>6} {'mean N':>7} {'TPOT ms':>8} {'speedup':>8}")
    for r in result.rows:
        print(
            f"{r.policy:<10} {r.tau:>6.2f} {r.mean_tree_size:>7.1f} {r.tpot_s * 1e3:>8.2f} "
            f"{r.speedup:>7.2f}×"
        )
    verdict = "identical" if result.identical else "DIFFERENT — losslessness violated"
    print(f"outputs of all policies vs AR: {verdict}")
    return 0 if result.identical else 1


def run_train(args: argparse.Namespace) -> int:
    _need_torch()
    from bastion.demo import DRAFTER_DIR, TARGET_DIR
    from bastion.demo.train import DrafterTraining, TargetTraining, train_drafter, train_target

    out = Path(args.out) if args.out else (TARGET_DIR if args.what == "target" else DRAFTER_DIR)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise ConfigError(f"{out} is not empty; pass --force to overwrite or --out DIR")
    if args.what == "target":
        cfg = TargetTraining(seed=args.seed)
        cfg = replace(cfg, steps=args.steps) if args.steps else cfg
        report = train_target(out, cfg, progress=not args.quiet)
    else:
        target = Path(args.target) if args.target else TARGET_DIR
        dcfg = DrafterTraining(seed=args.seed)
        dcfg = replace(dcfg, steps=args.steps) if args.steps else dcfg
        if out.exists() and args.force:
            for f in out.iterdir():
                f.unlink()
            out.rmdir()
        report = train_drafter(target, out, dcfg, progress=not args.quiet)
    print(json.dumps(report, indent=2))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="the real pipeline on CPU with the shipped trained pair (needs bastion[torch])",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts to decode")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--policy", action="append", default=[], help="default: ar,chain,fixed:32,bastion"
    )
    p.add_argument("--no-calibration", action="store_true", help="skip the CPU calibration")
    p.add_argument("--record-traces", metavar="DIR", help="write dense traces of every run here")
    p.add_argument("--json", action="store_true", help="one record per policy and `identical`")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.set_defaults(func=run_demo_cmd)

    t = sub.add_parser("train", help="train the demo target or drafter on CPU (deterministic)")
    t.add_argument("what", choices=("target", "drafter"))
    t.add_argument("--out", help="output directory (default: the package's demo models)")
    t.add_argument("--target", help="with drafter: the target directory (default: shipped)")
    t.add_argument("--steps", type=int, help="optimizer steps (default: 3000)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=run_train)
