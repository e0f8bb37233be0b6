"""Whole simulations: the main job, the CLI, trace replay, experiments and their executors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.errors import BastionError, ConfigError
from bastion.sim import experiments
from bastion.sim.backend import accepted_path
from bastion.sim.results import RunStore
from bastion.sim.simulate import SimSpec, simulate
from bastion.trace import Trace, TraceStep, write_trace
from bastion.tree import DraftMarginals, best_first_tree

QUICK = {"requests": 3, "output_len": 96}


def test_simulation_is_reproducible_and_sensible() -> None:
    spec = SimSpec(policies=("chain", "fixed:64", "bastion"), **QUICK)
    a, b = simulate(spec), simulate(spec)
    assert [r.tpot_s for r in a.rows] == [r.tpot_s for r in b.rows]
    by = {r.policy: r for r in a.rows}
    assert by["ar"].speedup == 1.0 and by["ar"].tau == 1.0
    assert by["chain"].speedup > 2.0
    assert by["fixed:64"].tau > by["chain"].tau  # a tree accepts more than the chain
    assert a.calibration_rmse_calibrated_s < 0.5 * a.calibration_rmse_bare_s


@pytest.mark.parametrize(("policy", "ratio"), [("bastion:paper", 0.5), ("bastion", 0.6)])
def test_adaptive_shrinks_trees_under_batching(policy: str, ratio: float) -> None:
    """The controller sees the batch's rising marginal cost (Table 2's lesson). The paper's
    controller halves its trees; the learning one, which follows the measured cycle, shrinks
    them less (0.507× when this test was written; the best fixed size goes 48–64 → 32)."""
    one = simulate(SimSpec(policies=(policy,), concurrency=1, requests=8, output_len=96))
    many = simulate(SimSpec(policies=(policy,), concurrency=16, requests=16, output_len=96))
    assert many.row(policy).mean_tree_size < ratio * one.row(policy).mean_tree_size


def test_cli_simulate_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "simulate",
            "--policy",
            "chain,fixed:16",
            "--requests",
            "2",
            "--output-len",
            "64",
            "--json",
        ]
    )
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["records"]
    assert [r["policy"] for r in rows] == ["ar", "chain", "fixed:16"]
    latency = {f"{q}_{p}_s" for q in ("ttft", "tpot", "e2e") for p in ("p50", "p99")}
    for r in rows:
        assert {"policy", "speedup", "tau", "mean_tree_size", "tpot_s"} <= set(r)
        assert {"simulated_s", "wall_s", *latency} <= set(r)
        assert r["simulated_s"] > 0 and r["wall_s"] > 0
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] and 0 < r["tpot_p50_s"] <= r["tpot_p99_s"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "tpu-v9"], "h100-sxm"),
        (["--model", "gpt-7"], "qwen3-8b"),
        (["--workload", "poetry"], "math"),
        (["--policy", "medusa"], "fixed:N"),
        (["--concurrency", "0"], "concurrency"),
    ],
)
def test_cli_simulate_bad_input(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--requests", "1", "--output-len", "8", *args]) == 2
    err = capsys.readouterr().err
    assert "error" in err and message in err and "Traceback" not in err


# --- trace replay -------------------------------------------------------------------------------


def make_trace(path: Path, dense: bool, n_out: int = 40, seed: int = 0) -> Trace:
    """A synthetic T = 0 trace: a target sequence and drafter rows around it."""
    rng = np.random.default_rng(seed)
    prompt = [1, 2, 3]
    out = rng.integers(10, 60, size=n_out).tolist()
    seq = prompt + out
    depth, k = 6, 3
    steps = []
    pos = len(prompt)
    positions = range(len(prompt), len(seq)) if dense else None
    while pos < len(seq):
        ids = np.zeros((depth, k), dtype=np.int64)
        for d in range(depth):
            idx = pos + 1 + d
            true = seq[idx] if idx < len(seq) else 99
            others = [t for t in rng.permutation(np.arange(100, 200))[:k]]
            row = others[: k - 1]
            row.insert(int(rng.integers(0, k)) if rng.random() < 0.8 else k - 1, true)
            ids[d] = row[:k] if true in row[:k] else [*row[: k - 1], 199]
        probs = np.tile([0.6, 0.25, 0.1], (depth, 1))
        steps.append(TraceStep(pos, DraftMarginals(ids, probs), 8, 1))
        if dense:
            pos += 1
        else:
            tree = best_first_tree(steps[-1].marginals, 8)
            target = np.array(
                [seq[pos + 1 + d] if pos + 1 + d < len(seq) else -1 for d in range(depth)]
            )
            pos += len(accepted_path(tree, target))
    trace = Trace(tuple(prompt), tuple(out), tuple(steps), {"policy": "fixed:8", "vocab_size": 200})
    write_trace(path, trace)
    del positions
    return trace


def test_replay_of_the_recorded_policy_is_exact(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "t.json", dense=False)
    spec = SimSpec(workload=str(tmp_path / "t.json"), policies=("fixed:8",), requests=1)
    result = simulate(spec)
    row = result.row("fixed:8")
    assert row.steps == len(trace.steps)


def test_dense_trace_replays_any_policy(tmp_path: Path) -> None:
    make_trace(tmp_path / "d.json", dense=True)
    spec = SimSpec(workload=str(tmp_path), policies=("chain", "fixed:4", "bastion"), requests=2)
    result = simulate(spec)
    assert all(r.tau >= 1.0 for r in result.rows)


def test_sparse_trace_refuses_other_policies(tmp_path: Path) -> None:
    make_trace(tmp_path / "t.json", dense=False)
    spec = SimSpec(workload=str(tmp_path / "t.json"), policies=("fixed:64",), requests=1)
    with pytest.raises(ConfigError, match="no drafter marginals at position"):
        simulate(spec)


def _trace(output: str, steps: str, meta: str = "{}") -> str:
    head = '{"format": "bastion-trace", "version": 1, "prompt_ids": [1], '
    return head + f'"output_ids": {output}, "metadata": {meta}, "steps": {steps}}}'


def _step(position: int, ids: str, probs: str) -> str:
    return (
        f'[{{"position": {position}, "token_ids": {ids}, "probs": {probs}, '
        '"tree_size": 1, "committed": 1}]'
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "cannot read"),
        (_trace("[2]", _step(1, "[[1, 2]]", "[[0.5]]")), "shape"),
        (_trace("[2, 3]", "[]"), "no recorded steps"),
        (_trace("[2, 3]", _step(1, "[[1, 7]]", "[[0.5, 0.1]]"), '{"vocab_size": 3}'), "vocabulary"),
        (_trace("[2, 3]", _step(9, "[[1, 7]]", "[[0.5, 0.1]]")), "outside the output"),
        (_trace("[2, 3]", _step(1, "[[1, 7]]", "[[0.5, 0.1]]"))[:-5], "cannot read"),
    ],
)
def test_bad_traces_are_named(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(BastionError, match=message):
        simulate(SimSpec(workload=str(tmp_path / "bad.json"), policies=("chain",), requests=1))


# --- experiments ----------------------------------------------------------------------------------


def tiny_runs(quick: bool) -> list[dict]:  # type: ignore[type-arg]
    return [
        experiments.make_run(policies=["chain"], requests=1, output_len=24, seed=s)
        for s in range(3)
    ]


def simulated(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """Rows without their wall time (the only field that differs between identical runs)."""
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_executors_give_identical_rows(tmp_path: Path) -> None:
    runs = tiny_runs(True)
    serial = experiments.run_all(runs, RunStore(tmp_path / "a"), "serial")
    pool = experiments.run_all(runs, RunStore(tmp_path / "b"), "process", workers=2)
    assert simulated(serial) == simulated(pool)


def test_interrupted_experiment_resumes_without_recomputing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tiny_runs(True)
    store = RunStore(tmp_path)
    calls: list[int] = []
    real = experiments.execute

    def flaky(run: dict) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
        calls.append(run["spec"]["seed"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # the second run is interrupted
        return real(run)

    monkeypatch.setattr(experiments.worker, "execute", flaky)  # where the executors look it up
    with pytest.raises(KeyboardInterrupt):
        experiments.run_all(runs, store, "serial")
    assert len(list(tmp_path.glob("*.json"))) == 1  # the finished run; nothing half-written
    assert not list(tmp_path.glob(".*"))
    calls.clear()
    monkeypatch.setattr(experiments.worker, "execute", real)
    rows = experiments.run_all(runs, store, "serial")
    assert len(rows) == 3 * 2  # AR + chain per run
    reference = experiments.run_all(runs, RunStore(tmp_path / "fresh"), "serial")
    assert simulated(rows) == simulated(reference)


@pytest.mark.slow  # (CI=true or -m slow: the default run stays within 5 minutes)
def test_ray_executor_matches_serial(tmp_path: Path, local_ray: None) -> None:
    pytest.importorskip("ray")
    runs = tiny_runs(True)[:2]
    serial = experiments.run_all(runs, RunStore(tmp_path / "s"), "serial")
    ray_rows = experiments.run_all(runs, RunStore(tmp_path / "r"), "ray", workers=2)
    assert simulated(ray_rows) == simulated(serial)


@pytest.mark.parametrize(
    ("run", "named"),
    [
        ({"spec": None}, "spec"),  # the three runs the fuzzer found crashing (CI, stop 48)
        ({"spec": "0"}, "spec"),
        ({"spec": ""}, "spec"),
        ({"spec": {"policies": "chain"}}, "policies"),
        ({"spec": {"policies": None}}, "policies"),
        ({"spec": {}, "remap": ["a.py"]}, "remap"),
        ({"spec": {}, "remap": {"a.py": 3}}, "remap"),
        ({"spec": {}, "python_path": "src"}, "python_path"),
        ({"spec": {}, "python_path": [None]}, "python_path"),
    ],
)
def test_a_malformed_run_is_refused_by_name(run: dict[str, object], named: str) -> None:
    with pytest.raises(BastionError, match=named):
        experiments.worker.execute(run)


def test_a_run_without_policies_simulates_the_default_ones() -> None:
    rows, _ = experiments.worker.execute({"spec": {"requests": 1, "output_len": 16}})
    assert [r["policy"] for r in rows] == ["ar", "chain", "fixed:64", "bastion"]


def test_cli_experiment_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "fig-99", "--out", "/tmp/none"]) == 2
    assert "budget-sweep" in capsys.readouterr().err


def test_simulate_main_job_runs_from_a_shell() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bastion", "simulate", "--requests", "2", "--output-len", "48"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "bastion" in out.stdout and "speedup" in out.stdout
