"""Reproduce the cost-model validation table and figure of docs/cost-model.md.

    python docs/make_cost_figures.py            # prints the Markdown tables, writes the PNG

Needs matplotlib (``pip install bastion[plot]``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.validation import (
    CSV_TO_OPERATOR,
    DEFAULT_TRAIN_TOKENS,
    MEASURED_OPTIONS,
    load_measured,
    operator_errors,
    roofline_per_layer,
)

HERE = Path(__file__).resolve().parent
CSV = HERE / "data" / "a100-80gb_llama-3-8b_per-layer-ops.csv"
FIGURE = HERE / "figures" / "a100-llama3-8b-measured-vs-predicted.png"


def tables() -> str:
    data = load_measured(CSV)
    model, hw = get_model("llama-3.1-8b"), get_profile("a100-sxm-80gb")
    lines = []
    for max_tokens in (1024, None):
        scope = f"s ≤ {max_tokens}" if max_tokens else "all s (1 … 32768)"
        lin = operator_errors(data, model, hw, max_tokens=max_tokens, tile_tokens=0)
        step = operator_errors(data, model, hw, max_tokens=max_tokens, tile_tokens=64)
        lines.append(f"\n**{scope}**, {lin[0].n_test} held-out token counts\n")
        lines.append(
            "| operator | bare RMSE µs | bare MAPE | linear RMSE µs | linear MAPE "
            "| linear+step RMSE µs | linear+step MAPE | linear+step max |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for a, b in zip(lin, step, strict=True):
            lines.append(
                f"| {a.column.removesuffix('_ms')} | {a.rmse_bare_ms * 1e3:.1f} "
                f"| {a.mape_bare:.1%} | {a.rmse_calibrated_ms * 1e3:.1f} | {a.mape_calibrated:.1%} "
                f"| {b.rmse_calibrated_ms * 1e3:.1f} | {b.mape_calibrated:.1%} "
                f"| {b.max_rel_calibrated:.1%} |"
            )
    return "\n".join(lines)


def figure() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load_measured(CSV)
    model, hw = get_model("llama-3.1-8b"), get_profile("a100-sxm-80gb")
    tokens = data["num_tokens"]
    keep = tokens <= 2048
    errors = {e.column: e for e in operator_errors(data, model, hw, tile_tokens=64)}
    columns = ["qkv_proj_ms", "o_proj_ms", "gate_up_proj_ms", "down_proj_ms"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    tiled = MEASURED_OPTIONS.__class__(**{**MEASURED_OPTIONS.__dict__, "tile_tokens": 64})
    for ax, column in zip(axes.ravel(), columns, strict=True):
        op, share = CSV_TO_OPERATOR[column]
        _, rm, bare = roofline_per_layer(model, hw, tokens, op, MEASURED_OPTIONS, share)
        rc, _, _ = roofline_per_layer(model, hw, tokens, op, tiled, share)
        cal = errors[column].calibration.predict(rc, rm)
        train = np.isin(tokens, DEFAULT_TRAIN_TOKENS) & keep
        ax.plot(tokens[keep], data[column][keep], ".", ms=3, label="measured (Vidur, A100 80GB)")
        ax.plot(tokens[keep], bare[keep] * 1e3, "-", label="bare roofline")
        ax.plot(tokens[keep], cal[keep] * 1e3, "-", label="calibrated (linear + 64-token step)")
        ax.plot(tokens[train], data[column][train], "o", mfc="none", label="calibration points")
        ax.set_title(column.removesuffix("_ms") + " (one layer)")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("tokens in the pass")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Llama-3-8B on A100 80GB: measured vs predicted per-layer projection latency")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(tables())
    figure()
    print(f"\nwrote {FIGURE.relative_to(HERE.parent)}")
