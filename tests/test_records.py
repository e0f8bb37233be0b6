"""The record vocabulary (bastion.records): one definition of every field, its JSON Schema shipped
in the package, every command's JSON output valid against it, and the old names still read.

The real backend's commands (`generate --json`, `demo --json`) are validated in
tests/test_torch_cli.py and tests/test_demo.py, where their models are built."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import jsonschema
import pytest

from bastion.cli import main
from bastion.records import FIELDS, RENAMED, json_schema, shipped_schema, upgrade
from bastion.sim.latency import REQUEST_COLUMNS
from bastion.sim.results import RECORD_COLUMNS, RunStore

ROOT = Path(__file__).resolve().parents[1]


def valid(document: object) -> None:
    jsonschema.validate(document, shipped_schema())


def test_the_shipped_schema_is_the_vocabularys() -> None:
    """bastion/schemas/records.schema.json is json_schema() as written (regenerate it with
    ``python -c "import json; from bastion.records import json_schema; print(json.dumps(
    json_schema(), indent=2, ensure_ascii=False))" > bastion/schemas/records.schema.json``)."""
    assert shipped_schema() == json_schema()
    jsonschema.Draft202012Validator.check_schema(shipped_schema())


def test_every_column_is_defined_once() -> None:
    assert set(RECORD_COLUMNS) <= set(FIELDS)
    assert set(REQUEST_COLUMNS) <= set(FIELDS)
    assert not set(RENAMED) & set(FIELDS)  # an old name is never also a current one
    assert set(RENAMED.values()) <= set(FIELDS)
    for name, f in FIELDS.items():
        assert f.meaning, name
        if name.endswith("_s") and not name.endswith("_tok_s"):
            assert f.unit == "s", name  # a name ending in _s is in seconds


def test_simulate_json_and_files_follow_the_vocabulary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--policy", "fixed:16", "--requests", "2", "--output-len", "12"]
    assert main([*args, "--json", "--out", str(tmp_path), "--warmup-steps", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    valid(out)
    valid(json.loads((tmp_path / "simulate.json").read_text()))
    assert [r["policy_spec"] for r in out["records"]] == ["ar", "fixed:16"]
    for name in ("simulate.csv", "requests.csv"):
        with (tmp_path / name).open() as fh:
            header = next(csv.reader(fh))
        assert set(header) <= set(FIELDS), name
        assert "policy_spec" in header


def test_experiment_results_follow_the_vocabulary(tmp_path: Path) -> None:
    from bastion.sim import experiments

    experiments.run_experiment("latency-model", tmp_path, executor="serial", quick=True)
    valid(json.loads((tmp_path / "latency-model" / "results.json").read_text()))
    for name in ("results.csv", "requests.csv"):
        path = tmp_path / "latency-model" / name
        if path.exists():
            with path.open() as fh:
                assert set(next(csv.reader(fh))) <= set(FIELDS), name


@pytest.mark.parametrize(
    "record",
    [
        {"policy": "chain", "time_per_output_token": 0.01},  # an old name
        {"policy": "chain", "tpot": 0.01},  # a name the vocabulary does not define
        {"policy": "chain", "tau": "high"},  # a wrong type
    ],
)
def test_the_schema_refuses_what_the_vocabulary_does_not_define(record: dict) -> None:  # type: ignore[type-arg]
    """Negative controls: the validation above can fail."""
    with pytest.raises(jsonschema.ValidationError):
        valid({"records": [record]})


def test_old_names_read_with_a_deprecation_warning(tmp_path: Path) -> None:
    old = {"policy": "fixed:8", "time_per_output_token": 0.5, "acceptance_lengths": [3, 2]}
    with pytest.warns(DeprecationWarning, match="time_per_output_token → tpot_s"):
        new = upgrade(old)
    assert new == {
        "policy": "fixed:8",
        "policy_spec": "fixed:8",
        "tpot_s": 0.5,
        "committed_per_step": [3, 2],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # current names: no warning
        assert upgrade(new) == new
    # a run stored by the previous release reads with the new names (and its spec)
    store = RunStore(tmp_path)
    run = {"key": "k1"}
    store.save(run, [{"policy": "chain", "cycle_measured_s": 0.1}])
    with pytest.warns(DeprecationWarning, match="cycle_measured_s → cycle_observed_s"):
        rows = RunStore(tmp_path).load(run)
    assert rows == [{"policy": "chain", "policy_spec": "chain", "cycle_observed_s": 0.1}]


def test_the_engines_old_names_read_with_a_warning() -> None:
    from bastion.engine import GenerationResult

    r = GenerationResult([1, 2, 3], committed_per_step=[2], decode_s=1.0)
    assert r.tpot_s == 0.5  # after the first token: 2 tokens in 1 s
    with pytest.warns(DeprecationWarning, match="committed_per_step"):
        assert r.acceptance_lengths == [2]
    with pytest.warns(DeprecationWarning, match="tpot_s"):
        assert r.time_per_output_token == 0.5
