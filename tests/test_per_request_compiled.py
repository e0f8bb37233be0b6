"""The paper's per-request rule compiled (``request()``, ``_bestfirst_request.c``,
:mod:`bastion.per_request`): on a calibrated roofline it prices itself, the trees and the
diagnostics of ``PerRequestPolicy(AdaptivePolicy(joint=False))``, request after request, bit
for bit; where it does not apply, the rule in Python."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

import bastion.per_request as per_request
from bastion.batch import BatchMarginals, StepRequests
from bastion.cost.calibration import Branch
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.engine import PerRequestPolicy
from bastion.errors import CostModelError
from bastion.interfaces import BatchPolicyContext
from bastion.policies import AdaptivePolicy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload

needs_kernel = pytest.mark.skipif(
    getattr(per_request._compiled, "request", None) is None, reason="compiled kernel not built"
)
TREE = ("offsets", "parents", "tokens", "depths", "scores", "ranks")


def _model(name: str, mode: str, tp: int = 1) -> RooflineCostModel:
    model = get_model(name)
    cm, _ = calibrated_cost_model(
        SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model), tp=tp), mode
    )
    if mode == "ema+calib":
        cm.ema.gamma = 0.91
    return cm  # type: ignore[return-value]


def _step(rng: np.random.Generator, b: int) -> tuple[BatchMarginals, StepRequests]:
    src = SyntheticSource(get_workload("math"), int(rng.integers(0, 1000)))
    src.reserve(b)
    for s in range(b):
        src.admit(s, int(rng.integers(0, 10**6)))
    previous = rng.integers(0, 60, b) * (rng.random(b) < 0.8)  # some on their first step
    expected = np.where(previous > 0, rng.random(b) * 8, 0.0)
    ctx = rng.integers(0, 20000, b)
    req = StepRequests.of(np.arange(b), ctx, np.zeros(b, np.int64), previous, expected)
    return src.draft(np.arange(b), np.zeros(b, np.int64))[0], req


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    if not all(np.array_equal(getattr(a.trees, f), getattr(b.trees, f)) for f in TREE):
        return False
    for da, db in zip(a.diagnostics, b.diagnostics, strict=True):
        for f in fields(da):
            x, y = getattr(da, f.name), getattr(db, f.name)
            if not (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y):
                return False
    return True


@needs_kernel
@pytest.mark.parametrize("name", ["qwen3-8b", "llama-3.1-8b"])
@pytest.mark.parametrize("mode", ["static", "ema+calib"])
def test_compiled_rule_is_each_request_in_python(name: str, mode: str) -> None:
    cm = _model(name, mode)
    rng = np.random.default_rng(len(name) * 7 + len(mode))
    for _ in range(10):
        m, req = _step(rng, int(rng.integers(2, 30)))
        policy = AdaptivePolicy(
            int(rng.choice([16, 128, 1024])), joint=False, initial_budget=int(rng.integers(1, 200))
        )
        context = BatchPolicyContext(req, cm)
        fast = per_request.choose_per_request(policy, m, context)
        assert fast is not None
        assert _same(fast, PerRequestPolicy(policy).choose_batch(m, context))


@needs_kernel
def test_where_it_does_not_apply_the_rule_runs_in_python() -> None:
    rng = np.random.default_rng(5)
    m, req = _step(rng, 5)
    policy = AdaptivePolicy(joint=False)
    for cm in (_model("qwen3-8b", "bare"), _model("qwen3-coder-30b-a3b", "static")):
        context = BatchPolicyContext(req, cm)
        assert per_request.choose_per_request(policy, m, context) is None
        assert _same(
            policy.choose_batch(m, context), PerRequestPolicy(policy).choose_batch(m, context)
        )
    cm = _model("qwen3-8b", "static")
    huge = replace(req, context_lens=np.full(5, 2**50, np.int64))  # counts beyond 2^53
    assert per_request.choose_per_request(policy, m, BatchPolicyContext(huge, cm)) is None
    first = AdaptivePolicy(joint=False, mode="exhaustive")  # the kernel runs auto only
    assert per_request.choose_per_request(first, m, BatchPolicyContext(req, cm)) is None


@needs_kernel
def test_a_cost_that_is_not_positive_is_refused_by_the_python_rule() -> None:
    cm = _model("qwen3-8b", "static")
    cal = cm.calibration
    assert cal is not None
    cm.calibration = replace(cal, compute=Branch(0.0, -1.0), memory=Branch(0.0, -1.0))
    m, req = _step(np.random.default_rng(6), 3)
    policy = AdaptivePolicy(joint=False)
    assert per_request.choose_per_request(policy, m, BatchPolicyContext(req, cm)) is None
    with pytest.raises(CostModelError):
        policy.choose_batch(m, BatchPolicyContext(req, cm))


@needs_kernel
@pytest.mark.parametrize(("name", "tp"), [("llama-3.1-70b", 4), ("qwen3-8b", 2)])
@pytest.mark.parametrize("mode", ["static", "ema+calib"])
def test_compiled_rule_prices_the_all_reduces_as_python(name: str, tp: int, mode: str) -> None:
    """Tensor parallelism: each curve's rows and L_AR carry the all-reduces (c₀ + c₁·T, added
    before γ) as RooflineCostModel._base adds them, bit for bit."""
    cm = _model(name, mode, tp)
    assert cm._pricer(True, tiled=False).has_comm
    rng = np.random.default_rng(tp * 11 + len(mode))
    for _ in range(8):
        m, req = _step(rng, int(rng.integers(2, 40)))
        policy = AdaptivePolicy(
            int(rng.choice([16, 128, 1024])), joint=False, initial_budget=int(rng.integers(1, 200))
        )
        context = BatchPolicyContext(req, cm)
        fast = per_request.choose_per_request(policy, m, context)
        assert fast is not None
        assert _same(fast, PerRequestPolicy(policy).choose_batch(m, context))


@needs_kernel
def test_its_diagnostics_read_as_a_sequence_of_each_requests() -> None:
    """The compiled rule's diagnostics are made when first read: as a sequence they are the
    Python rule's, one per request (length, index from either end, slices, iteration), and a
    step's per-request record gets its own."""
    cm = _model("qwen3-8b", "static")
    rng = np.random.default_rng(11)
    m, req = _step(rng, 6)
    policy = AdaptivePolicy(joint=False)
    context = BatchPolicyContext(req, cm)
    fast = per_request.choose_per_request(policy, m, context)
    slow = PerRequestPolicy(policy).choose_batch(m, context)
    assert fast is not None
    got, want = fast.diagnostics, slow.diagnostics
    assert isinstance(got, per_request.RequestDiagnostics) and len(got) == len(want) == 6
    assert [d.tree_size for d in got] == [d.tree_size for d in want]
    assert got[-1] is got[5] and got[1:3] == [got[1], got[2]]
    for i in range(6):
        assert np.array_equal(got[i].s_hat, want[i].s_hat) and got[i].mode == "bounded"
    with pytest.raises(IndexError):
        got[6]
    assert "BudgetDiagnostics(tree_size=" in repr(got)


