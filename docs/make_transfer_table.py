"""Reproduce the leave-one-GPU-out table of docs/cost-model.md.

    python docs/make_transfer_table.py          # prints the Markdown tables
    python docs/make_transfer_table.py --all    # the fit on all tables (KernelParams' defaults)
    python docs/make_transfer_table.py --steps  # measured vs predicted GEMM step positions

For every shipped per-operator table (``docs/data/datasets.toml``) in turn, the kernel model's
parameters are fitted on the *other* tables only and the held-out GPU is scored, exactly as

    bastion validate --measured HELD --format vidur --model M --gpu G \\
        --transfer-from OTHER1,OTHER2

prints it; ``calibrated (roofline)`` is the same command without ``--transfer-from`` (the
documented calibration: roofline features only). Every number is an error on held-out token
counts (the 124 not calibrated on, s ≤ 1024); nothing of the held-out table is fitted except,
in the calibrated modes, its 7 calibration points.
"""

from __future__ import annotations

from pathlib import Path

from bastion.cost.datasets import read_manifest
from bastion.cost.hardware import get_profile
from bastion.cost.kernels import KernelParams, kernel_pass
from bastion.cost.models import get_model
from bastion.cost.transfer import TransferFit, TransferSource, fit_kernel_params
from bastion.cost.validation import (
    FORMATS,
    MEASURED_OPTIONS,
    PASS,
    ValidationReport,
    load_measured,
    step_positions,
    steps_matched,
    validate,
)

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "data" / "datasets.toml"


def _source(ref) -> TransferSource:  # type: ignore[no-untyped-def]
    table = load_measured(ref.path, ref.format)
    spec = FORMATS[ref.format]
    return TransferSource(
        name=ref.path.name,
        columns=dict(table.columns),
        tokens=table.tokens,
        specs={c: spec[c] for c in table.columns},
        model=get_model(ref.model),
        hw=get_profile(ref.gpu),
    )


def leave_one_out() -> list[tuple[str, TransferFit, ValidationReport, ValidationReport]]:
    refs = read_manifest(MANIFEST)
    sources = [_source(r) for r in refs]
    out = []
    for i, ref in enumerate(refs):
        others = [s for j, s in enumerate(sources) if j != i]
        fit = fit_kernel_params(others, MEASURED_OPTIONS)
        table = load_measured(ref.path, ref.format)
        model, hw = get_model(ref.model), get_profile(ref.gpu)
        modes = ("bare", "transfer", "calibrated", "kernel-fit", "blended")
        with_transfer = validate(table, model, hw, transfer=fit.params, modes=modes)
        plain = validate(table, model, hw, modes=("bare", "calibrated", "kernel-fit", "blended"))
        out.append((ref.gpu, fit, with_transfer, plain))
    return out


