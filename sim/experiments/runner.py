"""Running an experiment: plan its runs, compute the missing ones, write its files and summary.

:func:`run_experiment` resolves the config, computes (or reuses) every run with the chosen
executor, and writes into ``OUT/NAME/``: ``results.csv`` and ``results.json`` (one record per
run and policy), ``requests.csv`` (one row per run, policy and request), the report's figures
and ``summary.md`` (the title, the config's description and the report's text). :func:`plan`
says what it would do without doing it (``--dry-run``).

What this module does not do: validate configs (:mod:`.config`) or format results
(:mod:`.reports`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.guard import public
from bastion.sim.results import (
    RunStore,
    write_csv_atomic,
    write_records_json,
    write_text_atomic,
)

from .config import ExperimentConfig, resolve_config
from .executors import run_all
from .reports import summary as report_summary
from .runs import Run

__all__ = ["Plan", "plan", "run_experiment"]


@dataclass(frozen=True)
class Plan:
    """What an experiment would do: its runs, how many are stored, where it writes."""

    config: ExperimentConfig
    runs: list[Run]
    target: Path
    stored: int
    quick: bool = False  # the config's [quick] grid

    @property
    def simulations(self) -> int:
        return sum(len(r["spec"]["policies"]) + 1 for r in self.runs)  # + AR

    def describe(self) -> str:
        """One line: the runs and the axes they vary along (read from the runs themselves, so
        ``--quick`` shows its own grid), the simulations, what is stored and where."""
        quick = self.config.quick if self.quick else {}
        grids = [{**g, **quick} for g in self.config.grids]
        keys = dict.fromkeys(k for g in grids for k, v in g.items() if len(v) > 1)
        axes = {
            k: {repr(r["spec"].get(k)) for r in self.runs}
            for k in keys
            if k != "policies" and self.runs and k in self.runs[0]["spec"]
        }
        shape = " × ".join(f"{len(v)} {k}" for k, v in axes.items() if len(v) > 1)
        return (
            f"{self.config.name}: {len(self.runs)} runs ({shape or 'one setting'}), "
            f"{self.simulations} policy simulations (AR included); {self.stored} stored, "
            f"{len(self.runs) - self.stored} to compute; results in {self.target}"
        )


@public
def plan(config: ExperimentConfig, out: Path, quick: bool = False) -> Plan:
    target = out / config.name
    runs = config.runs(quick)
    directory = target / ("runs-quick" if quick else "runs")
    stored = sum((directory / f"{r['key']}.json").is_file() for r in runs)
    return Plan(config, runs, target, stored, quick)


def _progress_bar(name: str) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar: Any = None

    def tick(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=name, unit="run", file=sys.stderr, dynamic_ncols=True)
        bar.update(done - bar.n)

    def close() -> None:
        if bar is not None:
            bar.close()

    return tick, close


@public
def run_experiment(
    name: str | os.PathLike[str] | ExperimentConfig,
    out: Path,
    executor: str = "process",
    address: str | None = None,
    workers: int | None = None,
    quick: bool = False,
    progress: bool = False,
    connect_timeout: float = 30.0,
) -> str:
    """Run or resume an experiment (a shipped name, a config path, or a loaded config); write
    results.csv, results.json, requests.csv, plots and summary.md; return the summary."""
    config = name if isinstance(name, ExperimentConfig) else resolve_config(name)
    p = plan(config, out, quick)
    store = RunStore(p.target / ("runs-quick" if quick else "runs"))
    tick, close = _progress_bar(config.name) if progress else (None, lambda: None)
    try:
        rows = run_all(p.runs, store, executor, workers, address, tick, connect_timeout)
    finally:
        close()
    requests = [q for run in p.runs for q in store.record(run).get("requests", [])]
    write_csv_atomic(p.target / "results.csv", rows)
    write_records_json(
        p.target / "results.json", rows, experiment=config.name, config=config.source
    )
    write_csv_atomic(p.target / "requests.csv", requests)
    title = f"# {config.name}{' (quick)' if quick else ''}\n\n"
    if config.description:
        title += config.description.strip() + "\n\n"
    summary = title + report_summary(config.report or "generic", rows, p.target) + "\n"
    write_text_atomic(p.target / "summary.md", summary)
    return summary
