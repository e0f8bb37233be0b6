"""Lockstep timing of several policies (bastion.backends.torch.lockstep).

Invariants: a turn clock counts only its owner's turns; the scheduler gives every step to the
session whose clock is lowest, after running each to the start of its timing (not counted);
``generate_lockstep`` decodes what ``generate_batch`` decodes for each contender, and its
contenders' clocks partition the time (their timed runs add up to at most the elapsed time);
a report's median TPOT is over the requests of every timed run.
"""

from __future__ import annotations

import time
from collections.abc import Generator

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bastion.backends.torch import generate, generate_batch  # noqa: E402
from bastion.backends.torch.lockstep import (  # noqa: E402
    Contender,
    TurnClock,
    generate_lockstep,
    lockstep,
)
from bastion.errors import BastionError  # noqa: E402
from tests.torch_models import BatchOracleDrafter, greedy_reference, tiny_target  # noqa: E402

PROMPTS = [[5, 17, 3, 44], [9, 2, 61, 30, 8, 11], [70, 1]]
NEW = 12


class FakeTime:
    """A base clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_turn_clock_counts_only_its_turns() -> None:
    base = FakeTime()
    clock = TurnClock(base)
    base.now = 5.0  # before any turn: not counted
    clock.resume()
    base.now = 7.0
    assert clock() == 2.0
    clock.pause()
    base.now = 100.0  # another's turn
    assert clock() == 2.0
    clock.resume()
    base.now = 100.5
    clock.pause()
    assert clock.own == 2.5


def test_the_step_goes_to_the_session_furthest_behind() -> None:
    """Three sessions whose steps cost 1, 2 and 3 time units, each after an untimed set-up
    (10, 20, 30 units: not counted); the order of their steps and their clocks follow from
    "lowest clock first"."""
    base = FakeTime()
    clocks = [TurnClock(base) for _ in range(3)]
    order: list[int] = []

    def session(i: int, cost: float, steps: int) -> Generator[bool, None, float]:
        base.now += 10.0 * (i + 1)  # the warm-up: untimed
        yield True
        start = clocks[i]()
        for _ in range(steps):
            base.now += cost
            order.append(i)
            yield False
        return clocks[i]() - start

    walls = lockstep([session(0, 1.0, 6), session(1, 2.0, 3), session(2, 3.0, 2)], clocks)
    assert walls == [6.0, 6.0, 6.0]  # each its own steps only: no set-up, no other's steps
    # clocks (0, 0, 0) → 0 steps; (1, 0, 0) → 1; (1, 2, 0) → 2; (1, 2, 3) → 0; (2, 2, 3) → 0;
    # (3, 2, 3) → 1; (3, 4, 3) → 0; (4, 4, 3) → 2; (4, 4, 6) → 0; (5, 4, 6) → 1; (5, 6, 6) → 0
    assert order == [0, 1, 2, 0, 0, 1, 0, 2, 0, 1, 0]


@pytest.mark.parametrize("weights", [False, 1.0, "ab", [1.0], [1.0, 0.0], [1.0, True], [1, None]])
def test_weights_that_are_not_one_positive_number_per_session_are_refused(weights) -> None:  # type: ignore[no-untyped-def]
    """A project error, not Python's (the fuzz test found ``weights=False`` escaping as a
    TypeError from ``len``)."""
    base = FakeTime()
    clocks = [TurnClock(base) for _ in range(2)]

    def session() -> Generator[bool, None, float]:
        yield True
        return 0.0

    with pytest.raises(BastionError, match="weights"):
        lockstep([session(), session()], clocks, weights=weights)


class _Cycle:
    """Garbage only the collector frees (a reference cycle)."""

    def __init__(self) -> None:
        self.me = self


def test_no_garbage_collection_lands_inside_a_timed_step() -> None:
    """The collector's passes (a full one walks every live object: hundreds of ms in a twin run)
    run between turns, where no clock runs — and do run, so cyclic garbage does not pile up."""
    import gc

    from bastion.backends.torch.lockstep import GC_EVERY_TURNS

    clocks = [TurnClock(time.perf_counter) for _ in range(2)]
    inside = between = 0

    def watch(phase: str, info: dict[str, int]) -> None:
        nonlocal inside, between
        if phase == "start":
            timed = any(c._since is not None for c in clocks)
            inside += timed
            between += not timed

    def session(i: int) -> Generator[bool, None, int]:
        yield True
        for _ in range(GC_EVERY_TURNS):
            for _ in range(2000):  # ≈ 3 automatic collections per step when left on
                _Cycle()
            yield False
        return i

    gc.callbacks.append(watch)
    try:
        assert lockstep([session(0), session(1)], clocks) == [0, 1]
    finally:
        gc.callbacks.remove(watch)
    assert inside == 0
    assert between >= 2  # every GC_EVERY_TURNS turns: 2 · GC_EVERY_TURNS turns here
    assert gc.isenabled()  # as it was before


def test_a_session_that_fails_in_its_set_up_stops_the_run() -> None:
    base = FakeTime()

    def broken() -> Generator[bool, None, float]:
        raise BastionError("bad input")
        yield True  # pragma: no cover

    def fine() -> Generator[bool, None, float]:
        yield True
        return 1.0

    with pytest.raises(BastionError, match="bad input"):
        lockstep([fine(), broken()], [TurnClock(base), TurnClock(base)])
    with pytest.raises(BastionError, match="one each"):
        lockstep([fine()], [TurnClock(base), TurnClock(base)])


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    return tiny_target()


def _oracle(target) -> BatchOracleDrafter:  # type: ignore[no-untyped-def]
    truths = {i: p + greedy_reference(target, p, NEW) + [0] * 8 for i, p in enumerate(PROMPTS)}
    return BatchOracleDrafter(truths, vocab=96)


def test_lockstep_decodes_what_each_policy_decodes_alone(target) -> None:  # type: ignore[no-untyped-def]
    policies = ("ar", "chain", "fixed:8")
    alone = [
        generate_batch(
            target,
            None if p == "ar" else _oracle(target),
            p,
            PROMPTS,
            batch_size=2,
            max_new_tokens=NEW,
            eos_token_id=None,
        )
        for p in policies
    ]
    heard: list[str] = []
    began = time.perf_counter()
    together = generate_lockstep(
        target,
        [Contender(p, None if p == "ar" else _oracle(target)) for p in policies],
        PROMPTS,
        batch_size=2,
        max_new_tokens=NEW,
        eos_token_id=None,
        repeats=2,
        warmup=1,
        progress=heard.append,
    )
    elapsed = time.perf_counter() - began
    assert heard == [f"timed run {k} of 2 done by every policy" for k in (1, 2)]
    for a, t in zip(alone, together, strict=True):
        assert [r.output_ids for r in t.records] == [r.output_ids for r in a.records]
        assert [r.committed_per_step for r in t.records] == [
            r.committed_per_step for r in a.records
        ]
        assert t.repeats_agree and len(t.runs) == 2 and t.warmup == 1
    # the clocks partition the time: a clock that counted the others' steps too would give
    # each run about the whole elapsed time
    assert sum(run.wall_s for t in together for run in t.runs) <= elapsed


def test_contenders_are_checked(target) -> None:  # type: ignore[no-untyped-def]
    shared = _oracle(target)
    with pytest.raises(BastionError, match="share one drafter"):
        generate_lockstep(
            target, [Contender("chain", shared), Contender("fixed:8", shared)], PROMPTS
        )
    with pytest.raises(BastionError, match="no contenders"):
        generate_lockstep(target, [], PROMPTS)
    with pytest.raises(BastionError, match="Contender"):
        generate_lockstep(target, ["chain"], PROMPTS)  # type: ignore[list-item]
    with pytest.raises(BastionError, match="needs a drafter"):
        generate_lockstep(target, [Contender("chain")], PROMPTS)
    with pytest.raises(BastionError):
        generate_lockstep(target, [Contender("ar")], PROMPTS, repeats=0)


@pytest.mark.parametrize("junk", [None, "model", object()])
def test_a_target_that_is_not_a_model_is_refused(junk) -> None:  # type: ignore[no-untyped-def]
    """Found by the fuzzer: the device was read off the target before anything was checked."""
    with pytest.raises(BastionError, match="target must be an object with"):
        generate(junk, None, "ar", PROMPTS[0])
    with pytest.raises(BastionError, match="target must be an object with"):
        generate_batch(junk, None, "ar", PROMPTS)
    with pytest.raises(BastionError, match="target must be an object with"):
        generate_lockstep(junk, [Contender("ar")], PROMPTS)


def test_the_median_tpot_pools_the_requests_of_every_timed_run(target) -> None:  # type: ignore[no-untyped-def]
    """A stall of the machine lengthens one request of one run: the median over every run's
    requests moves by at most one rank, the runs' mean TPOTs by the stall."""
    import dataclasses

    report = generate_batch(
        target, None, "ar", PROMPTS, max_new_tokens=NEW, eos_token_id=None, repeats=3
    )
    tpots = [t for run in report.runs for t in run.request_tpots]
    assert len(tpots) == 3 * len(PROMPTS) and all(t > 0 for t in tpots)
    assert report.latency()["tpot_p50_s"] == pytest.approx(float(np.median(tpots)), rel=1e-12)
    stalled = list(report.runs)
    first = stalled[0]
    slow = (first.request_tpots[0] + 1.0, *first.request_tpots[1:])
    stalled[0] = dataclasses.replace(first, request_tpots=slow, tpot_s=float(np.mean(slow)))
    moved = dataclasses.replace(report, runs=stalled)
    ordered = sorted(tpots)
    assert ordered[len(ordered) // 2 - 1] <= moved.latency()["tpot_p50_s"] <= ordered[-1]
    assert moved.latency()["tpot_p50_s"] < 0.5  # a 1 s stall is not the median
