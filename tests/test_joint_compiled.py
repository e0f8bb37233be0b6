"""The paper controller's joint budget compiled (``paper()``, ``_bestfirst_paper.c``): on a
calibrated roofline it prices itself, the trees and diagnostics of ``choose_joint_batch`` on
the model's ``joint_cost_curve``, node for node and bit for bit; where it does not apply (other
modes, an MoE target, counts beyond 2^53, costs that are not > 0) the Python loop answers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import bastion.joint as joint
from bastion.batch import BatchMarginals
from bastion.cost.calibration import Branch
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import CostModelError
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload

needs_kernel = pytest.mark.skipif(
    getattr(joint._compiled, "paper", None) is None, reason="compiled kernel not built"
)
FIELDS = ("offsets", "parents", "tokens", "depths", "scores", "ranks")


def _model(name: str, mode: str, tp: int = 1) -> RooflineCostModel:
    model = get_model(name)
    cm, _ = calibrated_cost_model(
        SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model), tp=tp), mode
    )
    if mode == "ema+calib":
        cm.ema.gamma = 1.13
    return cm  # type: ignore[return-value]


def _step(rng: np.random.Generator, b: int) -> BatchMarginals:
    src = SyntheticSource(get_workload("chat"), int(rng.integers(0, 1000)))
    src.reserve(b)
    for s in range(b):
        src.admit(s, int(rng.integers(0, 10**6)))
    return src.draft(np.arange(b), np.zeros(b, np.int64))[0]


def _reference(m: BatchMarginals, cm: RooflineCostModel, ctx: np.ndarray, n_max: int, start: int):  # type: ignore[no-untyped-def]
    return joint.choose_joint_batch(
        m, lambda grow: cm.joint_cost_curve(ctx, grow), n_max, "auto", start
    )


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    (ta, da), (tb, db) = a, b
    if not all(np.array_equal(getattr(ta, f), getattr(tb, f)) for f in FIELDS):
        return False
    arrays = ("a_hat_total", "c_hat", "s_hat")
    flags = ("tree_sizes", "total_size", "mode", "ar_step_s", "exhausted", "capped")
    return all(np.array_equal(getattr(da, f), getattr(db, f)) for f in arrays) and all(
        getattr(da, f) == getattr(db, f) for f in flags
    )


@needs_kernel
@pytest.mark.parametrize("name", ["qwen3-8b", "llama-3.1-8b", "qwen3-32b"])
@pytest.mark.parametrize("mode", ["static", "ema+calib"])
def test_compiled_joint_budget_is_the_python_loop(name: str, mode: str) -> None:
    cm = _model(name, mode)
    rng = np.random.default_rng(len(name) + len(mode))
    for _ in range(12):
        b = int(rng.integers(2, 40))
        m, ctx = _step(rng, b), rng.integers(0, 30000, b).astype(np.int64)
        n_max, start = int(rng.choice([1, 3, 16, 1024])), int(rng.integers(1, 150))
        fast = joint._choose_paper_compiled(m, cm, ctx, n_max, start)
        assert fast is not None
        assert _same(fast, _reference(m, cm, ctx, n_max, start))


@needs_kernel
def test_where_the_kernel_does_not_apply_the_python_loop_answers() -> None:
    rng = np.random.default_rng(3)
    m, ctx = _step(rng, 6), rng.integers(0, 3000, 6).astype(np.int64)
    for cm in (_model("qwen3-8b", "bare"), _model("qwen3-coder-30b-a3b", "static")):
        assert joint._choose_paper_compiled(m, cm, ctx, 64, 16) is None
        got = joint.choose_joint_priced(m, cm, ctx, 64, "auto", 16)
        assert _same(got, _reference(m, cm, ctx, 64, 16))
    cm = _model("qwen3-8b", "static")
    huge = np.full(6, 2**50, np.int64)  # counts beyond 2^53: not exact, so not compiled
    assert joint._choose_paper_compiled(m, cm, huge, 64, 16) is None


@needs_kernel
def test_a_cost_that_is_not_positive_is_refused_by_the_python_loop() -> None:
    cm = _model("qwen3-8b", "static")
    cal = cm.calibration
    assert cal is not None
    cm.calibration = replace(cal, compute=Branch(0.0, -1.0), memory=Branch(0.0, -1.0))
    m = _step(np.random.default_rng(4), 3)
    ctx = np.array([100, 200, 300], np.int64)
    assert joint._choose_paper_compiled(m, cm, ctx, 64, 16) is None
    with pytest.raises(CostModelError):
        joint.choose_joint_priced(m, cm, ctx, 64, "auto", 16)


@needs_kernel
@pytest.mark.parametrize(("name", "tp"), [("llama-3.1-70b", 4), ("qwen3-8b", 2)])
@pytest.mark.parametrize("mode", ["static", "ema+calib"])
def test_compiled_joint_budget_prices_the_all_reduces_as_python(
    name: str, tp: int, mode: str
) -> None:
    """Tensor parallelism: the kernel adds the all-reduces (c₀ + c₁·T per pass, c₁ to the
    growth bound) as joint_seconds and growth_bound do, bit for bit."""
    cm = _model(name, mode, tp)
    assert cm._pricer(True, tiled=False).has_comm
    rng = np.random.default_rng(tp + len(mode))
    for _ in range(10):
        b = int(rng.integers(2, 70))
        m, ctx = _step(rng, b), rng.integers(0, 30000, b).astype(np.int64)
        n_max, start = int(rng.choice([1, 3, 16, 1024])), int(rng.integers(1, 150))
        fast = joint._choose_paper_compiled(m, cm, ctx, n_max, start)
        assert fast is not None
        assert _same(fast, _reference(m, cm, ctx, n_max, start))


@needs_kernel
@pytest.mark.parametrize("bucket", [1, 7, 64])
@pytest.mark.parametrize("drafter", [True, False])
def test_the_kernel_buckets_the_contexts_and_prices_the_drafter_itself(
    bucket: int, drafter: bool
) -> None:
    """``paper()`` takes the raw contexts and the drafter pass's line: the contexts rounded up
    to any bucket (multiples and not), T_draft at their sum, or none without a drafter — the
    same trees and diagnostics as the Python loop on ``joint_cost_curve``; a context below 0
    leaves the step to the Python loop."""
    cm = _model("qwen3-8b", "static")
    cm.context_bucket = bucket
    if not drafter:
        cm.drafter, cm._drafter = None, None
    cm.prep_s = 3e-4
    rng = np.random.default_rng(bucket + 10 * drafter)
    for _ in range(6):
        b = int(rng.integers(2, 24))
        m = _step(rng, b)
        ctx = rng.integers(0, 9000, b).astype(np.int64)
        ctx[0] = bucket * int(rng.integers(0, 50))  # one on a bucket's edge
        fast = joint._choose_paper_compiled(m, cm, ctx, 64, 12)
        assert fast is not None
        assert _same(fast, _reference(m, cm, ctx, 64, 12))
    ctx[1] = -1
    assert joint._choose_paper_compiled(m, cm, ctx, 64, 12) is None
