"""Reproduce the leave-one-GPU-out table of docs/cost-model.md.

    python docs/make_transfer_table.py          # prints the Markdown tables
    python docs/make_transfer_table.py --all    # the fit on all tables (KernelParams' defaults)
    python docs/make_transfer_table.py --steps  # measured vs predicted GEMM step positions
    python docs/make_transfer_table.py --floor  # the model family's in-sample floor per GPU
    python docs/make_transfer_table.py --floor --variant padded-feed  # … of a GEMM variant

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

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from bastion.cost.datasets import read_manifest
from bastion.cost.hardware import get_profile
from bastion.cost.kernels import KIND_PARAMS, KernelParams, kernel_pass
from bastion.cost.models import get_model
from bastion.cost.transfer import (
    FIT_START,
    TransferFit,
    TransferSource,
    column_predictor,
    fit_kernel_params,
)
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


GEMM_COLUMNS = tuple(f"{op}_ms" for op in GEMMS)
#: Starts of the floor fits: FIT_START with its cycles per tile and L2 feed moved (the two the
#: fit is least sure of); the lowest training error wins (the documented fit uses the first).
FLOOR_STARTS = tuple(
    replace(FIT_START, tile_cycles=tc, l2_bytes_per_flop=l2)
    for tc, l2 in ((2000.0, 0.02), (200.0, 0.01), (8000.0, 0.04), (200.0, 0.04), (8000.0, 0.01))
)


def monotone_floor(seconds: np.ndarray) -> float:
    """The mean relative error of the non-decreasing curve through ``seconds`` with the least
    mean absolute log error (an isotonic fit of their logarithm: pool-adjacent-violators with
    block medians). A price that never falls as the token count grows errs about this much at
    least (exactly, in log error); what a model errs above it is its shape, not the data's
    dips. The kernel model itself need not be monotone (fewer real rows per tile after a new
    row of tiles), so this bounds the data's non-monotonicity, not the model."""
    blocks: list[list[float]] = []
    for v in np.log(np.asarray(seconds, dtype=np.float64)):
        blocks.append([float(v)])
        while len(blocks) > 1 and np.median(blocks[-2]) > np.median(blocks[-1]):
            last = blocks.pop()
            blocks[-1] += last
    fit = np.concatenate([np.full(len(b), np.median(b)) for b in blocks])
    return float(np.mean(np.abs(np.exp(fit - np.log(seconds)) - 1.0)))


