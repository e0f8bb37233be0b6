"""A cost model built from measured per-operator tables (``--cost-model profiled:FILE``).

Like Vidur, the profiled model predicts an operator from its measured latencies: between two
measured token counts by piecewise power-law (log-log) interpolation, beyond the measured range
by that operator's calibrated roofline (fitted to all its measured points with the global fit of
:mod:`bastion.cost.fitting`), scaled to meet the last measurement. Operators the table does not
measure (attention, the KV-cache write, in the Vidur layout also the LM head and final norm) come
from the roofline, bare or calibrated as the mode says, exactly as :class:`RooflineCostModel`
prices them:

    T_verify(T) = roofline(T) − Σ_covered bare_op(T) + Σ_columns count · measured_column(T)

(in the ``static`` modes the covered operators' share of the calibrated pass is removed in
proportion to their bare share). The table is for one GPU and one model at tensor parallel 1.

What this module does not do: read files other than the one table, or choose N.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.cost.calibration import CalibrationRecord, LinearCalibration
from bastion.cost.columnfit import calibrate_column, interpolate_loglog, operator_features
from bastion.cost.costmodel import CostMode, RooflineCostModel
from bastion.cost.hardware import HardwareProfile
from bastion.cost.measured import FORMATS, MeasuredTable, load_measured
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.roofline import verify_pass
from bastion.errors import ConfigError
from bastion.guard import public
from bastion.interfaces import CostCurve, StepLoad

__all__ = ["ProfiledCostModel", "cost_model_from_spec"]

Array = npt.NDArray[np.float64]
MIN_POINTS = 5


class _Column:
    """One measured column: interpolation inside its range, calibrated roofline beyond."""

    def __init__(self, column: str, table: MeasuredTable, model: ModelSpec, hw: HardwareProfile):
        spec = FORMATS[table.format][column]
        y = table.columns[column]
        have = np.isfinite(y)
        if have.sum() < MIN_POINTS:
            raise ConfigError(
                f"{table.path}: column {column!r} has {int(have.sum())} measured token counts; "
                f"a profiled operator needs at least {MIN_POINTS}"
            )
        self.name = column
        self.spec = spec
        self.tokens, self.seconds = table.tokens[have], y[have]
        self.model, self.hw = model, hw
        feats = operator_features(spec, model, hw, self.tokens)
        # the beyond-range roofline is fitted on ≤ 12 log-spaced measured points (leave-one-out
        # choice of its features is quadratic in the points)
        pick = np.zeros(self.tokens.size, dtype=bool)
        pick[np.unique(np.round(np.geomspace(1, self.tokens.size, 12)).astype(int) - 1)] = True
        self.calibration = calibrate_column(feats, self.tokens, self.seconds, pick)
        # how many cells one pass runs: a layer's count per layer column, once per pass
        share = sum(k for _, k in spec.parts) / len(spec.parts)
        per_layer = 1.0 / share
        if column == "layernorm_ms":  # one fused add + norm kernel; a layer runs two
            per_layer = 2.0
        self.count = per_layer if spec.per_pass else per_layer * model.layers
        self.replaces = {op for op, _ in spec.parts}
        if column == "layernorm_ms":
            self.replaces |= {"post_attn_norm"}

    def seconds_at(self, tokens: Array) -> Array:
        def beyond(t: Array) -> Array:
            return self.calibration.predict(operator_features(self.spec, self.model, self.hw, t))

        return interpolate_loglog(self.tokens, self.seconds, tokens, beyond)


@public
class ProfiledCostModel(RooflineCostModel):
    """:class:`RooflineCostModel` whose measured operators come from a per-operator table."""

    def __init__(
        self,
        hardware: HardwareProfile,
        model: ModelSpec,
        table: MeasuredTable,
        drafter: DrafterSpec | None = None,
        calibration: CalibrationRecord | LinearCalibration | None = None,
        mode: CostMode | None = None,
        *,
        options: RooflineOptions | None = None,
        **kwargs: Any,
    ) -> None:
        # the tables measure vLLM-style kernels: fused q/k/v and gate/up, gathered embedding
        opt = replace(
            options or RooflineOptions(),
            fused_qkv=True,
            fused_gate_up=True,
            full_embedding_table=False,
        )
        super().__init__(
            hardware, model, drafter, calibration, mode, options=opt, **kwargs
        )  # fmt: skip
        if model.is_moe:
            raise ConfigError("profiled cost models cover dense models; accepted: a dense model")
        self.table = table
        self.columns = [_Column(c, table, model, hardware) for c in table.columns]
        self._replaced = set().union(*(c.replaces for c in self.columns))

    def _covered_bare(self, tokens: Array) -> Array:
        b = verify_pass(self.model, self.hardware, [(tokens, 0)], self.options)
        ops = [op for op in b.operators if op.name in self._replaced]
        total = sum((np.asarray(op.time_s) for op in ops), np.zeros(()))
        return np.broadcast_to(total, tokens.shape).astype(np.float64)

    def _base(self, tokens: Array, load: StepLoad, masked: bool = True) -> tuple[Array, Array]:
        bare_s, cal_s = super()._base(tokens, load, masked)
        t = np.asarray(self._shape(tokens, load, masked).tokens, dtype=np.float64)
        t = np.broadcast_to(t, np.shape(bare_s)).astype(np.float64)
        covered = self._covered_bare(t)
        measured = sum((c.count * c.seconds_at(t) for c in self.columns), np.zeros(()))
        share = np.clip(covered / bare_s, 0.0, 1.0)
        return bare_s - covered + measured, cal_s * (1.0 - share) + measured

    def joint_cost_curve(
        self,
        context_lens: npt.NDArray[np.int64],
        grow: npt.NDArray[np.int64],
        *,
        growth: bool = True,
    ) -> CostCurve:
        """The joint curve priced prefix by prefix with ``step_cost`` (correct, not vectorised;
        it proves no growth bound, so ``growth`` changes nothing)."""
        from bastion.interfaces import RequestLoad

        ctx = [int(c) for c in context_lens]
        sizes = [1] * len(ctx)

        def load() -> StepLoad:
            rest = tuple(RequestLoad(s, c) for s, c in zip(sizes[1:], ctx[1:], strict=True))
            return StepLoad(ctx[0], rest)

        base = self.cost_curve(1, load())
        verify = [self.step_cost(1, load()).verify_s]
        for i in np.asarray(grow, dtype=np.int64).tolist():
            if not 0 <= i < len(ctx):
                raise ConfigError(f"grow must hold request indices in [0, {len(ctx)})")
            sizes[i] += 1
            verify.append(self.step_cost(sizes[0], load()).verify_s)
        return CostCurve(
            draft_s=base.draft_s,
            prep_s=base.prep_s,
            verify_s=np.array(verify, dtype=np.float64),
            ar_step_s=base.ar_step_s,
        )


def split_profiled(spec: str) -> tuple[str | None, str] | None:
    """``profiled:[FORMAT:]FILE`` → (FORMAT or None, FILE); anything else → None."""
    if not spec.startswith("profiled:"):
        return None
    rest = spec.removeprefix("profiled:")
    fmt, _, path = rest.partition(":")
    return (fmt, path) if fmt in FORMATS and path else (None, rest)


@public
def cost_model_from_spec(
    spec: str,
    hardware: HardwareProfile,
    model: ModelSpec,
    *,
    drafter: DrafterSpec | None = None,
    calibration: CalibrationRecord | LinearCalibration | None = None,
    options: RooflineOptions | None = None,
    **kwargs: Any,
) -> RooflineCostModel:
    """The cost model a ``--cost-model`` value names.

    ``bare``, ``static``, ``ema``, ``ema+calib``: :class:`RooflineCostModel` in that mode;
    ``profiled:FILE`` or ``profiled:FORMAT:FILE`` (FORMAT ``vidur``, the default, or
    ``llmservingsim``): :class:`ProfiledCostModel` from that table (static when a calibration
    is given, else bare, for the operators the table does not measure).
    """
    profiled = split_profiled(spec)
    if profiled is not None:
        fmt, path = profiled[0] or "vidur", profiled[1]
        if not path or not os.path.exists(path):
            raise ConfigError(
                f"--cost-model {spec!r}: no file {path!r}; accepted: profiled:FILE or "
                f"profiled:FORMAT:FILE with FORMAT one of {', '.join(FORMATS)}"
            )
        table = load_measured(path, fmt)
        return ProfiledCostModel(
            hardware, model, table, drafter, calibration, options=options, **kwargs
        )
    modes = ("bare", "static", "ema", "ema+calib")
    if spec not in modes:
        raise ConfigError(
            f"--cost-model {spec!r}; accepted: {', '.join(modes)}, profiled:FILE, "
            "profiled:FORMAT:FILE"
        )
    return RooflineCostModel(
        hardware, model, drafter, calibration, spec,  # type: ignore[arg-type]
        options=options, **kwargs,
    )  # fmt: skip
