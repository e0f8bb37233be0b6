"""The paper's per-request rule at batch > 1 in one compiled call (``bastion:per-request``).

:class:`bastion.policies.AdaptivePolicy` with ``joint=False`` runs its single-request
controller (:func:`bastion.budget.choose_tree`) once per request of a batched step, in order,
each against the whole pass: the others' trees as already chosen this step, or as last step's
(:class:`bastion.engine.PerRequestPolicy`). With B requests that is B cost curves priced and B
controller loops per step. ``request()`` (``_bestfirst_request.c``) does all of it in one call
where the cost model is a calibrated roofline of a dense target
(:func:`bastion.cost.requestprice.request_pricing`), pricing each curve itself — the same trees
and diagnostics, bit for bit (``tests/test_per_request_compiled.py``); elsewhere
:func:`choose_per_request` returns None and the policy runs the rule in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, tree_batch_from_buffers
from bastion.bestfirst import MAX_TREE_SIZE
from bastion.budget import BudgetDiagnostics
from bastion.cost.requestprice import request_pricing
from bastion.engine import load_arrays
from bastion.interfaces import BatchChoice, BatchPolicyContext

try:  # the optional compiled kernel (setup.py)
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _compiled = None

IntArray = npt.NDArray[np.int64]

__all__: list[str] = []  # a part of AdaptivePolicy's choose_batch, public there


def first_budget(previous: Any) -> Any:
    """The first tree budget of a request whose last tree had ``previous`` nodes (a number or
    an array of them), as the paper's per-request rule starts it here and in
    ``AdaptivePolicy.choose``: 1.5 times it, at least 16. The tree does not depend on it (the
    stop rule's bound is exact); it sets how much is grown and priced beyond the decision, and
    a start of twice it, at least 64, grew and priced rows the decision never needed."""
    return np.maximum(16, 3 * previous // 2)


def joint_first_budget(previous: IntArray, default: int) -> int:
    """The first budget of a joint step (both joint controllers) whose requests' last trees
    had ``previous`` nodes (0: no tree yet): 1.5 times their mean — rounded down, as
    ``int(np.mean)`` — at least 8; ``default`` where none had a tree. As :func:`first_budget`,
    the trees do not depend on it (the bound is exact): the proof needs ≈ 2× the chosen total,
    which the 1.25–8× regrowth then reaches; 3× settled in one round but grew ≈ 1.4× more."""
    last = previous.tolist()  # (Python ints: cheaper for a few; 0 adds nothing to the sum)
    known = len(last) - last.count(0)
    return max(8, 3 * (sum(last) // known) // 2) if known else default


def choose_per_request(
    policy: Any, marginals: BatchMarginals, context: BatchPolicyContext
) -> BatchChoice | None:
    """``PerRequestPolicy(policy).choose_batch(marginals, context)`` for an
    :class:`~bastion.policies.AdaptivePolicy` in one compiled call, or None where it does not
    apply (then run that)."""
    kernel = getattr(_compiled, "request", None)
    req, model = context.requests, context.cost_model
    probs = marginals.probs
    if kernel is None or policy.mode != "auto" or req.size < 2 or probs.ndim != 3:
        return None
    n_max = int(policy.n_max)
    if not 1 <= n_max <= MAX_TREE_SIZE or probs.shape[0] != req.size or not probs.size:
        return None
    priced = request_pricing(model)
    if priced is None:
        return None
    fixed, ops = priced
    contexts = req.context_lens
    sizes, expected = load_arrays(req)
    if (
        contexts.dtype.kind not in "iu"
        or contexts.min() < 0
        or sizes.min() < 1
        or not expected.min() >= 0  # (NaN too)
        or not expected.max() < math.inf
    ):
        return None  # the Python rule refuses these loads with its own error
    step = model.context_bucket  # type: ignore[union-attr]
    own = (-(-contexts.astype(np.int64) // step) * step).astype(np.float64)
    draft = 0.0
    if model.drafter is not None:  # type: ignore[union-attr]  # as RooflineCostModel.draft_s
        draft = model._drafter_pricer().total_s(req.size, int(own.sum()))  # type: ignore[union-attr]
    previous = req.previous_tree_sizes
    starts = np.where(previous > 0, first_budget(previous), policy.initial_budget)
    depth, k = probs.shape[1:]
    out = kernel(
        np.ascontiguousarray(probs, np.float64),
        np.ascontiguousarray(marginals.token_ids, np.int64),
        depth,
        k,
        n_max,
        np.ascontiguousarray(starts, np.int64),
        np.ascontiguousarray(sizes, np.int64),
        np.ascontiguousarray(expected, np.float64),
        own,
        np.ceil(contexts.astype(np.float64) / step) * step,
        np.concatenate((fixed, [draft, model.prep_s])),  # type: ignore[union-attr]
        ops,
    )
    if out[0] != 0:
        return None
    par, dep, rnk, sco, tok, off, built, budgets, diag, ar = out[1:]
    trees = tree_batch_from_buffers(off, par, tok, dep, sco, rnk)
    return BatchChoice(trees, RequestDiagnostics(trees.offsets, built, budgets, diag, ar, n_max))


class RequestDiagnostics(Sequence[BudgetDiagnostics]):
    """Each request's :class:`~bastion.budget.BudgetDiagnostics` of a compiled per-request step,
    a read-only sequence that makes them from the kernel's buffers when it is first read: a
    simulated serve reads none of them, and making 32 of them every step cost a quarter as much
    as the kernel itself."""

    __slots__ = ("_buffers", "_made")

    def __init__(
        self, offsets: IntArray, built: bytes, budgets: bytes, curves: bytes, ar: bytes, n_max: int
    ) -> None:
        self._buffers = (offsets, built, budgets, curves, ar, n_max)
        self._made: list[BudgetDiagnostics] | None = None

    def _all(self) -> list[BudgetDiagnostics]:
        if self._made is None:
            offsets, built, budgets, diag, ar, n_max = self._buffers
            frombuffer = np.frombuffer
            curves = frombuffer(diag, np.float64)
            made, at = [], 0
            for n, budget, c, ar_s in zip(
                frombuffer(built, np.int64).tolist(),
                frombuffer(budgets, np.int64).tolist(),
                np.diff(offsets).tolist(),
                frombuffer(ar, np.float64).tolist(),
                strict=True,
            ):
                made.append(
                    BudgetDiagnostics(
                        tree_size=c,
                        mode="bounded",
                        a_hat=curves[at : at + n],
                        c_hat=curves[at + n : at + 2 * n],
                        s_hat=curves[at + 2 * n : at + 3 * n],
                        ar_step_s=ar_s,
                        exhausted=n < budget,
                        capped=(c == n == n_max),
                    )
                )
                at += 3 * n
            self._made = made
        return self._made

    def __len__(self) -> int:
        return int(self._buffers[0].shape[0]) - 1  # the trees' offsets: B + 1

    @overload
    def __getitem__(self, i: int) -> BudgetDiagnostics: ...
    @overload
    def __getitem__(self, i: slice) -> list[BudgetDiagnostics]: ...
    def __getitem__(self, i: int | slice) -> BudgetDiagnostics | list[BudgetDiagnostics]:
        return self._all()[i]

    def __repr__(self) -> str:
        return repr(self._all())
