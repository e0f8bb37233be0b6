"""The simulator's side of ``bastion twin`` (bastion.sim.twin), without torch.

The requests are synthetic dense traces and the "machine" a measured truth made here, so the
replay's exactness and the comparison's verdicts are checked against numbers no shipped file
holds. The negative control is the issue's: a truth with the verify pass doubled must fail the
5 % speedup line and the 10 % TPOT line against the truth it was made from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import ArgumentError, ConfigError
from bastion.sim.gpu import GroundTruth
from bastion.sim.measured import MeasuredCosts
from bastion.sim.twin import compare, format_comparison, replay, summary
from bastion.trace import Trace
from bastion.tree import DraftMarginals
from tests.test_measured import make_samples

POLICIES = ("ar", "chain", "fixed:8", "fixed:32", "beam:2x8")
DEPTH, K, VOCAB = 15, 4, 50


def synthetic_trace(seed: int, prompt_len: int, out_len: int, hit: float) -> Trace:
    """A request whose drafter guesses the target's next token first with probability ``hit``
    (second otherwise, when it guesses it at all)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, prompt_len).tolist()
    out = rng.integers(0, VOCAB, out_len).tolist()
    seq = prompt + out
    dense = {}
    for root in range(prompt_len, len(seq)):
        ids = np.zeros((DEPTH, K), np.int64)
        for k in range(DEPTH):
            truth = seq[root + 1 + k] if root + 1 + k < len(seq) else 0
            others = [t for t in rng.permutation(VOCAB).tolist() if t != truth][:K]
            r = rng.random()
            if r < hit:
                row = [truth, *others[: K - 1]]
            elif r < 0.9:
                row = [others[0], truth, *others[1 : K - 1]]
            else:
                row = others
            ids[k] = row[:K]
        probs = np.tile(np.array([0.5, 0.2, 0.1, 0.05]) * 0.9 ** np.arange(DEPTH)[:, None], 1)
        dense[root] = DraftMarginals(ids, probs)
    return Trace(tuple(prompt), tuple(out), (), {"vocab_size": VOCAB}, dense)


@pytest.fixture(scope="module")
def setting() -> dict[str, object]:
    from bastion.sim.measured_fit import fit_measured

    model = get_model("qwen3-8b")
    measured = fit_measured(*make_samples())
    traces = [synthetic_trace(i, 40 + 7 * i, 30 + 5 * i, 0.7) for i in range(4)]
    return {
        "traces": traces,
        "hardware": get_profile("h100-sxm"),
        "model": model,
        "drafter": DrafterSpec.dflash_for(model),
        "measured": measured,
    }


def _replay(setting: dict[str, object], truth: GroundTruth, source: str, b: int = 1) -> list:
    return replay(
        setting["traces"],  # type: ignore[arg-type]
        POLICIES,
        batch_size=b,
        hardware=setting["hardware"],  # type: ignore[arg-type]
        model=setting["model"],  # type: ignore[arg-type]
        drafter=setting["drafter"],  # type: ignore[arg-type]
        truth=truth,
        source=source,
    )


def _doubled(m: MeasuredCosts) -> MeasuredCosts:
    verify = {
        kind: dataclasses.replace(
            term,
            pass_s=dataclasses.replace(
                term.pass_s, values=tuple(2 * v for v in term.pass_s.values)
            ),
            row_s=2 * term.row_s,
            attention_s=2 * term.attention_s,
            cache_s=2 * term.cache_s,
        )
        for kind, term in m.verify.items()
    }
    return dataclasses.replace(m, verify=verify)


@pytest.mark.parametrize("b", [1, 2])
def test_the_same_truth_passes_and_a_doubled_verify_pass_fails(
    setting: dict[str, object], b: int
) -> None:
    m = setting["measured"]
    assert isinstance(m, MeasuredCosts)
    real = _replay(setting, GroundTruth(name="m", noise=0.02, measured=m), "real", b)
    same = [
        dataclasses.replace(r, source="sim")
        for r in replay(
            setting["traces"],  # type: ignore[arg-type]
            POLICIES,
            batch_size=b,
            hardware=setting["hardware"],  # type: ignore[arg-type]
            model=setting["model"],  # type: ignore[arg-type]
            drafter=setting["drafter"],  # type: ignore[arg-type]
            truth=GroundTruth(name="m", noise=0.02, measured=m),
            seed=7,  # other noise draws: the same truth, measured again
        )
    ]
    doubled = _replay(
        setting, GroundTruth(name="d", noise=0.02, measured=_doubled(m)), "doubled", b
    )
    entries = compare(real + same + doubled)
    ok, bad = summary(entries, "sim"), summary(entries, "doubled")
    assert ok["speedup_error_max"] < 0.05 and ok["tpot_error_max"] < 0.10
    assert bad["speedup_error_max"] > 0.05 and bad["tpot_error_max"] > 0.10
    # τ and every step's commitment are the trace's, whatever the truth: exact
    for e in entries:
        assert e["tau_error"] == pytest.approx(0.0, abs=1e-12)
        assert e["committed_exact"], e["policy"]
    assert "chain" in format_comparison(entries)


