"""Several policies decoding the same prompts in lockstep: a fair timing on a drifting machine.

A shared CPU's speed drifts by 10–20 % over seconds, so policies timed one after another, or even
in turns prompt by prompt, are compared partly on the drift. Two halves of one stream of AR
steps of the demo target, dealt to two pretend policies in alternating blocks, differ (standard
deviation of their ratio over windows of 768 steps each) by 12 % when the blocks are 768 steps
(one policy's run, then the other's), 6 % at 96 steps (prompt by prompt), 0.2 % at every step
(``benchmarks/bench_lockstep_noise.py``, this repository's CPU machine).

:func:`generate_lockstep` therefore runs every contender's session (:func:`.generate_batch`'s
set-up, warm-up and timed runs) one step at a time: the next step goes to the contender whose own
clock is furthest behind, and each contender's clock (:class:`TurnClock`) runs only during its own
steps. Every contender's runs thus meet the same drift, each is timed as if it ran alone, and a
contender that finishes its runs early leaves the others to go on alone only for the difference
of their times. Python's garbage collector runs only between steps, outside every clock
(:func:`_collections_between_turns`): left automatic, its full collections were most of the
"stalls" of hundreds of ms that landed on single steps. What lockstep cannot spread: a stall of
the machine itself lands on one contender's step; a run's mean TPOT takes it whole, the median
over requests (:meth:`.BatchGenerationReport.latency`) mostly does not. What it does not do:
share a drafter between contenders (each needs its own instance: a drafter keeps per-request
state) or interleave the warm-ups (untimed).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bastion.errors import ArgumentError, BudgetError
from bastion.guard import has, integer, public
from bastion.interfaces import BatchDrafter, CostModel, Drafter, TreePolicy

from .reports import BatchGenerationReport
from .runner import _session
from .sampling import SamplingParams
from .timing import Clock, device_clock

__all__ = ["Contender", "TurnClock", "generate_lockstep", "lockstep"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Contender:
    """One policy of a lockstep run and what :func:`.generate_batch` takes for it."""

    policy: str | TreePolicy
    drafter: Drafter | BatchDrafter | None = None  # its own instance (None only for "ar")
    cost_model: CostModel | None = None
    predict_cycles: CostModel | None = None
    record_traces: Sequence[str | os.PathLike[str]] | None = None
    trace_metadata: Mapping[str, Any] | None = None
    dense_trace: bool = False
    policy_spec: str | None = None


class TurnClock:
    """A clock that runs only during its owner's turns (:meth:`resume` … :meth:`pause`): the
    seconds of ``base`` spent in them, so that a run timed by it is timed as if alone."""

    def __init__(self, base: Clock) -> None:
        if not callable(base):
            raise ArgumentError(f"TurnClock: base must be a clock (a callable); got {base!r}")
        self._base = base
        self.own = 0.0  # seconds of the turns so far
        self._since: float | None = None  # base time the current turn began, None between

    def resume(self) -> None:
        self._since = self._base()

    def pause(self) -> None:
        if self._since is not None:
            self.own += self._base() - self._since
            self._since = None

    def __call__(self) -> float:
        return self.own + (0.0 if self._since is None else self._base() - self._since)


def lockstep(
    sessions: Sequence[Generator[bool, None, _T]],
    clocks: Sequence[TurnClock],
    weights: Sequence[float] | None = None,
) -> list[_T]:
    """Drive generators that yield ``True`` once timing begins and ``False`` after every timed
    step: first each to its ``True`` (one after another: the untimed part), then, with every
    clock set to zero, step by step, always the one whose clock is lowest (ties: the first);
    their return values in order. A generator that returns before its ``True`` is done.

    ``weights`` (one per session, > 0; default all 1): the next step goes to the lowest clock ÷
    weight, so a session of half the work with weight ½ spreads its steps over the whole run
    instead of finishing in its first part (``bastion twin`` spreads its timing of the machine
    over the runs it predicts this way)."""
    if not isinstance(sessions, Sequence) or not all(isinstance(g, Generator) for g in sessions):
        raise ArgumentError("lockstep: sessions must be a sequence of generators")
    if not isinstance(clocks, Sequence) or not all(isinstance(c, TurnClock) for c in clocks):
        raise ArgumentError("lockstep: clocks must be a sequence of TurnClock")
    if len(sessions) != len(clocks):
        raise BudgetError(f"{len(sessions)} sessions for {len(clocks)} clocks; give one each")
    scale = [1.0] * len(sessions)
    if weights is not None:
        if (
            not isinstance(weights, Sequence)
            or isinstance(weights, str)
            or len(weights) != len(sessions)
            or not all(
                isinstance(w, int | float) and not isinstance(w, bool) and 0 < w < float("inf")
                for w in weights
            )
        ):
            raise BudgetError(
                f"lockstep: weights must be one finite number > 0 per session; got {weights!r:.80}"
            )
        scale = [1.0 / float(w) for w in weights]
    results: dict[int, _T] = {}

    def turn(i: int) -> bool:
        """One turn of session ``i``; False once it has returned."""
        clocks[i].resume()
        try:
            next(sessions[i])
        except StopIteration as stop:
            results[i] = stop.value
            return False
        finally:
            clocks[i].pause()
        return True

    live = [i for i in range(len(sessions)) if turn(i)]
    for clock in clocks:
        clock.own = 0.0
    with _collections_between_turns() as between:
        while live:
            i = min(live, key=lambda k: clocks[k].own * scale[k])
            if not turn(i):
                live.remove(i)
            between()
    return [results[i] for i in range(len(sessions))]


#: turns between two garbage collections of the timed part (each outside every clock)
GC_EVERY_TURNS = 256


@contextlib.contextmanager
def _collections_between_turns() -> Iterator[Callable[[], None]]:
    """Python's garbage collector, kept out of the timed steps. Left automatic, its full
    collections walk every live object (≈ 450 000 with a model, its traces and steps loaded):
    9 of them in a 96-second ``bastion twin`` run, 7 over 50 ms and up to 262 ms, each landing
    whole on one step of one session — the stalls of hundreds of ms its timings showed. Here
    what lives before the timed part is collected and frozen (never walked again), automatic
    collection is off while it runs, and the objects made since are collected every
    :data:`GC_EVERY_TURNS` turns between two turns, where no clock runs."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    turns = 0

    def between() -> None:
        nonlocal turns
        turns += 1
        if turns % GC_EVERY_TURNS == 0:
            gc.collect()

    try:
        yield between
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


