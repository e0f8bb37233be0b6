"""Several seeds: summary.md shows mean ± spread (standard deviation) across them, and a
report that reads one row per policy gets the seeds' means, not the last seed's row."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.sim import experiments
from bastion.sim.reporting import mean_over_seeds, spread

GRID = """
name = "{name}"
{report}
[grid]
model = "qwen3-coder-30b-a3b"
gpu = "a100-sxm-80gb"
workload = "qwen3-coder-30b-a3b-code"
policies = ["fixed:16", "fixed:32", "chain", "bastion"]
requests = 2
output_len = 24
seed = {seeds}
"""


def _run(tmp: Path, name: str, seeds: str, report: str = "") -> tuple[str, list[dict[str, str]]]:
    config = tmp / f"{name}.toml"
    config.write_text(textwrap.dedent(GRID.format(name=name, seeds=seeds, report=report)))
    summary = experiments.run_experiment(config, tmp / "out", executor="serial")
    with (tmp / "out" / name / "results.csv").open() as f:
        return summary, list(csv.DictReader(f))


def test_spread_is_mean_and_sample_standard_deviation() -> None:
    assert spread([2.0]) == 2.0
    assert spread([1.0, 3.0]) == "2 ± 1.41"
    assert spread([0.001, 0.003], scale=1e3) == "2 ± 1.41"
    assert np.isnan(spread([]))  # type: ignore[arg-type]


def test_mean_over_seeds_pools_metrics_and_keeps_the_setting() -> None:
    rows = [
        {"model": "m", "concurrency": 2, "seed": s, "policy": p, "tau": t, "by": [t, 1.0]}
        for s, p, t in ((0, "chain", 2.0), (1, "chain", 4.0), (0, "ar", 1.0), (1, "ar", 1.0))
    ]
    pooled = mean_over_seeds(rows)
    assert pooled == [
        {"model": "m", "concurrency": 2, "seed": [0, 1], "policy": "chain", "tau": 3.0,
         "by": [3.0, 1.0]},
        {"model": "m", "concurrency": 2, "seed": [0, 1], "policy": "ar", "tau": 1.0,
         "by": [1.0, 1.0]},
    ]  # fmt: skip
    assert mean_over_seeds(rows[:1]) == rows[:1]


def test_generic_summary_shows_mean_and_spread_over_seeds(tmp_path: Path) -> None:
    summary, rows = _run(tmp_path, "seeds", "[0, 1, 2]")
    assert "Over 3 seeds: mean ± standard deviation" in summary
    chain = [float(r["tau"]) for r in rows if r["policy"] == "chain"]
    assert len(chain) == 3 and len(set(chain)) > 1  # the seeds differ
    line = next(ln for ln in summary.splitlines() if ln.startswith("| chain |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "3"  # seeds
    assert cells[3] == f"{np.mean(chain):.3g} ± {np.std(chain, ddof=1):.3g}"  # τ
    # the negative control: one seed, plain numbers
    one, _ = _run(tmp_path, "one-seed", "0")
    assert "±" not in one and "Over" not in one


def test_a_bespoke_report_gets_the_seeds_means(tmp_path: Path) -> None:
    summary, rows = _run(tmp_path, "moe-seeds", "[0, 1]", report='report = "moe"')
    tau = {p: np.mean([float(r["tau"]) for r in rows if r["policy"] == p]) for p in ("chain",)}
    line = next(ln for ln in summary.splitlines() if ln.startswith("| chain |"))
    assert f"| {tau['chain']:.3g} |" in line  # the moe table's τ: the mean over both seeds
    assert "Across the 2 seeds" in summary
    assert summary.count("| chain |") == 2  # the moe table's row, then the generic one


def test_undefined_metrics_print_as_a_dash(tmp_path: Path) -> None:
    summary, rows = _run(tmp_path, "dash", "0")
    assert [r["acceptance_rate"] for r in rows if r["policy"] == "ar"] in (["nan"], [""])
    ar = next(ln for ln in summary.splitlines() if ln.startswith("| ar |"))
    cells = [c.strip() for c in ar.strip("|").split("|")]
    header = next(ln for ln in summary.splitlines() if ln.startswith("| policy |"))
    assert cells[[c.strip() for c in header.strip("|").split("|")].index("acceptance")] == "—"
    assert "nan" not in summary
    chain = next(ln for ln in summary.splitlines() if ln.startswith("| chain |"))
    assert "—" not in chain  # the negative control: a drafting policy has an acceptance


def test_quick_dry_run_describes_the_quick_grid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "budget-sweep", "--quick", "--dry-run"]) == 0
    quick = capsys.readouterr().out
    assert "2 runs (2 gpu)" in quick and "model" not in quick.split("(")[1].split(")")[0]
    assert main(["experiment", "budget-sweep", "--dry-run"]) == 0
    assert "36 runs (3 model × 4 gpu × 3 workload)" in capsys.readouterr().out
