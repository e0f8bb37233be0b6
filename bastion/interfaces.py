"""The four protocols of Bastion and the frozen values that cross them.

One decode step is ``draft -> choose -> verify`` over the whole batch of the step, with a
``CostModel`` pricing trees for the policy. Each protocol has two forms: the batched one
(``BatchDrafter.draft_batch``, ``BatchTreePolicy.choose_batch``, ``BatchVerifier.verify_batch``,
over the arrays of :mod:`bastion.batch`), which the engine calls, and the single-request one
(``Drafter.draft``, ``TreePolicy.choose``, ``Verifier.verify``), which is the simplest thing to
write and which the engine adapts by looping over the batch. The real backend (torch) and the
simulator implement the same protocols, so the engine loop, the policies and the controller
never know which one runs. Plain fakes satisfy them too, which is how the tests drive the core.

What this module does not do: any computation. It holds types only; ``DraftMarginals`` and
``DraftTree`` live in :mod:`bastion.tree` with their validation and helpers, and
``VerifyResult`` in :mod:`bastion.batch` beside its batched form (which converts to and from
it); all three are re-exported here, so ``bastion.interfaces`` names every type that crosses
the protocols.

Units: seconds for time, tokens for sizes and lengths. A tree of size N counts its root.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, BatchVerifyResult, StepRequests, TreeBatch, VerifyResult
from bastion.errors import BudgetError, CostModelError
from bastion.guard import integer, number, public
from bastion.tree import DraftMarginals, DraftTree

__all__ = [
    "BatchChoice",
    "BatchDrafter",
    "BatchPolicyContext",
    "BatchTreePolicy",
    "BatchVerifier",
    "CostCurve",
    "CostModel",
    "DraftContext",
    "DraftMarginals",
    "DraftTree",
    "Drafter",
    "PolicyContext",
    "RequestLoad",
    "StepCost",
    "StepLoad",
    "TreeChoice",
    "TreePolicy",
    "Verifier",
    "VerifyResult",
]


# --------------------------------------------------------------------------------------------
# Load: what a verification pass has to process besides this request's tree.
# --------------------------------------------------------------------------------------------


@public(
    error=BudgetError,
    tree_size=integer(lo=1),
    context_len=integer(lo=0),
    expected_tokens=number(lo=0.0),
)
@dataclass(frozen=True)
class RequestLoad:
    """One request's share of a batched verification pass."""

    tree_size: int  # tokens this request verifies (its tree, root included)
    context_len: int  # tokens already in its KV cache
    expected_tokens: float = 0.0  # its Â: tokens it is expected to commit from this pass


@public(error=BudgetError, context_len=integer(lo=0))
@dataclass(frozen=True)
class StepLoad:
    """The situation in which one request's tree is priced.

    ``co_batched`` lists the other requests verified in the same forward pass (empty at batch 1);
    a batched cost model prices the whole pass, so the marginal cost of this request's nodes
    rises with the batch, and the controller weighs a larger tree against the whole batch's
    expected tokens per pass (the others' ``expected_tokens``), not this request's alone.
    """

    context_len: int  # tokens in this request's KV cache before the tree
    co_batched: tuple[RequestLoad, ...] = ()

    @property
    def batch_size(self) -> int:
        return 1 + len(self.co_batched)

    @property
    def co_batched_tokens(self) -> float:
        """Σ expected_tokens of the other requests in the pass."""
        return float(sum(r.expected_tokens for r in self.co_batched))


# --------------------------------------------------------------------------------------------
# Cost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """Predicted time of one speculative cycle for one tree size, with its breakdown."""

    draft_s: float  # drafter forward pass
    prep_s: float  # T_aux: tree building, top-K normalisation, mask preparation
    verify_s: float  # target forward pass over the tree (the whole batch's pass when batched)
    breakdown: Mapping[str, float] = field(default_factory=dict)  # seconds per operator/branch

    @property
    def total_s(self) -> float:
        return self.draft_s + self.prep_s + self.verify_s


