"""Fuzzing the whole public surface: every callable a module declares in ``__all__`` is called
with arbitrary objects, and only the project's own errors (:class:`BastionError`) may come out.

The callables are found, not listed: each module of the ``bastion`` package (the simulator as
``bastion.sim``, the torch backend when torch is installed) is imported and every function and
class named in its ``__all__`` and defined there is called, so a new public function is covered
without editing this file. Arguments: every required parameter gets an arbitrary object (None,
strings, bytes, nested lists, huge and negative integers, NaN and infinities, empty, mis-shaped
and mismatched numpy arrays, a directory or a missing file as a path, a few valid library objects
so that checks past the first argument are reached); optional parameters get one at random.

What counts as a failure: any exception that is not a :class:`BastionError` — ``TypeError``,
``OverflowError``, ``IsADirectoryError``…, and also ``MemoryError`` (a huge number must be refused
before anything is allocated for it) and a call running past the hang guard. ``KeyboardInterrupt``
and ``SystemExit`` are not caught: they stop the run, which fails it too.

Left out, each with its reason in ``SKIPPED``: callables that do real, long work once their
arguments are valid (measuring this machine, training, whole sweeps), that change global state
(the backend registry), and the protocols of :mod:`bastion.interfaces` (interfaces, not
constructors). Run the whole test with ``CI=true`` for ≥ 100 examples per callable.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.errors import BastionError
from bastion.guard import integer, public, public_surface, readable_file
from tests.guards import hang_guard

CALL_GUARD_S = 20  # one call; a refusal takes milliseconds
EXAMPLES = 100 if os.environ.get("CI") else 8

# name -> why it is not fuzzed (each is guarded all the same; docs/errors.md lists its rules)
SKIPPED: dict[str, str] = {
    "bastion.cost.probe.measure_bandwidth": "measures this machine for seconds",
    "bastion.cost.probe.measure_gemm": "measures this machine for seconds",
    "bastion.cost.probe.measure_overhead": "measures this machine for seconds",
    "bastion.cost.probe.probe_profile": "measures this machine for seconds",
    "bastion.cost.backends.register_backend": "changes the process-wide backend registry",
    "bastion.demo.train.train_drafter": "trains a model for minutes",
    "bastion.demo.train.train_target": "trains a model for minutes",
    "bastion.demo.run.run_demo": "loads and runs the demo models for minutes",
    "bastion.demo.corpus.train_tokenizer": "trains a tokenizer",
}


PUBLIC = {name: fn for name, fn in public_surface().items() if name not in SKIPPED}


# ------------------------------------------------------------------------------------------
# arbitrary objects
# ------------------------------------------------------------------------------------------


def _valid_objects() -> list[object]:
    """A few well-formed library objects, so that the checks after the first argument run."""
    from bastion.interfaces import CostCurve
    from bastion.tree import DraftMarginals, best_first_tree

    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.3], [0.5, 0.2]])
    return [
        m,
        best_first_tree(m, 4),
        CostCurve(0.001, 0.0, np.linspace(0.01, 0.02, 8), 0.01),
        lambda *a, **k: None,  # a cost-curve source (or any callback) that returns nothing
        {"a": 1, "b": [None]},
        {},
    ]


@functools.cache
def junk(directory: Path) -> st.SearchStrategy[object]:
    numbers = st.one_of(
        st.integers(-3, 70),
        st.integers(),
        st.sampled_from([-(2**63), 2**63, 2**64, 10**20, 10**400, -(10**400)]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, 0.0, -0.0, 0.5]),
    )
    arrays = st.sampled_from(
        [
            np.array([]),
            np.zeros((0, 3)),
            np.ones((2, 3)),
            np.full((3,), np.nan),
            np.array([1, 2, 3]),
            np.array([[0.6, 0.3], [0.5, 0.2]]),
            np.array(["a", "b"]),
            np.array([1, None], dtype=object),
            np.array(2**63, dtype=np.uint64),
        ]
    )
    paths = st.sampled_from(
        [directory, str(directory), directory / "missing" / "x.toml", "", ".", "/"]
    )
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        numbers,
        st.text(max_size=6),
        st.binary(max_size=4),
        arrays,
        paths,
        st.sampled_from(_valid_objects()),
    )
    return st.one_of(
        scalars,
        st.lists(scalars, max_size=3),
        st.lists(st.lists(numbers, max_size=3), max_size=3),
        st.tuples(scalars, scalars),
        st.dictionaries(st.text(max_size=4), scalars, max_size=2),
    )


@functools.cache
def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p for p in sig.parameters.values() if p.kind not in kinds]


@st.composite
def call_arguments(
    draw: st.DrawFn, fn: Callable[..., Any], directory: Path
) -> tuple[list[object], dict[str, object]]:
    args: list[object] = []
    kwargs: dict[str, object] = {}
    anything = junk(directory)
    for p in _parameters(fn):
        if p.default is not inspect.Parameter.empty and not draw(st.booleans()):
            continue
        value = draw(anything)
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[p.name] = value
    return args, kwargs


def only_project_errors(
    name: str, fn: Callable[..., Any], args: list[object], kwargs: dict[str, object]
) -> None:
    try:
        with hang_guard(CALL_GUARD_S, f"{name}(…)"):
            fn(*args, **kwargs)
    except BastionError:
        pass


MEMORY_CAP = 12 << 30  # address space while fuzzing: a giant allocation is a MemoryError


@pytest.fixture(scope="module", autouse=True)
def _memory_cap():  # type: ignore[no-untyped-def]
    """A junk size that slipped through would allocate until the kernel's OOM killer ends the
    whole test run without a word; under this cap it is a MemoryError that names the callable
    (and fails the test, since only the project's errors may come out)."""
    try:
        import resource
    except ImportError:  # not on this platform: no cap
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = MEMORY_CAP if hard == resource.RLIM_INFINITY else min(MEMORY_CAP, hard)
    if soft != resource.RLIM_INFINITY and soft < cap:
        cap = soft
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):  # the process already uses more, or may not lower it
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_callable_refuses_junk_with_project_errors(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # whatever a junk path writes lands here
    fn = PUBLIC[name]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(call_arguments(fn, tmp_path))
    def run(call: tuple[list[object], dict[str, object]]) -> None:
        only_project_errors(name, fn, *call)

    run()


def test_a_rule_for_a_missing_parameter_is_refused_when_decorating() -> None:
    """A rule naming a parameter the function lacks (it would check nothing: a decorator left
    on the wrong function) is refused at decoration; the same rule on the function that has the
    parameter is taken."""
    from bastion.errors import ArgumentError

    def joined(parts: list[int]) -> int:
        return len(parts)

    def load(path: Path) -> str:
        return str(path)

    for bad in (public(path=readable_file), public(own=("path",)), public(lengths=("a", "b"))):
        with pytest.raises(ArgumentError, match="no parameter"):
            bad(joined)
    assert public(path=readable_file)(load)(Path(__file__)) == __file__
    assert public(parts=integer(0, 9))(joined)  # a rule for a parameter it has is taken


def test_the_surface_is_found() -> None:
    """The enumeration finds the documented entry points (a broken walk would find nothing)."""
    for name in (
        "bastion.tree.best_first_tree",
        "bastion.policies.make_policy",
        "bastion.trace.write_trace",
        "bastion.sim.simulate.simulate",
        "bastion.sim.simulate.SimSpec",
        "bastion.cost.hardware.get_profile",
    ):
        assert name in PUBLIC
    assert len(PUBLIC) > 200


def test_an_unguarded_function_fails_the_fuzz_test(tmp_path: Path) -> None:
    """Negative control: a toy function that takes its argument on trust is caught."""

    def unguarded(n: int) -> int:  # TypeError for a string, OverflowError for 10**400…
        return len(range(n)) + 1  # (no allocation: a list of n zeros took gigabytes and minutes)

    @settings(max_examples=200, deadline=None, database=None)
    @given(call_arguments(unguarded, tmp_path))
    def run(call: tuple[list[object], dict[str, object]]) -> None:
        only_project_errors("unguarded", unguarded, *call)

    with pytest.raises(Exception) as caught:
        run()
    assert not isinstance(caught.value, BastionError)


def test_docs_list_every_rule() -> None:
    """docs/errors.md's table of argument rules is the one the code makes (run
    ``python docs/make_guard_table.py`` after changing a rule)."""
    import importlib.util

    pytest.importorskip("torch")  # the table lists the torch backend's rules too
    from bastion.guard import rules_table

    path = Path(__file__).resolve().parents[1] / "docs" / "make_guard_table.py"
    spec = importlib.util.spec_from_file_location("make_guard_table", path)
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    text = make.DOC.read_text(encoding="utf-8")
    assert make.BEGIN in text and make.END in text
    assert make.rewritten(text, rules_table()) == text, "run python docs/make_guard_table.py"


def test_the_reported_inputs_are_project_errors(tmp_path: Path) -> None:
    """The cases the guard was written for: numbers too large for the machine, a directory as
    the trace writer's output, lengths that disagree, None where a number is expected."""
    import copy

    from bastion.cost.hardware import get_profile, profile_from_dict, profile_to_dict
    from bastion.errors import ArgumentError, BudgetError, ConfigError
    from bastion.policies import make_policy
    from bastion.sim.experiments import load_config
    from bastion.sim.gpu import routing_draws
    from bastion.trace import Trace, write_trace
    from bastion.tree import DraftMarginals, best_first_tree

    with pytest.raises(BudgetError, match="tree_size"):
        make_policy("fixed:12345678901234567890")
    data = profile_to_dict(get_profile("h100-sxm"))
    for table in ("peak", "efficiency"):
        bad = copy.deepcopy(data)
        bad[table][next(iter(bad[table]))] = 10**400
        with pytest.raises(ConfigError, match="positive finite number"):
            profile_from_dict(bad)
    config = tmp_path / "big.toml"
    config.write_text('name = "big"\n[grid]\npolicies = ["chain"]\nrequests = ' + "9" * 30 + "\n")
    with pytest.raises(ConfigError):
        load_config(config)
    with pytest.raises(BastionError, match="directory"):
        write_trace(tmp_path, Trace.__new__(Trace))
    with pytest.raises(ArgumentError, match="broadcast"):
        routing_draws(np.ones(2), np.ones(3), 0.5)
    m = DraftMarginals([[1, 2]], [[0.6, 0.3]])
    with pytest.raises(ArgumentError, match="marginals"):
        best_first_tree(None, 4)  # type: ignore[arg-type]
    assert best_first_tree(m, 10**20).size == 3  # a huge budget is still cut, not refused
