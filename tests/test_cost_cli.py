"""`bastion cost` and `bastion calibrate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bastion.cli import main


def test_cost_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cost", "--model", "qwen3-8b", "--gpu", "h100-sxm", "--tokens", "1,16,64,256"]
    assert main([*argv, "--context", "1024", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in records] == [1, 16, 64, 256]
    totals = [r["total_s"] for r in records]
    assert totals == sorted(totals) and 1e-3 < totals[0] < 2e-2
    assert {"op", "time_s", "flops", "bytes"} <= set(records[0]["breakdown"][0])
    assert main([*argv, "--batch", "4"]) == 0
    assert "top operators" in capsys.readouterr().out


def test_calibrate_then_static_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb", "--cache-dir", str(tmp_path)]
    assert main(["calibrate", *common, "--tokens", "1,8,64,256,512", "--repeats", "1"]) == 0
    assert "RMSE bare" in capsys.readouterr().out
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert main(["cost", *common, "--cost-model", "static", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["mode"] == "static"


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--model", "qwen3-9b", "--gpu", "h100-sxm"]) == 2
    assert "known:" in capsys.readouterr().err
    args = ["cost", "--model", "qwen3-8b", "--gpu", "h100-sxm", "--cache-dir", str(tmp_path)]
    assert main([*args, "--mode", "static"]) == 2
    assert "bastion calibrate" in capsys.readouterr().err
    assert main(["calibrate", "--model", "qwen3-8b", "--gpu", "h100-sxm", "--backend", "x"]) == 2
