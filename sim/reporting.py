"""What the experiment reports share: grouping rows, markdown tables, matplotlib and figures.

Every report (``bastion.sim.experiments.reports``, and the controller-regret analysis of
:mod:`bastion.sim.regret`) turns a list of records into a markdown text and, where matplotlib is
installed, a PNG figure. Numbers in tables are written with three significant digits.

What this module does not do: compute anything a report claims (each report does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Row", "cell", "group", "md_table", "pyplot", "save_figure"]

log = logging.getLogger(__name__)

Row = dict[str, Any]
"""One record (a row of results.csv)."""


def group(rows: Sequence[Row], keys: Sequence[str]) -> dict[tuple[Any, ...], list[Row]]:
    """Rows by the values of ``keys``, in order of first appearance."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
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


def save_figure(fig: Any, path: Path) -> None:
    """A figure as PNG, written atomically (a crash never leaves half an image), then closed."""
    from bastion.files import save_figure_atomic

    save_figure_atomic(fig, path, dpi=110)
    plt = pyplot()
    if plt is not None:
        plt.close(fig)


def cell(x: Any) -> str:
    """A table cell: floats to three significant digits."""
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (cells as :func:`cell` writes them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)
