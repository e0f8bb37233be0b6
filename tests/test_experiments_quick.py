"""Every shipped experiment's quick grid, end to end (its own module: the run's longest test,
so that the workers, which take a module at a time, can balance it against the others)."""

from __future__ import annotations

from pathlib import Path

from bastion.sim import experiments


def test_every_experiment_runs_quick(tmp_path: Path) -> None:
    """Each experiment's quick grid runs end to end and writes CSV, summary (and plots): on
    two worker processes, the CLI's default executor (the serial one is checked against the
    others in test_executors_give_identical_rows)."""
    for name in experiments.known_experiments():
        summary = experiments.run_experiment(
            name, tmp_path, executor="process", workers=2, quick=True
        )
        assert "Claim" in summary
        assert (tmp_path / name / "results.csv").stat().st_size > 0
        assert (tmp_path / name / "summary.md").exists()
