"""docs/experiments/ stores each experiment's summary, plots and results.csv only; the
per-request rows (requests.csv) and results.json are regenerated on demand, never committed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KEPT = ("summary.md", "results.csv")


def _git(*args: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.splitlines()


def test_only_summaries_plots_and_results_csv_are_stored() -> None:
    tracked = _git("ls-files", "docs/experiments")
    assert tracked, "docs/experiments/ holds the shipped experiments' results"
    extra = [f for f in tracked if not (f.endswith(".png") or f.rsplit("/", 1)[-1] in KEPT)]
    assert not extra, f"regenerated on demand, not stored: {extra}"
    names = {Path(f).parent.name for f in tracked}
    for name in names:
        assert f"docs/experiments/{name}/summary.md" in tracked


def test_regenerated_files_are_ignored_and_kept_ones_are_not() -> None:
    ignored = ["docs/experiments/moe/requests.csv", "docs/experiments/moe/results.json"]
    kept = ["docs/experiments/moe/summary.md", "docs/experiments/moe/results.csv"]
    assert _git("check-ignore", "--no-index", *ignored, *kept) == ignored
