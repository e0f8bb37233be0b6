"""Policy identity: policies compared together never share a label, and an experiment never
records two different policies under one label (which would merge them in its summary)."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pytest

from bastion.cli import main
from bastion.errors import ConfigError
from bastion.policies import policy_labels
from bastion.sim import experiments
from bastion.sim.simulate import SimSpec, simulate

PLUGIN = '''
from bastion.interfaces import TreeChoice
from bastion.tree import best_first_tree


class DepthCapped:
    """Best-first at a budget, cut at a depth; one display name whatever its arguments."""

    name = "depthcap"

    def __init__(self, budget=64, depth=6):
        self.budget, self.depth = int(budget), int(depth)

    def choose(self, marginals, context):
        tree = best_first_tree(marginals, self.budget)
        keep = [i for i, d in enumerate(tree.depths) if d <= self.depth]
        return TreeChoice(tree.prefix(max(len(keep), 1)))


class Impostor(DepthCapped):
    """A plug-in whose display name is a built-in's."""

    name = "fixed:16"


class Baseline(DepthCapped):
    name = "ar"
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "capped.py"
    path.write_text(PLUGIN)
    return path


def test_labels_are_display_names_unless_two_would_share_one(plugin: Path) -> None:
    a, b = f"{plugin}:DepthCapped:64,6", f"{plugin}:DepthCapped:8,2"
    assert policy_labels(["ar", "chain", "fixed:16", a]) == ["ar", "chain", "fixed:16", "depthcap"]
    assert policy_labels(["ar", a, b]) == ["ar", a, b]  # one class, two arguments
    impostor, baseline = f"{plugin}:Impostor", f"{plugin}:Baseline"
    assert policy_labels(["ar", "fixed:16", impostor]) == ["ar", "fixed:16", impostor]
    assert policy_labels(["ar", baseline]) == ["ar", baseline]  # not merged with AR
    assert policy_labels(["ar", "bastion", "bastion:512"]) == ["ar", "bastion", "bastion:512"]


def test_a_policy_given_twice_is_refused_in_one_line(
    plugin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="given twice"):
        policy_labels(["ar", "chain", "chain"])
    with pytest.raises(ConfigError, match="given twice"):
        SimSpec(policies=("chain", "chain"))
    argv = ["simulate", "--policy", "fixed:8", "--policy", "fixed:8", "--requests", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'fixed:8' is given twice" in err


def test_simulate_records_same_named_plugins_by_spec(plugin: Path) -> None:
    a, b = f"{plugin}:DepthCapped:64,6", f"{plugin}:DepthCapped:8,2"
    result = simulate(SimSpec(policies=(a, b), requests=1, output_len=8, n_max=64))
    assert [r.policy for r in result.rows] == ["ar", a, b]
    assert {q["policy"] for q in result.request_rows()} == {"ar", a, b}
    assert result.row(a).mean_tree_size != result.row(b).mean_tree_size  # two policies, two rows


def _config(tmp: Path, policies: str) -> Path:
    path = tmp / "same-name.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            name = "same-name"
            [grid]
            policies = {policies}
            requests = 1
            output_len = 8
            n_max = 64
            """
        )
    )
    return path


def test_experiment_refuses_one_label_for_two_policies_across_runs(
    tmp_path: Path, plugin: Path
) -> None:
    """Compared in different runs, the two would be labelled alike and averaged together."""
    config = _config(tmp_path, '[["capped.py:DepthCapped:64,6"], ["capped.py:DepthCapped:8,2"]]')
    with pytest.raises(ConfigError) as info:
        experiments.load_config(config)
    message = str(info.value)
    assert "\n" not in message
    assert "DepthCapped:64,6" in message and "DepthCapped:8,2" in message
    assert "'depthcap'" in message
    # the negative control: one policy of that name across runs is fine
    experiments.load_config(_config(tmp_path, '[["capped.py:DepthCapped:64,6"], ["chain"]]'))


def test_experiment_summary_keeps_same_named_plugins_apart(tmp_path: Path, plugin: Path) -> None:
    config = _config(tmp_path, '["capped.py:DepthCapped:64,6", "capped.py:DepthCapped:8,2"]')
    summary = experiments.run_experiment(config, tmp_path / "out", executor="serial")
    with (tmp_path / "out" / "same-name" / "results.csv").open() as f:
        labels = [r["policy"] for r in csv.DictReader(f)]
    a, b = (f"{plugin}:DepthCapped:64,6", f"{plugin}:DepthCapped:8,2")
    assert labels == ["ar", a, b]
    assert f"| {a} |" in summary and f"| {b} |" in summary
