"""The learning controller's stepped decision floor compiled (``floor()`` in
``_bestfirst_joint.c``) is its numpy form in ``DecisionCurves._joint_deciding``, bit for bit:
for any learned table (measured cells, gaps, one observation or many, a spread that is zero or
not), size correction, batch, contexts, horizon and prefill chunk riding in the pass."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.learned_curves as curves
from bastion.cycles import LATTICE
from bastion.learned import LearnedCostModel
from tests.test_learned import FlatPrior

pytestmark = pytest.mark.skipif(
    getattr(curves._kernel, "floor", None) is None, reason="no compiled kernel"
)


@st.composite
def _learners(draw: st.DrawFn) -> tuple[LearnedCostModel, np.ndarray, int, int]:
    b = draw(st.integers(2, 40))
    learner = LearnedCostModel(FlatPrior(slope=draw(st.sampled_from([0.0, 1e-6, 2e-5]))))
    contexts = np.asarray(draw(st.lists(st.integers(0, 9000), min_size=b, max_size=b)), np.int64)
    # a few totals, each seen up to 40 times: cells with a spread, fuller than the window
    pool = draw(st.lists(st.one_of(st.integers(b, 4 * b), st.integers(b, 4096)), max_size=4))
    seen = st.lists(st.sampled_from(pool), max_size=40) if pool else st.just([])
    for total in draw(seen):
        step = draw(st.sampled_from([0.5, 1.0, 1.1, 1.3, 3.0]))
        sizes = np.full(b, total // b, np.int64)
        sizes[: total % b] += 1
        learner.observe_cycle("tree", contexts, sizes, 10e-3 * step)
    if draw(st.booleans()):  # a size correction other than none
        h = np.asarray(
            draw(
                st.lists(
                    st.sampled_from([0.5, 0.9, 1.0, 1.2, 2.5]),
                    min_size=LATTICE.shape[0],
                    max_size=LATTICE.shape[0],
                )
            ),
            np.float64,
        )
        h.flags.writeable = False
        learner.sizes.factors = lambda _b: h  # type: ignore[method-assign]
    top = draw(st.one_of(st.integers(b, 4 * b + 8), st.integers(b, 4096)))
    riding = draw(st.sampled_from([0, 0, 1, 37, 512]))
    return learner, contexts, top, riding


@settings(deadline=None)  # the profile's examples (more under CI=true)
@given(case=_learners())
def test_the_compiled_floor_is_the_numpy_floor(
    case: tuple[LearnedCostModel, np.ndarray, int, int],
) -> None:
    learner, contexts, top, riding = case
    reference = learner.copy()  # its own caches: each form prices afresh
    cells, got = learner._joint_deciding(contexts, top, riding)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(curves, "_kernel", None)
        want_cells, want = reference._joint_deciding(contexts, top, riding)
    assert np.array_equal(cells, want_cells)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True), (got, want)


def test_the_compiled_floor_refuses_buffers_that_do_not_match() -> None:
    floor = curves._kernel.floor
    even, ratios = np.ones(10), np.ones(LATTICE.shape[0])
    counts, factors = np.ones(LATTICE.shape[0], np.int64), np.ones(LATTICE.shape[0])
    args = (even, even, 0.25, ratios, counts, factors, 0.1, 9)
    assert np.frombuffer(floor(*args, 2, 11, 5, LATTICE)).size == 5
    with pytest.raises(ValueError, match="inconsistent"):  # the prior ends before top
        floor(*args, 2, 12, 5, LATTICE)
    with pytest.raises(ValueError, match="inconsistent"):  # one anchor ends before top
        floor(even, even[:8], 0.25, ratios, counts, factors, 0.1, 9, 2, 11, 5, LATTICE)
    with pytest.raises(ValueError, match="inconsistent"):  # more cells than the table holds
        floor(even, even, 0.25, ratios[:4], counts, factors, 0.1, 9, 2, 11, 5, LATTICE)
    with pytest.raises(ValueError, match="inconsistent"):  # top below the batch
        floor(*args, 4, 3, 5, LATTICE)