def _fit_gemm_columns(
    src: TransferSource, columns: tuple[str, ...], starts: tuple[KernelParams, ...]
) -> tuple[float, KernelParams]:
    """The GEMM kind's parameters fitted on ``columns`` of ``src`` itself (in-sample; s ≤ 1024),
    from each start, restarted twice; (lowest mean squared log error, its parameters)."""
    from scipy.optimize import minimize

    from bastion.errors import ConfigError

    keep = src.tokens <= 1024
    t = src.tokens[keep]
    terms = [
        (
            column_predictor(src.specs[c], src.model, src.hw, t, MEASURED_OPTIONS),
            src.columns[c][keep],
        )
        for c in columns
    ]
    names = list(FIT_START.to_dict())
    free = [names.index(n) for n in names if n in KIND_PARAMS["gemm"]]
    fractions = [names.index(n) for n in ("dram_efficiency", "tensor_efficiency", "l2_fraction")]
    best: tuple[float, KernelParams] | None = None
    for start in starts:
        v0 = start.as_vector()

        def params(x: np.ndarray, v0: np.ndarray = v0) -> KernelParams:
            v = v0.copy()
            v[free] = np.exp(np.clip(x, -30.0, 30.0))
            v[fractions] = np.minimum(v[fractions], 1.0)
            return KernelParams.from_vector(v)

        def loss(x: np.ndarray, params=params) -> float:  # type: ignore[no-untyped-def]
            try:
                p = params(x)
            except ConfigError:
                return 1e9
            return float(np.mean([np.mean(np.log(f(p) / y) ** 2) for f, y in terms]))

        x = np.log(v0[free])
        settings = {"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-10}
        for _ in range(3):
            res = minimize(loss, x, method="Nelder-Mead", options=settings)
            x = res.x
        if best is None or res.fun < best[0]:
            best = (float(res.fun), params(x))
    assert best is not None
    return best


def floor_table() -> str:
    """Per GPU: the in-sample floor of the GEMM columns (their six parameters fitted jointly on
    the table itself, and each column alone), of the whole pass (all ten on all columns), the
    monotone floor of the data, and the leave-one-GPU-out transfer with the fit's start chosen
    by the lowest *training* error of :data:`FLOOR_STARTS` (the documented table uses the
    first start only)."""
    refs = read_manifest(MANIFEST)
    sources = [_source(r) for r in refs]
    lines = [
        "| GPU | GEMMs joint: RMS log error | q/k/v, o, gate+up, down | mean | Σ GEMMs "
        "| each column alone | whole pass (all columns) | monotone floor: GEMMs, Σ GEMMs "
        "| leave-one-out, best-training start: pass, per-op |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (ref, src) in enumerate(zip(refs, sources, strict=True)):
        keep = src.tokens <= 1024
        t = src.tokens[keep]
        loss, p = _fit_gemm_columns(src, GEMM_COLUMNS, FLOOR_STARTS)
        pred = {
            c: column_predictor(src.specs[c], src.model, src.hw, t, MEASURED_OPTIONS)(p)
            for c in GEMM_COLUMNS
        }
        meas = {c: src.columns[c][keep] for c in GEMM_COLUMNS}
        err = {c: float(np.mean(np.abs(pred[c] / meas[c] - 1.0))) for c in GEMM_COLUMNS}
        total_p, total_m = sum(pred.values()), sum(meas.values())
        sum_err = float(np.mean(np.abs(total_p / total_m - 1.0)))
        alone = []
        for c in GEMM_COLUMNS:
            _, pc = _fit_gemm_columns(src, (c,), FLOOR_STARTS[:3])
            f = column_predictor(src.specs[c], src.model, src.hw, t, MEASURED_OPTIONS)
            alone.append(float(np.mean(np.abs(f(pc) / meas[c] - 1.0))))
        table = load_measured(ref.path, ref.format)
        model, hw = get_model(ref.model), get_profile(ref.gpu)
        own = min(
            (fit_kernel_params([src], MEASURED_OPTIONS, start=s) for s in FLOOR_STARTS[:3]),
            key=lambda f: f.train_rmsle,
        )
        rep = validate(table, model, hw, transfer=own.params, modes=("transfer",))
        own_pass = rep.pass_result("transfer")
        mono = [monotone_floor(meas[c]) for c in GEMM_COLUMNS]
        others = [s for j, s in enumerate(sources) if j != i]
        fits = [fit_kernel_params(others, MEASURED_OPTIONS, start=s) for s in FLOOR_STARTS]
        fit = min(fits, key=lambda f: f.train_rmsle)
        loo = validate(table, model, hw, transfer=fit.params, modes=("transfer",))
        loo_pass = loo.pass_result("transfer")
        assert own_pass and loo_pass
        lines.append(
            f"| {ref.gpu} | {np.sqrt(loss):.4f} "
            f"| {' / '.join(f'{err[c]:.1%}' for c in GEMM_COLUMNS)} "
            f"| {np.mean(list(err.values())):.1%} | {sum_err:.1%} "
            f"| {' / '.join(f'{e:.1%}' for e in alone)} "
            f"| {own_pass.mape:.1%} (per-op {rep.mean_mape('transfer'):.1%}) "
            f"| {' / '.join(f'{e:.1%}' for e in mono)}, {monotone_floor(total_m):.1%} "
            f"| {loo_pass.mape:.1%}, {loo.mean_mape('transfer'):.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import sys

    sys.path.insert(0, str(HERE))
    from gemm_variants import VARIANTS, use_variant

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--all", action="store_true", help="the fit on all tables (defaults)")
    what.add_argument("--steps", action="store_true", help="GEMM step positions table")
    what.add_argument("--floor", action="store_true", help="in-sample floors per GPU")
    parser.add_argument(
        "--variant",
        default="base",
        choices=VARIANTS,
        help="price the GEMMs with a variant of docs/gemm_variants.py (default: the library)",
    )
    args = parser.parse_args(argv)

    with use_variant(args.variant):
        if args.all:
            print(fit_all())
        elif args.steps:
            print(steps_table())
        elif args.floor:
            print(floor_table())
        else:
            print(tables())


if __name__ == "__main__":
    main()
