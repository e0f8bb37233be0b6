"""The decode loop both backends share: draft → choose trees → verify → commit, per batch.

One :class:`SpecEngine` drives any drafter, tree policy, verifier and clock. The real backend
passes torch implementations and a wall clock that synchronises the device; the simulator passes
simulated ones and simulated time. Policies and the controller never know which.

The unit of a step is the batch: :meth:`SpecEngine.step` drafts every request of the step, lets
the policy choose all of their trees together, verifies them in one call and returns what each
request committed. Batch 1 is the same code with one request, and :meth:`SpecEngine.generate`
(one request from prefill to its last token) is a loop over that same step.

Each of the three parts may implement the batched protocol of :mod:`bastion.interfaces`
(``draft_batch``, ``choose_batch``, ``verify_batch``) or only the single-request one (``draft``,
``choose``, ``verify``); the engine adapts the latter by looping over the batch, so a 14-line
policy with a ``choose(marginals, context)`` works unchanged. A policy that declares
``uses_drafter = False`` (target-only AR) is never given a draft; one that declares
``uses_cost_model = True`` is given each request's batched :class:`StepLoad` when adapted.

Terms (as in vLLM's spec-decode docs): *accepted* tokens are draft tokens the target agreed with;
the *bonus* token is the target's own token after the last accepted one, always committed. Per
step the committed length is accepted + 1, and τ (mean acceptance length) includes the bonus.

A step whose requests carry a KV room (:attr:`bastion.batch.StepRequests.kv`, set by a server
that counts its paged KV cache) has its trees cut to what fits before they are verified
(:func:`bastion.kvroom.fit_trees`: the joint budget's own allocation at the largest total that
fits), so no tree forces a preemption.

What this module does not do: prefill, sampling or KV-cache management (the verifier's job), or
admission of requests into batches (the simulator's serving layer, or the caller).
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bastion.batch import (
    BatchMarginals,
    BatchVerifyResult,
    StepRequests,
    TreeBatch,
    empty_marginals,
)
from bastion.errors import PolicyError
from bastion.fastinit import trusted_init
from bastion.guard import public, unchecked
from bastion.interfaces import (
    BatchChoice,
    BatchDrafter,
    BatchPolicyContext,
    BatchTreePolicy,
    BatchVerifier,
    CostModel,
    DraftContext,
    Drafter,
    PolicyContext,
    RequestLoad,
    StepLoad,
    TreePolicy,
    Verifier,
    VerifyResult,
)
from bastion.kvroom import fit_trees
from bastion.records import delivered_counts
from bastion.tree import DraftMarginals, DraftTree

_fit_trees = unchecked(fit_trees)  # the per-step call, past the guard (the engine's own)

__all__ = [
    "NO_DRAFT",
    "BatchStepRecord",
    "Clock",
    "GenerationResult",
    "SpecEngine",
    "StepRecord",
    "batch_policy",
    "wall_clock",
]

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds; must include device synchronisation where needed

# What a single-request policy with ``uses_drafter = False`` receives instead of a draft.
NO_DRAFT = DraftMarginals([[0]], [[0.0]])


def wall_clock() -> float:
    return time.perf_counter()


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """One speculative cycle of one request (a view of its share of a batched step)."""

    tree: DraftTree
    result: VerifyResult
    draft_s: float  # the step's drafter call (shared by the batch)
    build_s: float  # the step's tree policy and controller (shared by the batch)
    verify_s: float  # the step's verification including commit (shared by the batch)
    diagnostics: object | None = None

    @property
    def committed_len(self) -> int:
        return self.result.committed_len


@dataclass(frozen=True, eq=False)
class BatchStepRecord:
    """One step of a batch: the trees chosen, what each request committed, the stage times."""

    requests: StepRequests
    trees: TreeBatch
    result: BatchVerifyResult
    draft_s: float
    build_s: float  # tree policy and controller, for the whole batch
    verify_s: float
    diagnostics: object | None = None
    kind: str = "tree"  # "tree", "chain" (one causal path) or "ar" (nothing drafted)
    # what the drafter's output needed: "topk" (top-K marginals for trees, or for a decision
    # that chose the chain), "argmax" (the top-1 path only: the chain policy, or a chain
    # decision that stood) or "none" (AR)
    preparation: str = "topk"

    @property
    def size(self) -> int:
        return self.requests.size

    @property
    def cycle_s(self) -> float:
        """The step's measured cycle: drafting, choosing and verifying (commit included)."""
        return self.draft_s + self.build_s + self.verify_s

    def record(self, i: int) -> StepRecord:
        """Request i's share of the step as a single-request :class:`StepRecord`."""
        diag = self.diagnostics
        if isinstance(diag, Sequence) and len(diag) == self.size:
            diag = diag[i]
        return StepRecord(
            self.trees.tree(i),
            self.result.result(i),
            self.draft_s,
            self.build_s,
            self.verify_s,
            diag,
        )


