"""The machine's pace (bastion.sim.measured_pace): its drift read from timed steps, taken out of
a measured truth.

The "machine" is the pretend one of tests/test_measured.py, timed here along a timeline of our
own: every step kind early on, then only tree steps through a slow spell (1.3× slower) — the
pattern a shared CPU put into a recorded twin run, when the calibration's AR session had ended
before a slow spell that its tree sessions ran through. A truth fitted as timed then prices
trees too slow against AR (the negative control below); the paced fit must not.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bastion.errors import ArgumentError, ConfigError
from bastion.sim.measured_fit import fit_measured
from bastion.sim.measured_pace import MachinePace, fit_paced, machine_pace
from bastion.stepcosts import StepSample
from tests.test_measured import machine_verify, make_samples

SPELL = 1.3  # the slow spell's slowdown
GAP = 0.2  # seconds between steps on the timeline


def _timed(spell: float = SPELL) -> tuple[list[StepSample], list, float]:
    """The pretend machine's samples on a timeline: the first part every kind (with half the
    trees), the rest only trees, slowed by ``spell``; and when the spell began."""
    steps, prefills = make_samples(seed=3)
    rng = np.random.default_rng(7)
    trees = [s for s in steps if s.kind == "tree"]
    rng.shuffle(trees)  # type: ignore[arg-type]
    early = [s for s in steps if s.kind != "tree"] + trees[: len(trees) // 3]
    late = trees[len(trees) // 3 :]
    rng.shuffle(early)  # type: ignore[arg-type]
    start = len(early) * GAP + 1.0
    out = []
    for i, s in enumerate([*early, *late]):
        slow = spell if i >= len(early) else 1.0
        times = {k: getattr(s, k) * slow for k in ("draft_s", "build_s", "verify_s", "other_s")}
        out.append(dataclasses.replace(s, at=1.0 + i * GAP, **times))
    return out, prefills, start


def _tree_over_ar(costs) -> float:  # type: ignore[no-untyped-def]
    """How much slower than the machine the fit prices a tree, relative to how it prices AR."""
    tree = costs.verify_s("tree", [32], [150]) / machine_verify("tree", 1, 32, 150)
    ar = costs.verify_s("ar", [1], [150]) / machine_verify("ar", 1, 1, 150)
    return float(tree / ar)


def test_a_slow_spell_is_taken_out_of_the_truth_and_read_as_the_machines_pace() -> None:
    steps, prefills, spell_at = _timed()
    plain = fit_measured(steps, prefills)
    # negative control: fitted as timed, the spell makes trees ≥ 10 % dearer than AR
    assert _tree_over_ar(plain) > 1.10
    costs, pace = fit_paced(steps, prefills)
    assert _tree_over_ar(costs) == pytest.approx(1.0, abs=0.04)
    # the pace reads the spell: 1.3× as slow inside as before it (away from its edge)
    before = pace.at([1.0 + 0.25 * (spell_at - 1.0), 1.0 + 0.5 * (spell_at - 1.0)])
    inside = pace.at([spell_at + 3.0, spell_at + 4.0])
    assert inside / before == pytest.approx(np.full(2, SPELL), rel=0.04)
    # and the fitted truth is the machine at its mean speed: between the two
    assert 0.8 < before.mean() < 1.0 < inside.mean() < 1.3


def test_without_a_spell_the_paced_fit_is_the_plain_one() -> None:
    steps, prefills, _ = _timed(spell=1.0)
    costs, pace = fit_paced(steps, prefills)
    plain = fit_measured(steps, prefills)
    for kind, n in (("ar", 1), ("chain", 16), ("tree", 64)):
        assert costs.verify_s(kind, [n, n], [120, 150]) == pytest.approx(
            plain.verify_s(kind, [n, n], [120, 150]), rel=0.01
        )
    assert pace.at([2.0, 5.0]) == pytest.approx(np.ones(2), abs=0.03)


def test_steps_without_a_time_are_fitted_as_timed() -> None:
    steps, prefills = make_samples(seed=3)  # at = 0: no timeline
    costs, pace = fit_paced(steps, prefills)
    plain = fit_measured(steps, prefills)
    assert costs.verify_s("tree", [32], [150]) == plain.verify_s("tree", [32], [150])
    assert pace.at([0.0, 10.0]).tolist() == [1.0, 1.0]


def test_a_thin_window_is_widened_to_the_nearest_steps() -> None:
    times = np.arange(10, dtype=np.float64)  # one step a second, 1 s each priced, the last 3 at 2 s
    spent = np.array([1.0] * 7 + [2.0] * 3)
    pace = MachinePace(
        times,
        np.concatenate(([0.0], np.cumsum(spent))),
        np.concatenate(([0.0], np.cumsum(np.ones(10)))),
        window_s=0.5,
        min_steps=3,
    )
    assert pace.at([0.0, 9.0]).tolist() == [1.0, 2.0]  # the 3 nearest: all fast / all slow
    assert pace.at([7.0]).tolist() == [pytest.approx(5.0 / 3.0)]  # 6, 7, 8
    assert pace.at([-100.0]).tolist() == [1.0]  # before the first step: the first 3


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"window_s": 0.0}, ConfigError, "window_s must be finite and > 0"),
        ({"window_s": -1}, ConfigError, "window_s must be finite and > 0"),
        ({"window_s": float("nan")}, ArgumentError, "window_s must be a finite number"),
        ({"window_s": True}, ArgumentError, "window_s must be a finite number"),
        ({"min_steps": 0}, ConfigError, "min_steps must be ≥ 1"),
        ({"min_steps": 2.5}, ArgumentError, "min_steps must be an integer"),
    ],
)
def test_bad_pace_settings_are_refused(kwargs: dict, error: type, message: str) -> None:
    steps, prefills, _ = _timed()
    costs = fit_measured(steps, prefills)
    with pytest.raises(error, match=message):
        machine_pace(costs, steps, **kwargs)


def test_bad_pace_inputs_are_refused() -> None:
    steps, prefills, _ = _timed()
    costs = fit_measured(steps, prefills)
    with pytest.raises(ArgumentError, match="costs must be a MeasuredCosts"):
        machine_pace("fast", steps)  # type: ignore[arg-type]
    with pytest.raises((ConfigError, ArgumentError), match="steps must be"):
        machine_pace(costs, [1.0])  # type: ignore[list-item]