def test_a_replayed_request_commits_what_its_trace_says(setting: dict[str, object]) -> None:
    rows = _replay(setting, GroundTruth(name="m", noise=0.0, measured=setting["measured"]), "sim")
    traces = setting["traces"]
    ar = next(r for r in rows if r.policy == "ar")
    assert ar.committed == tuple(tuple([1] * (len(t.output_ids) - 1)) for t in traces)  # type: ignore[attr-defined]
    for r in rows:
        assert [sum(c) for c in r.committed] == [len(t.output_ids) - 1 for t in traces]  # type: ignore[attr-defined]
    fixed = next(r for r in rows if r.policy == "fixed:32")
    assert fixed.tau > 1.5  # the drafter's first guesses are right 70 % of the time


def test_replay_refuses_what_it_cannot_replay(setting: dict[str, object]) -> None:
    truth = GroundTruth(name="m", measured=setting["measured"])
    kw = dict(
        batch_size=1,
        hardware=setting["hardware"],
        model=setting["model"],
        drafter=setting["drafter"],
        truth=truth,
    )
    with pytest.raises(ConfigError, match="at least one trace"):
        replay([], POLICIES, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one policy"):
        replay(setting["traces"], (), **kw)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="each a Trace"):
        replay(["nope"], POLICIES, **kw)  # type: ignore[arg-type, list-item]


def test_prompts_are_prefilled_alone_one_after_another_as_the_real_loop_does(
    setting: dict[str, object],
) -> None:
    from bastion.policies import make_policy
    from bastion.sim.arrivals import Arrival
    from bastion.sim.gpu import SimulatedGPU
    from bastion.sim.replay import TraceSource
    from bastion.sim.serving import serve

    m = setting["measured"]
    assert isinstance(m, MeasuredCosts)
    traces = setting["traces"]
    gpu = SimulatedGPU(
        setting["hardware"],  # type: ignore[arg-type]
        setting["model"],  # type: ignore[arg-type]
        setting["drafter"],  # type: ignore[arg-type]
        GroundTruth(name="m", noise=0.0, measured=m),
    )
    arrivals = [Arrival(0.0, len(t.prompt_ids), len(t.output_ids)) for t in traces]  # type: ignore[attr-defined]
    source = TraceSource([(t, str(i)) for i, t in enumerate(traces)])  # type: ignore[arg-type]
    run = serve(
        make_policy("fixed:8"),
        gpu,
        source,
        concurrency=2,
        arrivals=arrivals,
        prefill_chunk=1 << 30,
        prefill_alone=True,
    )
    ttft = {r.request_id: r.ttft_s for r in run.requests}
    p = [m.prefill_s([len(t.prompt_ids)], [0]) for t in traces]  # type: ignore[attr-defined]
    assert ttft[0] == pytest.approx(p[0])
    assert ttft[1] == pytest.approx(p[0] + p[1])  # the second waits for the first's prefill
    assert run.prefill_s == pytest.approx(sum(p))


def test_rankings_count_only_pairs_the_real_run_separates() -> None:
    from bastion.sim.twin import RANK_BAND, _ranking

    def entry(policy: str, real: float, sim: float) -> dict[str, object]:
        return {"policy": policy, "batch_size": 1, "tpot_p50_s_real": real, "tpot_p50_s": sim}

    apart = 1.0 + 2 * RANK_BAND
    close = 1.0 + RANK_BAND / 2
    # a pair the real run separates, ranked the other way by the simulator: a flip
    assert _ranking([entry("a", 1.0, 1.0), entry("b", apart, 0.9)]) == {
        "ranked_pairs": 1.0,
        "ranking_flips": 1.0,
    }
    # … the same order: no flip; a pair within the noise band: not ranked at all
    assert _ranking([entry("a", 1.0, 1.0), entry("b", apart, 1.2)])["ranking_flips"] == 0.0
    assert _ranking([entry("a", 1.0, 1.0), entry("b", close, 0.9)])["ranked_pairs"] == 0.0


