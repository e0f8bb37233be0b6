"""The timed fields of the record vocabulary, pinned to their definitions on both backends.

``bastion.records`` defines, for a request that arrives (or is submitted), receives its first
output token and its last: ``ttft_s`` = first token − arrival, ``e2e_s`` = finish − arrival,
``tpot_s`` = (finish − first token) / (output_len − 1), 0 for one token; a run's ``tpot_s`` is
the mean over requests (the real backend's report: the median over timed runs of that mean),
``ttft_mean_s`` / ``e2e_mean_s`` means, ``*_p50_s`` / ``*_p99_s`` numpy's linear percentiles,
TPOT's over the requests with output_len > 1 (the real backend's: pooled over every timed run).

Each test computes the expected numbers by hand from per-request timelines and compares the
fields to them, so a change of any definition fails here: dividing the decode time by all the
output tokens instead of the tokens after the first, a median where a mean is stated. The
simulator's timelines are read off a deterministic run (noise 0); the real backend's are made
exact by an injected clock that moves only when a prefill or a verification pass runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
import pytest

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.policies import make_policy
from bastion.sim.arrivals import Arrival
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.serving import serve
from bastion.sim.simulate import PolicyResult
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload


def _tpot(first: float, finish: float, output_len: int) -> float:
    """The definition, written out: the decode time over the tokens after the first."""
    return (finish - first) / (output_len - 1) if output_len > 1 else 0.0


def _p(values: Sequence[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50.0, 99.0])
    return float(p50), float(p99)


# --------------------------------------------------------------------------------------------
# The simulator
# --------------------------------------------------------------------------------------------

# output lengths 1 (no TPOT), 2, 7 and 13 tokens; two arrive together and queue behind the
# others (concurrency 2), one arrives later: TTFT, TPOT and end-to-end each spread unevenly,
# so every mean differs from its median
ARRIVALS = [
    Arrival(0.0, 64, 7),
    Arrival(0.0, 64, 1),
    Arrival(0.0, 96, 13),
    Arrival(0.002, 32, 2),
    Arrival(0.2, 64, 7),
]


@pytest.fixture(scope="module")
def served():  # type: ignore[no-untyped-def]
    m = get_model("qwen3-8b")
    gpu = SimulatedGPU(
        get_profile("h100-sxm"), m, DrafterSpec.dflash_for(m), GroundTruth(noise=0.0)
    )
    source = SyntheticSource(get_workload("math"))
    return serve(make_policy("fixed:8"), gpu, source, arrivals=ARRIVALS, concurrency=2)


def test_the_simulated_timelines_are_what_the_definitions_read(served) -> None:  # type: ignore[no-untyped-def]
    """Preconditions: every request ran to its output length and its times are ordered; a
    request of one token has no decode; the means differ from the medians (else a swap of
    the two would pass unseen)."""
    for q, a in zip(served.requests, ARRIVALS, strict=True):
        assert q.tokens == a.output_len and q.arrival_s == a.time_s
        assert q.arrival_s <= q.start_s <= q.end_s
    one = served.requests[1]
    assert one.tokens == 1 and one.end_s == one.start_s
    ttft = [q.start_s - q.arrival_s for q in served.requests]
    e2e = [q.end_s - q.arrival_s for q in served.requests]
    tpot = [_tpot(q.start_s, q.end_s, q.tokens) for q in served.requests if q.tokens > 1]
    for values in (ttft, e2e, tpot):
        assert abs(statistics.mean(values) - statistics.median(values)) > 1e-4


def test_the_simulator_request_fields_follow_their_definitions(served) -> None:  # type: ignore[no-untyped-def]
    """Each request's ttft_s, tpot_s and e2e_s (its stats and its requests.csv row) from its
    arrival, first-token and finish times."""
    for q in served.requests:
        want = {
            "ttft_s": q.start_s - q.arrival_s,
            "tpot_s": _tpot(q.start_s, q.end_s, q.tokens),
            "e2e_s": q.end_s - q.arrival_s,
        }
        row = q.latency().row()
        assert (row["arrival_s"], row["first_token_s"], row["finish_s"]) == (
            q.arrival_s,
            q.start_s,
            q.end_s,
        )
        assert row["output_len"] == q.tokens
        for name, value in want.items():
            assert getattr(q, name) == pytest.approx(value, rel=1e-12, abs=0.0), name
            assert row[name] == pytest.approx(value, rel=1e-12, abs=0.0), name


def test_the_simulator_run_fields_are_the_stated_means_and_medians(served) -> None:  # type: ignore[no-untyped-def]
    """A run's record: tpot_s, ttft_mean_s and e2e_mean_s are means over the requests (TPOT's
    with 0 for a one-token request), the p50 / p99 fields numpy's percentiles, TPOT's over the
    requests of more than one token."""
    qs = served.requests
    ttft = [q.start_s - q.arrival_s for q in qs]
    e2e = [q.end_s - q.arrival_s for q in qs]
    tpots = [_tpot(q.start_s, q.end_s, q.tokens) for q in qs]
    decoded = [t for t, q in zip(tpots, qs, strict=True) if q.tokens > 1]
    record = PolicyResult.of(served, ar_tpot_s=1.0, wall_s=0.0)
    want = {
        "tpot_s": statistics.mean(tpots),
        "ttft_mean_s": statistics.mean(ttft),
        "e2e_mean_s": statistics.mean(e2e),
    }
    for name, values in (("ttft", ttft), ("tpot", decoded), ("e2e", e2e)):
        want[f"{name}_p50_s"], want[f"{name}_p99_s"] = _p(values)
    assert want["ttft_p50_s"] == pytest.approx(statistics.median(ttft), rel=1e-12)
    assert served.tpot_s == pytest.approx(want["tpot_s"], rel=1e-12)
    for name, value in want.items():
        assert getattr(record, name) == pytest.approx(value, rel=1e-12, abs=0.0), name


# --------------------------------------------------------------------------------------------
# The real backend (torch), on a tiny random model with an injected clock
# --------------------------------------------------------------------------------------------

PREFILL_S = 0.5  # every prefill takes this long on the injected clock …
STEP_S = (0.25, 0.5, 2.0)  # … and every decode step this long, in timed run 1, 2, 3
NEW = 5  # output tokens per request: the prefill's and 4 AR steps'
PROMPTS = [[5, 6, 7], [1, 2, 3, 4], [9, 8]]


class _StageClock:
    """A clock that moves only where the test says: by PREFILL_S in a prefill, by the run's
    step time in a verification pass; reading it costs nothing."""

    def __init__(self) -> None:
        self.now = 0.0
        self.step_s = STEP_S[0]

    def __call__(self) -> float:
        return self.now


def _timelines(step_s: float) -> list[tuple[float, float, float]]:
    """(submitted, first token, finish) of the three requests of one run at batch size 2,
    from the run's start: requests 0 and 1 are prefilled one after the other, decode together
    (4 AR steps), then request 2 takes the freed slot."""
    p, d = PREFILL_S, (NEW - 1) * step_s
    return [(0.0, p, 2 * p + d), (0.0, 2 * p, 2 * p + d), (0.0, 3 * p + d, 3 * p + 2 * d)]


@pytest.fixture(scope="module")
def real_report():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bastion.backends.torch import TorchVerifier
    from bastion.backends.torch.runner import _finish, _session
    from tests.torch_models import tiny_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = tiny_target("qwen3")
        clock = _StageClock()
        verifier = TorchVerifier(target)
        prefill, verify_batch = verifier.prefill, verifier.verify_batch

        def timed_prefill(*args: object) -> object:
            out = prefill(*args)  # type: ignore[arg-type]
            clock.now += PREFILL_S
            return out

        def timed_verify(*args: object) -> object:
            out = verify_batch(*args)  # type: ignore[arg-type]
            clock.now += clock.step_s
            return out

        def next_run(done: int) -> None:
            clock.step_s = STEP_S[min(done, len(STEP_S) - 1)]

        verifier.prefill = timed_prefill  # type: ignore[method-assign]
        verifier.verify_batch = timed_verify  # type: ignore[method-assign]
        session = _session(
            target,
            None,
            "ar",
            PROMPTS,
            batch_size=2,
            max_new_tokens=NEW,
            sampling=None,
            seed=0,
            eos_token_id=None,
            cost_model=None,
            record_traces=None,
            trace_metadata=None,
            dense_trace=False,
            verifier=verifier,
            repeats=len(STEP_S),
            warmup=0,
            predict_cycles=None,
            policy_spec=None,
            clock=clock,
            on_run=next_run,
        )
        return _finish(session)
    finally:
        torch.set_num_threads(threads)


def test_the_real_request_fields_follow_their_definitions(real_report) -> None:  # type: ignore[no-untyped-def]
    """Each request's ttft_s (queue and prefill), tpot_s and e2e_s of the first timed run,
    from the clock's timeline."""
    assert [r.output_len for r in real_report.records] == [NEW] * len(PROMPTS)
    for r, (sent, first, finish) in zip(real_report.records, _timelines(STEP_S[0]), strict=True):
        assert r.ttft_s == pytest.approx(first - sent, rel=1e-12)
        assert r.tpot_s == pytest.approx(_tpot(first, finish, NEW), rel=1e-12)
        assert r.e2e_s == pytest.approx(finish - sent, rel=1e-12)
        assert r.to_dict()["tpot_s"] == r.tpot_s


