"""What the experiment reports share: grouping rows, markdown tables, matplotlib and figures.

Every report (``bastion.sim.experiments.reports``, and the controller-regret analysis of
:mod:`bastion.sim.regret`) turns a list of records into a markdown text and, where matplotlib is
installed, a PNG figure. Numbers in tables are written with three significant digits; a value
undefined for its row (NaN: e.g. draft acceptance for target-only AR decoding, which drafts
nothing) as ``—``; a metric over several seeds as ``mean ± standard deviation`` (:func:`spread`).

What this module does not do: compute anything a report claims (each report does).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bastion.errors import ConfigError
from bastion.guard import has, public, writable_file
from bastion.sim.results import SPEC_COLUMNS

__all__ = [
    "Row",
    "cell",
    "group",
    "md_table",
    "mean_over_seeds",
    "pyplot",
    "save_figure",
    "seed_count",
    "spread",
]

log = logging.getLogger(__name__)

Row = dict[str, Any]
"""One record (a row of results.csv)."""


@public
def group(rows: Sequence[Row], keys: Sequence[str]) -> dict[tuple[Any, ...], list[Row]]:
    """Rows by the values of ``keys``, in order of first appearance; a row without one of the
    keys, or with a value that cannot be a key (a list), is a :class:`ConfigError`."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for i, r in enumerate(rows):
        missing = [k for k in keys if k not in r]
        if missing:
            raise ConfigError(f"group: row {i} has no column {missing[0]!r}")
        key = tuple(r[k] for k in keys)
        try:
            out.setdefault(key, []).append(r)
        except TypeError:
            raise ConfigError(f"group: row {i} holds an unhashable value under {keys!r}") from None
    return out


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None (with a warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: plots skipped (pip install 'bastion[plot]')")
        return None
    return plt


@public(fig=has("savefig"), path=writable_file)
def save_figure(fig: Any, path: Path) -> None:
    """A figure as PNG, written atomically (a crash never leaves half an image), then closed."""
    from bastion.files import save_figure_atomic

    save_figure_atomic(fig, path, dpi=110)
    plt = pyplot()
    if plt is not None:
        plt.close(fig)


def cell(x: Any) -> str:
    """A table cell: floats to three significant digits; NaN — a metric undefined for the row,
    such as draft acceptance for AR, which drafts nothing — as ``—``."""
    if isinstance(x, float):
        return "—" if math.isnan(x) else f"{x:.3g}"
    return str(x)


@public
def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (cells as :func:`cell` writes them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


@public
def seed_count(rows: Sequence[Row]) -> int:
    """How many different seeds the rows hold."""
    return len({r.get("seed") for r in rows})


@public
def spread(values: Sequence[float], scale: float = 1.0) -> float | str:
    """One cell for a metric over seeds: the value itself for one seed, else ``mean ± sd``
    (the sample standard deviation, n − 1), each to three significant digits. Seeds where the
    metric is undefined (NaN) are left out; none left: NaN."""
    xs = np.asarray(values, dtype=np.float64) * scale
    xs = xs[~np.isnan(xs)]  # seeds where the metric is undefined (none drafted) do not count
    if xs.size == 0:
        return float("nan")
    if xs.size == 1:
        return float(xs[0])
    return f"{cell(float(np.mean(xs)))} ± {cell(float(np.std(xs, ddof=1)))}"


@public
def mean_over_seeds(rows: Sequence[Row]) -> list[Row]:
    """One row per setting and policy, seeds pooled: the metrics (numbers, and equal-length
    lists of numbers) averaged, the setting's columns kept; ``seed`` lists the seeds pooled.
    Rows that hold one seed are returned unchanged (copies)."""
    if seed_count(rows) <= 1:
        return [dict(r) for r in rows]
    keys = [k for k in ("experiment", *SPEC_COLUMNS, "policy") if k != "seed" and k in rows[0]]
    out: list[Row] = []
    for rs in group(rows, keys).values():
        merged = dict(rs[0])
        for k in merged.keys() - {*keys, "seed"}:
            values = [r.get(k) for r in rs]
            if all(_number(v) for v in values):
                merged[k] = float(np.mean(np.asarray(values, dtype=np.float64)))
            elif (
                all(isinstance(v, list | tuple) and all(map(_number, v)) for v in values)
                and len({len(v) for v in values}) == 1  # type: ignore[arg-type]
            ):
                merged[k] = [float(x) for x in np.mean(np.asarray(values, float), axis=0)]
        merged["seed"] = sorted({r.get("seed") for r in rs})
        out.append(merged)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


ReportFn = Callable[[list[Row], Path], str]


def report_guard(name: str) -> Callable[[ReportFn], ReportFn]:
    """A report's boundary: its rows must be a non-empty list of records, and rows that lack
    what the report reads (a missing column or policy) are a :class:`ConfigError` naming the
    report, not a ``KeyError`` or ``IndexError`` from inside it."""
    import functools

    def wrap(report: ReportFn) -> ReportFn:
        @functools.wraps(report)
        def checked(rows: list[Row], out: Path) -> str:
            if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
                raise ConfigError(f"the {name} report needs a non-empty list of result records")
            try:
                return report(rows, out)
            except (KeyError, IndexError) as exc:
                raise ConfigError(
                    f"the {name} report cannot read these records (missing {exc}); run the "
                    f"{name} experiment's grid"
                ) from None

        return checked

    return wrap