_step_record = trusted_init(BatchStepRecord)  # the engine's per-step records
_context = trusted_init(BatchPolicyContext)
# what each plan_step answer prepares (the draft's top-K, its argmax, or no draft)
_PREPARATION = {"ar": "none", "chain": "argmax", "tree": "topk"}


@dataclass
class GenerationResult:
    """What :meth:`SpecEngine.generate` returns for one request."""

    output_ids: list[int]  # generated tokens only (prompt excluded), EOS included if produced
    steps: list[StepRecord] = field(default_factory=list)
    decode_s: float = 0.0  # time from the first draft to the last commit
    # per step: tokens received (bonus included; a step cut by max_new_tokens or EOS counts only
    # what it delivered, see bastion.records) and the draft tokens among them
    committed_per_step: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def acceptance_lengths(self) -> list[int]:
        """The previous release's name of :attr:`committed_per_step` (deprecated)."""
        warnings.warn(
            "GenerationResult.acceptance_lengths is renamed committed_per_step (bastion.records)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.committed_per_step

    @property
    def tau(self) -> float:
        """Mean committed tokens per step, bonus included."""
        lens = self.committed_per_step
        return sum(lens) / len(lens) if lens else 0.0

    @property
    def mean_tree_size(self) -> float:
        return sum(s.tree.size for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def tpot_s(self) -> float:
        """Decode time ÷ the output tokens after the first (the serving benchmarks' TPOT)."""
        n = len(self.output_ids) - 1
        return self.decode_s / n if n > 0 else 0.0

    @property
    def time_per_output_token(self) -> float:
        """The previous release's name of :attr:`tpot_s` (deprecated)."""
        warnings.warn(
            "GenerationResult.time_per_output_token is renamed tpot_s (bastion.records)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.tpot_s

    def stage_times(self) -> dict[str, float]:
        return {
            "draft": sum(s.draft_s for s in self.steps),
            "build": sum(s.build_s for s in self.steps),
            "verify": sum(s.verify_s for s in self.steps),
        }


# --------------------------------------------------------------------------------------------
# Adapters: single-request parts driven through the batched protocols
# --------------------------------------------------------------------------------------------


def load_arrays(requests: StepRequests) -> tuple[np.ndarray, np.ndarray]:
    """(tree sizes, Â) of :func:`batch_loads`, as arrays over the batch."""
    sizes = requests.previous_tree_sizes
    expected = requests.previous_expected
    known = sizes > 0
    if not known.all():
        count = int(np.count_nonzero(known))
        guess, typical = 1, 1.0
        if count:  # the known ones' means as np.mean forms them (sum / count), the whole
            # sizes' rounded down by integer division (what int() of it gives)
            guess = max(1, int(np.add.reduce(sizes[known])) // count)
            typical = float(np.add.reduce(expected[known]) / count)
        sizes = np.where(known, sizes, guess)
        expected = np.where(known, expected, typical)
    return sizes, expected


def batch_loads(requests: StepRequests) -> list[RequestLoad]:
    """Each request's share of the pass, from last step's tree sizes and Â.

    A request on its first step has none yet: it is assumed to take the batch's typical tree
    (the mean over the others, or 1 when no request has one)."""
    sizes, expected = load_arrays(requests)
    return [
        RequestLoad(s, c, a)
        for s, c, a in zip(
            sizes.tolist(), requests.context_lens.tolist(), expected.tolist(), strict=True
        )
    ]


@dataclass(frozen=True)
class PerRequestPolicy:
    """A single-request ``TreePolicy`` run once per request of a batched step.

    Policies that declare ``uses_cost_model = True`` see each request's batched ``StepLoad``:
    the other requests' trees as already chosen this step, or as last step's where not yet
    chosen, so each request's controller weighs its tree against the whole pass.
    """

    policy: TreePolicy

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def uses_drafter(self) -> bool:
        return bool(getattr(self.policy, "uses_drafter", True))

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        req = context.requests
        previous = req.previous_tree_sizes.tolist()
        contexts = req.context_lens.tolist()
        policy, cm = self.policy, context.cost_model
        if not getattr(policy, "uses_cost_model", False) or req.size == 1:
            choices = [
                policy.choose(
                    marginals.row(j), PolicyContext(StepLoad(contexts[j]), cm, previous[j] or None)
                )
                for j in range(req.size)
            ]
        else:
            loads = batch_loads(req)
            choices = []
            for j in range(req.size):
                load = StepLoad(contexts[j], (*loads[:j], *loads[j + 1 :]))
                choice = policy.choose(
                    marginals.row(j), PolicyContext(load, cm, previous[j] or None)
                )
                tree = choice.tree
                loads[j] = RequestLoad(tree.size, contexts[j], float(tree.scores.sum()))
                choices.append(choice)
        for c in choices:
            if not isinstance(getattr(c, "tree", None), DraftTree):
                raise PolicyError(
                    f"policy {_describe(policy)}: choose() returned {_kind(c)}; it must "
                    "return a bastion.interfaces.TreeChoice whose tree is a DraftTree"
                )
        trees = TreeBatch.from_trees([c.tree for c in choices])
        diagnostics = [c.diagnostics for c in choices]
        return BatchChoice(trees, diagnostics if any(d is not None for d in diagnostics) else None)


def _kind(value: object) -> str:
    """A wrong answer as an error message names it: its type, and the value when short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 60 else type(value).__name__


def _describe(policy: object) -> str:
    """A policy for an error message: its name, its class and the file that class is in (the
    user's own file for a ``file.py:Name`` plug-in)."""
    cls = type(policy)
    module = sys.modules.get(cls.__module__)
    where = getattr(module, "__file__", None) or cls.__module__
    return f"{getattr(policy, 'name', '?')!r} ({cls.__qualname__} in {where})"


@public
def batch_policy(policy: TreePolicy | BatchTreePolicy) -> BatchTreePolicy:
    """``policy`` itself if it chooses batches, else it wrapped in :class:`PerRequestPolicy`."""
    if isinstance(policy, BatchTreePolicy):
        return policy
    return PerRequestPolicy(policy)


def _draft_each(drafter: Drafter) -> Callable[[StepRequests], BatchMarginals]:
    def draft_batch(requests: StepRequests) -> BatchMarginals:
        feedback = requests.feedback or (None,) * requests.size
        committed = requests.committed or ((),) * requests.size
        bonus = requests.bonus_tokens.tolist()
        rows = [
            drafter.draft(DraftContext(int(rid), tuple(c), b, fb))
            for rid, c, b, fb in zip(
                requests.request_ids.tolist(), committed, bonus, feedback, strict=True
            )
        ]
        return BatchMarginals.from_rows(rows)

    return draft_batch


def _verify_each(verifier: Verifier) -> Callable[[StepRequests, TreeBatch], BatchVerifyResult]:
    def verify_batch(requests: StepRequests, trees: TreeBatch) -> BatchVerifyResult:
        ids = requests.request_ids.tolist()
        return BatchVerifyResult.from_results(
            [verifier.verify(rid, trees.tree(j)) for j, rid in enumerate(ids)]
        )

    return verify_batch


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@dataclass
class SpecEngine:
    """Runs speculative decoding one batched step at a time through the four protocols."""

    drafter: Drafter | BatchDrafter
    policy: TreePolicy | BatchTreePolicy
    verifier: Verifier | BatchVerifier
    cost_model: CostModel | None = None
    clock: Clock = wall_clock
    observe_costs: bool = True  # feed each measured verify time to cost_model.observe

    # With observe_costs=False the caller reports times itself (the simulator prices a whole
    # batched pass on its simulated GPU after the step).
    #
    # A policy that declares ``learns = True`` (``bastion``) gets a LearnedCostModel around the
    # cost model given (the same object if it already is one) and every step's kind, trees,
    # committed lengths and measured cycle (``observe_step``); a policy with a
    # ``plan_step(requests, cost_model)`` method says before drafting what the step will be
    # ("ar": no draft; "chain": the drafter's top-1 suffices; "tree": top-K), one with only
    # ``wants_draft(requests, cost_model)`` whether to draft at all. The record's
    # ``preparation`` says which the step needed, so the simulator charges that.

    def __post_init__(self) -> None:
        self._policy = batch_policy(self.policy)
        self._uses_drafter = bool(getattr(self._policy, "uses_drafter", True))
        self._wants_draft = getattr(self._policy, "wants_draft", None)
        self._plan_step = getattr(self._policy, "plan_step", None)
        self._static_kind = (
            "ar"
            if not self._uses_drafter
            else "tree"
            if getattr(self.policy, "uses_topk", True)
            else "chain"
        )
        if getattr(self._policy, "learns", False) and self.cost_model is not None:
            from bastion.learned import LearnedCostModel

            if not isinstance(self.cost_model, LearnedCostModel):
                self.cost_model = LearnedCostModel(self.cost_model)
        self._observe_step = getattr(self.cost_model, "observe_step", None)
        # a learning cost model learns whole steps (observe_step); its verify-only observe is a
        # no-op, so the engine does not build the load it would be handed
        self._observe_verify = not getattr(self.cost_model, "learns_whole_steps", False)
        d, v = self.drafter, self.verifier
        self._draft = d.draft_batch if isinstance(d, BatchDrafter) else _draft_each(d)
        self._verify = v.verify_batch if isinstance(v, BatchVerifier) else _verify_each(v)

    def step(self, requests: StepRequests) -> BatchStepRecord:
        """One cycle for every request of ``requests``: draft, choose trees, verify, commit."""
        clock = self.clock
        t0 = clock()
        drafts = self._uses_drafter
        preparation = "none" if not drafts else "topk" if self._static_kind == "tree" else "argmax"
        if drafts and self._plan_step is not None:
            plan = self._plan_step(requests, self.cost_model)
            if plan not in ("ar", "chain", "tree"):
                raise PolicyError(
                    f"policy {_describe(self.policy)}: plan_step() returned {plan!r}; it must "
                    'return "ar", "chain" or "tree"'
                )
            drafts = plan != "ar"
            preparation = _PREPARATION[plan]
        elif drafts and self._wants_draft is not None:
            drafts = bool(self._wants_draft(requests, self.cost_model))
            preparation = preparation if drafts else "none"
        # target-only decoding: no draft pass at all
        marginals = self._draft(requests) if drafts else empty_marginals(requests.size)
        t1 = clock()
        choice = self._policy.choose_batch(marginals, _context(requests, self.cost_model))
        if not isinstance(getattr(choice, "trees", None), TreeBatch):
            raise PolicyError(
                f"policy {_describe(self.policy)}: choose_batch() returned {_kind(choice)}; "
                "it must return a bastion.interfaces.BatchChoice whose trees are a TreeBatch"
            )
        trees = choice.trees.with_root_tokens(requests.bonus_tokens)
        if requests.kv is not None:  # a counted KV cache: trees that do not fit are cut
            trees = _fit_trees(trees, requests.kv)
        kind = "ar" if not drafts else (choice.kind or self._static_kind)
        t2 = clock()
        result = self._verify(requests, trees)
        t3 = clock()
        record = _step_record(
            requests,
            trees,
            result,
            t1 - t0,
            t2 - t1,
            t3 - t2,
            choice.diagnostics,
            kind,
            preparation,
        )
        if self.cost_model is not None and self.observe_costs:
            if self._observe_verify:
                self.cost_model.observe(*observed_load(requests, trees), t3 - t2)
            if self._observe_step is not None:
                self.report(record, t3 - t0)
        return record

    def report(self, record: BatchStepRecord, cycle_s: float) -> None:
        """Tell a learning cost model what a step cost (``cycle_s``) and what it committed;
        the simulator calls this with the simulated cycle (it runs with observe_costs=False)."""
        if self._observe_step is not None:
            self._observe_step(
                record.kind,
                record.requests.context_lens,
                record.trees,
                record.result.committed_lens,
                record.result.accepted_nodes,
                cycle_s,
                preparation=record.preparation,
            )

    def generate(
        self,
        request_id: int,
        prompt_ids: Sequence[int],
        first_token: int,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        feedback: object | None = None,
    ) -> GenerationResult:
        """Decode one request after prefill: ``first_token`` is the target's token from prefill.

        Stops after ``max_new_tokens`` generated tokens (the first token counts) or at EOS; a
        step that commits past either is cut there.
        """
        out = [int(first_token)]
        result = GenerationResult(out)
        if max_new_tokens <= 1 or first_token == eos_token_id:
            del out[max(max_new_tokens, 1) :]
            return result
        committed = [*map(int, prompt_ids), int(first_token)]
        start = self.clock()
        previous = 0
        expected = 0.0
        while len(out) < max_new_tokens:
            requests = StepRequests.of(
                [request_id],
                [len(committed) - 1],
                [committed[-1]],
                [previous],
                [expected],
                feedback=(feedback,),
                committed=(committed,),
            )
            step = self.step(requests)
            rec = step.record(0)
            result.steps.append(rec)
            previous = rec.tree.size
            expected = float(rec.tree.scores.sum())
            new = [*rec.result.accepted_tokens, rec.result.bonus_token]
            if eos_token_id is not None and eos_token_id in new:
                new = new[: new.index(eos_token_id) + 1]
            new = new[: max_new_tokens - len(out)]
            delivered, accepted = delivered_counts(rec.committed_len, len(new))
            result.committed_per_step.append(delivered)
            result.accepted_per_step.append(accepted)
            out.extend(new)
            committed.extend(new)
            feedback = rec.result.feedback
            if eos_token_id is not None and new and new[-1] == eos_token_id:
                break
        result.decode_s = self.clock() - start
        log.debug("request %d: %d tokens in %d steps", request_id, len(out), len(result.steps))
        return result


def observed_load(requests: StepRequests, trees: TreeBatch) -> tuple[int, StepLoad]:
    """A measured batched pass as (first request's tree size, its StepLoad with the others)."""
    sizes = trees.sizes.tolist()
    contexts = requests.context_lens.tolist()
    expected = trees.expected_tokens().tolist()
    others = tuple(
        RequestLoad(s, c, a) for s, c, a in zip(sizes[1:], contexts[1:], expected[1:], strict=True)
    )
    return sizes[0], StepLoad(contexts[0], others)
