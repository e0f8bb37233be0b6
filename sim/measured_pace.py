"""The machine's speed over time, read from timed steps: a shared machine's drift, taken out of a
measured truth and put back into the replay of the runs it predicts.

A shared CPU's speed drifts by ±10 % within a quarter of a minute and has slow spells of tens
of percent (``bastion twin``'s calibration steps, 5-second windows). A truth fitted on
calibration steps as they were timed mixes that drift into its terms wherever the calibration's
mix of step kinds changes over time — when a slow spell falls where most calibration steps are
trees, the tree terms come out slow and the AR terms fast (by 4–5 % in one recorded run), and
every speedup over AR with them. :func:`fit_paced` therefore fits twice: once as timed, then
again with each calibration step's times divided by the machine's speed around it
(:class:`MachinePace`: the calibration steps within ``window_s`` of it, their measured time over
what the first fit says of them, normalised to a mean of 1 over the calibration), and so on
for a few passes. The last fit is the machine at its mean speed; :meth:`MachinePace.at` is its
speed at any moment, which the twin's replay applies step by step to the runs it predicts (each
at the moment the real step ran) — from the calibration steps' times only, never the predicted
steps' own.

What this module does not do: fit the terms (:mod:`bastion.sim.measured_fit` does) or replay
(:mod:`bastion.sim.twin` does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.measured import MeasuredCosts
from bastion.sim.measured_fit import fit_measured
from bastion.stepcosts import STAGES, PrefillSample, StepSample

__all__ = [
    "PACE_MIN_STEPS",
    "PACE_PASSES",
    "PACE_WINDOW_S",
    "MachinePace",
    "fit_paced",
    "machine_pace",
]

Array = npt.NDArray[np.float64]

PACE_WINDOW_S = 5.0  # the window around a moment whose calibration steps give its speed
PACE_MIN_STEPS = 32  # a window with fewer is widened to the nearest this many steps
# passes of refitting with the pace taken out (on two recorded twin runs a step's speed moved
# by ≤ 3–4 % in the second pass and ≤ 0.6–0.9 % in the fourth; the passes do not settle to a
# fixed point — the stalls the fit leaves out and the pace keeps nudge the level — so a fixed
# number is used)
PACE_PASSES = 4
_TIMES = ("draft_s", "build_s", "verify_s", "other_s", *STAGES)


@dataclass(frozen=True)
class MachinePace:
    """The machine's speed at any moment (1.1: 10 % slower than the truth), from timed steps:
    over those within ``window_s / 2`` of the moment (at least ``min_steps``: the nearest), their
    measured time over what the truth says of them. Built by :func:`machine_pace`."""

    times: Array  # the steps' start times (the machine's monotonic clock), ascending
    measured: Array  # cumulative measured seconds, len(times) + 1
    priced: Array  # cumulative truth's seconds, len(times) + 1
    window_s: float = PACE_WINDOW_S
    min_steps: int = PACE_MIN_STEPS

    def at(self, times: npt.ArrayLike) -> Array:
        """The speed at each of ``times`` (1.0 everywhere when no step had a time)."""
        t = np.asarray(times, dtype=np.float64)
        n = self.times.shape[0]
        if n == 0:
            return np.ones_like(t)
        lo = np.searchsorted(self.times, t - self.window_s / 2)
        hi = np.searchsorted(self.times, t + self.window_s / 2, side="right")
        want = min(self.min_steps, n)
        thin = hi - lo < want  # too few steps in the window: the nearest ``want`` instead
        if np.any(thin):
            mid = np.searchsorted(self.times, t[thin])
            start = np.clip(mid - want // 2, 0, n - want)
            lo[thin], hi[thin] = start, start + want
        spent = self.measured[hi] - self.measured[lo]
        priced = self.priced[hi] - self.priced[lo]
        return np.where(priced > 0, spent / np.where(priced > 0, priced, 1.0), 1.0)


@public
def machine_pace(
    costs: MeasuredCosts,
    steps: Sequence[StepSample],
    window_s: float = PACE_WINDOW_S,
    min_steps: int = PACE_MIN_STEPS,
) -> MachinePace:
    """The machine's speed over the time ``steps`` were timed, against ``costs`` (steps without
    a recorded time, ``at`` = 0, are left out)."""
    if not all(isinstance(s, StepSample) for s in steps):
        raise ConfigError("machine_pace: steps must be StepSample instances")
    if not (math.isfinite(window_s) and window_s > 0):  # (types: the guard's)
        raise ConfigError(f"machine_pace: window_s must be finite and > 0; got {window_s!r}")
    if min_steps < 1:
        raise ConfigError(f"machine_pace: min_steps must be ≥ 1; got {min_steps!r}")
    timed = sorted((s for s in steps if s.at > 0), key=lambda s: s.at)
    measured = np.array([s.cycle_s for s in timed], dtype=np.float64)
    priced = np.array([costs.step_s(s) for s in timed], dtype=np.float64)
    return MachinePace(
        np.array([s.at for s in timed], dtype=np.float64),
        np.concatenate(([0.0], np.cumsum(measured))),
        np.concatenate(([0.0], np.cumsum(priced))),
        float(window_s),
        min_steps,
    )


def _slowed(step: StepSample, factor: float) -> StepSample:
    """``step`` as timed on a machine ``factor`` times as fast (every time ÷ ``factor``)."""
    return dataclasses.replace(step, **{k: getattr(step, k) / factor for k in _TIMES})


@public
def fit_paced(
    steps: Sequence[StepSample],
    prefills: Sequence[PrefillSample],
    meta: Mapping[str, Any] | None = None,
    window_s: float = PACE_WINDOW_S,
) -> tuple[MeasuredCosts, MachinePace]:
    """A measured truth of the machine at its mean speed, and its speed over time: fit ``steps``
    as timed, read the speed around each step from that fit (:func:`machine_pace`), fit again
    with each step's times divided by its speed (normalised to a mean of 1, weighted by the
    steps' priced time), and repeat against the new fit, :data:`PACE_PASSES` passes in all.
    Steps without a recorded time keep theirs. ``prefills`` are fitted as timed."""
    costs = fit_measured(steps, prefills, meta)
    pace = machine_pace(costs, steps, window_s)
    at = np.array([s.at for s in steps], dtype=np.float64)
    timed = at > 0
    if not np.any(timed):
        return costs, pace
    for _ in range(PACE_PASSES):
        speed = np.ones_like(at)
        speed[timed] = pace.at(at[timed])
        weight = np.array([costs.step_s(s) for s in steps], dtype=np.float64)
        speed /= float(np.sum(speed * weight) / np.sum(weight))
        normalised = [
            _slowed(s, float(f)) if t else s for s, f, t in zip(steps, speed, timed, strict=True)
        ]
        costs = fit_measured(normalised, prefills, meta)
        pace = machine_pace(costs, steps, window_s)
    return costs, pace
