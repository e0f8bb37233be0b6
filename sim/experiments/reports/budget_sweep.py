"""The ``budget-sweep`` report (the paper's Fig. 6): fixed-N speedup curves against adaptive.

Per model × GPU × workload: the best fixed N (the oracle), the adaptive controller's speedup and
mean N, their ratio, the paper's controller beside it, and whether the fixed-N curve is unimodal;
the figure draws every curve with the adaptive choice marked."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bastion.guard import public
from bastion.sim.reporting import Row, group, md_table, pyplot, report_guard, save_figure

__all__ = ["FIXED_SWEEP", "report"]

FIXED_SWEEP = (16, 32, 64, 128, 256, 512, 1024)
"""The fixed tree sizes a budget-sweep config must compare (``fixed:N``)."""


@public
@report_guard("budget-sweep")
def report(rows: list[Row], out: Path) -> str:
    table = []
    groups = group(rows, ("model", "gpu", "workload"))
    for key, rs in groups.items():
        by = {r["policy"]: r for r in rs}
        fixed = [by[f"fixed:{n}"]["speedup"] for n in FIXED_SWEEP]
        best = int(np.argmax(fixed))
        adaptive = by["bastion"]
        ratio = adaptive["speedup"] / fixed[best]
        paper = by.get("bastion:paper", {}).get("speedup", float("nan")) / fixed[best]
        table.append(
            (
                *key,
                FIXED_SWEEP[best],
                fixed[best],
                adaptive["speedup"],
                adaptive["mean_tree_size"],
                ratio,
                paper,
                "yes" if _unimodal(fixed) else "no",
            )
        )
    _budget_sweep_figure(groups, out)
    ratios = [t[-3] for t in table]
    papers = [t[-2] for t in table if t[-2] == t[-2]]
    uni = sum(t[-1] == "yes" for t in table)
    header = (
        "model",
        "gpu",
        "workload",
        "oracle N",
        "oracle ×",
        "adaptive ×",
        "adaptive N",
        "adaptive/oracle",
        "paper's controller/oracle",
        "unimodal",
    )
    paper_line = (
        f"; the paper's controller (bastion:paper)/oracle median {np.median(papers):.3f}, "
        f"min {min(papers):.3f}"
        if papers
        else ""
    )
    kept = sum(r >= 0.98 for r in ratios)
    return (
        md_table(header, table)
        + "\n\nClaim (Fig. 6): fixed-N speedup curves are peaked, with a peak that moves with "
        f"model, GPU and workload; adaptive tracks the oracle. Simulator: unimodal in {uni}/"
        f"{len(table)} settings; oracle N ranges {min(t[3] for t in table)}–"
        f"{max(t[3] for t in table)}; adaptive (bastion, learning)/oracle median "
        f"{np.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}, ≥ 0.98 in "
        f"{kept}/{len(ratios)}{paper_line}."
    )


def _budget_sweep_figure(groups: Mapping[tuple[Any, ...], list[Row]], out: Path) -> None:
    """One row of panels per model × GPU (shared y axis), one column per workload; the
    adaptive controller's choice (its mean N and speedup) marked on each curve."""
    plt = pyplot()
    if plt is None:
        return
    pairs = list(dict.fromkeys(k[:2] for k in groups))
    workloads = list(dict.fromkeys(k[2] for k in groups))
    width = max(3.6 * len(workloads), 7.0)
    ncol = 5 if width >= 10 else 3
    legend_in = 0.3 * math.ceil(5 / ncol)  # the figure legend's height (inches)
    fig, axes = plt.subplots(
        len(pairs),
        len(workloads),
        figsize=(width, 2.7 * len(pairs) + legend_in + 0.2),
        squeeze=False,
        sharex=True,
        sharey="row",
    )
    for (model, gpu, workload), rs in groups.items():
        i, j = pairs.index((model, gpu)), workloads.index(workload)
        ax = axes[i][j]
        by = {r["policy"]: r for r in rs}
        fixed = [by[f"fixed:{n}"]["speedup"] for n in FIXED_SWEEP]
        best = int(np.argmax(fixed))
        adaptive = by["bastion"]
        ax.semilogx(FIXED_SWEEP, fixed, "o-", color="C0", ms=3, label="fixed N")
        ax.plot(
            FIXED_SWEEP[best],
            fixed[best],
            "s",
            color="C0",
            mfc="none",
            ms=8,
            label="oracle (best fixed N)",
        )
        ax.axhline(adaptive["speedup"], color="C3", ls="--", lw=1, label="adaptive")
        ax.plot(
            max(adaptive["mean_tree_size"], FIXED_SWEEP[0] / 2),
            adaptive["speedup"],
            "*",
            color="C3",
            ms=10,
            label="adaptive: its mean N",
        )
        ax.axhline(by["chain"]["speedup"], color="C2", ls=":", lw=1, label="chain")
        ax.set_title(f"{model} · {gpu} · {workload}", fontsize=8)
        ax.grid(alpha=0.3)
        if i == len(pairs) - 1:
            ax.set_xlabel("tree size N")
        if j == 0:
            ax.set_ylabel("speedup over AR ×")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - (legend_in + 0.1) / fig.get_figheight()))
    save_figure(fig, out / "budget-sweep.png")


def _unimodal(values: Sequence[float], rtol: float = 0.01) -> bool:
    """Rises then falls (within rtol of noise)."""
    v = np.asarray(values)
    peak = int(np.argmax(v))
    up = np.all(np.diff(v[: peak + 1]) >= -rtol * v.max())
    down = np.all(np.diff(v[peak:]) <= rtol * v.max())
    return bool(up and down)
