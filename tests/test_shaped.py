"""Beam and EAGLE trees for a batch, compiled (bastion.shaped): the trees of each policy's own
``choose``, request by request, also on marginals outside the contract (ties, zeros, NaN,
values above 1 — where the reference refuses a tree, the batch refuses with the same error),
and tree by tree without the kernel."""

from __future__ import annotations

import numpy as np
import pytest

import bastion.shaped as shaped
from bastion.batch import BatchMarginals, StepRequests
from bastion.engine import PerRequestPolicy
from bastion.interfaces import BatchPolicyContext
from bastion.policies import BeamPolicy, EaglePolicy

needs_kernel = pytest.mark.skipif(shaped._compiled is None, reason="compiled kernel not built")


def _marginals(rng: np.random.Generator, rough: int) -> BatchMarginals:
    b, d, k = (int(x) for x in rng.integers(1, (5, 9, 18)))
    p = rng.random((b, d, k))
    if rough % 3 == 0:  # ties and zeros
        p = np.round(p * 3) / 3
    if rough % 2 == 0:  # the contract: rows sorted descending, summing to at most 1
        p = -np.sort(-p, axis=2)
        p /= np.maximum(p.sum(axis=2, keepdims=True), 1.0)
    elif rough % 5 == 0:  # above 1: a child may outrank its parent (the reference refuses)
        p *= 1.7
    if rough % 7 == 0:
        p[rng.random(p.shape) < 0.1] = np.nan
    if rough % 11 == 0:
        p[rng.random(p.shape) < 0.05] = np.inf
    return BatchMarginals(rng.integers(0, 1000, (b, d, k)), p)


def _outcome(choose, m: BatchMarginals, ctx: BatchPolicyContext) -> object:  # type: ignore[no-untyped-def]
    try:
        with np.errstate(invalid="ignore"):  # NaN marginals
            t = choose(m, ctx).trees
    except Exception as exc:  # the error itself is compared
        return type(exc), str(exc)
    return tuple(
        (a.dtype.str, a.tolist())
        for a in (t.offsets, t.parents, t.tokens, t.depths, t.scores, t.ranks)
    )


@needs_kernel
@pytest.mark.parametrize("seed", range(6))
def test_compiled_batch_is_each_request_alone(seed: int) -> None:
    rng = np.random.default_rng(seed)
    refused = 0
    for rough in range(120):
        m = _marginals(rng, rough)
        b = m.probs.shape[0]
        ctx = BatchPolicyContext(StepRequests.of(np.arange(b), np.zeros(b), np.zeros(b)))
        beam = BeamPolicy(int(rng.integers(1, 30)), int(rng.integers(1, 10)))
        eagle = EaglePolicy(*(int(x) for x in rng.integers(1, (20, 10, 300))))
        for policy in (beam, eagle):
            ours = _outcome(policy.choose_batch, m, ctx)
            ref = _outcome(PerRequestPolicy(policy).choose_batch, m, ctx)
            assert ours == ref, policy
            refused += isinstance(ref[0], type)
    assert refused  # the refusals were exercised


def test_without_the_kernel_the_trees_are_built_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = _marginals(np.random.default_rng(9), 2)
    b = m.probs.shape[0]
    ctx = BatchPolicyContext(StepRequests.of(np.arange(b), np.zeros(b), np.zeros(b)))
    monkeypatch.setattr(shaped, "_compiled", None)
    for policy in (BeamPolicy(4, 15), EaglePolicy()):
        assert _outcome(policy.choose_batch, m, ctx) == _outcome(
            PerRequestPolicy(policy).choose_batch, m, ctx
        )
