"""``DecisionCurves.joint_cycles`` (several batch totals priced at once, as the learning
controller prices a step with a prefill chunk) gives each total exactly what ``joint_cycle``
gives it alone: the same floats, for totals within the joint horizon and beyond it (another
prior horizon each), with the table measured or not."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.learned import LearnedCostModel
from tests.test_learned import FlatPrior


@pytest.mark.parametrize("measured", [False, True])
@pytest.mark.parametrize("b", [2, 5, 32])
def test_joint_cycles_are_joint_cycle_of_each_total(b: int, measured: bool) -> None:
    learner = LearnedCostModel(FlatPrior(slope=2e-5))
    contexts = np.arange(b, dtype=np.int64) * 97 + 300
    if measured:  # ratios other than 1, in several cells
        for total, seconds in ((b, 9e-3), (4 * b, 13e-3), (b + 700, 21e-3)):
            sizes = np.full(b, total // b, np.int64)
            sizes[: total % b] += 1
            for _ in range(3):
                learner.observe_cycle("tree", contexts, sizes, seconds)
    # the tree's and the chain's totals of a step with a 512-token chunk, and beyond the horizon
    totals = (b + 3 + 512, 7 * b + 512, b + 512, 7 * b, b, 4096, 4097, 9000, 2 * b)
    got = learner.joint_cycles(contexts, totals)
    want = [learner.copy().joint_cycle(contexts, total) for total in totals]
    assert got == want
    assert all(type(value) is float for value in got)
    assert len({*got}) > 3  # (the totals are priced apart)


def test_a_total_below_the_batch_is_left_to_joint_cycle() -> None:
    """A total below B is not a batch total: whatever joint_cycle makes of it (an error, or
    its slice's value), joint_cycles makes the same."""
    learner = LearnedCostModel(FlatPrior(slope=2e-5))
    contexts = np.full(4, 500, np.int64)
    for total in (3, 0, -1):
        try:
            want: object = learner.joint_cycle(contexts, total)
        except Exception as exc:
            want = type(exc)
        try:
            got: object = learner.joint_cycles(contexts, (8, total))[1]
        except Exception as exc:
            got = type(exc)
        assert got == want
