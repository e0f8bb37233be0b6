"""The decode loop both backends share: draft → build tree → verify → commit.

One :class:`SpecEngine` drives any ``Drafter``, ``TreePolicy``, ``Verifier`` and clock. The
real backend passes torch implementations and a wall clock that synchronises the device; the
simulator passes simulated ones and simulated time. Policies and the controller never know which.

Terms (as in vLLM's spec-decode docs): *accepted* tokens are draft tokens the target agreed with;
the *bonus* token is the target's own token after the last accepted one, always committed. Per
step the committed length is accepted + 1, and τ (mean acceptance length) includes the bonus.

What this module does not do: prefill, sampling or KV-cache management (the verifier's job),
or batching across requests (the simulator's serving layer calls :meth:`SpecEngine.step` per
request with a batched ``StepLoad``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bastion.interfaces import (
    CostModel,
    DraftContext,
    Drafter,
    PolicyContext,
    StepLoad,
    TreeChoice,
    TreePolicy,
    Verifier,
    VerifyResult,
)
from bastion.tree import DraftMarginals, DraftTree

__all__ = ["NO_DRAFT", "Clock", "GenerationResult", "SpecEngine", "StepRecord", "wall_clock"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds; must include device synchronisation where needed

# What a policy with ``uses_drafter = False`` (target-only AR) receives instead of a draft.
NO_DRAFT = DraftMarginals([[0]], [[0.0]])


def wall_clock() -> float:
    return time.perf_counter()


@dataclass(frozen=True)
class StepRecord:
    """One speculative cycle of one request."""

    tree: DraftTree
    result: VerifyResult
    draft_s: float
    build_s: float  # tree policy (and controller)
    verify_s: float  # verification including commit
    diagnostics: object | None = None

    @property
    def committed_len(self) -> int:
        return self.result.committed_len


@dataclass
class GenerationResult:
    """What :meth:`SpecEngine.generate` returns for one request."""

    output_ids: list[int]  # generated tokens only (prompt excluded), EOS included if produced
    steps: list[StepRecord] = field(default_factory=list)
    decode_s: float = 0.0  # time from the first draft to the last commit

    @property
    def acceptance_lengths(self) -> list[int]:
        return [s.committed_len for s in self.steps]

    @property
    def tau(self) -> float:
        """Mean committed tokens per step, bonus included."""
        lens = self.acceptance_lengths
        return sum(lens) / len(lens) if lens else 0.0

    @property
    def mean_tree_size(self) -> float:
        return sum(s.tree.size for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def time_per_output_token(self) -> float:
        return self.decode_s / len(self.output_ids) if self.output_ids else 0.0

    def stage_times(self) -> dict[str, float]:
        return {
            "draft": sum(s.draft_s for s in self.steps),
            "build": sum(s.build_s for s in self.steps),
            "verify": sum(s.verify_s for s in self.steps),
        }


@dataclass
class SpecEngine:
    """Runs speculative decoding for one request at a time through the four protocols."""

    drafter: Drafter
    policy: TreePolicy
    verifier: Verifier
    cost_model: CostModel | None = None
    clock: Clock = wall_clock
    observe_costs: bool = True  # feed each measured verify time to cost_model.observe

    # With observe_costs=False the caller reports times itself (the simulator prices a whole
    # batched pass once per serving step, after every request's tree is known).

    def step(
        self,
        request_id: int,
        committed: Sequence[int],
        feedback: object | None,
        load: StepLoad,
        previous_tree_size: int | None = None,
    ) -> StepRecord:
        """One cycle: draft from the committed tokens, choose a tree, verify it.

        ``previous_tree_size`` (the request's last tree) lets an adaptive policy start its
        search near where it stopped last time; it never changes which tree is chosen."""
        t0 = self.clock()
        if getattr(self.policy, "uses_drafter", True):
            marginals = self.drafter.draft(
                DraftContext(request_id, tuple(committed), int(committed[-1]), feedback)
            )
        else:  # target-only decoding: no draft pass at all
            marginals = NO_DRAFT
        t1 = self.clock()
        context = PolicyContext(load, self.cost_model, previous_tree_size)
        choice: TreeChoice = self.policy.choose(marginals, context)
        tree = choice.tree.with_root_token(int(committed[-1]))
        t2 = self.clock()
        result = self.verifier.verify(request_id, tree)
        t3 = self.clock()
        if self.cost_model is not None and self.observe_costs:
            self.cost_model.observe(tree.size, load, t3 - t2)
        return StepRecord(tree, result, t1 - t0, t2 - t1, t3 - t2, choice.diagnostics)

    def generate(
        self,
        request_id: int,
        prompt_ids: Sequence[int],
        first_token: int,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        feedback: object | None = None,
    ) -> GenerationResult:
        """Decode after prefill: ``first_token`` is the target's token from the prefill pass.

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
        while len(out) < max_new_tokens:
            load = StepLoad(context_len=len(committed) - 1)
            last = result.steps[-1].tree.size if result.steps else None
            rec = self.step(request_id, committed, feedback, load, last)
            result.steps.append(rec)
            new = [*rec.result.accepted_tokens, rec.result.bonus_token]
            if eos_token_id is not None and eos_token_id in new:
                new = new[: new.index(eos_token_id) + 1]
            new = new[: max_new_tokens - len(out)]
            out.extend(new)
            committed.extend(new)
            feedback = rec.result.feedback
            if eos_token_id is not None and new and new[-1] == eos_token_id:
                break
        result.decode_s = self.clock() - start
        log.debug("request %d: %d tokens in %d steps", request_id, len(out), len(result.steps))
        return result
