"""``bastion cost`` (predict verification latency) and ``bastion calibrate`` (fit and store)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bastion.cli import _checks as checks
from bastion.errors import BudgetError, ConfigError
from bastion.files import check_output_dir

#: Bounds of the grids and sizes these commands take (refused above, before any work).
MAX_LIST = 256  # entries in one comma-separated list
MAX_VALUE = 2**24  # a token count, context length or tile
MAX_BATCH = 4096  # requests in one priced pass (`cost --batch`)
MAX_REPEATS = 1000


def int_list(text: str) -> list[int]:
    if text.count(",") > 2 * MAX_LIST:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_LIST} integers, got {text[:80]!r}")
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text[:80]!r}"
        ) from None
    if not values or min(values) < 1 or max(values) > MAX_VALUE or len(values) > MAX_LIST:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_LIST} integers in [1, {MAX_VALUE}], got {text[:80]!r}"
        )
    return values


def _common(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="bundled model name or config.json path")
    p.add_argument("--gpu", required=required, help="hardware profile name or path to a .toml")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
    p.add_argument(
        "--expert-touch", default="saturating", choices=["saturating", "uniform"], help="MoE U(s)"
    )
    p.add_argument("--cache-dir", help="calibration records directory")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cost", help="predicted verification latency and its breakdown")
    _common(p)
    p.add_argument("--tokens", type=int_list, default=[1, 16, 64, 256], help="e.g. 1,16,64")
    p.add_argument("--context", type=int, default=1024, help="tokens already cached")
    p.add_argument("--batch", type=int, default=1, help="requests in the pass (same s, c)")
    p.add_argument(
        "--cost-model",
        "--mode",  # the earlier name
        dest="mode",
        default="bare",
        choices=["bare", "static"],
        help="static: use a calibration record",
    )
    p.add_argument("--backend", default="synthetic", help="calibration record's backend")
    p.add_argument("--no-drafter", action="store_true", help="leave out the DFlash drafter")
    p.add_argument("--json", action="store_true", help="one JSON record per token count")
    p.set_defaults(func=_cost)

    p = subparsers.add_parser(
        "calibrate",
        help="profile a backend over a grid and fit",
        description="Either --model and --gpu with a --backend (sim, synthetic), or --target DIR "
        "--device cpu|cuda to time real verification passes of a Hugging Face model (--gpu names "
        "the GPU's profile; on a CPU this machine is probed once).",
    )
    _common(p, required=False)
    p.add_argument("--target", help="Hugging Face model directory: calibrate on the real device")
    p.add_argument("--device", default="cpu", help="with --target: cpu | cuda | cuda:N")
    p.add_argument("--backend", default="synthetic", help="verification backend to time")
    p.add_argument("--tokens", type=int_list, help="token grid (default: the paper's 14)")
    p.add_argument("--contexts", type=int_list, help="context grid (default: 64,256,1024)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiles", type=int_list, default=None, help="tile candidates, e.g. 64,128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--refit", action="store_true", help="ignore a stored record")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_calibrate)


def _options(args: argparse.Namespace) -> Any:
    from bastion.cost.opcounts import RooflineOptions

    return RooflineOptions(dtype=args.dtype, expert_touch=args.expert_touch)


def _cost(args: argparse.Namespace) -> int:
    from bastion.bestfirst import MAX_TREE_SIZE
    from bastion.cost.calibration import CalibrationCache, calibration_key
    from bastion.cost.costmodel import RooflineCostModel
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model
    from bastion.interfaces import RequestLoad, StepLoad

    checks.int_in("--batch", args.batch, 1, MAX_BATCH)
    checks.int_in("--context", args.context, 0, MAX_VALUE)
    if max(args.tokens) > MAX_TREE_SIZE:
        raise BudgetError(f"--tokens must be ≤ MAX_TREE_SIZE = {MAX_TREE_SIZE}; got {args.tokens}")
    hw = get_profile(args.gpu)
    model = get_model(args.model)
    record = None
    if args.mode == "static":
        cache = CalibrationCache(args.cache_dir)
        key = calibration_key(hw, model, args.dtype, args.backend)
        record = cache.load(key)
        if record is None:
            raise ConfigError(
                f"no calibration stored for {key} in {cache.directory}; run `bastion calibrate`"
            )
    drafter = None if args.no_drafter else DrafterSpec.dflash_for(model)
    cm = RooflineCostModel(
        hw, model, drafter=drafter, calibration=record, mode=args.mode, options=_options(args),
        context_bucket=1,
    )  # fmt: skip
    records = []
    for s in args.tokens:
        load = StepLoad(
            args.context, tuple(RequestLoad(s, args.context) for _ in range(args.batch - 1))
        )
        step = cm.step_cost(s, load)
        rb = cm.roofline(s, load)
        records.append(
            {
                "model": model.name,
                "gpu": hw.name,
                "mode": args.mode,
                "tokens": s,
                "context": args.context,
                "batch": args.batch,
                "total_s": step.verify_s,
                "draft_s": step.draft_s,
                "prep_s": step.prep_s,
                "cycle_s": step.total_s,
                "branches": {
                    "compute_s": float(rb.compute_s),
                    "memory_s": float(rb.memory_s),
                    "launch_s": rb.launch_s,
                },
                "breakdown": rb.to_records(),
            }
        )
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    print(f"{model.name} on {hw.name}, context {args.context}, batch {args.batch}, {args.mode}")
    print(f"{'tokens':>7} {'verify ms':>10} {'draft ms':>9} {'compute ms':>11} {'memory ms':>10}"
          f"  top operators")  # fmt: skip
    for r in records:
        ops = sorted(r["breakdown"], key=lambda o: -float(o["time_s"]))[:3]
        top = ", ".join(f"{o['op']} {float(o['time_s']) * 1e3:.2f}" for o in ops)
        print(
            f"{r['tokens']:>7} {r['total_s'] * 1e3:>10.3f} {r['draft_s'] * 1e3:>9.3f} "
            f"{r['branches']['compute_s'] * 1e3:>11.3f} {r['branches']['memory_s'] * 1e3:>10.3f}"
            f"  {top}"
        )
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from bastion.cost.backends import get_backend
    from bastion.cost.calibration import (
        DEFAULT_CONTEXTS,
        DEFAULT_TOKENS,
        CalibrationCache,
        calibrate_or_load,
    )
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import get_model

    checks.seed(args.seed)
    checks.int_in("--repeats", args.repeats, 1, MAX_REPEATS)
    if args.tiles and max(args.tiles) > 2**16:
        raise BudgetError(f"--tiles must be ≤ {2**16} tokens; got {args.tiles}")
    cache = CalibrationCache(args.cache_dir)
    check_output_dir(cache.directory, "--cache-dir")  # the record is written after the sweep
    if args.target:
        from bastion.backends.torch import load_target
        from bastion.backends.torch.calibrate import calibrate_target

        target = load_target(args.target, args.device)
        record, _, _ = calibrate_target(
            target,
            gpu=args.gpu,
            cache=cache,
            refit=args.refit,
            tokens=args.tokens or DEFAULT_TOKENS,
            contexts=args.contexts or DEFAULT_CONTEXTS,
            repeats=args.repeats,
        )
        return _print_record(args, cache, record)
    if not args.model or not args.gpu:
        raise ConfigError("calibrate needs --model and --gpu (or --target DIR for a real model)")
    hw = get_profile(args.gpu)
    model = get_model(args.model)
    verify = get_backend(args.backend)(model, hw, args.seed)
    record = calibrate_or_load(
        model,
        hw,
        verify,
        backend=args.backend,
        dtype=args.dtype,
        cache=cache,
        refit=args.refit,
        sweep_kwargs={
            "tokens": args.tokens or DEFAULT_TOKENS,
            "contexts": args.contexts or DEFAULT_CONTEXTS,
            "repeats": args.repeats,
        },
        options=_options(args),
        tile_candidates=tuple(args.tiles) if args.tiles else (0, 64, 128),
    )
    return _print_record(args, cache, record)


def _print_record(args: argparse.Namespace, cache: Any, record: Any) -> int:
    path = cache.path_for(record.key)
    if args.json:
        print(json.dumps({"path": str(path), **record.to_dict()}, indent=2))
        return 0
    cal = record.calibration
    print(f"calibration {path}")
    print(f"  points {len(record.points)}, tile {cal.tile_tokens or 'off'}")
    print(f"  compute: {cal.compute.alpha:.4f}·R_c + {cal.compute.beta * 1e3:.4f} ms")
    print(f"  memory:  {cal.memory.alpha:.4f}·R_m + {cal.memory.beta * 1e3:.4f} ms")
    print(
        f"  RMSE bare {record.rmse_bare_s * 1e3:.3f} ms -> calibrated "
        f"{record.rmse_calibrated_s * 1e3:.3f} ms (in-sample)"
    )
    print(
        f"  cross-validated error (leave-one-out, held-out points): "
        f"{record.cv_mape:.1%} mean, {record.cv_max_error:.1%} max"
    )
    return 0