@dataclass(frozen=True)
class CostCurve:
    """Ĉ(N) for N = 1 … len(verify_s), plus L_AR, in one vectorised record.

    ``verify_s[n - 1]`` is the predicted verification time of a tree of size n. The controller
    reads this once per step instead of calling the cost model once per candidate size.
    """

    draft_s: float
    prep_s: float
    verify_s: npt.NDArray[np.float64]  # shape [N_max], seconds
    ar_step_s: float  # L_AR: one target-only autoregressive step in the same situation
    # a guaranteed lower bound on how much verify_s grows per further node beyond its last
    # entry (0: only that it never decreases); joint curves use it to stop pricing early
    growth_s: float = 0.0
    # joint curves only, optional: floor_s[j] ≤ verify_s[j] of *any* longer chain's curve, for
    # j = 0 … len − 1 added nodes (beyond: its last entry); lets the stop rule bound Ĉ ahead
    floor_s: npt.NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        """Types and shape only: values (finite, positive) are checked where a curve is used
        (:func:`bastion.budget.validate_cost_curve`), so a cost model's bad output is reported
        as that model's error."""
        for name in ("draft_s", "prep_s", "ar_step_s", "growth_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise CostModelError(f"CostCurve.{name} must be a number of seconds; got {value!r}")
        verify = self.verify_s
        if not (isinstance(verify, np.ndarray) and verify.dtype == np.float64):
            try:
                verify = np.asarray(verify, dtype=np.float64)
            except (TypeError, ValueError, OverflowError) as exc:
                raise CostModelError(f"CostCurve.verify_s must be numbers: {exc}") from exc
            object.__setattr__(self, "verify_s", verify)
        if verify.ndim != 1 or verify.shape[0] < 1:
            raise CostModelError(
                f"CostCurve.verify_s must be 1-D with an entry per N ≥ 1; got shape {verify.shape}"
            )
        floor = self.floor_s
        if floor is not None and not (
            isinstance(floor, np.ndarray)
            and floor.dtype == np.float64
            and floor.ndim == 1
            and floor.shape[0] >= 1
        ):
            raise CostModelError(
                f"CostCurve.floor_s must be None or a 1-D float64 array; got {floor!r:.80}"
            )

    @property
    def max_tree_size(self) -> int:
        return int(self.verify_s.shape[0])

    def total_s(self) -> npt.NDArray[np.float64]:
        """Ĉ(N) = T_draft + T_aux + T_verify(N) for N = 1 … N_max."""
        return self.draft_s + self.prep_s + self.verify_s


@runtime_checkable
class CostModel(Protocol):
    """Predicts cycle latency; shared by the simulator and the real backend."""

    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        """The predicted cost of one cycle with a tree of ``tree_size`` nodes, with breakdown."""
        ...

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        """Ĉ(N) for every N ≤ ``max_tree_size`` and L_AR, vectorised."""
        ...

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        """Feed back a measured verification time (online calibration); may do nothing."""
        ...


# --------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may consult besides the marginals. Static policies ignore it."""

    load: StepLoad
    cost_model: CostModel | None = None
    previous_tree_size: int | None = None  # this request's last tree (a hint for growth)


@dataclass(frozen=True)
class TreeChoice:
    """A policy's answer: the tree to verify and, for adaptive policies, why that size."""

    tree: DraftTree
    diagnostics: object | None = None  # e.g. bastion.budget.BudgetDiagnostics


@runtime_checkable
class TreePolicy(Protocol):
    """Turns drafter marginals into a prefix-closed draft tree."""

    @property
    def name(self) -> str: ...

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice: ...


@dataclass(frozen=True, eq=False)
class BatchPolicyContext:
    """What a batched policy may consult besides the step's marginals."""

    requests: StepRequests  # ids, KV lengths, last step's tree sizes and Â per request
    cost_model: CostModel | None = None


@dataclass(frozen=True, eq=False)
class BatchChoice:
    """A batched policy's answer: one tree per request and, optionally, why."""

    trees: TreeBatch
    diagnostics: object | None = None  # e.g. joint-budget or per-request diagnostics
    # how the step is verified: "tree" (a tree mask over top-K drafts), "chain" (one path,
    # causal pass) or "ar" (nothing drafted); None: as the policy declares (``uses_topk``)
    kind: str | None = None


@runtime_checkable
class BatchTreePolicy(Protocol):
    """Chooses the trees of every request of a step together (e.g. under a joint budget)."""

    @property
    def name(self) -> str: ...

    def choose_batch(
        self, marginals: BatchMarginals, context: BatchPolicyContext
    ) -> BatchChoice: ...


# --------------------------------------------------------------------------------------------
# Drafter and verifier
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftContext:
    """What the drafter sees at the start of a step.

    ``feedback`` is the opaque payload the verifier returned last step (tapped hidden states on
    the real backend, a position in a trace in the simulator); ``None`` on the first step.
    """

    request_id: int
    committed: tuple[int, ...]  # every token of the request so far, prompt included
    bonus_token: int  # the root of the next tree (last committed token)
    feedback: object | None = None


@runtime_checkable
class Drafter(Protocol):
    """Proposes per-position marginals for the positions after the bonus token."""

    def draft(self, context: DraftContext) -> DraftMarginals: ...


@runtime_checkable
class Verifier(Protocol):
    """Runs the target over a tree and applies a lossless acceptance rule."""

    def verify(self, request_id: int, tree: DraftTree) -> VerifyResult: ...


@runtime_checkable
class BatchDrafter(Protocol):
    """Drafts every request of a step (one pass over the batch where the backend can)."""

    def draft_batch(self, requests: StepRequests) -> BatchMarginals: ...


@runtime_checkable
class BatchVerifier(Protocol):
    """Verifies every request's tree of a step (one forward pass where the backend can)."""

    def verify_batch(self, requests: StepRequests, trees: TreeBatch) -> BatchVerifyResult: ...
