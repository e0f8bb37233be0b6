"""The ``controller-regret`` report: the learning controller against every other policy.

For each setting (every spec column that varies, seeds pooled) the metric is the speedup over AR
at concurrency 1 and the throughput above it; ``bastion``'s *regret ratio* is its metric over
the best of every policy of the setting that is not a ``bastion`` one (AR, the chain, fixed N,
…), and the paper's controller (``bastion:paper``) is shown beside it. The promise being
checked: ``bastion`` ≥ 0.98 × the best other policy in every setting, median ≥ 1.00.

:func:`acceptance_curve` gives the τ(N) curve of a workload preset that
``bastion validate --regret`` scores a cost model's decisions with.

What this module does not do: run simulations (the experiment runner does) or decide anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import each, mapping_with, public
from bastion.sim.results import SPEC_COLUMNS

__all__ = ["PROMISE", "regret_report", "regret_rows"]

PROMISE = 0.98  # bastion ≥ PROMISE × the best other policy, in every setting

Row = dict[str, Any]


def acceptance_curve(
    workload: str, n_max: int = 1024, steps: int = 300, seed: int = 0
) -> npt.NDArray[np.float64]:
    """τ(N) for N = 1 … ``n_max``: the mean committed tokens per step (bonus included) of the
    best-first tree of each size on ``steps`` draft steps of a workload preset (T = 0: the
    prefixes of one verified tree of ``n_max`` nodes give every smaller size exactly)."""
    from bastion.bestfirst import accepted_paths
    from bastion.errors import BudgetError
    from bastion.policies import best_first_batch
    from bastion.sim.synthetic import SyntheticSource
    from bastion.sim.workloads import get_workload

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BudgetError(f"steps must be an integer ≥ 1; got {steps!r}")
    source = SyntheticSource(get_workload(workload), seed)
    source.admit(0, 0)
    slots = np.zeros(1, np.int64)
    sizes = np.arange(1, n_max + 1)
    total = np.zeros(n_max)
    for _ in range(steps):
        marginals, target = source.draft(slots, slots)
        trees = best_first_batch(marginals, n_max)
        walked = accepted_paths(trees.parents, trees.tokens, trees.depths, trees.offsets, target)
        if walked is None:  # pragma: no cover - without the compiled kernel
            from bastion.sim.backend import accepted_counts

            raise BudgetError(f"acceptance curves need the compiled kernel ({accepted_counts})")
        path = np.sort(walked[3])
        total += 1 + np.searchsorted(path, sizes - 1, side="right")
    return total / steps


def _metric(row: Row) -> float:
    concurrency = row.get("concurrency") or 1
    key = "speedup" if int(concurrency) <= 1 and not row.get("arrival_rate") else "throughput_tok_s"
    return float(row[key])


@public(error=ConfigError, rows=each(mapping_with("policy")))
def regret_rows(rows: Sequence[Row]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(setting columns, one tuple per setting): the setting's values, the best other policy,
    its metric, bastion's, bastion's ratio, bastion:paper's ratio (nan without it)."""
    varying = [c for c in SPEC_COLUMNS if c != "seed" and len({str(r.get(c)) for r in rows}) > 1]
    groups: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for r in rows:
        key = tuple(r.get(c) for c in varying)
        try:
            metric = _metric(r)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(
                f"a result row lacks a numeric speedup or throughput: {exc!r}"
            ) from None
        groups.setdefault(key, {}).setdefault(str(r["policy"]), []).append(metric)
    out = []
    for key, by in groups.items():
        mean = {p: float(np.mean(v)) for p, v in by.items()}
        others = {p: v for p, v in mean.items() if not p.startswith("bastion")}
        if "bastion" not in mean or not others:
            continue
        best = max(others, key=lambda p: others[p])
        paper = mean.get("bastion:paper", float("nan")) / others[best]
        out.append(
            (*key, best, others[best], mean["bastion"], mean["bastion"] / others[best], paper)
        )
    return varying, out


@public
def regret_report(rows: list[Row], out: Path) -> str:
    """The table, the summary line and ``regret.png`` (bastion's and the paper's ratios)."""
    varying, table = regret_rows(rows)
    if not table:
        return "No setting has both bastion and another policy: nothing to compare."
    ratios = np.array([t[-2] for t in table])
    paper = np.array([t[-1] for t in table])
    _figure(varying, table, out)
    header = [*varying, "best other", "its metric", "bastion", "bastion/best", "paper/best"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for t in table:
        cells = [f"{x:.3g}" if isinstance(x, float) else str(x) for x in t]
        lines.append("| " + " | ".join(cells) + " |")
    kept = int(np.sum(ratios >= PROMISE))
    summary = (
        "\n\nClaim (the `bastion` policy's promise): never slower than the best built-in "
        f"policy, within noise — bastion ≥ {PROMISE} × the best other policy in every setting. "
        f"Simulator: bastion/best other median {np.median(ratios):.3f}, min {ratios.min():.3f}, "
        f"≥ {PROMISE} in {kept}/{len(ratios)} settings"
    )
    if np.isfinite(paper).any():
        p = paper[np.isfinite(paper)]
        summary += (
            f"; the paper's controller: median {np.median(p):.3f}, min {p.min():.3f}, "
            f"≥ {PROMISE} in {int(np.sum(p >= PROMISE))}/{len(p)}"
        )
    return "\n".join(lines) + summary + "."


def _figure(varying: list[str], table: list[tuple[Any, ...]], out: Path) -> None:
    from bastion.sim.reporting import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return
    order = np.argsort([t[-2] for t in table])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = np.arange(len(table))
    ax.scatter(x, [table[i][-2] for i in order], s=14, label="bastion (learning)")
    ax.scatter(x, [table[i][-1] for i in order], s=14, marker="x", label="bastion:paper")
    ax.axhline(PROMISE, color="grey", lw=0.8, ls="--", label=f"{PROMISE}")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xlabel("setting (sorted by bastion's ratio)")
    ax.set_ylabel("metric / best other policy")
    ax.set_title("Controller regret: " + " × ".join(varying))
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "regret.png")