@public(
    target=has("config", "parameters"),
    batch_size=integer(1, 1 << 16),
    max_new_tokens=integer(1, 1 << 20),
    repeats=integer(1, 1000),
    warmup=integer(0, 1000),
)
def generate_lockstep(
    target: Any,
    contenders: Sequence[Contender],
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 1,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = -1,
    repeats: int = 1,
    warmup: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[BatchGenerationReport]:
    """:func:`.generate_batch` for every contender on the same prompts, their timed runs in
    lockstep (see the module): one report per contender, in order. Each contender's warm-ups
    run before any timed step; run r of every contender goes on together. ``progress`` hears
    each time every contender has finished one more timed run."""
    if not contenders:
        raise BudgetError("no contenders: give at least one")
    if not all(isinstance(c, Contender) for c in contenders):
        raise BudgetError("contenders must be Contender(policy, drafter, …) instances")
    drafters = [id(c.drafter) for c in contenders if c.drafter is not None]
    if len(set(drafters)) != len(drafters):
        raise BudgetError(
            "two contenders share one drafter instance; give each its own (a drafter keeps "
            "per-request state)"
        )
    base = device_clock(next(target.parameters()).device)
    clocks = [TurnClock(base) for _ in contenders]
    done = [0] * len(contenders)  # timed runs finished, per contender

    def finished(i: int) -> Callable[[int], None]:
        def tell(runs: int) -> None:
            before = min(done)
            done[i] = runs
            if progress is not None and min(done) > before:
                progress(f"timed run {min(done)} of {repeats} done by every policy")

        return tell

    sessions = [
        _session(
            target,
            c.drafter,
            c.policy,
            prompts,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            seed=seed,
            eos_token_id=eos_token_id,
            cost_model=c.cost_model,
            record_traces=c.record_traces,
            trace_metadata=c.trace_metadata,
            dense_trace=c.dense_trace,
            verifier=None,
            repeats=repeats,
            warmup=warmup,
            predict_cycles=c.predict_cycles,
            policy_spec=c.policy_spec,
            clock=clock,
            on_run=finished(i),
        )
        for i, (c, clock) in enumerate(zip(contenders, clocks, strict=True))
    ]
    return lockstep(sessions, clocks)
