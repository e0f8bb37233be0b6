"""``bastion validate``: the cost model against measured per-operator timings of a GPU."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bastion.cli.cost_cmd import MAX_VALUE, int_list


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate",
        help="bare / transfer / calibrated / profiled error against measured per-operator timings",
        description="Read a per-operator CSV (Vidur- or LLMServingSim-style: num_tokens and "
        "milliseconds per operator), calibrate each operator on --calibrate-on token counts and "
        "report the error of the bare roofline, the calibrated roofline and the profiled "
        "(interpolated) model on every other token count up to --max-tokens; with "
        "--transfer-from, also the kernel-aware model with parameters fitted on other GPUs' "
        "tables only ('transfer').",
    )
    p.add_argument("--measured", required=True, help="CSV of per-operator timings")
    p.add_argument("--format", required=True, choices=["vidur", "llmservingsim"])
    p.add_argument("--model", required=True, help="bundled model name or config.json path")
    p.add_argument("--gpu", required=True, help="hardware profile name or path to a .toml")
    p.add_argument(
        "--calibrate-on",
        type=int_list,
        default=None,
        help="token counts to calibrate on (default 1,16,64,128,256,512,1024)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=1024, help="score token counts up to this (0: all)"
    )
    p.add_argument(
        "--transfer-from",
        default=None,
        metavar="FILE[,FILE...]",
        help="other GPUs' tables (each FILE listed in a datasets.toml beside it, or "
        "FILE@MODEL@GPU): fit the kernel model's efficiency parameters on them and add the "
        "'transfer' mode, which predicts this GPU from them only",
    )
    p.add_argument(
        "--kernel-fit",
        action="store_true",
        help="also the kernel-aware model with its parameters refitted on each column's "
        "calibration points ('kernel-fit') and its geometric mean with the calibrated "
        "roofline ('blended'); needs a profile with sm_clock_hz and max_threads_per_sm",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON records per operator and mode, and a whole-pass record (operator 'pass') "
        "per mode",
    )
    p.add_argument(
        "--regret",
        action="store_true",
        help="instead: the decision regret of each mode (bare, calibrated, measured: deciding "
        "only among at most 32 measured sizes; with --transfer-from also transfer) over the "
        "shipped workload presets' acceptance curves (docs/cost-model.md)",
    )
    p.set_defaults(func=_validate)


def _modes(transfer: bool, kernel_fit: bool) -> tuple[str, ...]:
    first = ("bare", "transfer") if transfer else ("bare",)
    modes = (*first, "calibrated", "profiled")
    return (*modes, "kernel-fit", "blended") if kernel_fit else modes


def _regret(args: argparse.Namespace, table: Any, model: Any, hw: Any) -> int:
    from bastion.cost.regret import decision_regret
    from bastion.sim.regret import acceptance_curve
    from bastion.sim.workloads import known_workloads

    top = int(table.tokens.max())
    curves = {name: acceptance_curve(name, top) for name in sorted(known_workloads())}
    transfer = None
    if args.transfer_from is not None:  # the kernel model with other GPUs' parameters too
        transfer = _fit_transfer(args, hw.name, model).params
    records = decision_regret(table, model, hw, curves, transfer=transfer)
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
        return 0
    print(f"{table.path}: {model.name} on {hw.name}; decision regret over {', '.join(curves)}")
    print(f"{'mode':<11} {'sizes':>5} {'worst':>7} {'median':>7}  chosen N per workload")
    for r in records:
        chosen = ", ".join(f"{k} {v}" for k, v in r.chosen.items())
        print(
            f"{r.mode:<11} {r.n_measured:>5} {r.worst_regret:>7.2%} {r.median_regret:>7.2%}  "
            f"{chosen}"
        )
    return 0


def _validate(args: argparse.Namespace) -> int:
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import get_model
    from bastion.cost.validation import DEFAULT_TRAIN_TOKENS, load_measured, validate
    from bastion.errors import ConfigError

    if not 0 <= args.max_tokens <= MAX_VALUE:
        raise ConfigError(
            f"--max-tokens must be in [0, {MAX_VALUE}] (0: all), got {args.max_tokens}"
        )
    hw = get_profile(args.gpu)
    model = get_model(args.model)
    table = load_measured(args.measured, args.format)
    if args.regret:
        return _regret(args, table, model, hw)
    transfer = None
    if args.transfer_from is not None:
        transfer = _fit_transfer(args, hw.name, model)
    report = validate(
        table,
        model,
        hw,
        train_tokens=tuple(args.calibrate_on or DEFAULT_TRAIN_TOKENS),
        max_tokens=args.max_tokens or None,
        transfer=transfer.params if transfer else None,
        modes=_modes(transfer is not None, args.kernel_fit),
    )
    if not report.results:
        raise ConfigError(
            f"{args.measured}: no column could be scored ("
            + "; ".join(f"{c}: {why}" for c, why in report.skipped.items())
            + "); give more --calibrate-on token counts that the file measures"
        )
    if args.json:
        print(json.dumps(report.records(), indent=2))
        return 0
    scope = f"s ≤ {report.max_tokens}" if report.max_tokens else "all s"
    print(f"{report.path} ({report.format}): {report.model} on {report.gpu}, {scope}")
    missing = report.missing_train_tokens
    lacks = f" (not in the file: {', '.join(map(str, missing))})" if missing else ""
    print(
        f"calibrated on s ∈ {{{', '.join(map(str, report.train_tokens))}}}{lacks}; held-out errors"
    )
    for column, what in report.mapped.items():
        print(f"  mapped   {column}: {what}")
    for column in report.unmapped:
        print(f"  unmapped {column}: no roofline operator (not scored)")
    for column, why in report.skipped.items():
        print(f"  skipped  {column}: {why}")
    if transfer is not None:
        fitted = ", ".join(f"{k} {v:.4g}" for k, v in transfer.params.to_dict().items())
        print(f"transfer: fitted on {', '.join(transfer.sources)} (nothing of this file): {fitted}")
    print(f"{'operator':<16} {'mode':<11} {'n':>4} {'MAPE':>7} {'max':>7} {'at s':>6}  notes")
    for r in report.results:
        print(
            f"{r.operator:<16} {r.mode:<11} {r.n_test:>4} {r.mape:>7.1%} {r.max_error:>7.1%} "
            f"{r.worst_tokens:>6}  {r.detail}"
        )
    for mode in report.modes:
        whole = report.pass_result(mode)
        tail = f"; whole pass {whole.mape:.1%} MAPE (n = {whole.n_test})" if whole else ""
        print(
            f"mean over operators, {mode}: {report.mean_mape(mode):.1%} MAPE, "
            f"worst point {report.max_error(mode):.1%}{tail}"
        )
    return 0


def _fit_transfer(args: argparse.Namespace, target_gpu: str, target_model: Any) -> Any:
    """Load the --transfer-from tables and fit the kernel parameters on them."""
    from bastion.cost.datasets import parse_transfer_specs
    from bastion.cost.hardware import get_profile
    from bastion.cost.kernels import KernelDevice
    from bastion.cost.measured import FORMATS, MEASURED_OPTIONS, load_measured
    from bastion.cost.models import get_model
    from bastion.cost.transfer import TransferSource, fit_kernel_params
    from bastion.errors import ConfigError

    refs = parse_transfer_specs(args.transfer_from, args.measured, args.format)
    KernelDevice.of(get_profile(args.gpu))  # the target's profile must have what the model needs
    sources = []
    for ref in refs:
        hw = get_profile(ref.gpu)
        if hw.name == target_gpu:
            raise ConfigError(
                f"--transfer-from {ref.path} was measured on {hw.name}, the GPU being "
                "predicted; transfer predicts a GPU from other GPUs' tables only"
            )
        KernelDevice.of(hw)
        table = load_measured(ref.path, ref.format)
        spec = FORMATS[ref.format]
        sources.append(
            TransferSource(
                name=str(ref.path),
                columns=dict(table.columns),
                tokens=table.tokens,
                specs={c: spec[c] for c in table.columns},
                model=get_model(ref.model),
                hw=hw,
            )
        )
    return fit_kernel_params(sources, MEASURED_OPTIONS, max_tokens=args.max_tokens or None)
