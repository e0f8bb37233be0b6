"""Serving: closed and open loop, chunked prefill, per-request latency, the CLI's new inputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import ConfigError
from bastion.policies import make_policy
from bastion.sim.arrivals import Arrival
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.serving import serve
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload


def gpu() -> SimulatedGPU:
    m = get_model("qwen3-8b")
    return SimulatedGPU(get_profile("h100-sxm"), m, DrafterSpec.dflash_for(m), GroundTruth(noise=0))


def source() -> SyntheticSource:
    return SyntheticSource(get_workload("math").with_(output_len_sigma=0.0, prompt_len_sigma=0.0))


def test_an_idle_server_prefills_a_prompt_in_chunks() -> None:
    """TTFT of a lone request = its prompt's prefill passes, chunk by chunk, nothing else."""
    g = gpu()
    arrivals = [Arrival(0.5, 1300, 20)]
    r = serve(make_policy("chain"), g, source(), arrivals=arrivals, prefill_chunk=512)
    q = r.requests[0]
    expected = sum(g.prefill_truth([n], [c]) for n, c in ((512, 0), (512, 512), (276, 1024)))
    assert q.arrival_s == 0.5
    assert q.ttft_s == pytest.approx(expected, rel=1e-12)
    assert q.tokens == 20 and q.e2e_s == pytest.approx(q.ttft_s + (q.end_s - q.start_s))
    no_prefill = serve(make_policy("chain"), gpu(), source(), arrivals=arrivals, prefill_chunk=0)
    assert no_prefill.requests[0].ttft_s == 0.0


def test_open_loop_requests_start_no_earlier_than_they_arrive() -> None:
    arrivals = [Arrival(t, 64, 32) for t in (0.0, 0.0, 0.01, 2.0, 2.0005)]
    r = serve(make_policy("fixed:16"), gpu(), source(), arrivals=arrivals, concurrency=2)
    assert [q.arrival_s for q in r.requests] == [a.time_s for a in arrivals]
    for q in r.requests:
        assert q.arrival_s <= q.start_s <= q.end_s and q.tokens == 32
    assert max(r.batch_sizes) <= 2
    assert r.elapsed_s > 2.0  # the server idled until the late arrivals


def test_queueing_raises_time_to_first_token() -> None:
    """Negative control for TTFT: the same requests arriving 50× faster than they can be
    served queue up, and their p99 TTFT grows by orders of magnitude."""
    calm = [Arrival(i * 1.0, 128, 64) for i in range(12)]
    rush = [Arrival(i * 0.02, 128, 64) for i in range(12)]
    ttft = {}
    for name, arr in (("calm", calm), ("rush", rush)):
        r = serve(make_policy("chain"), gpu(), source(), arrivals=arr, concurrency=1)
        ttft[name] = np.percentile([q.ttft_s for q in r.requests], 99)
    assert ttft["rush"] > 10 * ttft["calm"]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_requests_stop_at_their_output_length(concurrency: int) -> None:
    """Nothing past a request's output length is committed or counted: every step's count is
    what the request received, so the counts sum to its tokens after the first, τ is their mean
    and the accepted draft tokens never exceed them. With 6-token outputs a 64-node tree on the
    math workload often accepts more than the 5 tokens still wanted (negative control below)."""
    arrivals = [Arrival(0.0, 64, 6) for _ in range(6)]
    r = serve(make_policy("fixed:64"), gpu(), source(), arrivals=arrivals, concurrency=concurrency)
    for q in r.requests:
        assert q.tokens == 6
        assert sum(q.committed) == q.tokens - 1
        assert q.latency().committed_tokens == q.tokens - 1
        assert q.tau == pytest.approx(np.mean(q.committed))
        assert all(0 <= a <= c for a, c in zip(q.accepted, q.committed, strict=True))
    assert r.tau <= 5.0
    assert r.throughput == pytest.approx(6 * 6 / r.elapsed_s)
    # the control: the same requests with long outputs do commit more than 5 tokens in a step
    long = serve(make_policy("fixed:64"), gpu(), source(), arrivals=[Arrival(0.0, 64, 200)] * 6)
    assert max(c for q in long.requests for c in q.committed) > 5


def test_closed_loop_arrival_is_admission() -> None:
    r = serve(make_policy("ar"), gpu(), source(), n_requests=4, concurrency=2)
    starts = sorted(q.arrival_s for q in r.requests)
    assert starts[:2] == [0.0, 0.0] and starts[2] > 0.0  # the third waits for a finished one
    assert all(q.ttft_s > 0 for q in r.requests)  # prefill is simulated by default


