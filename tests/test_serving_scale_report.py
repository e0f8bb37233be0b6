"""The ``serving-scale`` report on rows whose answers are known by hand, and the shipped config's
grid."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.sim import experiments
from bastion.sim.experiments.reports import summary


def _row(policy: str, prompt: int, rate: float, thr: float, p99: float, **extra: Any) -> dict:  # type: ignore[type-arg]
    return {
        "model": "llama-3.1-8b",
        "tp": 2,
        "prompt_len": prompt,
        "arrival_rate": rate,
        "policy": policy,
        "throughput_tok_s": thr,
        "tpot_p99_s": p99,
        "goodput_rps": 1.0,
        "preemptions": 0,
        "speedup": extra.pop("speedup", 1.0),
        "seed": 0,
        **extra,
    }


def _rows() -> list[dict]:  # type: ignore[type-arg]
    rows = []
    for prompt, speedup in ((512, 1.5), (16384, 2.4)):
        for rate in (2.0, 8.0):
            rows += [
                _row("ar", prompt, rate, 1000.0, 0.040),
                _row("chain", prompt, rate, 1500.0, 0.030, speedup=1.3),
                _row("fixed:16", prompt, rate, 2000.0, 0.020, speedup=1.4),
                _row("bastion", prompt, rate, 2500.0, 0.025, speedup=speedup),
            ]
    return rows


def test_the_report_compares_bastion_with_the_best_other(tmp_path: Path) -> None:
    text = summary("serving-scale", _rows(), tmp_path)
    # bastion 2500 tok/s against fixed:16's 2000; its TPOT p99 25 ms against fixed:16's 20 ms
    line = next(s for s in text.splitlines() if s.startswith("| llama-3.1-8b | 2 | 512 | 2"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[-2:] == ["1.25", "1.25"]
    assert "2000 / 20.0 / 1.00 / 0" in cells  # fixed:16's cell
    assert "1.50× at 512-token prompts, 2.40× at 16384 (+60 %)" in text
    assert text.count("Claim (MagicDec)") == 1
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "serving-scale.png").is_file()


def test_the_report_refuses_rows_it_cannot_read(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "arrival_rate"} for r in _rows()]
    with pytest.raises(ConfigError, match="arrival_rate"):
        summary("serving-scale", rows, tmp_path)


def test_the_shipped_config_expands() -> None:
    cfg = experiments.resolve_config("serving-scale")
    runs = cfg.runs()
    specs = [r["spec"] for r in runs]
    assert {(s["model"], s["tp"]) for s in specs} == {
        ("llama-3.1-8b", 1),
        ("llama-3.1-8b", 2),
        ("llama-3.1-70b", 4),
    }
    assert {s["prompt_len"] for s in specs} == {512, 16384}
    assert len(runs) == 2 * 2 * 3 + 2 * 3  # TP × prompt × rate (8B), prompt × rate (70B)
    assert len(cfg.runs(quick=True)) == 2 * 2 + 2
