"""Plug-in policies: by import path, file or entry-point name; via make_policy and simulate."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bastion.cli import main
from bastion.errors import BastionError, BudgetError, ConfigError, PolicyError, UnknownNameError
from bastion.plugins import parse_args, parse_spec
from bastion.policies import make_policy, policy_label, split_policy_specs
from bastion.sim.simulate import SimSpec, simulate

PLUGIN = textwrap.dedent(
    '''
    """A researcher's policy, outside the package."""
    from bastion.interfaces import TreeChoice
    from bastion.tree import best_first_tree

    class Greedy:
        """Best-first at a fixed size: the simplest single-request policy."""

        def __init__(self, size=8, label="greedy"):
            self.size = int(size)
            self.name = f"{label}:{self.size}"

        def choose(self, marginals, context):
            return TreeChoice(best_first_tree(marginals, self.size))

    class Priced:
        """Declares that it needs a cost model; remembers whether it got one."""

        name = "priced"
        uses_cost_model = True
        seen = []

        def choose(self, marginals, context):
            Priced.seen.append(context.cost_model is not None)
            return TreeChoice(best_first_tree(marginals, 4))

    def make_greedy(size):
        return Greedy(size, label="factory")

    READY = Greedy(3, label="ready")
    NOT_A_POLICY = object()

    def broken():
        raise RuntimeError("boom")

    class Careless:
        """Forgets to return its choice."""

        name = "careless"

        def choose(self, marginals, context):
            best_first_tree(marginals, 4)

    class CarelessBatch:
        """Answers a batch with a plain list instead of a BatchChoice."""

        name = "careless-batch"

        def choose_batch(self, marginals, context):
            return []
    '''
)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "myplugins.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    saved = list(sys.path)
    yield tmp_path
    sys.path[:] = saved
    sys.modules.pop("myplugins", None)


def test_import_path_from_the_current_directory(plugin_dir: Path) -> None:
    policy = make_policy("myplugins:Greedy")
    assert policy.name == "greedy:8"
    assert make_policy("myplugins:Greedy:16,label=g").name == "g:16"
    assert make_policy("myplugins:make_greedy:5").name == "factory:5"
    ready = make_policy("myplugins:READY")  # a ready object is returned as it is
    assert ready.name == "ready:3" and make_policy(ready) is ready
    assert policy_label(ready) == "ready:3 [myplugins:Greedy]"


def test_file_path_spec(plugin_dir: Path) -> None:
    path = plugin_dir / "myplugins.py"
    assert make_policy(f"{path}:Greedy:6").name == "greedy:6"


@pytest.mark.parametrize(
    ("spec", "error", "says"),
    [
        ("myplugins:Nope", ConfigError, "no attribute 'Nope'"),
        ("myplugins:NOT_A_POLICY", BudgetError, "not a tree policy"),
        ("myplugins:READY:3", ConfigError, "ready object"),
        ("myplugins:broken", ConfigError, "RuntimeError: boom"),
        ("myplugins:Greedy:size=1,size=2", ConfigError, "twice"),
        ("myplugins:Greedy:size=1,2", ConfigError, "positional argument"),
        ("myplugins:Greedy:,", ConfigError, "empty argument"),
        ("no_such_module_xyz:Thing", ConfigError, "no module 'no_such_module_xyz'"),
        ("missing.py:Thing", ConfigError, "is not a file"),
        ("notregistered", UnknownNameError, "bastion.policies"),
        ("a b:C", ConfigError, "not a module name"),
        ("", ConfigError, "non-empty"),
    ],
)
def test_bad_specs_name_the_problem(plugin_dir: Path, spec: str, error: type, says: str) -> None:
    with pytest.raises(error, match=None) as info:
        make_policy(spec)
    assert isinstance(info.value, BastionError)
    assert says in str(info.value)


def test_errors_name_the_spec_and_the_users_file(plugin_dir: Path) -> None:
    """A typo in a file spec names the user's file (not the module name it is loaded under)
    and the close matches; a constructor's error names the spec and where the class lives."""
    path = plugin_dir / "myplugins.py"
    with pytest.raises(ConfigError) as info:
        make_policy(f"{path}:Gredy")
    message = str(info.value)
    assert str(path.resolve()) in message and "did you mean Greedy" in message
    assert "bastion_plugin" not in message
    with pytest.raises(ConfigError) as info:
        make_policy(f"{path}:Greedy:abc")
    message = str(info.value)
    assert f"{path}:Greedy:abc" in message and str(path.resolve()) in message
    assert "Greedy('abc') raised ValueError" in message


@pytest.mark.parametrize("name", ["Careless", "CarelessBatch"])
def test_a_policy_answering_the_wrong_type_is_a_policy_error(plugin_dir: Path, name: str) -> None:
    policy = make_policy(f"myplugins:{name}")
    with pytest.raises(PolicyError) as info:
        simulate(SimSpec(policies=(policy,), requests=1, output_len=8, warmup_steps=0))
    message = str(info.value)
    assert repr(policy.name) in message and "myplugins.py" in message
    assert ("TreeChoice" if name == "Careless" else "BatchChoice") in message


def test_the_cli_reports_a_wrong_answer_in_one_line(
    plugin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--requests", "1", "--output-len", "8", "--policy", "myplugins:Careless"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'careless'" in err and "TreeChoice" in err


def test_non_policy_objects_are_refused() -> None:
    with pytest.raises(BudgetError, match="choose"):
        make_policy(42)  # type: ignore[arg-type]


def test_argument_parsing() -> None:
    assert parse_args("32,1.5,true,x,k=7", "s") == ((32, 1.5, True, "x"), {"k": 7})
    spec = parse_spec("pkg.mod:Outer.Inner:1", ())
    assert (spec.source, spec.attr, spec.args) == ("pkg.mod", "Outer.Inner", (1,))
    registered = parse_spec("greedy:8", ("greedy",))  # a registered name takes NAME:ARGS
    assert (registered.source, registered.attr, registered.args) == ("greedy", None, (8,))


def test_split_policy_specs_keeps_arguments_with_their_spec() -> None:
    text = "chain,fixed:16,bastion:per-request,64,mymod:Greedy:8,label=x,other.py:P"
    assert split_policy_specs(text) == [
        "chain",
        "fixed:16",
        "bastion:per-request,64",
        "mymod:Greedy:8,label=x",
        "other.py:P",
    ]


def test_entry_point_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed distribution registers a short name under ``bastion.policies``."""
    (tmp_path / "epplugins.py").write_text(PLUGIN)
    dist = tmp_path / "epplugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epplugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[bastion.policies]\ngreedy = epplugins:Greedy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert make_policy("greedy").name == "greedy:8"
        assert make_policy("greedy:12").name == "greedy:12"
        with pytest.raises(UnknownNameError, match="registered: greedy"):
            make_policy("greedier")
        with pytest.raises(ConfigError) as info:  # a bad argument names the spec and its origin
            make_policy("greedy:abc")
        assert "'greedy:abc'" in str(info.value) and "epplugins:Greedy" in str(info.value)
    finally:
        sys.modules.pop("epplugins", None)


def test_simulate_runs_plugin_policies_and_hands_cost_models_by_attribute(plugin_dir: Path) -> None:
    priced = make_policy("myplugins:Priced")  # an object made outside simulate
    seen = type(priced).seen
    spec = SimSpec(policies=("myplugins:Greedy:16", priced, "fixed:16"), requests=2)
    result = simulate(spec)
    greedy, fixed = result.row("greedy:16"), result.row("fixed:16")
    # the plug-in is best-first at 16, exactly what fixed:16 is: same requests, same trees
    assert greedy.tau == pytest.approx(fixed.tau)
    assert seen and all(seen)  # declared uses_cost_model → given one
    assert spec.to_dict()["policies"][1] == "priced [myplugins:Priced]"


# the console script, as a user runs it (its sys.path lacks the current directory)
BASTION = [shutil.which("bastion") or sys.executable] + (
    [] if shutil.which("bastion") else ["-m", "bastion"]
)
POLICY_ARGS = ("--policy", "myplugins:Greedy:16,label=mine")


def test_simulate_cli_takes_a_plugin_spec(plugin_dir: Path) -> None:
    run = subprocess.run(
        [*BASTION, "simulate", "--requests", "2", *POLICY_ARGS],
        capture_output=True,
        text=True,
        cwd=plugin_dir,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "mine:16" in run.stdout
