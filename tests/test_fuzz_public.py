"""Fuzzing the whole public surface: every callable a module declares in ``__all__`` is called
with arbitrary objects, and only the project's own errors (:class:`BastionError`) may come out.

The callables are found, not listed: each module of the ``bastion`` package (the simulator as
``bastion.sim``, the torch backend when torch is installed) is imported and every function and
class named in its ``__all__`` and defined there is called, so a new public function is covered
without editing this file; so are each public class's own constructors (its classmethods and
staticmethods) and the public methods of a few well-formed library objects (a cost model,
marginals, a tree, a hardware profile…). Arguments: in one call of four, every required
parameter gets an arbitrary object (None, strings, bytes, nested lists, huge and negative
integers, NaN and infinities, empty, mis-shaped and mismatched numpy arrays, a directory or a
missing file as a path, a few valid library objects so that checks past the first argument are
reached); in the others each gets a value of its annotation's type with arbitrary content
(:func:`typed`: integers of any size and near misses such as 1.5 or "2", numeric lists and
arrays of any length and shape, a valid object of the annotated class, a callback that returns
junk), one in eight still junk — what reaches the checks past the types: two lengths that must
agree, what a callback returns. Optional parameters are given at random.

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

import collections.abc as cabc
import functools
import inspect
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.errors import BastionError
from bastion.guard import integer, public, public_surface, readable_file
from tests.guards import hang_guard

CALL_GUARD_S = 20  # one call; a refusal takes milliseconds


def _examples() -> int:
    """Examples per callable: 100 under CI, 8 here; ``FUZZ_EXAMPLES=N`` (1 … 100 000) for a
    longer hunt (800 takes ≈ 15 minutes on 2 cores and finds what CI's 100 would, one day)."""
    given = os.environ.get("FUZZ_EXAMPLES")
    if given is None:
        return 100 if os.environ.get("CI") else 8
    if not given.isdigit() or not 1 <= int(given) <= 100_000:
        raise ValueError(f"FUZZ_EXAMPLES must be an integer in 1 … 100000; got {given!r}")
    return int(given)


EXAMPLES = _examples()

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


@functools.cache
def _valid_objects() -> tuple[object, ...]:
    """A few well-formed library objects, so that the checks after the first argument run."""
    from bastion.cost.costmodel import RooflineCostModel
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model
    from bastion.interfaces import CostCurve, RequestLoad, StepLoad
    from bastion.tree import DraftMarginals, best_first_tree

    m = DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.3], [0.5, 0.2]])
    hardware, model = get_profile("a100-sxm-80gb"), get_model("qwen3-8b")
    drafter = DrafterSpec.dflash_for(model)
    return (
        m,
        best_first_tree(m, 4),
        CostCurve(0.001, 0.0, np.linspace(0.01, 0.02, 8), 0.01),
        StepLoad(64),
        StepLoad(100, (RequestLoad(3, 70, 1.5),)),
        RequestLoad(2, 10),
        hardware,
        model,
        drafter,
        RooflineCostModel(hardware, model, drafter),
        lambda *a, **k: None,  # a cost-curve source (or any callback) that returns nothing
        {"a": 1, "b": [None]},
        {},
    )


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


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s resolved annotations; one that names a type-checking-only import is left out."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        scope = getattr(inspect.unwrap(fn), "__globals__", {})
        hints = {}
        for p in _parameters(fn):
            try:
                hints[p.name] = (
                    eval(p.annotation, scope) if isinstance(p.annotation, str) else p.annotation
                )
            except Exception:
                continue
        return hints


def _returning(value: object) -> Callable[..., object]:
    def callback(*args: object, **kwargs: object) -> object:
        return value

    callback.__qualname__ = f"returning {value!r:.40}"
    return callback