def tables() -> str:
    lines: list[str] = []
    summary = [
        "| held-out GPU | fitted on | bare pass | transfer pass | calibrated pass "
        "| kernel-fit pass | blended pass "
        "| bare per-op | transfer per-op | calibrated per-op | calibrated+kernel per-op "
        "| kernel-fit per-op | blended per-op | blended+transfer per-op |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for gpu, fit, rep, plain in leave_one_out():

        def cell(report: ValidationReport, op: str, mode: str) -> str:
            r = next(r for r in report.results if r.operator == op and r.mode == mode)
            return f"{r.mape:.1%} ({r.max_error:.0%})"

        ops = [r.operator for r in rep.results if r.mode == "bare"]
        lines += [
            f"\n**{gpu}** held out; transfer fitted on {' + '.join(fit.sources)}\n",
            "| operator | bare | transfer | calibrated (roofline) | calibrated (+kernel) "
            "| kernel-fit | blended | blended (+transfer) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for op in ops:
            lines.append(
                f"| {'**pass**' if op == PASS else op} | {cell(rep, op, 'bare')} "
                f"| {cell(rep, op, 'transfer')} | {cell(plain, op, 'calibrated')} "
                f"| {cell(rep, op, 'calibrated')} | {cell(plain, op, 'kernel-fit')} "
                f"| {cell(plain, op, 'blended')} | {cell(rep, op, 'blended')} |"
            )
        lines.append(
            f"| **mean over operators** | {rep.mean_mape('bare'):.1%} "
            f"| {rep.mean_mape('transfer'):.1%} | {plain.mean_mape('calibrated'):.1%} "
            f"| {rep.mean_mape('calibrated'):.1%} | {plain.mean_mape('kernel-fit'):.1%} "
            f"| {plain.mean_mape('blended'):.1%} | {rep.mean_mape('blended'):.1%} |"
        )
        fitted = ", ".join(f"{k} {v:.3g}" for k, v in fit.params.to_dict().items())
        lines.append(f"\nFitted on the other tables: {fitted}.")
        bp, tp = rep.pass_result("bare"), rep.pass_result("transfer")
        cp, kp = plain.pass_result("calibrated"), plain.pass_result("kernel-fit")
        blp = plain.pass_result("blended")
        assert bp and tp and cp and kp and blp
        summary.append(
            f"| {gpu} | {' + '.join(fit.sources)} | {bp.mape:.1%} | {tp.mape:.1%} | {cp.mape:.1%} "
            f"| {kp.mape:.1%} | {blp.mape:.1%} "
            f"| {rep.mean_mape('bare'):.1%} | {rep.mean_mape('transfer'):.1%} "
            f"| {plain.mean_mape('calibrated'):.1%} | {rep.mean_mape('calibrated'):.1%} "
            f"| {plain.mean_mape('kernel-fit'):.1%} | {plain.mean_mape('blended'):.1%} "
            f"| {rep.mean_mape('blended'):.1%} |"
        )
    return "\n".join(summary) + "\n" + "\n".join(lines)


GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
MEASURED_JUMP, MODEL_JUMP, WITHIN = 0.15, 0.05, 64


def steps(params: KernelParams | None = None) -> dict[str, dict[str, tuple[list[int], list[int]]]]:
    """GPU → GEMM → (measured step positions, the kernel model's), s ≤ 1024 on the table's own
    token grid: a measured step is a rise of > 15 % from the previous token count, a model step
    > 5 % (the model has no noise). ``params``: the kernel parameters (default: KernelParams())."""
    out: dict[str, dict[str, tuple[list[int], list[int]]]] = {}
    for ref in read_manifest(MANIFEST):
        table = load_measured(ref.path, ref.format)
        keep = table.tokens <= 1024
        t = table.tokens[keep]
        model = kernel_pass(get_model(ref.model), get_profile(ref.gpu), t, MEASURED_OPTIONS, params)
        out[ref.gpu] = {
            op: (
                step_positions(t, table.columns[f"{op}_ms"][keep], MEASURED_JUMP),
                step_positions(t, model[op], MODEL_JUMP),
            )
            for op in GEMMS
        }
    return out


def steps_table() -> str:
    lines = [
        "| GPU | GEMM | measured steps (s) | kernel model's steps (s) | matched ±64 | ±8 "
        "| model steps not measured (±64) |",
        "|---|---|---|---|---|---|---|",
    ]
    for gpu, ops in steps().items():
        for op, (meas, model) in ops.items():
            hit, exact = steps_matched(meas, model, WITHIN), steps_matched(meas, model, 8)
            extra = len(model) - len(steps_matched(model, meas, WITHIN))
            lines.append(
                f"| {gpu} | {op} | {', '.join(map(str, meas))} | {', '.join(map(str, model))} "
                f"| {len(hit)}/{len(meas)} | {len(exact)}/{len(meas)} | {extra}/{len(model)} |"
            )
    return "\n".join(lines)


def fit_all() -> str:
    fit = fit_kernel_params([_source(r) for r in read_manifest(MANIFEST)], MEASURED_OPTIONS)
    per = ", ".join(f"{k} {v:.1%}" for k, v in fit.train_mape.items())
    params = ", ".join(f"{k} = {v:.4g}" for k, v in fit.params.to_dict().items())
    return f"fitted on all {len(fit.sources)} tables (in-sample mean error {per}):\n{params}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--all"]:
        print(fit_all())
    elif sys.argv[1:] == ["--steps"]:
        print(steps_table())
    else:
        print(tables())
