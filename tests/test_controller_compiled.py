"""The compiled batch-1 size choice (``bastion._bestfirst.choose``) is the Python loop of
:func:`bastion.controller.choose_size`, bit for bit: same tree, same candidates, same Â-credited
expectations, Ŝ and choice, on any marginals, cost table, gain ratios and start."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion.controller as controller
from bastion.cycles import token_lattice
from bastion.learned import LearnedCostModel
from bastion.tree import DraftMarginals
from tests.test_learned import FlatPrior

pytestmark = pytest.mark.skipif(controller._kernel is None, reason="no compiled kernel")


@st.composite
def _cases(draw: st.DrawFn) -> tuple[DraftMarginals, LearnedCostModel, int, int, int]:
    depth = draw(st.integers(1, 8))
    k = draw(st.integers(1, 4))
    raw = draw(
        st.lists(
            st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.9, 1.0]), min_size=depth * k, max_size=depth * k
        )
    )
    probs = -np.sort(-np.asarray(raw, np.float64).reshape(depth, k), axis=1)
    probs /= np.maximum(probs.sum(axis=1, keepdims=True), 1.0)
    ids = np.arange(depth * k, dtype=np.int64).reshape(depth, k) + 7
    learner = LearnedCostModel(FlatPrior(slope=draw(st.sampled_from([0.0, 1e-6, 2e-5]))))
    context = draw(st.integers(0, 4096))
    for n in draw(st.lists(st.sampled_from(token_lattice(1024).tolist()), max_size=12)):
        step = draw(st.sampled_from([0.5, 1.0, 1.3, 3.0]))
        learner.observe_cycle("tree", np.array([context]), np.array([n]), 10e-3 * step)
    cells = token_lattice(1024).shape[0]
    h = np.asarray(
        draw(st.lists(st.sampled_from([0.0, 0.3, 0.9, 1.0, 1.7]), min_size=cells, max_size=cells)),
        np.float64,
    )
    h.flags.writeable = False
    learner.sizes.gain_ratios = lambda _b: h  # type: ignore[method-assign]
    n_max = draw(st.sampled_from([1, 5, 8, 64, 100, 256, 1024]))
    start = draw(st.integers(1, 600))
    return DraftMarginals(ids, probs), learner, context, n_max, start


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_compiled_choice_is_the_python_loop(
    case: tuple[DraftMarginals, LearnedCostModel, int, int, int],
) -> None:
    marginals, learner, context, n_max, start = case
    tree, diag = controller.choose_size(marginals, learner, context, n_max, start)
    kernel, controller._kernel = controller._kernel, None
    try:
        ref_tree, ref = controller.choose_size(marginals, learner, context, n_max, start)
    finally:
        controller._kernel = kernel
    assert diag.tree_size == ref.tree_size and diag.best == ref.best
    for name in ("parents", "tokens", "depths", "scores", "ranks"):
        assert np.array_equal(getattr(tree, name), getattr(ref_tree, name)), name
    for name in ("sizes", "a_hat", "c_hat", "s_hat"):
        assert np.array_equal(getattr(diag, name), getattr(ref, name)), name
    assert diag.ar_step_s == ref.ar_step_s


def test_compiled_choice_refuses_bad_buffers() -> None:
    p = np.full((2, 2), 0.5)
    ids = np.zeros((2, 2), np.int64)
    sizes = np.array([1, 2, 4], np.int64)
    ones = np.ones(3)
    kernel = controller._kernel
    with pytest.raises(ValueError, match="depth"):
        kernel.choose(p, ids, 3, 2, 4, sizes, ones, ones, 1.0)
    with pytest.raises(ValueError, match="m >= 1"):
        kernel.choose(p, ids, 2, 2, 4, sizes, ones[:2], ones, 1.0)
    with pytest.raises(ValueError, match="start at 1"):
        kernel.choose(p, ids, 2, 2, 4, sizes + 1, ones, ones, 1.0)
    with pytest.raises(ValueError, match="ascending"):
        kernel.choose(p, ids, 2, 2, 4, sizes[[0, 2, 1]], ones, ones, 1.0)