def typed(tp: object, directory: Path, depth: int = 0) -> st.SearchStrategy[object]:
    """Values of the annotation's type but arbitrary content: an ``int`` of any size, lists of
    any length (so that sequences which must agree do not), a valid library object for a class,
    a callback that answers junk for a ``Callable``. These reach the checks that junk of the
    wrong type never reaches (the agreement of two lengths, what a callback returns)."""
    anything = junk(directory)
    if depth > 3 or tp in (Any, object, inspect.Parameter.empty) or isinstance(tp, TypeVar):
        return anything
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is np.ndarray or "_SupportsArray" in str(tp):  # npt.NDArray, npt.ArrayLike
        return st.integers(0, 3).flatmap(lambda i: numeric_arrays() if i else anything)
    if tp is type(None):
        return st.none()
    if origin is typing.Union or origin is types.UnionType:
        return st.one_of([typed(a, directory, depth + 1) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is typing.Annotated:
        return typed(args[0], directory, depth + 1)
    if tp is bool:
        return st.booleans()
    if tp is int:  # and near misses: a fraction, a whole float, a bool, a digit string
        return st.one_of(st.integers(-2, 70), st.integers(), st.sampled_from(NEAR_INTS))
    if tp is float:
        return st.one_of(st.floats(-10.0, 100.0), st.floats(), st.sampled_from(NEAR_FLOATS))
    if tp is str:
        return st.text(max_size=8)
    if tp in (Path, os.PathLike) or origin is os.PathLike:
        return junk(directory)
    if tp is cabc.Callable or origin is cabc.Callable:
        return st.builds(_returning, st.one_of(anything, st.sampled_from(_valid_objects())))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return st.tuples(*(typed(a, directory, depth + 1) for a in args))
    if origin in (list, tuple, set, frozenset) or origin in _SEQUENCES:
        item = typed(args[0], directory, depth + 1) if args else anything
        kind = origin if origin in (tuple, set, frozenset) else list
        return st.lists(item, max_size=4).map(kind)  # type: ignore[arg-type]
    if origin in (dict, cabc.Mapping, cabc.MutableMapping):
        keys, values = (typed(a, directory, depth + 1) for a in args) if args else (anything,) * 2
        return st.dictionaries(keys, values, max_size=3)
    if isinstance(tp, type):
        try:
            fits = [o for o in _valid_objects() if isinstance(o, tp)]
        except TypeError:  # a protocol that is not runtime-checkable
            fits = []
        if fits:
            return st.sampled_from(fits)
    return anything


_SEQUENCES = (cabc.Sequence, cabc.Iterable, cabc.Collection)
NEAR_INTS: tuple[object, ...] = (1.5, 2.0, True, "2", np.float64(2.5), np.int64(3))
NEAR_FLOATS: tuple[object, ...] = ("1.0", True, np.float32(0.5), 10**400)


def numeric_arrays() -> st.SearchStrategy[object]:
    """Numbers as a list, a list of rows or a numpy array, 1-D or 2-D, of any length: the
    shapes an array argument takes, with lengths that need not agree with anything."""
    values = st.one_of(st.floats(0.0, 1.0), st.floats(-2.0, 100.0), st.integers(-1, 70))
    rows = st.integers(1, 4).flatmap(
        lambda k: st.lists(st.lists(values, min_size=k, max_size=k), min_size=1, max_size=3)
    )
    plain = st.one_of(st.lists(values, max_size=5), rows)
    return st.one_of(plain, plain.map(np.asarray))


@st.composite
def call_arguments(
    draw: st.DrawFn, fn: Callable[..., Any], directory: Path
) -> tuple[list[object], dict[str, object]]:
    """Arguments for ``fn``: all junk (one call in four; each optional parameter given or
    not), or each of its annotation's type with one in eight still junk (each optional
    parameter given three times in four)."""
    args: list[object] = []
    kwargs: dict[str, object] = {}
    anything = junk(directory)
    hints = _hints(fn) if draw(st.integers(0, 3)) else None
    for p in _parameters(fn):
        given = draw(st.integers(0, 3)) if hints is not None else draw(st.integers(0, 1))
        if p.default is not inspect.Parameter.empty and not given:
            continue
        if hints is not None and p.name in hints and draw(st.integers(0, 7)):
            value = draw(typed(hints[p.name], directory))
        else:
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


# a class's own constructors (classmethods, staticmethods) and the methods of well-formed
# library objects are public too: name -> why one is not fuzzed
METHODS_SKIPPED: dict[str, str] = {
    "bastion.tree.DraftMarginals.trusted": "documented to skip validation (hot loops)",
    "bastion.tree.DraftTree.trusted": "documented to skip validation (hot loops)",
}


def _own_methods(cls: type) -> list[str]:
    """The public methods ``cls`` and its bases in the library define (not properties)."""
    names: list[str] = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith(("bastion.", "sim.")):
            continue
        for attr, raw in vars(klass).items():
            if attr.startswith("_") or attr in names or isinstance(raw, property):
                continue
            if callable(raw) or isinstance(raw, classmethod | staticmethod):
                names.append(attr)
    return names


def _class_methods() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for name, obj in PUBLIC.items():
        if not isinstance(obj, type):
            continue
        for attr, raw in vars(obj).items():
            if not attr.startswith("_") and isinstance(raw, classmethod | staticmethod):
                found[f"{name}.{attr}"] = getattr(obj, attr)
    return {k: v for k, v in found.items() if k not in METHODS_SKIPPED}


def _instance_methods() -> dict[str, tuple[int, str]]:
    """``Class.method`` -> (index in _valid_objects(), method name), for the library's objects."""
    found: dict[str, tuple[int, str]] = {}
    for i, obj in enumerate(_valid_objects()):
        cls = type(obj)
        if not cls.__module__.startswith(("bastion.", "sim.")):
            continue
        for attr in _own_methods(cls):
            if isinstance(inspect.getattr_static(obj, attr), classmethod | staticmethod):
                continue  # fuzzed with the class's constructors
            found.setdefault(f"{cls.__module__}.{cls.__qualname__}.{attr}", (i, attr))
    return found


CLASS_METHODS = _class_methods()
INSTANCE_METHODS = _instance_methods()


def _fuzz(name: str, fn: Callable[..., Any], directory: Path) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(call_arguments(fn, directory))
    def run(call: tuple[list[object], dict[str, object]]) -> None:
        only_project_errors(name, fn, *call)

    run()


@pytest.mark.parametrize("name", sorted(CLASS_METHODS))
def test_class_constructors_refuse_junk_with_project_errors(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _fuzz(name, CLASS_METHODS[name], tmp_path)


@pytest.mark.parametrize("name", sorted(INSTANCE_METHODS))
def test_methods_of_library_objects_refuse_junk_with_project_errors(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy

    monkeypatch.chdir(tmp_path)
    index, attr = INSTANCE_METHODS[name]
    obj = copy.deepcopy(_valid_objects()[index])  # observe() and the like change their object
    _fuzz(name, getattr(obj, attr), tmp_path)


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


def _cost_model() -> Any:
    return next(o for o in _valid_objects() if type(o).__name__ == "RooflineCostModel")


def _marginals() -> Any:
    from bastion.tree import DraftMarginals

    return DraftMarginals([[1, 2], [3, 4]], [[0.6, 0.3], [0.5, 0.2]])


def _from_distributions() -> object:
    from bastion.tree import DraftMarginals

    return DraftMarginals.from_distributions(np.full((2, 4), 0.25), k=1.5)  # type: ignore[arg-type]


def _one_root_for_two() -> object:
    from bastion.tree import best_first_trees

    return best_first_trees([_marginals(), _marginals()], 4, [7])


def _source_returns_none() -> object:
    from bastion.budget import choose_tree

    return choose_tree(_marginals(), lambda n: None, 8)  # type: ignore[arg-type,return-value]


def _context_none() -> object:
    from bastion.interfaces import StepLoad

    return _cost_model().cost_curve(8, StepLoad(context_len=None))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        pytest.param(
            _from_distributions,
            "BudgetError",
            r"from_distributions: k must be an integer in \[1, 4\]; got 1\.5",
            id="from_distributions-k-1.5",
        ),
        pytest.param(
            _one_root_for_two,
            "ArgumentError",
            r"best_first_trees: batch and root_tokens must have the same length; batch has 2, "
            r"root_tokens has 1",
            id="best_first_trees-one-root-two-requests",
        ),
        pytest.param(
            _source_returns_none,
            "CostModelError",
            r"must return a CostCurve pricing N = 1 … \d+; got None",
            id="choose_tree-source-returns-None",
        ),
        pytest.param(
            _context_none,
            "BudgetError",
            r"StepLoad: context_len must be an integer ≥ 0; got None",
            id="cost_curve-context-None",
        ),
        pytest.param(
            lambda: _cost_model().cost_curve(8, None),
            "BudgetError",
            r"RooflineCostModel\.cost_curve: load must be a StepLoad; got None",
            id="cost_curve-load-None",
        ),
        pytest.param(
            lambda: _cost_model().bucket(None),
            "BudgetError",
            r"RooflineCostModel\.bucket: context_len must be an integer ≥ 0; got None",
            id="bucket-None",
        ),
    ],
)
def test_the_inputs_of_issue_35_are_project_errors(
    call: Callable[[], object], error: str, message: str
) -> None:
    """The four inputs a new user tried (and two of their siblings) are the project's errors,
    naming what was given and what is accepted, not a TypeError, ValueError or AttributeError
    from deep inside."""
    import bastion.errors

    with pytest.raises(BastionError, match=message) as caught:
        call()
    assert type(caught.value) is getattr(bastion.errors, error)


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
