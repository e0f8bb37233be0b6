"""Cross-GPU transfer (bastion.cost.transfer, `bastion validate --transfer-from`): parameters
fitted on other GPUs' tables predict a GPU none of whose cells is read; the flag's inputs are
checked. Every table and GPU here is written by the test (synthetic, from known parameters)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.cost.datasets import parse_transfer_specs, read_manifest
from bastion.cost.hardware import load_profile
from bastion.cost.kernels import KernelParams
from bastion.cost.models import get_model
from bastion.cost.transfer import FIT_START, TransferSource, column_predictor, fit_kernel_params
from bastion.cost.validation import (
    FORMATS,
    MEASURED_OPTIONS,
    PASS,
    load_measured,
    operator_features,
    validate,
)
from bastion.errors import ConfigError
from tests.test_cost_kernels import write_profile

MODEL = get_model("llama-3.1-8b")
COLUMNS = ("qkv_proj_ms", "o_proj_ms", "down_proj_ms", "input_norm_ms", "act_ms")
TOKENS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 72, 96, 128, 136, 192, 256, 264, 320, 384, 512, 520]
TOKENS += [640, 768, 776, 896, 1024]
# the "real" parameters every synthetic GPU obeys (not FIT_START: the fit has to move)
TRUE = KernelParams(
    dram_efficiency=0.72,
    stream_efficiency=0.85,
    tensor_efficiency=0.75,
    l2_bytes_per_flop=0.012,
    tile_cycles=3000.0,
    kernel_s=2.5e-6,
    row_cycles=2500.0,
    sm_bytes_per_clock=7.0,
    l2_fraction=0.3,
    gather_cycles=60.0,
)
GPUS = {  # name: (SMs, clock, threads per SM, FLOP/clk/SM, bandwidth, L2)
    "alpha": (108, 1.41e9, 2048, 2048.0, 2.0e12, 40e6),
    "beta": (84, 1.74e9, 1536, 1024.0, 0.7e12, 6e6),
    "gamma": (132, 1.83e9, 2048, 4096.0, 3.35e12, 50e6),
}


def make_gpu(tmp_path: Path, name: str) -> Path:
    sms, clock, threads, fpc, bw, l2 = GPUS[name]
    return write_profile(tmp_path, name, sms, clock, threads, fpc, bw, l2)


def make_table(tmp_path: Path, name: str, params: KernelParams = TRUE) -> Path:
    """A Vidur-format table of GPU ``name``: the kernel model's times at ``params``, rounded to
    0.1 µs as a profiler would print them."""
    hw = load_profile(make_gpu(tmp_path, name))
    t = np.array(TOKENS, dtype=np.float64)
    cols = {}
    for c in COLUMNS:
        sec = column_predictor(FORMATS["vidur"][c], MODEL, hw, t, MEASURED_OPTIONS)(params)
        cols[c] = np.round(sec * 1e3, 4)
    lines = ["num_tokens," + ",".join(COLUMNS)]
    lines += [
        ",".join([str(s)] + [f"{cols[c][i]:g}" for c in COLUMNS]) for i, s in enumerate(TOKENS)
    ]
    path = tmp_path / f"{name}.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _source(tmp_path: Path, name: str) -> TransferSource:
    table = load_measured(make_table(tmp_path, name), "vidur")
    return TransferSource(
        name,
        dict(table.columns),
        table.tokens,
        {c: FORMATS["vidur"][c] for c in table.columns},
        MODEL,
        load_profile(make_gpu(tmp_path, name)),
    )


def test_fit_on_two_gpus_predicts_the_third(tmp_path: Path) -> None:
    """The parameters that generated alpha's and beta's tables, recovered from them alone,
    predict gamma (a different SM count, clock, per-SM peak, bandwidth and L2) to within the
    tables' rounding, where the starting guess is far off."""
    fit = fit_kernel_params(
        [_source(tmp_path, "alpha"), _source(tmp_path, "beta")], MEASURED_OPTIONS
    )
    assert fit.train_rmsle < 0.01
    target = load_measured(make_table(tmp_path, "gamma"), "vidur")
    hw = load_profile(make_gpu(tmp_path, "gamma"))
    report = validate(target, MODEL, hw, transfer=fit.params)
    start = validate(target, MODEL, hw, transfer=FIT_START)
    assert report.mean_mape("transfer") < 0.01
    assert start.mean_mape("transfer") > 5 * report.mean_mape("transfer")
    whole = report.pass_result("transfer")
    assert whole is not None and whole.mape < 0.01
    assert {r.mode for r in report.results if r.operator == PASS} == {
        "bare",
        "transfer",
        "calibrated",
        "profiled",
    }


