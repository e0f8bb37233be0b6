"""`bastion experiment --config`: config validation, grids with plug-in policies, records a
team can share, caches that cannot go stale, and crash consistency (kill -9, truncated runs)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bastion.cli import main
from bastion.errors import ConfigError
from bastion.sim import experiments
from bastion.sim.results import METRIC_COLUMNS, RECORD_COLUMNS, SPEC_COLUMNS, RunStore
from bastion.sim.simulate import PolicyResult

PLUGIN = '''
import numpy as np

from bastion.interfaces import TreeChoice
from bastion.tree import best_first_tree


class Confident:
    """Best-first through nodes with path probability >= floor (a researcher's policy)."""

    def __init__(self, floor=0.05, n_max=32):
        self.floor, self.n_max = floor, n_max
        self.name = f"confident:{floor}"

    def choose(self, marginals, context):
        tree = best_first_tree(marginals, self.n_max)
        keep = int(np.sum(tree.scores >= self.floor))
        return TreeChoice(tree.prefix(max(keep, 1)))
'''


def write_config(tmp: Path, body: str, name: str = "exp.toml") -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "mypolicies_cfg.py").write_text(PLUGIN)
    return d


def tiny(tmp: Path, extra: str = "", grid: str = "") -> Path:
    return write_config(
        tmp,
        f"""
        name = "tiny"
        python_path = ["plugins"]
        {extra}
        [grid]
        policies = ["chain", "mypolicies_cfg:Confident:0.1", "plugins/mypolicies_cfg.py:Confident"]
        seed = [0, 1]
        concurrency = [1, 2]
        requests = 2
        output_len = 24
        {grid}
        """,
    )


def test_record_columns_are_the_policy_result_fields() -> None:
    assert tuple(f for f in PolicyResult.__dataclass_fields__) == METRIC_COLUMNS
    assert RECORD_COLUMNS[1 : 1 + len(SPEC_COLUMNS)] == SPEC_COLUMNS
    assert len(set(RECORD_COLUMNS)) == len(RECORD_COLUMNS)


def test_config_grid_with_plugins_writes_shareable_records(
    tmp_path: Path, plugin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny(tmp_path)
    assert (
        main(["experiment", "--config", str(config), "--out", str(tmp_path / "o"), "--dry-run"])
        == 0
    )
    assert "tiny: 4 runs (2 seed × 2 concurrency), 16 policy simulations" in capsys.readouterr().out
    code = main(
        ["experiment", "--config", str(config), "--out", str(tmp_path / "o"), "--workers", "2"]
    )
    assert code == 0
    target = tmp_path / "o" / "tiny"
    with (target / "results.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = reader.fieldnames
    assert header is not None and tuple(header) == RECORD_COLUMNS  # the documented order
    assert len(rows) == 4 * 4  # 4 runs × (AR + 3 policies)
    labels = {r["policy"] for r in rows}
    assert {"ar", "chain", "confident:0.1", "confident:0.05"} == labels
    assert {(r["seed"], r["concurrency"]) for r in rows} == {
        (s, c) for s in ("0", "1") for c in ("1", "2")
    }
    for r in rows:
        assert r["experiment"] == "tiny" and r["bastion_version"] and len(r["run_key"]) == 16
        assert r["model"] == "qwen3-8b" and r["truth"] == "hf-eager" and r["requests"] == "2"
    chain = next(r for r in rows if r["policy"] == "chain")
    per_position = json.loads(chain["acceptance_by_position"])
    assert 0 < float(chain["acceptance_rate"]) <= 1
    assert per_position == sorted(per_position, reverse=True) and 0 < per_position[0] <= 1
    data = json.loads((target / "results.json").read_text())
    assert set(data) == {"experiment", "config", "records"} and len(data["records"]) == 16
    with (target / "requests.csv").open() as f:
        requests = list(csv.DictReader(f))
    assert len(requests) == 4 * 4 * 2  # runs × policies × requests
    assert {"policy", "seed", "ttft_s", "tpot_s", "tau", "run_key"} <= set(requests[0])
    assert "Fixed:" in (target / "summary.md").read_text()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[grid]\nmodels = ['qwen3-8b']\n", "exp.toml: grid.models: unknown key; accepted: model"),
        ("nmae = 'x'\n[grid]\n", "exp.toml: nmae: unknown key; accepted: name, description"),
        ("[grid]\nconcurrency = 'x'\n", "grid.concurrency: expected an integer ≥ 1"),
        ("[grid]\nconcurrency = [1, 0]\n", "grid.concurrency: expected an integer ≥ 1"),
        ("[grid]\nseed = true\n", "grid.seed: expected an integer ≥ 0"),
        ("[grid]\narrival_rate = -1.0\n", "grid.arrival_rate: expected a number > 0"),
        ("[grid]\ncost_mode = 'magic'\n", "grid.cost_mode: expected one of bare, static"),
        ("[grid]\ngpu = 'tpu-v9'\n", "exp.toml: grid.gpu: "),
        ("[grid]\nmodel = 'gpt-7'\n", "exp.toml: grid.model: "),
        ("[grid]\nworkload = 'poetry'\n", "exp.toml: grid.workload: "),
        ("[grid]\ntruth = 'nope'\n", "exp.toml: grid.truth: "),
        ("[grid]\npolicies = ['medusa']\n", "grid point"),
        ("[grid]\npolicies = []\n", "grid.policies: expected a list of policy specs"),
        ("[grid]\nrequests = []\n", "grid.requests: an empty list gives no runs"),
        ("report = 'fig-9'\n[grid]\n", "report: unknown report 'fig-9'; known: generic"),
        ("name = 'a/b'\n[grid]\n", "exp.toml: name: expected a non-empty name"),
        ("python_path = ['nowhere']\n[grid]\n", "python_path: "),
        ("[quick]\nseed = 1\n", "exp.toml: grid: missing"),
        ("[grid]\n[quick]\nfoo = 1\n", "exp.toml: quick.foo: unknown key"),
        ("[grid\n", "exp.toml is not valid TOML"),
    ],
)
def test_bad_configs_name_file_and_key(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        experiments.load_config(write_config(tmp_path, body))
    assert message in str(info.value)


def test_cli_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "[grid]\nseeds = [1]\n")
    assert main(["experiment", "--config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "grid.seeds: unknown key" in err and "Traceback" not in err
    assert main(["experiment"]) == 2
    assert "--config FILE.toml" in capsys.readouterr().err


def test_shipped_configs_reproduce_the_builtin_grids() -> None:
    sizes = {n: len(experiments.resolve_config(n).runs()) for n in experiments.known_experiments()}
    assert sizes == {
        "best-first-vs-beam": 6,
        "budget-sweep": 36,
        "controller-heldout": 108,
        "controller-regret": 216,
        "latency-model": 24,
        "moe": 1,
        "multi-batch": 12,
        "serving-scale": 18,
    }
    multi = experiments.resolve_config("multi-batch").runs(quick=True)
    assert [(r["spec"]["concurrency"], r["spec"]["requests"]) for r in multi] == [
        (1, 4),
        (8, 16),
        (32, 64),
    ]


def profile_config(tmp_path: Path, peak: float) -> Path:
    from bastion.cost.hardware import get_profile, profile_to_toml

    base = get_profile("h100-sxm")
    text = profile_to_toml(base).replace(
        f"memory_bandwidth = {base.memory_bandwidth!r}", f"memory_bandwidth = {peak!r}", 1
    )
    assert f"memory_bandwidth = {peak!r}" in text
    (tmp_path / "mygpu.toml").write_text(text)
    return write_config(
        tmp_path,
        """
        name = "stale"
        [grid]
        gpu = "mygpu.toml"
        policies = ["chain"]
        seed = [0, 1]
        requests = 1
        output_len = 16
        """,
    )


def test_changed_profile_contents_are_recomputed_never_served_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bastion.cost.hardware import get_profile

    bw = get_profile("h100-sxm").memory_bandwidth
    config = profile_config(tmp_path, bw)
    out = tmp_path / "o"
    first = experiments.run_all(
        experiments.load_config(config).runs(), RunStore(out / "a"), "serial"
    )
    capsys.readouterr()
    again = experiments.run_all(
        experiments.load_config(config).runs(), RunStore(out / "a"), "serial"
    )
    assert "reusing 2 stored run(s) of 2" in capsys.readouterr().err
    assert [r["tpot_s"] for r in again] == [r["tpot_s"] for r in first]
    profile_config(tmp_path, bw / 2)  # same file name, half the memory bandwidth
    changed = experiments.run_all(
        experiments.load_config(config).runs(), RunStore(out / "a"), "serial"
    )
    assert "reusing" not in capsys.readouterr().err
    assert changed[0]["gpu"] == first[0]["gpu"]  # the same name …
    assert changed[0]["run_key"] != first[0]["run_key"]  # … another key
    assert changed[0]["tpot_s"] > first[0]["tpot_s"]  # and a slower GPU's numbers


@pytest.mark.parametrize("content", ["", '{"rows": [', "[1, 2]", '{"rows": []}'])
def test_truncated_run_file_is_set_aside_and_recomputed(tmp_path: Path, content: str) -> None:
    runs = [
        experiments.make_run(policies=["chain"], requests=1, output_len=16, seed=s)
        for s in range(2)
    ]
    store = RunStore(tmp_path)
    reference = experiments.run_all(runs, store, "serial")
    store.path(runs[1]).write_text(content)  # a crash mid-write, or a disk filling up
    store = RunStore(tmp_path)
    rows = experiments.run_all(runs, store, "serial")
    assert [r["tpot_s"] for r in rows] == [r["tpot_s"] for r in reference]
    assert store.set_aside == [store.path(runs[1]).with_suffix(".corrupt")]
    assert store.set_aside[0].read_text() == content  # kept for inspection


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_leaves_no_workers_and_resumes(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """
        name = "killed"
        [grid]
        policies = ["chain", "fixed:16"]
        seed = [0, 1, 2, 3, 4, 5, 6, 7]
        requests = 2
        output_len = 96
        """,
    )
    out = tmp_path / "o"
    runs = out / "killed" / "runs"
    cmd = [
        sys.executable,
        "-m",
        "bastion",
        "experiment",
        "--config",
        str(config),
        "--out",
        str(out),
        "--workers",
        "2",
        "--no-progress",
    ]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(runs.glob("*.json")):
        workers = sorted(set(workers) | set(_children(parent.pid)))
        assert parent.poll() is None, parent.stderr.read() if parent.stderr else ""
        time.sleep(0.05)
    workers = sorted(set(workers) | set(_children(parent.pid)))
    assert list(runs.glob("*.json")), "no run finished in time"
    assert workers, "the process pool had no workers"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)], "pool workers outlived their killed parent"
    finished = len(list(runs.glob("*.json")))
    assert finished < 8 and not list(runs.glob(".*"))  # no half-written run file
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    assert f"reusing {finished} stored run(s) of 8" in done.stderr
    with (out / "killed" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 * 3
    assert [r["seed"] for r in rows[::3]] == [str(s) for s in range(8)]


def test_simulate_out_writes_the_same_records(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        code = main(
            [
                "simulate",
                "--policy",
                "chain",
                "--requests",
                "2",
                "--output-len",
                "24",
                "--seed",
                "3",
                "--out",
                str(tmp_path),
            ]
        )
    finally:
        os.umask(old)
    assert code == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert set(data) == {"spec", "records"} and [r["policy"] for r in data["records"]] == [
        "ar",
        "chain",
    ]
    assert data["records"][0]["acceptance_rate"] is None  # AR drafts nothing (NaN → null)
    with (tmp_path / "simulate.csv").open() as f:
        header = next(csv.reader(f))
    assert set(header) <= set(RECORD_COLUMNS)
    assert header == [c for c in RECORD_COLUMNS if c in header]  # documented order
    assert data["records"][1]["seed"] == 3 and data["records"][1]["bastion_version"]
    for name in ("simulate.json", "simulate.csv", "requests.csv"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644  # the user's umask


def test_a_run_key_changes_with_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored run is keyed on bastion's own source too: a changed controller or cost model
    must not be served a result the old code computed (negative control: the same code gives
    the same key)."""
    from bastion.sim.experiments import runs

    run = {
        "spec": {
            "gpu": "h100-sxm",
            "model": "qwen3-8b",
            "workload": "math",
            "truth": "hf-eager",
            "policies": ["chain"],
        },
        "tags": {},
    }
    digest = runs.code_digest()
    assert len(digest) == 64
    key = runs.run_key(run)
    assert runs.run_key(run) == key
    monkeypatch.setattr(runs, "_CODE", [digest[::-1]])
    assert runs.run_key(run) != key
