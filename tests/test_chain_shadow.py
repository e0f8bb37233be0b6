"""The chain's shadow, compiled: ``chain_cut()`` and ``shadow()`` give numpy's very doubles.

The learning controller prices the chain against its trees on every deciding step (the chain's
Â cut at every depth, :func:`bastion.controller._chain_cut`) and learns what the chain would
have committed on every tree step (:func:`bastion.observed.shadow_of`). Both are compiled where
the extension is built; their numpy forms are the reference, compared bit for bit here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bastion import controller, observed

kernel = observed._kernel
pytestmark = pytest.mark.skipif(kernel is None, reason="no compiled kernel")


def _numpy_cut(probs: np.ndarray) -> np.ndarray:
    cut = probs[:, :, 0].cumprod(axis=1)
    cut.cumsum(axis=1, out=cut)
    return cut


def _numpy_shadow(run: np.ndarray, deepest: np.ndarray, chain: np.ndarray) -> tuple[float, float]:
    b = run.shape[0]
    cut = chain[np.arange(b), np.maximum(deepest - 1, 0)]
    return float(b + int(np.add.reduce(run))), b + float(np.add.reduce(cut[deepest > 0]))


def _probs(rng: np.random.Generator, b: int, depth: int, k: int) -> np.ndarray:
    p = np.sort(rng.dirichlet(np.ones(k + 1), size=(b, depth))[..., :k], axis=-1)[..., ::-1]
    p[rng.random((b, depth)) < 0.05, 0] = 0.0  # a row drafted nothing
    p[rng.random((b, depth)) < 0.05, 0] *= 1e-300  # underflow along the chain
    return np.ascontiguousarray(p)


@pytest.fixture(params=["compiled", "numpy"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the compiled route and on the numpy one (the kernels switched off)."""
    if request.param == "numpy":
        monkeypatch.setattr(controller, "_chain_cut_kernel", None)
        monkeypatch.setattr(observed, "_shadow", None)
    return str(request.param)


@pytest.mark.parametrize("seed", range(8))
def test_chain_cut_is_numpys_cumulative_product_then_sum(seed: int, route: str) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        b, depth, k = int(rng.integers(1, 40)), int(rng.integers(1, 17)), int(rng.integers(1, 9))
        probs = _probs(rng, b, depth, k)
        got = controller._chain_cut(probs)
        assert got.shape == (b, depth)
        assert got.tobytes() == _numpy_cut(probs).tobytes()
        # a strided view (the calibrated marginals may be one) reads as its copy
        wide = np.zeros((b, depth, k + 2))
        wide[:, :, :k] = probs
        assert controller._chain_cut(wide[:, :, :k]).tobytes() == got.tobytes()


@pytest.mark.parametrize("seed", range(8))
def test_shadow_is_numpys_sums(seed: int, route: str) -> None:
    """B from 2 to 300: numpy's add.reduce is sequential below 8 values, eight accumulators up
    to 128, halved above; every regime is met."""
    rng = np.random.default_rng(100 + seed)
    for b in (2, 3, 7, 8, 9, 16, 17, 100, 128, 129, 200, 300):
        depth = int(rng.integers(1, 16))
        chain = _numpy_cut(_probs(rng, b, depth, 4)) * rng.uniform(0.5, 3.0)
        run = rng.integers(0, depth + 1, size=b).astype(np.int64)
        deepest = rng.integers(0, depth + 1, size=b).astype(np.int64)
        deepest[rng.random(b) < 0.2] = 0  # root-only trees add nothing
        got = observed.shadow_of(run, deepest, chain)
        want = _numpy_shadow(run, deepest, chain)
        assert [x.hex() for x in got] == [x.hex() for x in want]


def test_the_sums_order_matters_so_the_tests_can_tell() -> None:
    """A negative control: a sequential sum of the same values differs from numpy's (so the
    test above would catch a kernel that summed in another order)."""
    rng = np.random.default_rng(3)
    differs = 0
    for _ in range(200):
        values = rng.uniform(0.0, 10.0, size=int(rng.integers(9, 300)))
        sequential = 0.0
        for v in values.tolist():
            sequential += v
        differs += sequential != float(np.add.reduce(values))
    assert differs > 20


def test_shadow_refuses_what_does_not_fit() -> None:
    chain = np.zeros((3, 4))
    run = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="inconsistent"):
        kernel.shadow(run, np.zeros(2, np.int64), chain, 4)
    with pytest.raises(ValueError, match="inconsistent"):
        kernel.shadow(run, run, chain, 5)
    with pytest.raises(ValueError, match="deeper"):
        kernel.shadow(run, np.array([0, 5, 1], np.int64), chain, 4)
    with pytest.raises(ValueError, match="deeper"):
        kernel.shadow(run, np.array([0, -1, 1], np.int64), chain, 4)
    with pytest.raises(ValueError, match="inconsistent"):
        kernel.chain_cut(np.zeros((2, 3, 4)), 2, 3, 5)
    assert math.isfinite(kernel.shadow(run, run, chain, 4)[1])