def test_the_pass_record_sums_columns_times_kernels_times_layers(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    rows = ["num_tokens,o_proj_ms,residual_add_ms,embedding_ms"]
    rows += [f"{s},{0.01 * (1 + s / 64):g},{0.002:g},{0.003:g}" for s in TOKENS]
    path.write_text("\n".join(rows) + "\n")
    alpha = load_profile(make_gpu(tmp_path, "alpha"))
    report = validate(load_measured(path, "vidur"), MODEL, alpha)
    bare = {r.operator: r for r in report.results if r.mode == "bare"}
    assert bare[PASS].n_test == bare["o_proj"].n_test == len(TOKENS) - 7
    # by hand: (o_proj + 2 residual adds) × 32 layers + the embedding once, measured and bare
    t = np.array(TOKENS, dtype=np.float64)
    hw = alpha
    spec = FORMATS["vidur"]
    col = {c: operator_features(spec[c], MODEL, hw, t).bare for c in spec if c in rows[0]}
    meas = 32 * (0.01 * (1 + t / 64) + 2 * 0.002) + 0.003
    pred = 32 * (col["o_proj_ms"] + 2 * col["residual_add_ms"]) + col["embedding_ms"]
    held = ~np.isin(t, [1, 16, 64, 128, 256, 512, 1024])
    rel = np.abs(pred[held] - meas[held] * 1e-3) / (meas[held] * 1e-3)
    assert bare[PASS].mape == pytest.approx(float(rel.mean()), rel=1e-9)


def _cli(tmp_path: Path, transfer: str, measured: Path | None = None) -> list[str]:
    target = measured or make_table(tmp_path, "gamma")
    return [
        "validate",
        "--measured",
        str(target),
        "--format",
        "vidur",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        str(make_gpu(tmp_path, "gamma")),
        "--transfer-from",
        transfer,
    ]


def test_cli_transfer_json_has_a_pass_record_for_every_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = make_table(tmp_path, "alpha"), make_table(tmp_path, "beta")
    ga, gb = make_gpu(tmp_path, "alpha"), make_gpu(tmp_path, "beta")
    spec = f"{a}@llama-3.1-8b@{ga},{b}@llama-3.1-8b@{gb}"
    assert main([*_cli(tmp_path, spec), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    modes = {"bare", "transfer", "calibrated", "profiled"}
    assert {r["mode"] for r in records if r["operator"] == "pass"} == modes
    transfer = {r["operator"]: r for r in records if r["mode"] == "transfer"}
    assert transfer["pass"]["mape"] < 0.01 and transfer["qkv_proj"]["mape"] < 0.01
    assert main(_cli(tmp_path, spec)) == 0
    out = capsys.readouterr().out
    assert "transfer: fitted on" in out and "whole pass" in out


def test_cli_reads_model_and_gpu_from_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = make_table(tmp_path, "alpha")
    make_gpu(tmp_path, "alpha")
    (tmp_path / "datasets.toml").write_text(
        '[[dataset]]\nfile = "alpha.csv"\nformat = "vidur"\nmodel = "llama-3.1-8b"\n'
        'gpu = "alpha.toml"\n'
    )
    (ref,) = read_manifest(tmp_path / "datasets.toml")
    assert ref.path == tmp_path / "alpha.csv" and ref.gpu == str(tmp_path / "alpha.toml")
    assert main([*_cli(tmp_path, str(a)), "--json"]) == 0
    assert any(r["mode"] == "transfer" for r in json.loads(capsys.readouterr().out))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "give one or more tables"),
        ("{a},", "give one or more tables"),
        ("{missing}", "measured data not found"),
        ("{missing}@llama-3.1-8b@{gpu_a}", "measured data not found"),
        ("{a}@llama-3.1-8b", "three parts"),
        ("{a}", "no .*datasets.toml names its model and GPU"),
        ("{target}@llama-3.1-8b@{gpu_a}", "is the --measured file itself"),
        ("{a}@llama-3.1-8b@{gpu_a},{a}@llama-3.1-8b@{gpu_a}", "names .* twice"),
        ("{a}@llama-3.1-8b@{gpu_g}", "measured on gamma, the GPU being predicted"),
        ("{a}@no-such-model@{gpu_a}", "unknown model"),
        ("{a}@llama-3.1-8b@{old}", "has no \\[peak\\].sm_clock_hz"),
    ],
)
def test_cli_refuses_bad_transfer_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    target = make_table(tmp_path, "gamma")
    old = write_profile(tmp_path, "old", clock=None, threads=None)
    names = {
        "a": make_table(tmp_path, "alpha"),
        "missing": tmp_path / "missing.csv",
        "target": target,
        "gpu_a": make_gpu(tmp_path, "alpha"),
        "gpu_g": make_gpu(tmp_path, "gamma"),
        "old": old,
    }
    text = spec.format(**{k: str(v) for k, v in names.items()})
    assert main(_cli(tmp_path, text, target)) == 2
    err = capsys.readouterr().err
    import re

    assert re.search(message, err), err
    assert "Traceback" not in err