class _Marginals:
    """A drafter that hands request i its row of a step's marginals."""

    def __init__(self, m: BatchMarginals) -> None:
        self.m = m

    def draft(self, context):  # type: ignore[no-untyped-def]
        from bastion.tree import DraftMarginals

        i = int(context.request_id)
        return DraftMarginals(self.m.token_ids[i], self.m.probs[i])


class _RootOnly:
    def verify(self, request_id: int, tree):  # type: ignore[no-untyped-def]
        from bastion.batch import VerifyResult

        return VerifyResult((0,), (), 7)


@needs_kernel
def test_a_steps_record_hands_each_request_its_own_diagnostics() -> None:
    """Through the engine: the compiled rule's diagnostics split per request in a step's
    record (``BatchStepRecord.record(i)``), as a list of them would."""
    from bastion.engine import SpecEngine

    cm = _model("qwen3-8b", "static")
    m, req = _step(np.random.default_rng(12), 4)
    engine = SpecEngine(_Marginals(m), AdaptivePolicy(joint=False), _RootOnly(), cost_model=cm)
    step = engine.step(req)
    assert isinstance(step.diagnostics, per_request.RequestDiagnostics)
    for i in range(4):
        assert step.record(i).diagnostics is step.diagnostics[i]
        assert step.record(i).diagnostics.tree_size == step.trees.sizes[i]