def test_each_replayed_run_runs_at_its_measured_speed(setting: dict[str, object]) -> None:
    m = setting["measured"]
    assert isinstance(m, MeasuredCosts)
    truth = GroundTruth(name="m", noise=0.0, measured=m)
    kw = dict(
        batch_size=1,
        hardware=setting["hardware"],
        model=setting["model"],
        drafter=setting["drafter"],
        truth=truth,
        repeats=2,
    )
    even = replay(setting["traces"], ("fixed:8",), speeds=[1.0, 1.0], **kw)[0]  # type: ignore[arg-type]
    slow = replay(setting["traces"], ("fixed:8",), speeds=[1.0, 1.5], **kw)[0]  # type: ignore[arg-type]
    assert slow.request_tpots[0] == pytest.approx(even.request_tpots[0])
    assert np.array(slow.request_tpots[1]) == pytest.approx(1.5 * np.array(even.request_tpots[1]))
    with pytest.raises(ConfigError, match="one per run"):
        replay(setting["traces"], ("fixed:8",), speeds=[1.0], **kw)  # type: ignore[arg-type]


def test_a_replayed_step_runs_at_the_machines_speed_when_its_real_step_ran(
    setting: dict[str, object],
) -> None:
    """Per-step speeds: the k-th decode step (and the prefills just before it) at speeds[k]."""
    m = setting["measured"]
    assert isinstance(m, MeasuredCosts)
    kw = dict(
        batch_size=1,
        hardware=setting["hardware"],
        model=setting["model"],
        drafter=setting["drafter"],
        truth=GroundTruth(name="m", noise=0.0, measured=m),
    )
    traces = setting["traces"]
    even = replay(traces, ("fixed:8",), **kw)[0]  # type: ignore[arg-type]
    first = len(even.committed[0])  # the first request's decode steps (B = 1: one at a time)
    # a constant pace is the whole-run factor
    same = replay(traces, ("fixed:8",), speeds=[(1.5,) * 3], **kw)[0]  # type: ignore[arg-type]
    whole = replay(traces, ("fixed:8",), speeds=[1.5], **kw)[0]  # type: ignore[arg-type]
    assert same.request_tpots[0] == pytest.approx(whole.request_tpots[0])
    # fast through the first request, twice as slow after: only the later requests pay
    pace = (1.0,) * first + (2.0,)
    paced = replay(traces, ("fixed:8", "ar"), speeds={"fixed:8": [pace], "ar": [1.0]}, **kw)
    tpots = np.array(paced[0].request_tpots[0])
    assert tpots[0] == pytest.approx(even.request_tpots[0][0])
    assert tpots[1:] == pytest.approx(2.0 * np.array(even.request_tpots[0][1:]))
    # the second request's prefill ran in the slow part too
    ttft = paced[0].ttft_mean_s * len(traces)  # type: ignore[arg-type]
    assert ttft > even.ttft_mean_s * len(traces)  # type: ignore[arg-type]
    for bad, message in [
        ({"ar": [1.0]}, "no entry for policy 'fixed:8'"),
        ([()], "a run's speed must be"),
        ([(1.0, 0.0)], "a run's speed must be"),
    ]:
        with pytest.raises(ConfigError, match=message):
            replay(traces, ("fixed:8",), speeds=bad, **kw)  # type: ignore[arg-type]
    for bad in ([float("inf")], "fast"):  # refused at the door (the guard)
        with pytest.raises(ArgumentError, match="speeds must be"):
            replay(traces, ("fixed:8",), speeds=bad, **kw)  # type: ignore[arg-type]


def test_plot_twin_refuses_no_rows(tmp_path: Path) -> None:
    """An empty comparison is a project error, not matplotlib's ValueError (the fuzz test found
    it)."""
    from bastion.sim.twin import plot_twin

    with pytest.raises(ConfigError, match="no rows"):
        plot_twin([], tmp_path / "twin.png")


@pytest.mark.parametrize("policy", ["chain", "fixed:8"])
def test_the_drafter_takes_the_prompt_then_every_steps_tokens(
    setting: dict[str, object], policy: str
) -> None:
    """Under a measured truth the replay charges the drafter's intake as the real loop feeds
    it: the prompt's features at a request's first draft, then the tokens each step committed,
    at the next draft (a drafter costing only its intake: 1 ms per feature)."""
    from bastion.sim.measured import Curve, DraftTerm

    m = setting["measured"]
    assert isinstance(m, MeasuredCosts)
    intake = DraftTerm(Curve((1.0,), (0.0,)), 0.0, 3, append_s=1e-3, appended=50.0)
    fed = dataclasses.replace(m, draft={"argmax": intake, "topk": intake})
    trace = setting["traces"][1]
    assert isinstance(trace, Trace)
    row = replay(
        [trace],
        (policy,),
        batch_size=1,
        hardware=setting["hardware"],  # type: ignore[arg-type]
        model=setting["model"],  # type: ignore[arg-type]
        drafter=setting["drafter"],  # type: ignore[arg-type]
        truth=GroundTruth(name="fed", noise=0.0, measured=fed),
    )[0]
    committed = row.committed[0]
    want = 1e-3 * (len(trace.prompt_ids) + sum(committed[:-1]))
    assert row.draft_s * row.steps == pytest.approx(want)
