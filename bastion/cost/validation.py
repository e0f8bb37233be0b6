"""Compare the per-operator roofline with measured per-layer kernel timings.

The measured data (``docs/data/a100-80gb_llama-3-8b_per-layer-ops.csv``, from the Vidur
simulator's public profiling data, MIT licence) gives milliseconds per layer per operator of
Meta-Llama-3-8B on one A100 80GB against the number of tokens in the pass. Its kernels are
vLLM's: fused q/k/v and gate/up projections, fused SiLU·mul, gathered embedding rows, one
residual add per kernel.

:func:`operator_errors` calibrates each operator on a few token counts and reports the error of
the bare and the calibrated roofline on the others.

What this module does not do: read files outside the path it is given, or plot (see
``docs/make_cost_figures.py``).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bastion.cost.calibration import LinearCalibration, fit_linear, rmse
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import ModelSpec
from bastion.cost.roofline import RooflineOptions, verify_pass
from bastion.errors import ConfigError

__all__ = [
    "CSV_TO_OPERATOR",
    "DEFAULT_TRAIN_TOKENS",
    "MEASURED_OPTIONS",
    "OperatorError",
    "load_measured",
    "operator_errors",
    "roofline_per_layer",
]

Array = npt.NDArray[np.float64]

#: CSV column → (roofline operator, how many of that operator's kernels one column covers)
CSV_TO_OPERATOR: dict[str, tuple[str, float]] = {
    "qkv_proj_ms": ("qkv_proj", 1.0),
    "o_proj_ms": ("o_proj", 1.0),
    "gate_up_proj_ms": ("gate_up_proj", 1.0),
    "down_proj_ms": ("down_proj", 1.0),
    "act_ms": ("act", 1.0),
    "rope_ms": ("rope", 1.0),
    "input_norm_ms": ("input_norm", 1.0),
    "post_attn_norm_ms": ("post_attn_norm", 1.0),
    "residual_add_ms": ("residual_add", 0.5),  # our op is both adds of a layer
    "embedding_ms": ("embedding", 1.0),
}
#: The measured kernels' implementation choices.
MEASURED_OPTIONS = RooflineOptions(fused_qkv=True, fused_gate_up=True, full_embedding_table=False)
#: Token counts to calibrate on (the rest are predicted).
DEFAULT_TRAIN_TOKENS: tuple[int, ...] = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 32768)


def load_measured(path: str | os.PathLike[str]) -> dict[str, Array]:
    """The CSV as columns of floats (``num_tokens`` plus one column per operator)."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except FileNotFoundError:
        raise ConfigError(f"measured data not found: {path}") from None
    if not rows or "num_tokens" not in rows[0]:
        raise ConfigError(f"{path}: expected a CSV with a num_tokens column")
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


def roofline_per_layer(
    model: ModelSpec,
    hw: HardwareProfile,
    tokens: npt.ArrayLike,
    op: str,
    options: RooflineOptions = MEASURED_OPTIONS,
    share: float = 1.0,
) -> tuple[Array, Array, Array]:
    """(compute branch, memory branch, bare time) in seconds for one layer's ``op``."""
    s = np.asarray(tokens, dtype=np.float64)
    b = verify_pass(model, hw, [(s, 0)], options).op(op)
    per = share / (1.0 if op in ("embedding", "final_norm", "lm_head") else model.layers)
    shape = s.shape
    return (
        np.broadcast_to(b.compute_s * per, shape).astype(np.float64),
        np.broadcast_to(b.memory_s * per, shape).astype(np.float64),
        np.broadcast_to(b.time_s * per, shape).astype(np.float64),
    )


@dataclass(frozen=True)
class OperatorError:
    """Bare and calibrated error of one operator on the held-out token counts."""

    column: str
    operator: str
    rmse_bare_ms: float
    rmse_calibrated_ms: float
    mape_bare: float  # mean |pred − meas| / meas
    mape_calibrated: float
    max_rel_calibrated: float
    calibration: LinearCalibration
    n_test: int


def operator_errors(
    data: dict[str, Array],
    model: ModelSpec,
    hw: HardwareProfile,
    train_tokens: Sequence[int] = DEFAULT_TRAIN_TOKENS,
    max_tokens: int | None = None,
    tile_tokens: int = 0,
) -> list[OperatorError]:
    """Calibrate each operator on ``train_tokens``; score bare and calibrated on the rest.

    ``max_tokens`` restricts training and scoring to passes of at most that many tokens (tree
    verification lives below ~1024).
    """
    tokens = data["num_tokens"]
    keep = tokens <= (max_tokens or np.inf)
    train = keep & np.isin(tokens, np.asarray(train_tokens, dtype=np.float64))
    test = keep & ~train
    if train.sum() < 5 or test.sum() < 1:
        raise ConfigError("need at least 5 training and 1 test token counts")
    tiled = RooflineOptions(
        fused_qkv=True, fused_gate_up=True, full_embedding_table=False, tile_tokens=tile_tokens
    )
    out = []
    for column, (op, share) in CSV_TO_OPERATOR.items():
        if column not in data:
            continue
        y = data[column] * 1e-3
        _, rm, bare = roofline_per_layer(model, hw, tokens, op, MEASURED_OPTIONS, share)
        rc, _, _ = roofline_per_layer(model, hw, tokens, op, tiled, share)
        cal = fit_linear(rc[train], rm[train], y[train], tile_tokens=tile_tokens)
        pred = cal.predict(rc, rm)
        rel_bare = np.abs(bare[test] - y[test]) / y[test]
        rel_cal = np.abs(pred[test] - y[test]) / y[test]
        out.append(
            OperatorError(
                column=column,
                operator=op,
                rmse_bare_ms=rmse(bare[test], y[test]) * 1e3,
                rmse_calibrated_ms=rmse(pred[test], y[test]) * 1e3,
                mape_bare=float(rel_bare.mean()),
                mape_calibrated=float(rel_cal.mean()),
                max_rel_calibrated=float(rel_cal.max()),
                calibration=cal,
                n_test=int(test.sum()),
            )
        )
    return out
