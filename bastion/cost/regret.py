"""Decision regret: what a cost model's errors cost the controller, on a measured table.

A cost model is only as good as the choices it leads to: two sizes whose predicted times are
both 10 % off in the same direction are still ranked right, while a 3 % error across a kernel
step can send the controller to the wrong side of it. Given a measured per-operator table
(:mod:`bastion.cost.validation`) and acceptance curves τ(N) (committed tokens per step of the
best-first tree of each size, e.g. from the shipped workload presets), each mode picks

    N* = argmax_N τ(N) · T(1) / T(N)

over the table's token counts with its own T — ``bare`` (the roofline), ``transfer`` (the
kernel model with parameters fitted on *other* GPUs' tables, where given), ``calibrated`` (the
roofline fitted per operator on the default calibration sizes), ``measured`` (the learning
controller's procedure: decide only among sizes whose time was measured — the table's token
counts on the controller's token lattice, at most ``max_measured`` of the smallest) — and is
scored with the
measured T: regret = 1 − S(N*) / max_N S(N), S(N) = τ(N) · T_meas(1) / T_meas(N). T is the
whole verification pass from the table: the per-layer columns times the model's layers plus the
per-pass columns (the drafter and host are left out: they do not depend on N).

What this module does not do: read files (:func:`bastion.cost.validation.load_measured`) or
make acceptance curves (``bastion.sim.regret.acceptance_curve``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bastion.cost.columnfit import calibrate_column, operator_features
from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import KernelParams
from bastion.cost.measured import FORMATS, MEASURED_OPTIONS, MeasuredTable
from bastion.cost.models import ModelSpec
from bastion.cost.transfer import column_predictor
from bastion.cost.validation import DEFAULT_TRAIN_TOKENS, MIN_TRAIN
from bastion.errors import ConfigError
from bastion.guard import array, integer, public

__all__ = [
    "MAX_MEASURED",
    "REGRET_MODES",
    "RegretRecord",
    "decision_regret",
    "measured_sizes",
    "pass_times",
]

Array = npt.NDArray[np.float64]
MAX_MEASURED = 32  # sizes the learning controller's start-up times, at most
REGRET_MODES = ("bare", "calibrated", "measured")  # "transfer" after "bare" where given


@dataclass(frozen=True)
class RegretRecord:
    """One mode's decision regret over the acceptance curves."""

    mode: str
    worst_regret: float  # the largest 1 − S(N*)/S_best over the curves
    median_regret: float
    n_measured: int  # token counts the mode decided among (measured: ≤ MAX_MEASURED)
    chosen: dict[str, int]  # N* per curve

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "worst_regret": self.worst_regret,
            "median_regret": self.median_regret,
            "n_measured": self.n_measured,
            "chosen": dict(self.chosen),
        }


@public
def pass_times(
    table: MeasuredTable,
    model: ModelSpec,
    hw: HardwareProfile,
    transfer: KernelParams | None = None,
) -> tuple[npt.NDArray[np.int64], dict[str, Array]]:
    """The token counts at which every mapped column was measured, and the whole pass there:
    measured, bare roofline, calibrated roofline (per column, on the default sizes) and, given
    ``transfer`` (kernel parameters fitted on other GPUs' tables), the kernel model's."""
    spec = FORMATS[table.format]
    usable = [c for c, v in table.columns.items() if np.isfinite(v).sum() >= MIN_TRAIN]
    if not usable:
        raise ConfigError(f"{table.path}: no column has {MIN_TRAIN} measured token counts")
    complete = np.all([np.isfinite(table.columns[c]) for c in usable], axis=0)
    tokens = table.tokens
    train = np.isin(tokens, np.asarray(DEFAULT_TRAIN_TOKENS, dtype=np.float64)) & complete
    modes = ("measured", "bare", "calibrated") + (("transfer",) if transfer is not None else ())
    out = {m: np.zeros(int(complete.sum())) for m in modes}
    for column in usable:
        reps = 1.0 if spec[column].per_pass else float(model.layers)
        y = table.columns[column]
        feats = operator_features(spec[column], model, hw, tokens)
        out["measured"] += reps * y[complete]
        out["bare"] += reps * feats.bare[complete]
        if transfer is not None:
            predict = column_predictor(spec[column], model, hw, tokens, MEASURED_OPTIONS)
            out["transfer"] += reps * predict(transfer)[complete]
        if train.sum() >= MIN_TRAIN:
            out["calibrated"] += (
                reps * calibrate_column(feats, tokens, y, train).predict(feats)[complete]
            )
        else:
            out["calibrated"] += reps * feats.bare[complete]
    return tokens[complete].astype(np.int64), out


@public(tokens=array(1, lo=0, nonempty=True, whole=True), most=integer(lo=0))
def measured_sizes(tokens: npt.NDArray[np.int64], most: int) -> npt.NDArray[np.int64]:
    """Indices of the token counts the learning controller would have timed: the table's
    counts on its token lattice (every 8 tokens up to 256, then coarser), the smallest ``most``
    of them — dense where tree sizes are decided."""
    from bastion.learned import token_lattice

    tokens = np.asarray(tokens, dtype=np.int64)
    on = np.flatnonzero(np.isin(tokens, token_lattice(int(tokens.max()))))
    return on[:most]


@public
def decision_regret(
    table: MeasuredTable,
    model: ModelSpec,
    hw: HardwareProfile,
    curves: Mapping[str, Array],
    max_measured: int = MAX_MEASURED,
    transfer: KernelParams | None = None,
) -> list[RegretRecord]:
    """Each mode's regret over ``curves`` (name → τ(N) for N = 1 … len, τ(1) = 1);
    ``transfer``: also the kernel model's with these parameters (fitted on other GPUs' tables,
    :func:`bastion.cost.transfer.fit_kernel_params`)."""
    if isinstance(max_measured, bool) or not isinstance(max_measured, int) or max_measured < 2:
        raise ConfigError(f"max_measured must be an integer ≥ 2; got {max_measured!r}")
    if not curves:
        raise ConfigError("decision regret needs at least one acceptance curve")
    tokens, times = pass_times(table, model, hw, transfer)
    if tokens.size < 2 or tokens[0] != 1:
        raise ConfigError(
            f"{table.path}: the pass must be measured at 1 token and at least one more size "
            f"(measured at {tokens.tolist()[:8]})"
        )
    for name, tau in curves.items():
        if np.asarray(tau).shape[0] < int(tokens[-1]):
            raise ConfigError(
                f"acceptance curve {name!r} has {np.asarray(tau).shape[0]} sizes; the table "
                f"needs {int(tokens[-1])}"
            )
    measured_idx = measured_sizes(tokens, max_measured)
    records = []
    modes = REGRET_MODES if transfer is None else ("bare", "transfer", *REGRET_MODES[1:])
    for mode in modes:
        candidates = measured_idx if mode == "measured" else np.arange(tokens.size)
        belief = times["measured" if mode == "measured" else mode]
        regrets, chosen = [], {}
        for name, curve in curves.items():
            tau = np.asarray(curve, dtype=np.float64)[tokens - 1]
            truth = tau * times["measured"][0] / times["measured"]
            predicted = tau[candidates] * belief[0] / belief[candidates]
            pick = int(candidates[int(np.argmax(predicted))])
            regrets.append(1.0 - float(truth[pick] / truth.max()))
            chosen[name] = int(tokens[pick])
        records.append(
            RegretRecord(
                mode=mode,
                worst_regret=float(max(regrets)),
                median_regret=float(np.median(regrets)),
                n_measured=int(candidates.size),
                chosen=chosen,
            )
        )
    return records
