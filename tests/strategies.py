"""Hypothesis strategies shared by the property tests.

Built with ``st.composite`` and ``.map`` rather than filters, so every draw is usable. Ties in
probabilities are drawn on purpose (``tied=True`` quantises them): tie-breaking is where
best-first implementations usually go wrong.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from bastion.tree import DraftMarginals

__all__ = ["convex_costs", "marginals", "prob_rows"]


@st.composite
def prob_rows(draw: st.DrawFn, depth: int, k: int, tied: bool) -> np.ndarray:
    """[depth, k] sub-stochastic rows sorted descending (top-k of a full distribution)."""
    raw = np.array(
        draw(
            st.lists(
                st.lists(st.floats(0.0, 1.0), min_size=k + 1, max_size=k + 1),
                min_size=depth,
                max_size=depth,
            )
        )
    )
    raw = raw + 1e-3  # keep every row's total mass positive
    rows = raw / raw.sum(axis=1, keepdims=True)  # the last column is mass outside the top-k
    p = -np.sort(-rows[:, :k], axis=1)
    if tied:
        p = np.floor(p * 8.0) / 8.0  # coarse grid: many exact ties, some zeros
        p = -np.sort(-p, axis=1)
    return p


@st.composite
def marginals(
    draw: st.DrawFn,
    max_depth: int = 6,
    max_k: int = 5,
    min_depth: int = 1,
    min_k: int = 1,
) -> DraftMarginals:
    depth = draw(st.integers(min_depth, max_depth))
    k = draw(st.integers(min_k, max_k))
    tied = draw(st.booleans())
    p = draw(prob_rows(depth, k, tied))
    seed = draw(st.integers(0, 2**32 - 1))
    vocab = np.random.default_rng(seed).permuted(np.tile(np.arange(4 * k), (depth, 1)), axis=1)
    return DraftMarginals(vocab[:, :k], p)


@st.composite
def convex_costs(draw: st.DrawFn, n_max: int) -> np.ndarray:
    """A positive, non-decreasing, convex Ĉ(N) for N = 1 … n_max (sum of convex pieces)."""
    n = np.arange(1, n_max + 1, dtype=np.float64)
    c0 = draw(st.floats(1e-3, 1.0))
    lin = draw(st.floats(0.0, 1e-2))
    quad = draw(st.floats(0.0, 1e-4))
    knee = draw(st.integers(1, n_max))
    slope = draw(st.floats(0.0, 5e-2))
    return c0 + lin * n + quad * n**2 + slope * np.maximum(0.0, n - knee)
