"""`bastion validate`: importers of both per-operator formats, their errors, and the held-out
error of the bare / calibrated / profiled predictions (public A100 data in docs/data, Vidur, MIT;
synthetic files in the LLMServingSim layout)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.validation import (
    FORMATS,
    PASS,
    MeasuredDataError,
    load_measured,
    operator_features,
    validate,
)

CSV = Path(__file__).resolve().parents[1] / "docs/data/a100-80gb_llama-3-8b_per-layer-ops.csv"
MODEL, HW = get_model("llama-3.1-8b"), get_profile("a100-sxm-80gb")
GEMMS = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
TOKENS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024]


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _synthetic(tmp_path: Path, fmt: str, lm_head_up_to: int = 256) -> Path:
    """A file whose every column is exactly max(2·R_c + 3 µs, 1.5·R_m + 4 µs) of its operator:
    a calibrated roofline that is right must reproduce it on the held-out token counts."""
    spec = FORMATS[fmt]
    t = np.array(TOKENS, dtype=np.float64)
    cols = {}
    for column, cs in spec.items():
        f = operator_features(cs, MODEL, HW, t)
        cols[column] = np.maximum(2 * f.compute["plain"] + 3e-6, 1.5 * f.memory + 4e-6) * 1e3
    header = ["num_tokens", *spec, "sampler_ms"]
    rows = []
    for i, s in enumerate(TOKENS):
        row: list[object] = [s]
        for column in spec:
            empty = column == "lm_head_ms" and s > lm_head_up_to
            row.append("" if empty else f"{cols[column][i]:.6g}")
        rows.append([*row, "0.01"])
    return _write(tmp_path / f"{fmt}.csv", header, rows)


@pytest.mark.parametrize("fmt", ["vidur", "llmservingsim"])
def test_every_column_is_mapped_or_reported(tmp_path: Path, fmt: str) -> None:
    table = load_measured(_synthetic(tmp_path, fmt), fmt)
    assert set(table.columns) == set(FORMATS[fmt])
    assert table.unmapped == ("sampler_ms",)
    report = validate(table, MODEL, HW, max_tokens=1024)
    assert report.unmapped == ("sampler_ms",)
    assert {r.operator + "_ms" for r in report.results if r.operator != PASS} == set(FORMATS[fmt])
    assert {r.mode for r in report.results if r.operator == PASS} == {
        "bare",
        "calibrated",
        "profiled",
    }
    for r in report.results:
        if r.mode == "calibrated" and r.operator not in ("lm_head", PASS):  # exact, 7 points
            assert r.mape < 1e-3 and r.max_error < 5e-3, r
        if r.mode == "bare":  # …and the bare roofline is not it
            assert r.mape > 0.1, r
    if fmt == "llmservingsim":  # LM head measured up to 256 tokens only
        (lm,) = [r for r in report.results if r.operator == "lm_head" and r.mode == "bare"]
        assert lm.n_test == sum(1 for s in TOKENS if s <= 256) - 5


def test_records_have_the_documented_keys(tmp_path: Path) -> None:
    report = validate(load_measured(_synthetic(tmp_path, "vidur"), "vidur"), MODEL, HW)
    for rec in report.records():
        assert set(rec) == {"operator", "mode", "mape", "max_error", "n_test"}
    assert {r["mode"] for r in report.records()} == {"bare", "calibrated", "profiled"}


@pytest.mark.parametrize(
    ("cell", "expected"),
    [("abc", "'abc' is not a number"), ("-1", "out of range"), ("0", "out of range")],
)
def test_a_bad_cell_names_file_row_and_column(tmp_path: Path, cell: str, expected: str) -> None:
    rows: list[list[object]] = [[s, "0.03", "0.02"] for s in (1, 2, 4, 8)]
    rows[1][2] = cell
    path = _write(tmp_path / "bad.csv", ["num_tokens", "qkv_proj_ms", "o_proj_ms"], rows)
    with pytest.raises(MeasuredDataError, match=expected) as info:
        load_measured(path, "vidur")
    assert f"{path}, row 3, column 'o_proj_ms'" in str(info.value)


def test_empty_cells_are_not_measured_and_bad_tables_are_refused(tmp_path: Path) -> None:
    rows: list[list[object]] = [[s, "0.03", ""] for s in (1, 2, 4)]
    table = load_measured(
        _write(tmp_path / "a.csv", ["num_tokens", "qkv_proj_ms", "o_proj_ms"], rows)
    )
    assert (
        np.isnan(table.columns["o_proj_ms"]).all()
        and np.isfinite(table.columns["qkv_proj_ms"]).all()
    )
    with pytest.raises(MeasuredDataError, match="no 'num_tokens' column"):
        load_measured(_write(tmp_path / "b.csv", ["tokens", "qkv_proj_ms"], [[1, 1]]))
    with pytest.raises(MeasuredDataError, match=r"row 3, column 'num_tokens': 1 repeats row 2"):
        load_measured(_write(tmp_path / "c.csv", ["num_tokens", "qkv_proj_ms"], [[1, 1], [1, 2]]))
    with pytest.raises(MeasuredDataError, match="row 2: 3 values for 2 header columns"):
        load_measured(_write(tmp_path / "d.csv", ["num_tokens", "qkv_proj_ms"], [[1, 1, 1]]))
    with pytest.raises(MeasuredDataError, match="no column of the llmservingsim format"):
        load_measured(
            _write(tmp_path / "e.csv", ["num_tokens", "act_ms"], [[1, 1]]), "llmservingsim"
        )
    with pytest.raises(MeasuredDataError, match="not found"):
        load_measured(tmp_path / "missing.csv")


def test_the_shipped_a100_data_is_vidur_format_and_calibration_beats_bare() -> None:
    table = load_measured(CSV, "vidur")
    assert table.unmapped == () and len(table.columns) == 10
    report = validate(table, MODEL, HW)
    by = {(r.operator, r.mode): r for r in report.results}
    # 10 columns × 3 modes, and one whole-pass record per mode
    assert len(report.results) == 33 and all(r.n_test == 124 for r in report.results)
    # the measured numbers of docs/cost-model.md, with a little slack (held-out token counts)
    assert report.mean_mape("calibrated") < 0.08 < report.mean_mape("bare")
    assert report.mean_mape("profiled") < 0.08
    for op in GEMMS:
        assert by[(op, "bare")].mape < 0.2  # weight-bound projections: bare already close
    for (op, mode), r in by.items():
        if mode == "calibrated":
            assert r.mape < min(0.125, by[(op, "bare")].mape), op


def test_validate_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _synthetic(tmp_path, "llmservingsim")
    args = ["validate", "--measured", str(path), "--format", "llmservingsim"]
    args += ["--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "unmapped sampler_ms" in out and "mean over operators, calibrated" in out
    assert main([*args, "--json", "--calibrate-on", "1,16,64,128,256,512"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["operator"] for r in records} >= {"layernorm", "lm_head", "rotary_emb"}
    bad = _write(tmp_path / "bad.csv", ["num_tokens", "qkv_proj_ms"], [[1, "x"]])
    assert main([*args[:1], "--measured", str(bad), *args[3:]]) == 2
    assert f"{bad}, row 2, column 'qkv_proj_ms'" in capsys.readouterr().err


def test_a_byte_order_mark_loads_and_the_sizes_named_are_the_sizes_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CSV saved with a UTF-8 byte-order mark (Excel's "CSV UTF-8") reads as without one; the
    calibration sizes reported are those the file has, and the asked-for ones it lacks are said."""
    path = _synthetic(tmp_path, "vidur")
    rows = [r for r in path.read_text().splitlines(keepends=True) if not r.startswith("16,")]
    bom = tmp_path / "bom.csv"
    bom.write_bytes("".join(rows).encode("utf-8-sig"))
    table = load_measured(bom, "vidur")
    assert 16 not in table.tokens and table.tokens[0] == 1
    report = validate(table, MODEL, HW)
    assert 16 not in report.train_tokens and report.missing_train_tokens == (16,)
    assert report.train_tokens == (1, 64, 128, 256, 512, 1024)
    args = ["validate", "--measured", str(bom), "--format", "vidur"]
    args += ["--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "calibrated on s ∈ {1, 64, 128, 256, 512, 1024} (not in the file: 16)" in out