def test_manifest_entries_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "datasets.toml"
    bad.write_text('[[dataset]]\nfile = "a.csv"\nformat = "csv"\nmodel = "m"\ngpu = "g"\n')
    with pytest.raises(ConfigError, match="format 'csv'; accepted: vidur, llmservingsim"):
        read_manifest(bad)
    bad.write_text('[[dataset]]\nfile = "a.csv"\nspeed = 1\n')
    with pytest.raises(ConfigError, match=r"unknown key.*speed.*missing format, model, gpu"):
        read_manifest(bad)
    with pytest.raises(ConfigError, match="is the --measured file itself"):
        parse_transfer_specs(f"{tmp_path / 'x.csv'}@m@g", tmp_path / "x.csv", "vidur")


def test_each_kind_reads_exactly_its_documented_parameters(tmp_path: Path) -> None:
    """KIND_PARAMS (what a per-operator calibration frees) against the formulas: doubling a
    listed parameter changes that kind's price somewhere on the token grid, doubling any
    other leaves it unchanged to the last bit."""
    from bastion.cost.kernels import KIND_PARAMS
    from bastion.cost.transfer import column_params

    hw = load_profile(make_gpu(tmp_path, "beta"))  # a small L2: every L2 branch is reached
    t = np.arange(1.0, 4097.0, 5.0)
    base = TRUE.to_dict()
    for column in ("qkv_proj_ms", "input_norm_ms", "residual_add_ms", "embedding_ms"):
        spec = FORMATS["vidur"][column]
        predict = column_predictor(spec, MODEL, hw, t, MEASURED_OPTIONS)
        ref = predict(TRUE)
        free = column_params(spec)
        assert free, column
        for name in base:
            moved = dict(
                base,
                **{
                    name: min(base[name] * 2.0, 1.0)
                    if name
                    in ("dram_efficiency", "stream_efficiency", "tensor_efficiency", "l2_fraction")
                    else base[name] * 2.0
                },
            )
            changed = not np.array_equal(predict(KernelParams(**moved)), ref)
            assert changed == (name in free), (column, name)
    assert set(KIND_PARAMS) == {"gemm", "rows", "stream", "gather", "roofline"}


