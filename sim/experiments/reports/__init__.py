"""Reports: what an experiment writes to summary.md (and its figures), chosen by name.

A config names its report (``report = "budget-sweep"``); without one an experiment gets
``generic``, a table of every setting and policy.

Seeds: ``generic`` and ``controller-regret`` pool seeds themselves (``generic`` writes
``mean ± standard deviation`` over seeds); every other report receives one row per setting and
policy, averaged over the seeds (:func:`bastion.sim.reporting.mean_over_seeds`), and, when the
grid has several seeds, :func:`summary` adds the generic table (mean ± standard deviation)
below it. Each report is one module with one function,
``report(rows, out) -> str``: it receives every record of the experiment and the experiment's
output directory (for its figures) and returns the markdown text under the summary's title.
:data:`REPORTS` maps the names a config may give to those functions.

What this module does not do: run anything, or write summary.md (:mod:`..runner` does).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bastion.errors import UnknownNameError
from bastion.guard import public
from bastion.sim.reporting import Row, mean_over_seeds, seed_count

from . import (
    best_first_vs_beam,
    budget_sweep,
    controller_regret,
    generic,
    latency_model,
    moe,
    multi_batch,
    serving_scale,
)

__all__ = ["POOLS_SEEDS", "REPORTS", "Report", "summary"]

Report = Callable[[list[Row], Path], str]

REPORTS: dict[str, Report] = {
    "generic": generic.report,
    "budget-sweep": budget_sweep.report,
    "best-first-vs-beam": best_first_vs_beam.report,
    "multi-batch": multi_batch.report,
    "moe": moe.report,
    "latency-model": latency_model.report,
    "controller-regret": controller_regret.report,
    "serving-scale": serving_scale.report,
}
"""Reports a config may name (``report = "…"``); without one an experiment gets ``generic``."""

POOLS_SEEDS = frozenset({"generic", "controller-regret"})
"""Reports that read every seed's rows themselves."""


@public
def summary(name: str, rows: list[Row], out: Path) -> str:
    """The report ``name``'s text for an experiment's rows (see the module docstring on seeds)."""
    if name not in REPORTS:
        raise UnknownNameError(f"unknown report {name!r}; known: {', '.join(sorted(REPORTS))}")
    if name in POOLS_SEEDS or seed_count(rows) <= 1:
        return REPORTS[name](rows, out)
    text = REPORTS[name](mean_over_seeds(rows), out)
    return (
        text
        + f"\n\nAcross the {seed_count(rows)} seeds (the table above: their means):\n\n"
        + generic.report(rows, out)
    )