def test_the_real_run_fields_are_the_stated_means_and_medians(real_report) -> None:  # type: ignore[no-untyped-def]
    """Per timed run, tpot_s is the mean of its requests' TPOT; the report's tpot_s is the
    median over the runs; ttft_mean_s and e2e_mean_s are means, their p50 / p99 percentiles
    over the first run's requests; TPOT's percentiles pool every run's requests."""
    per_run = [[_tpot(f, e, NEW) for _, f, e in _timelines(s)] for s in STEP_S]
    assert [list(run.request_tpots) for run in real_report.runs] == [
        pytest.approx(t, rel=1e-12) for t in per_run
    ]
    means = [statistics.mean(t) for t in per_run]
    assert [run.tpot_s for run in real_report.runs] == pytest.approx(means, rel=1e-12)
    assert statistics.median(means) != pytest.approx(statistics.mean(means))  # precondition
    d = real_report.to_dict()
    assert d["tpot_s"] == pytest.approx(statistics.median(means), rel=1e-12)
    assert d["repeats"]["tpot_s"] == pytest.approx(
        {"median": statistics.median(means), "min": min(means), "max": max(means)}, rel=1e-12
    )
    first = _timelines(STEP_S[0])
    ttft = [f - s for s, f, _ in first]
    e2e = [e - s for s, _, e in first]
    pooled = [t for run in per_run for t in run]
    want = {"ttft_mean_s": statistics.mean(ttft), "e2e_mean_s": statistics.mean(e2e)}
    for name, values in (("ttft", ttft), ("tpot", pooled), ("e2e", e2e)):
        want[f"{name}_p50_s"], want[f"{name}_p99_s"] = _p(values)
        assert statistics.median(values) != pytest.approx(statistics.mean(values))
    for name, value in want.items():
        assert d[name] == pytest.approx(value, rel=1e-12), name
