"""The ``generic`` report: one line per setting and policy, for any experiment.

The spec columns that vary across the experiment come first, then the policy, the number of
seeds pooled and the means of the headline metrics; the columns that do not vary are written
once above the table.

Where a run had SLOs, the table adds their attainment and goodput, and ``slo.png`` plots both
per policy against the first numeric setting that varies (arrival rate, concurrency…); where
memory bound (a preemption, or a request that waited for admission), it adds the most requests
run at once, the preemptions and the queueing delay's p99. Otherwise the table is as before.

What this module does not do: plot anything else (a generic grid has no single natural
figure)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bastion.guard import public
from bastion.sim.reporting import (
    Row,
    group,
    md_table,
    pyplot,
    report_guard,
    save_figure,
    seed_count,
    spread,
)
from bastion.sim.results import SPEC_COLUMNS

__all__ = ["GENERIC_METRICS", "report"]


GENERIC_METRICS = (
    ("speedup", "speedup ×", 1.0),
    ("tau", "τ", 1.0),
    ("acceptance_rate", "acceptance", 1.0),
    ("mean_tree_size", "mean N", 1.0),
    ("tpot_s", "TPOT ms", 1e3),
    ("tpot_p99_s", "TPOT p99 ms", 1e3),
    ("ttft_p50_s", "TTFT p50 ms", 1e3),
    ("throughput_tok_s", "tok/s", 1.0),
)

SLO_METRICS = (("slo_attainment", "SLO met %", 100.0), ("goodput_rps", "goodput req/s", 1.0))
MEMORY_METRICS = (
    ("max_running", "max running", 1.0),
    ("preemptions", "preemptions", 1.0),
    ("queue_delay_p99_s", "queue p99 s", 1.0),
)


def _given(rows: list[Row], name: str) -> bool:
    return any(isinstance(r.get(name), int | float) and r[name] == r[name] for r in rows)


@public
@report_guard("generic")
def report(rows: list[Row], out: Path) -> str:
    """One line per setting and policy: the spec columns that vary, then the metrics — over
    several seeds, mean ± standard deviation."""
    varying = [c for c in SPEC_COLUMNS if c != "seed" and len({str(r.get(c)) for r in rows}) > 1]
    keys = [*varying, "policy"]
    metrics = list(GENERIC_METRICS)
    slo = _given(rows, "slo_attainment")
    if slo:
        metrics += SLO_METRICS
    if any((r.get("preemptions") or 0) > 0 or (r.get("queue_delay_p99_s") or 0) > 0 for r in rows):
        metrics += MEMORY_METRICS
    table = []
    for key, rs in group(rows, keys).items():
        values = []
        for name, _, scale in metrics:
            xs = [r[name] for r in rs if isinstance(r.get(name), int | float)]
            values.append(spread(xs, scale) if xs else float("nan"))
        table.append((*key, len(rs), *values))
    header = (*keys, "seeds", *[label for _, label, _ in metrics])
    if slo:
        _plot_slo(rows, varying, out)
    fixed = {c: rows[0].get(c) for c in SPEC_COLUMNS if c not in varying and c != "seed"}
    setting = ", ".join(f"{k} {v}" for k, v in fixed.items() if v is not None)
    note = (
        f"\n\nOver {seed_count(rows)} seeds: mean ± standard deviation (n − 1) across seeds."
        if seed_count(rows) > 1
        else ""
    )
    return f"Fixed: {setting}.\n\n" + md_table(header, table) + note


def _plot_slo(rows: list[Row], varying: list[str], out: Path) -> None:
    """``slo.png``: goodput and SLO attainment per policy (seeds averaged) against the first
    numeric setting that varies, or one point per policy where none does."""
    plt = pyplot()
    if plt is None:
        return
    axis = next((c for c in varying if all(isinstance(r.get(c), int | float) for r in rows)), None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for policy, rs in group(rows, ["policy"]).items():
        by = group(rs, [axis]) if axis else {(0,): rs}
        xs = sorted(by)
        for ax, name, scale in ((left, "goodput_rps", 1.0), (right, "slo_attainment", 100.0)):
            ys = [scale * float(np.nanmean([r[name] for r in by[x]])) for x in xs]
            ax.plot([x[0] for x in xs], ys, "o-", label=policy[0])
    left.set_ylabel("goodput (requests/s meeting the SLOs)")
    right.set_ylabel("SLO attainment (%)")
    for ax in (left, right):
        ax.set_xlabel(axis or "")
    left.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "slo.png")
