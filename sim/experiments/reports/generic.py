"""The ``generic`` report: one line per setting and policy, for any experiment.

The spec columns that vary across the experiment come first, then the policy, the number of
seeds pooled and the means of the headline metrics; the columns that do not vary are written
once above the table.

What this module does not do: plot (a generic grid has no single natural figure)."""

from __future__ import annotations

from pathlib import Path

from bastion.guard import public
from bastion.sim.reporting import Row, group, md_table, report_guard, seed_count, spread
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


@public
@report_guard("generic")
def report(rows: list[Row], out: Path) -> str:
    """One line per setting and policy: the spec columns that vary, then the metrics — over
    several seeds, mean ± standard deviation."""
    varying = [c for c in SPEC_COLUMNS if c != "seed" and len({str(r.get(c)) for r in rows}) > 1]
    keys = [*varying, "policy"]
    table = []
    for key, rs in group(rows, keys).items():
        values = []
        for name, _, scale in GENERIC_METRICS:
            xs = [r[name] for r in rs if isinstance(r.get(name), int | float)]
            values.append(spread(xs, scale) if xs else float("nan"))
        table.append((*key, len(rs), *values))
    header = (*keys, "seeds", *[label for _, label, _ in GENERIC_METRICS])
    fixed = {c: rows[0].get(c) for c in SPEC_COLUMNS if c not in varying and c != "seed"}
    setting = ", ".join(f"{k} {v}" for k, v in fixed.items() if v is not None)
    note = (
        f"\n\nOver {seed_count(rows)} seeds: mean ± standard deviation (n − 1) across seeds."
        if seed_count(rows) > 1
        else ""
    )
    return f"Fixed: {setting}.\n\n" + md_table(header, table) + note
