"""The decode loop of a session: every prompt through ``SpecEngine.step``, ``batch_size`` at a time.

:func:`_decoding` admits prompts as slots free up (each after its own prefill), runs one
:meth:`bastion.engine.SpecEngine.step` per batched step, hands each request the tokens it
received (cut at EOS and ``max_new_tokens``) and releases a finished request from the verifier
and the drafter at once. It times every prefill and every step, stage by stage
(:mod:`bastion.stepcosts`), and yields after every step, so that a caller may run other
sessions' steps in between (:mod:`.lockstep`); :func:`_finish` runs it through.

What this module does not do: set a session up (:mod:`.prepare`) or turn its runs into reports
(:mod:`.reports`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bastion.batch import StepRequests
from bastion.engine import SpecEngine, StepRecord
from bastion.records import delivered_counts
from bastion.stepcosts import PrefillSample, StepSample

from .clock import Clock
from .verifier import TorchVerifier, VerifyTiming

_T = TypeVar("_T")


@dataclass
class _Live:
    """A request in the batch."""

    index: int  # position in the prompt list (and request id)
    committed: list[int]  # prompt + output so far
    out: list[int]
    feedback: object | None
    queue_s: float
    prefill_s: float
    first_at: float
    steps: list[StepRecord] = field(default_factory=list)
    previous: int = 0
    expected: float = 0.0
    end_at: float = 0.0
    timings: list[VerifyTiming] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)  # per step: tokens it received
    accepted: list[int] = field(default_factory=list)  # per step: draft tokens among them


# sizes, contexts, draft, build, verify, whether the step drafted, and the controller's own
# predicted cycle (a learning controller's diagnostics; NaN for any other policy)
_Cycle = tuple[list[int], list[int], float, float, float, bool, float]


@dataclass
class _Run:
    lives: list[_Live]
    wall_s: float
    steps: int
    step_sizes: list[int]
    stage_times: dict[str, float]
    # per step: (tree sizes, contexts, measured draft, build, verify) for the cycle report
    cycles: list[_Cycle]
    samples: list[StepSample] = field(default_factory=list)  # every step, stage by stage
    prefills: list[PrefillSample] = field(default_factory=list)


def _done(live: _Live, max_new_tokens: int, eos: frozenset[int]) -> bool:
    return len(live.out) >= max_new_tokens or (bool(live.out) and live.out[-1] in eos)


def _finish(decoding: Generator[Any, None, _T]) -> _T:
    """Run a generator (a decoding, a session) to its end; its return value."""
    while True:
        try:
            next(decoding)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def _decoding(
    engine: SpecEngine,
    verifier: TorchVerifier,
    drafter: object,
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    max_new_tokens: int,
    eos: frozenset[int],
    clock: Clock,
    run: int = 0,
) -> Generator[bool, None, _Run]:
    """Decode every prompt, at most ``batch_size`` at a time, one ``engine.step`` per step;
    yields after every step (the caller may run others' steps in between: :mod:`.lockstep`;
    :func:`_finish` runs it through) and returns the run (``run``: its index among the timed
    runs, recorded in its step samples)."""
    for part in (verifier, drafter):
        release_all = getattr(part, "release_all", None)
        if release_all is not None:
            release_all()
    pending = deque(range(len(prompts)))
    active: list[_Live] = []
    finished: dict[int, _Live] = {}
    steps = 0
    step_sizes: list[int] = []
    stages = {"draft": 0.0, "build": 0.0, "verify": 0.0}
    cycles: list[_Cycle] = []
    samples: list[StepSample] = []
    prefills: list[PrefillSample] = []
    learns = bool(getattr(engine.policy, "learns", False))  # it may skip drafting some steps
    decides = bool(getattr(engine.policy, "uses_cost_model", False))
    builder = str(getattr(engine.policy, "tree_builder", ""))

    def finish(live: _Live, at: float) -> None:
        live.end_at = at
        live.timings = list(verifier.timings(live.index))
        finished[live.index] = live
        _release(verifier, live.index)
        _release(drafter, live.index)

    start = clock()
    # the clock when the last step's bookkeeping ended: what the loop spends from there to the
    # next step's start (recording the sample, the loop's head), prefills aside, is the next
    # step's (a request's decode time pays it: ≈ 25 µs a step on the demo pair, 0.6 % of AR's)
    settled: float | None = None
    while pending or active:
        prefilling = 0.0
        while pending and len(active) < batch_size:
            i = pending.popleft()
            admitted = clock()
            first, feedback = verifier.prefill(i, prompts[i])
            now = clock()
            prefilling += now - admitted
            prefills.append(PrefillSample(len(prompts[i]), now - admitted))
            live = _Live(
                i,
                [*map(int, prompts[i]), int(first)],
                [int(first)],
                feedback,
                admitted - start,
                now - admitted,
                now,
            )
            if _done(live, max_new_tokens, eos):
                finish(live, now)
            else:
                active.append(live)
        if not active:
            continue
        begin = clock()
        between = max(begin - settled - prefilling, 0.0) if settled is not None else 0.0
        at = time.perf_counter()  # the machine's time (the turn clock counts only its turns)
        fed = [live.feedback for live in active]  # what a drafted step's drafter takes first
        requests = StepRequests.of(
            [live.index for live in active],
            [len(live.committed) - 1 for live in active],
            [live.committed[-1] for live in active],
            [live.previous for live in active],
            [live.expected for live in active],
            feedback=fed,
            committed=[live.committed for live in active],
        )
        step = engine.step(requests)
        now = clock()
        steps += 1
        step_sizes.append(len(active))
        stages["draft"] += step.draft_s
        stages["build"] += step.build_s
        stages["verify"] += step.verify_s
        sizes = step.trees.sizes.tolist()
        predicted = getattr(step.diagnostics, "predicted_cycle_s", math.nan)
        cycles.append(
            (
                sizes,
                requests.context_lens.tolist(),
                step.draft_s,
                step.build_s,
                step.verify_s,
                step.kind != "ar",
                float(predicted) if isinstance(predicted, (int, float)) else math.nan,
            )
        )
        expected = step.trees.expected_tokens().tolist()
        still = []
        for j, live in enumerate(active):
            rec = step.record(j)
            live.steps.append(rec)
            live.previous, live.expected = sizes[j], expected[j]
            new = [*rec.result.accepted_tokens, rec.result.bonus_token]
            stop = next((k for k, t in enumerate(new) if t in eos), None)
            if stop is not None:
                new = new[: stop + 1]
            new = new[: max_new_tokens - len(live.out)]
            live.out.extend(new)
            live.committed.extend(new)
            delivered, accepted = delivered_counts(rec.committed_len, len(new))
            live.delivered.append(delivered)
            live.accepted.append(accepted)
            if step.kind == "ar" and learns and hasattr(live.feedback, "then"):
                live.feedback = live.feedback.then(rec.result.feedback)  # not drafted: keep
            else:
                live.feedback = rec.result.feedback
            if _done(live, max_new_tokens, eos):
                finish(live, now)
            else:
                still.append(live)
        active = still
        diag = step.diagnostics
        diag = diag[0] if isinstance(diag, Sequence) and diag else diag
        split = _stages(getattr(verifier, "last_timing", None), step.verify_s)
        settled = clock()  # (recording this step's sample is the next step's: ``between``)
        control = (
            "repeat" if getattr(diag, "repeated", False) else "decide" if decides else "static"
        )
        samples.append(
            StepSample(
                step.kind,
                step.preparation,
                control,
                tuple(sizes),
                tuple(requests.context_lens.tolist()),
                step.draft_s,
                step.build_s,
                step.verify_s,
                max(settled - begin - step.draft_s - step.build_s - step.verify_s, 0.0) + between,
                builder if step.kind == "tree" else "",
                *split,
                run,
                at,
                sum(map(_feature_tokens, fed)) if step.kind != "ar" else 0,
            )
        )
        yield False  # a step done (not the start of timing: see _session)
    wall = clock() - start
    lives = [finished[i] for i in range(len(prompts))]
    return _Run(lives, wall, steps, step_sizes, stages, cycles, samples, prefills)


def _feature_tokens(feedback: object) -> int:
    """Tokens of target features a request's feedback holds (a run of skipped steps' parts
    summed; 0 for none or a feedback that does not say)."""
    parts = getattr(feedback, "parts", None)
    if parts:  # contiguous (FeedbackRun.then keeps them so): O(1), however many steps it holds
        last = parts[-1]
        return int(last.start + last.length - parts[0].start)
    return int(getattr(feedback, "length", 0))


def _stages(timing: VerifyTiming | None, verify_s: float) -> tuple[float, float, float, float]:
    """(mask, forward, accept, commit) of a step's verifier call, commit taking the rest of the
    call (its bookkeeping) so that they add up to ``verify_s``; zeros without a timing."""
    if timing is None:
        return 0.0, 0.0, 0.0, 0.0
    rest = verify_s - timing.mask_s - timing.forward_s - timing.accept_s
    if rest < 0:  # the engine's and the verifier's clocks read apart: scale to the call
        scale = verify_s / (timing.mask_s + timing.forward_s + timing.accept_s)
        return timing.mask_s * scale, timing.forward_s * scale, timing.accept_s * scale, 0.0
    return timing.mask_s, timing.forward_s, timing.accept_s, rest


def _release(part: object, request_id: int) -> None:
    release = getattr(part, "release", None)
    if release is not None:
        release(request_id)