def test_bad_serving_input() -> None:
    with pytest.raises(ConfigError, match="prefill_chunk"):
        serve(make_policy("ar"), gpu(), source(), n_requests=1, prefill_chunk=-1)
    with pytest.raises(ConfigError, match="n_requests"):
        serve(make_policy("ar"), gpu(), source())
    with pytest.raises(ConfigError, match="arrivals"):
        serve(make_policy("ar"), gpu(), source(), n_requests=3, arrivals=[Arrival(0, 8, 8)])


def test_cli_open_loop_writes_requests_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("arrival_s,prompt_len,output_len\n0.0 100 16\n0.01 300 24\n0.02 50 8\n")
    out = tmp_path / "out"
    code = main(
        ["simulate", "--arrivals", str(arrivals), "--policy", "chain", "--out", str(out), "--json"]
    )
    assert code == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert [r["policy"] for r in records] == ["ar", "chain"]
    with open(out / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    assert {r["policy"] for r in rows} == {"ar", "chain"}
    assert sorted(int(r["output_len"]) for r in rows if r["policy"] == "chain") == [8, 16, 24]
    assert all(float(r["ttft_s"]) > 0 for r in rows)


def test_cli_poisson_arrivals_are_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--arrival-rate", "20", "--requests", "6", "--policy", "chain", "--json"]
    runs = []
    for _ in range(2):
        assert main([*args, "--output-len", "16"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["records"])
    strip = [[{k: v for k, v in r.items() if k != "wall_s"} for r in run] for run in runs]
    assert strip[0] == strip[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arrival-rate", "-1"], "arrival_rate"),
        (["--arrival-rate", "nan"], "arrival_rate"),
        (["--arrivals", "/nonexistent/arrivals.txt"], "arrivals.txt"),
        (["--arrival-rate", "5", "--arrivals", "x.txt"], "not both"),
        (["--prefill-chunk", "-5"], "prefill_chunk"),
    ],
)
def test_cli_bad_open_loop_input(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *args]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_refuses_an_unwritable_out_before_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["simulate", "--out", str(blocker / "sub")]) != 0
    assert "not a directory" in capsys.readouterr().err


def test_results_get_the_users_umask(tmp_path: Path) -> None:
    """Atomic writes keep the user's umask (mkstemp alone leaves files owner-only)."""
    import os

    from bastion.sim.results import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644


def test_output_len_override_may_exceed_the_presets_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--output-len fixes every request's length, even past the preset's distribution cap."""
    args = ["simulate", "--output-len", "9000", "--requests", "1", "--policy", "chain", "--json"]
    assert main(args) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert records[0]["simulated_s"] > 9000 * 0.005  # 9000 AR steps of several ms each


class _Recording:
    """A batch policy with a cost model that builds fixed trees and records what the server
    told it of each request's last step."""

    uses_cost_model = True

    def __init__(self, reads_expected: bool | None) -> None:
        if reads_expected is not None:
            self.uses_previous_expected = reads_expected
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    @property
    def name(self) -> str:
        return "recording"

    def choose(self, marginals, context):  # type: ignore[no-untyped-def]
        raise AssertionError("the server calls choose_batch")

    def choose_batch(self, marginals, context):  # type: ignore[no-untyped-def]
        from bastion.interfaces import BatchChoice
        from bastion.policies import best_first_batch

        req = context.requests
        self.seen.append((req.previous_tree_sizes.copy(), req.previous_expected.copy()))
        return BatchChoice(best_first_batch(marginals, 8))


@pytest.mark.parametrize("reads_expected", [None, True, False])
def test_the_server_tracks_last_steps_expected_tokens_for_a_policy_that_reads_them(
    reads_expected: bool | None,
) -> None:
    """The last step's Â per request reaches every cost-model policy but one that declares
    ``uses_previous_expected = False``; its last tree sizes reach all of them."""
    policy = _Recording(reads_expected)
    serve(policy, gpu(), source(), n_requests=3, concurrency=2, max_steps=12)
    sizes = np.concatenate([s for s, _ in policy.seen[1:]])
    expected = np.concatenate([e for _, e in policy.seen[1:]])
    assert policy.seen and (sizes == 8).all()
    if reads_expected is False:
        assert not expected.any()
    else:
        assert (expected > 1.0).all()