def test_a_column_calibrated_on_seven_points_recovers_its_steps(tmp_path: Path) -> None:
    """The kernel model refitted on one column's 7 calibration points (fit_column_params)
    predicts the other token counts of a table the model generated, wave steps included, to
    within the table's rounding; the starting guess is far off (negative control), and a
    smooth fit of the same 7 points (the calibrated roofline) misses the steps."""
    from bastion.cost.transfer import fit_column_params

    hw = load_profile(make_gpu(tmp_path, "beta"))
    table = load_measured(make_table(tmp_path, "beta"), "vidur")
    report = validate(table, MODEL, hw, modes=("bare", "calibrated", "kernel-fit", "blended"))
    by = {(r.operator, r.mode): r for r in report.results}
    for op in ("input_norm", "act", "o_proj"):
        assert by[(op, "kernel-fit")].mape < 0.01, op
    assert by[("input_norm", "calibrated")].mape > 3 * by[("input_norm", "kernel-fit")].mape
    spec = FORMATS["vidur"]["input_norm_ms"]
    train = np.isin(table.tokens, [1, 16, 64, 128, 256, 512, 1024])
    y = table.columns["input_norm_ms"]
    fitted = fit_column_params(spec, MODEL, hw, table.tokens[train], y[train], MEASURED_OPTIONS)
    predict = column_predictor(spec, MODEL, hw, table.tokens, MEASURED_OPTIONS)
    assert np.mean(np.abs(predict(fitted) / y - 1)) < 0.01
    assert np.mean(np.abs(predict(FIT_START) / y - 1)) > 0.1
    # only the parameters a row kernel reads moved
    moved = {k for k, v in fitted.to_dict().items() if v != FIT_START.to_dict()[k]}
    assert moved <= {"row_cycles", "sm_bytes_per_clock", "stream_efficiency", "kernel_s"}


def test_blended_is_the_geometric_mean_and_the_new_modes_are_opt_in(tmp_path: Path) -> None:
    hw = load_profile(make_gpu(tmp_path, "alpha"))
    table = load_measured(make_table(tmp_path, "alpha"), "vidur")
    assert {r.mode for r in validate(table, MODEL, hw).results} == {
        "bare",
        "calibrated",
        "profiled",
    }
    modes = ("calibrated", "kernel-fit", "blended")
    report = validate(table, MODEL, hw, modes=modes)
    assert {r.mode for r in report.results} == set(modes)
    # one column by hand: √(calibrated × kernel-fit) at the held-out counts
    from bastion.cost.transfer import fit_column_params
    from bastion.cost.validation import calibrate_column

    spec, y, t = FORMATS["vidur"]["act_ms"], table.columns["act_ms"], table.tokens
    train = np.isin(t, [1, 16, 64, 128, 256, 512, 1024])
    feats = operator_features(spec, MODEL, hw, t)
    cal = calibrate_column(feats, t, y, train).predict(feats)
    kp = fit_column_params(spec, MODEL, hw, t[train], y[train], MEASURED_OPTIONS)
    kfit = column_predictor(spec, MODEL, hw, t, MEASURED_OPTIONS)(kp)
    got = {r.mode: r.mape for r in report.results if r.operator == "act"}
    for mode, pred in (("calibrated", cal), ("kernel-fit", kfit), ("blended", np.sqrt(cal * kfit))):
        assert got[mode] == pytest.approx(np.mean(np.abs(pred[~train] / y[~train] - 1)), rel=1e-9)


def test_cli_kernel_fit_adds_the_two_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_table(tmp_path, "alpha")
    gpu = make_gpu(tmp_path, "alpha")
    argv = ["validate", "--measured", str(path), "--format", "vidur", "--model", "llama-3.1-8b"]
    assert main([*argv, "--gpu", str(gpu), "--json", "--kernel-fit"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["mode"] for r in records} == {
        "bare",
        "calibrated",
        "profiled",
        "kernel-fit",
        "blended",
    }
