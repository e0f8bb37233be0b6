"""Reproduce the cost-model validation table and figure of docs/cost-model.md.

    python docs/make_cost_figures.py            # prints the Markdown table, writes the PNG

The table is what ``bastion validate --measured docs/data/a100-80gb_llama-3-8b_per-layer-ops.csv
--format vidur --model llama-3.1-8b --gpu a100-sxm-80gb`` prints. The figure needs matplotlib
(``pip install bastion[plot]``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.validation import (
    DEFAULT_TRAIN_TOKENS,
    FORMATS,
    calibrate_column,
    load_measured,
    operator_features,
    validate,
)
from bastion.files import save_figure_atomic

HERE = Path(__file__).resolve().parent
CSV = HERE / "data" / "a100-80gb_llama-3-8b_per-layer-ops.csv"
FIGURE = HERE / "figures" / "a100-llama3-8b-measured-vs-predicted.png"


def tables() -> str:
    table = load_measured(CSV, "vidur")
    report = validate(table, get_model("llama-3.1-8b"), get_profile("a100-sxm-80gb"))
    by = {(r.operator, r.mode): r for r in report.results}
    ops = list(dict.fromkeys(r.operator for r in report.results))
    lines = [
        f"\n**s ≤ {report.max_tokens}**, {report.results[0].n_test} held-out token counts per "
        "operator (calibrated on s ∈ {1, 16, 64, 128, 256, 512, 1024})\n",
        "| operator | bare MAPE | bare max | calibrated MAPE | calibrated max | features (CV) "
        "| CV error | profiled MAPE | profiled max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for op in ops:
        b, c, p = by[(op, "bare")], by[(op, "calibrated")], by[(op, "profiled")]
        choice, _, cv = c.detail.partition(", leave-one-out ")
        lines.append(
            f"| {op} | {b.mape:.1%} | {b.max_error:.1%} | {c.mape:.1%} | {c.max_error:.1%} "
            f"| {choice} | {cv} | {p.mape:.1%} | {p.max_error:.1%} |"
        )
    lines.append(
        "| **mean / worst** | "
        + " | ".join(
            f"**{report.mean_mape(m):.1%}** | **{report.max_error(m):.1%}**"
            + (" | | " if m == "calibrated" else "")
            for m in ("bare", "calibrated", "profiled")
        )
        + " |"
    )
    return "\n".join(lines)


def figure() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = load_measured(CSV, "vidur")
    model, hw = get_model("llama-3.1-8b"), get_profile("a100-sxm-80gb")
    tokens = table.tokens
    keep = tokens <= 1024
    t = tokens[keep]
    train = np.isin(t, DEFAULT_TRAIN_TOKENS)
    columns = ["qkv_proj_ms", "o_proj_ms", "gate_up_proj_ms", "down_proj_ms"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for ax, column in zip(axes.ravel(), columns, strict=True):
        y = table.columns[column][keep]
        feats = operator_features(FORMATS["vidur"][column], model, hw, t)
        cal = calibrate_column(feats, t, y, train)
        ax.plot(t, y * 1e3, ".", ms=3, label="measured (Vidur, A100 80GB)")
        ax.plot(t, feats.bare * 1e3, "-", label="bare roofline")
        ax.plot(t, cal.predict(feats) * 1e3, "-", label=f"calibrated ({cal.choice})")
        ax.plot(t[train], y[train] * 1e3, "o", mfc="none", label="calibration points")
        ax.set_title(column.removesuffix("_ms") + " (one layer)")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("tokens in the pass")
    fig.suptitle("Llama-3-8B on A100 80GB: measured vs predicted per-layer projection latency")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    save_figure_atomic(fig, FIGURE, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(tables())
    figure()
    print(f"\nwrote {FIGURE.relative_to(HERE.parent)}")
