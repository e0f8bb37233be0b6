"""The guard on the public API: arguments are checked where a caller hands them over.

One layer, raising :class:`ArgumentError` (or the error a function names) whose message names
the function and the argument, says what it got and what is accepted:

- :func:`public`, the decorator on every public function and class (its ``__init__``) that
  takes arguments, and on the methods that take a caller's input (a class's constructors such
  as ``from_dict``, a cost model's ``cost_curve``): each argument is checked against the
  parameter's annotation — ``int`` takes an integer (not a bool) within ±2**63, ``float`` a
  finite real number (±inf too where the default is infinite), ``str``/``bool`` their type,
  ``Path`` a ``str`` or ``os.PathLike`` (converted to a ``Path``), a class an instance of it,
  ``Sequence[X]``/``list[X]``/``Mapping`` their container and items, ``Literal`` one of its
  values, a ``Callable`` something callable, ``npt.NDArray`` a numeric numpy array,
  ``npt.ArrayLike`` a numeric array-like; ``None`` only where the annotation or the default
  allows it. ``Any``, type variables and protocols are not checked (duck typing stays).
- rules for what an annotation cannot say, given to the decorator by parameter name
  (:func:`integer`, :func:`number`, :func:`array`, :func:`each`, :func:`has`,
  :func:`mapping_with`, :func:`readable_file`, :func:`writable_file`), and agreements between
  parameters (``lengths=``, ``broadcast=``);
- the same checks as plain functions for a function body (:func:`as_int`, :func:`as_float`,
  :func:`finite_array`, :func:`same_length`, :func:`output_path`), and :func:`forwarded` for a
  caller's arguments the library hands on to another public function as they came.

Past the boundary nothing is checked again: a call from the library's own modules
(``bastion.*`` and the simulator, but not the command line, which hands over what a user typed)
goes straight to the function after one frame look-up (well under a microsecond). The functions
a decode step calls several times — the best-first builders (``best_first``,
``best_first_many``, ``buildable_nodes``), ``tree_from_arrays``, ``learner_of``,
``bastion.cycles.batch_bucket`` and ``lattice_index`` — are not decorated: each checks its
arguments in its body at the cost of one conversion or ``isinstance``. The per-step methods of
the controller and the policies are not checked again (their object was checked when it was
built). What this module does not do: check the inside of arrays beyond their kind unless a rule
says so.
"""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import math
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bastion.errors import ArgumentError, BastionError, ConfigError

__all__ = [
    "INT64_LIMIT",
    "array",
    "as_float",
    "as_int",
    "each",
    "finite_array",
    "forwarded",
    "has",
    "integer",
    "is_finite",
    "mapping_with",
    "number",
    "output_path",
    "public",
    "public_surface",
    "readable_file",
    "rules_table",
    "same_length",
    "writable_file",
]

INT64_LIMIT = 2**63
_INTERNAL = ("bastion.", "sim.")  # callers whose calls are past the boundary (not checked again)
_OUTSIDE = ("bastion.cli",)  # … except the command line, which hands over what a user typed
F = TypeVar("F", bound=Callable[..., Any])
Check = Callable[[object], str | None]  # None when the value passes, else what is accepted


# --------------------------------------------------------------------------------------------
# Helpers for the body of a public function
# --------------------------------------------------------------------------------------------


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_finite(value: object) -> bool:
    """Whether ``value`` is a real number (not a bool) that is finite as a float: an integer
    too large for a float is not (``math.isfinite`` would raise ``OverflowError`` on it)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def as_int(
    value: object,
    name: str,
    lo: int | None = None,
    hi: int | None = None,
    error: type[BastionError] = ArgumentError,
) -> int:
    """``value`` as an int in [lo, hi] (an integer, not a bool; a float with no fraction is not
    taken), or ``error`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise error(f"{name} must be an integer{_range(lo, hi)}; got {_shown(value)}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise error(f"{name} must be an integer{_range(lo, hi)}; got {_shown(v)}")
    return v


def as_float(
    value: object,
    name: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    positive: bool = False,
    error: type[BastionError] = ArgumentError,
) -> float:
    """``value`` as a finite float in [lo, hi] (> 0 with ``positive``), or ``error`` naming
    ``name``. Integers too large for a float are refused, not an OverflowError."""
    what = "a finite number" + (" > 0" if positive else "") + _range(lo, hi)
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise error(f"{name} must be {what}; got {_shown(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise error(f"{name} must be {what}; got an integer too large for a float") from None
    if (
        not math.isfinite(v)
        or (positive and v <= 0)
        or (lo is not None and v < lo)
        or (hi is not None and v > hi)
    ):
        raise error(f"{name} must be {what}; got {_shown(value)}")
    return v


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" ≥ {lo}"
    if hi is not None:
        return f" ≤ {hi}"
    return ""


def finite_array(
    value: object,
    name: str,
    ndim: int | None = None,
    *,
    nonempty: bool = False,
    error: type[BastionError] = ArgumentError,
) -> np.ndarray:
    """``value`` as a float64 array of finite numbers (``ndim`` dimensions if given), or
    ``error`` naming ``name``."""
    if value is None or isinstance(value, str | bytes | cabc.Mapping):
        raise error(f"{name} must be an array of finite numbers; got {_shown(value)}")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise error(
            f"{name} must be an array of finite numbers; got {_shown(value)} ({exc})"
        ) from None
    if ndim is not None and arr.ndim != ndim:
        raise error(f"{name} must be a {ndim}-D array of finite numbers; got shape {arr.shape}")
    if nonempty and arr.size == 0:
        raise error(f"{name} must not be empty")
    if not np.all(np.isfinite(arr)):
        raise error(f"{name} must hold finite numbers only; got NaN or ±inf")
    return arr


def same_length(error: type[BastionError] = ArgumentError, **named: cabc.Sized) -> int:
    """The common length of the named sequences, or ``error`` listing each length."""
    lengths = {name: len(value) for name, value in named.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{n} has {k}" for n, k in lengths.items())
        raise error(f"{' and '.join(lengths)} must have the same length; {shown}")
    return next(iter(lengths.values()), 0)


def forwarded(fn: F) -> F:
    """``fn`` (a function or method decorated with :func:`public`) checking its arguments even
    when the library calls it: for a caller's arguments the library hands on as they came
    (``**sweep_kwargs``), which a call from the library would otherwise skip. A function that
    is not decorated is returned as it is."""
    return getattr(fn, "__checked__", fn)


def output_path(value: object, name: str = "path") -> Path:
    """A file path that can be written (not a directory, not under a regular file), or a
    :class:`ConfigError`; missing parent folders are fine."""
    from bastion.paths import check_output_file

    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{name} must be a file path (str or os.PathLike); got {_shown(value)}")
    return check_output_file(value, name)


# --------------------------------------------------------------------------------------------
# Rules for what an annotation cannot say, given to the decorator: ``@public(n=integer(lo=1))``
# --------------------------------------------------------------------------------------------


def _described(check: Check, what: str) -> Check:
    """``check`` carrying ``what`` it accepts (docs/errors.md's table is made from it)."""
    check.what = what  # type: ignore[attr-defined]
    return check


def describe(check: Check) -> str:
    """What a rule accepts, in words."""
    return str(getattr(check, "what", getattr(check, "__doc__", "") or "")).strip()


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """An integer (not a bool) in [lo, hi], within ±2**63 when unbounded."""
    what = "an integer" + _range(lo, hi)

    def check(value: object) -> str | None:
        if _int_check(value) is not None:
            return what if lo is not None or hi is not None else _int_check(value)
        v = int(value)  # type: ignore[call-overload]
        return what if (lo is not None and v < lo) or (hi is not None and v > hi) else None

    return _described(check, what)


def number(lo: float | None = None, hi: float | None = None, *, positive: bool = False) -> Check:
    """A finite real number in [lo, hi] (> 0 with ``positive``)."""
    what = "a finite number" + (" > 0" if positive else "") + _range(lo, hi)
    finite = _float_check(False)

    def check(value: object) -> str | None:
        if finite(value) is not None:
            return what
        v = float(value)  # type: ignore[arg-type]
        bad = (positive and v <= 0) or (lo is not None and v < lo) or (hi is not None and v > hi)
        return what if bad else None

    return _described(check, what)


def array(
    ndim: int | None = None,
    lo: float | None = None,
    hi: float | None = None,
    *,
    nonempty: bool = False,
    positive: bool = False,
    whole: bool = False,
) -> Check:
    """A numeric array-like of finite numbers in [lo, hi] (> 0 with ``positive``), with ``ndim``
    dimensions if given."""
    shape = f"a {ndim}-D array" if ndim is not None else "an array"
    what = (
        shape
        + (" (not empty)" if nonempty else "")
        + (" of whole numbers" if whole else " of finite numbers")
        + (" > 0" if positive else "")
        + _range(lo, hi)
    )

    def check(value: object) -> str | None:
        if _array_check(value) is not None:
            return what
        try:
            if np.asarray(value).dtype.kind in "USV":  # "3": a string is not a number here
                return what
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            return what
        if (ndim is not None and arr.ndim != ndim) or (nonempty and arr.size == 0):
            return what + f" (got shape {arr.shape})"
        if arr.size and not (
            np.all(np.isfinite(arr))
            and (not positive or float(arr.min()) > 0)
            and (not whole or bool(np.all(arr == np.round(arr))))
            and (not whole or float(np.abs(arr).max()) < INT64_LIMIT)
            and (lo is None or float(arr.min()) >= lo)
            and (hi is None or float(arr.max()) <= hi)
        ):
            return what
        return None

    return _described(check, what)


def each(check: Check) -> Check:
    """A sequence (list, tuple or 1-D array) whose every item passes ``check``."""

    def every(value: object) -> str | None:
        if isinstance(value, np.ndarray) and value.ndim != 1:
            return "a sequence (list or tuple)"
        if not isinstance(value, Sequence | np.ndarray) or isinstance(value, str | bytes):
            return "a sequence (list or tuple)"
        for item in value:
            if (want := check(item)) is not None:
                return f"a sequence whose items are each {want}"
        return None

    return _described(every, f"a sequence whose items are each {describe(check)}")


def has(*attributes: str) -> Check:
    """An object with these attributes (a loaded model, a drafter…): duck typing, not a class."""
    what = "an object with " + ", ".join(f".{a}" for a in attributes)

    def check(value: object) -> str | None:
        return None if all(hasattr(value, a) for a in attributes) else what

    return _described(check, what)


def mapping_with(*keys: str) -> Check:
    """A mapping (dict) holding at least these keys."""
    what = "a mapping with the keys " + ", ".join(map(repr, keys))

    def check(value: object) -> str | None:
        return None if isinstance(value, cabc.Mapping) and all(k in value for k in keys) else what

    return _described(check, what)


def readable_file(value: object) -> str | None:
    """a path to an existing regular file (not a directory)"""
    if _path_check(value) is not None:
        return "a path to an existing file"
    path = Path(value)  # type: ignore[arg-type]
    return None if path.is_file() else "a path to an existing file (not a directory)"


def writable_file(value: object) -> str | None:
    """a file path that can be written: not a directory, not under a regular file"""
    if _path_check(value) is not None or str(value) == "":
        return "a file path (str or os.PathLike)"
    path = Path(value)  # type: ignore[arg-type]
    if path.is_dir() or path.name in ("", ".", ".."):
        return "a file path, not a directory"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return None if parent.is_dir() else f"a file path ({parent} is not a directory)"


# --------------------------------------------------------------------------------------------
# The decorator: checks from annotations
# --------------------------------------------------------------------------------------------


def _int_check(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return "an integer"
    if not -INT64_LIMIT <= int(value) < INT64_LIMIT:
        return "an integer within ±2**63"
    return None


def _float_check(allow_inf: bool) -> Check:
    what = "a number (not NaN)" if allow_inf else "a finite number"

    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            return what
        try:
            v = float(value)
        except OverflowError:
            return what + " (this integer is too large for a float)"
        if math.isnan(v) or (not allow_inf and math.isinf(v)):
            return what
        return None

    return check


def _instance_check(cls: type, what: str) -> Check:
    def check(value: object) -> str | None:
        return None if isinstance(value, cls) else what

    return check


def _path_check(value: object) -> str | None:
    if not isinstance(value, str | os.PathLike) or "\x00" in os.fspath(value):
        return "a path (str or os.PathLike, no NUL character)"
    return None


def _array_check(value: object) -> str | None:
    if value is None or isinstance(value, str | bytes | cabc.Mapping | cabc.Set):
        return "an array of numbers"
    if isinstance(value, np.ndarray):
        return None if value.dtype.kind in "biuf" else "an array of numbers"
    if isinstance(value, int | float | np.number | cabc.Sequence):
        return None
    return "an array of numbers"


def _ndarray_check(value: object) -> str | None:
    ok = isinstance(value, np.ndarray) and value.dtype.kind in "biuf"
    return None if ok else "a numpy array of numbers"


def _callable_check(value: object) -> str | None:
    return None if callable(value) else "a callable"


def _name_of(tp: object) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _is_array_type(tp: object) -> bool:
    """numpy.ndarray, npt.NDArray[...] or one of the members of npt.ArrayLike's union."""
    origin = typing.get_origin(tp) or tp
    return origin is np.ndarray or "_SupportsArray" in str(origin)


def _checker(tp: object, allow_inf: bool = False) -> Check | None:
    """A check for annotation ``tp``, or None when it is not checked (Any, TypeVar, protocol)."""
    if tp is Any or tp is object or isinstance(tp, TypeVar) or tp is inspect.Parameter.empty:
        return None
    if (typing.get_origin(tp) or tp) is np.ndarray:
        return _ndarray_check
    if _is_array_type(tp):
        return _array_check
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        if any(_is_array_type(a) for a in args):
            return _array_check  # numpy's ArrayLike is a union of everything array-like
        pathish = any((typing.get_origin(a) or a) in (os.PathLike, Path) for a in args)
        members = [a for a in args if a is not type(None) and not (pathish and a is str)]
        checks = [_checker(a, allow_inf) for a in members]  # str | PathLike: one path check
        if any(c is None for c in checks):
            return None
        none_ok = type(None) in args

        def union(value: object) -> str | None:
            if value is None and none_ok:
                return None
            wants = [c(value) for c in checks]  # type: ignore[misc]
            return None if any(w is None for w in wants) else " or ".join(map(str, wants))

        return union
    if origin is typing.Literal:

        def literal(value: object) -> str | None:
            ok = any(type(value) is type(a) and value == a for a in args)
            return None if ok else "one of " + ", ".join(map(repr, args))

        return literal
    if origin is typing.Annotated:
        return _checker(args[0], allow_inf)
    if origin is type and args and isinstance(args[0], type):
        base = args[0]

        def subclass(value: object) -> str | None:
            ok = isinstance(value, type) and issubclass(value, base)
            return None if ok else f"a subclass of {base.__name__}"

        return subclass
    if tp is int:
        return _int_check
    if tp is float:
        return _float_check(allow_inf)
    if tp is bool:
        return _instance_check(bool | np.bool_, "a bool")  # type: ignore[arg-type]
    if tp is str:
        return _instance_check(str, "a str")
    if tp is Path or tp is os.PathLike or origin is os.PathLike:
        return _path_check
    if origin in (cabc.Callable,) or tp is cabc.Callable:
        return _callable_check
    if origin in (list, tuple, cabc.Sequence, cabc.Iterable, cabc.Collection, set, frozenset):
        return _container_check(origin, args, allow_inf)
    if origin in (dict, cabc.Mapping, cabc.MutableMapping):
        inner = _checker(args[1], allow_inf) if len(args) == 2 else None
        keys = _checker(args[0], allow_inf) if len(args) == 2 else None
        return _mapping_check(keys, inner)
    if isinstance(tp, type):
        if getattr(tp, "_is_protocol", False):
            return None
        if tp in (list, tuple, dict, set, frozenset):
            return _instance_check(tp, f"a {tp.__name__}")
        return _instance_check(tp, f"a {_name_of(tp)}")
    return None


def _container_check(origin: object, args: tuple[Any, ...], allow_inf: bool) -> Check:
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [_checker(a, allow_inf) for a in args]

        def fixed(value: object) -> str | None:
            if not isinstance(value, Sequence) or isinstance(value, str | bytes):
                return f"a sequence of {len(items)}"
            if len(value) != len(items):
                return f"a sequence of {len(items)} items"
            for item, check in zip(value, items, strict=True):
                if check is not None and (want := check(item)) is not None:
                    return f"a sequence of {len(items)} whose items are each {want}"
            return None

        return fixed
    inner = _checker(args[0], allow_inf) if args else None
    iterable_only = origin in (cabc.Iterable, cabc.Collection, set, frozenset)
    arrays_ok = inner in (None, _int_check) or (args and args[0] is float)

    def container(value: object) -> str | None:
        if isinstance(value, str | bytes) and args and (args[0] is not str or type(value) is bytes):
            return "a sequence (not a string)"
        if isinstance(value, np.ndarray) and value.ndim == 0:
            return "a sequence (list or tuple)"
        if iterable_only:
            if not isinstance(value, cabc.Iterable):
                return "an iterable"
            if inner is None or not isinstance(value, cabc.Collection):
                return None  # an iterator is consumed by the function, not here
        elif isinstance(value, np.ndarray):
            if not arrays_ok or value.ndim == 0:
                return "a sequence (list or tuple)"
        elif not isinstance(value, Sequence):
            return "a sequence (list or tuple)"
        if inner is not None:
            for item in value:
                if (want := inner(item)) is not None:
                    return f"a sequence whose items are each {want}"
        return None

    return container


def _mapping_check(keys: Check | None, inner: Check | None) -> Check:
    def mapping(value: object) -> str | None:
        if not isinstance(value, cabc.Mapping):
            return "a mapping (dict)"
        for k, v in value.items():
            if keys is not None and (want := keys(k)) is not None:
                return f"a mapping whose keys are each {want}"
            if inner is not None and (want := inner(v)) is not None:
                return f"a mapping whose values are each {want}"
        return None

    return mapping


def _plan(fn: Callable[..., Any], own: frozenset[str], rules: dict[str, Check]) -> Any:
    """(signature, {name: check}) for ``fn``, from its resolved annotations."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation names something imported for type checking only
        hints = {}
        scope = getattr(inspect.unwrap(fn), "__globals__", {})
        for p in sig.parameters.values():
            try:
                hints[p.name] = (
                    eval(p.annotation, scope) if isinstance(p.annotation, str) else p.annotation
                )
            except Exception:  # that one parameter stays unchecked
                continue
    checks: dict[str, tuple[Check, bool]] = {}
    paths: set[str] = set()  # parameters annotated Path: a str is taken and converted
    for p in sig.parameters.values():
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        tp = hints.get(p.name, inspect.Parameter.empty)
        default = p.default
        allow_inf = isinstance(default, float) and math.isinf(default)
        check = rules.get(p.name) or (None if p.name in own else _checker(tp, allow_inf))
        if check is not None:
            checks[p.name] = (check, default is None)
        if tp is Path or tp == Path | None:
            paths.add(p.name)
    return sig, checks, frozenset(paths)


_frame = sys._getframe
_inside: dict[object, bool] = {}  # calling module's name -> whether its calls are the library's


def _is_internal(module: object) -> bool:
    return (
        isinstance(module, str) and module.startswith(_INTERNAL) and not module.startswith(_OUTSIDE)
    )


def _length(value: object) -> int | None:
    try:
        return len(value)  # type: ignore[arg-type]
    except TypeError:  # None, a scalar, a 0-d array: the parameter's own check speaks
        return None


def _guarded(
    fn: Callable[..., Any],
    where: str,
    error: type[BastionError],
    own: frozenset[str],
    rules: dict[str, Check],
    lengths: tuple[str, ...],
    broadcast: tuple[str, ...] = (),
) -> Callable[..., Any]:
    code = getattr(fn, "__code__", None)
    if code is not None and not code.co_flags & inspect.CO_VARKEYWORDS:
        # a rule for a parameter the function does not have is the decorator's mistake (it
        # would check nothing): refused when the module is imported, from the code object
        params = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        unknown = (set(rules) | own | set(lengths) | set(broadcast)) - params
        if unknown:
            raise ArgumentError(f"public({where}): no parameter {', '.join(sorted(unknown))}")
    plan: list[Any] = []

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caller = _frame(1).f_globals.get("__name__")
        inside = _inside.get(caller)
        if inside is None:
            inside = _inside[caller] = _is_internal(caller)
        if inside:
            return fn(*args, **kwargs)  # past the boundary: the library's own call
        return checked(*args, **kwargs)

    def checked(*args: Any, **kwargs: Any) -> Any:
        if not plan:
            plan.append(_plan(fn, own, rules))
        sig, checks, paths = plan[0]
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise error(f"{where}: {exc}") from None
        for name, value in bound.arguments.items():
            entry = checks.get(name)
            if entry is None or (value is None and entry[1]):
                continue
            want = entry[0](value)
            if want is not None:
                raise error(f"{where}: {name} must be {want}; got {_shown(value)}")
        if lengths:
            present = {n: _length(bound.arguments.get(n)) for n in lengths}
            sized = {n: k for n, k in present.items() if k is not None}
            if len(set(sized.values())) > 1:
                shown = ", ".join(f"{n} has {k}" for n, k in sized.items())
                raise error(f"{where}: {' and '.join(sized)} must have the same length; {shown}")
        if broadcast:
            shapes = {n: np.shape(bound.arguments[n]) for n in broadcast if n in bound.arguments}
            try:
                np.broadcast_shapes(*shapes.values())
            except ValueError:
                shown = ", ".join(f"{n} has shape {k}" for n, k in shapes.items())
                raise error(
                    f"{where}: {' and '.join(shapes)} must broadcast together; {shown}"
                ) from None
        convert = [n for n in paths if isinstance(bound.arguments.get(n), str | os.PathLike)]
        if any(not isinstance(bound.arguments[n], Path) for n in convert):
            for n in convert:
                bound.arguments[n] = Path(bound.arguments[n])
            return fn(*bound.args, **bound.kwargs)
        return fn(*args, **kwargs)

    wrapper.__checked__ = checked  # type: ignore[attr-defined]
    wrapper.__guard__ = {  # type: ignore[attr-defined]
        "error": error.__name__,
        "rules": {name: describe(rule) for name, rule in rules.items()},
        "own": sorted(own),
        "lengths": list(lengths),
        "broadcast": list(broadcast),
    }
    return wrapper


@typing.overload
def public(obj: F) -> F: ...
@typing.overload
def public(
    *,
    error: type[BastionError] = ...,
    own: Sequence[str] = ...,
    lengths: Sequence[str] = ...,
    broadcast: Sequence[str] = ...,
    **rules: Check,
) -> Callable[[F], F]: ...


def public(
    obj: Any = None,
    *,
    error: type[BastionError] = ArgumentError,
    own: Sequence[str] = (),
    lengths: Sequence[str] = (),
    broadcast: Sequence[str] = (),
    **rules: Check,
) -> Any:
    """Check a public function's (or class's ``__init__``) arguments against its annotations;
    a ``str`` given for a parameter annotated ``Path`` is converted to a ``Path``.

    ``error`` is raised for a bad argument (default :class:`ArgumentError`); ``own`` names the
    parameters the function checks itself with its own rule and error (a budget of any size,
    cut to what can be built, refused with a :class:`BudgetError`); ``lengths`` names sized
    parameters whose lengths must agree, ``broadcast`` arrays whose shapes must broadcast
    together; each keyword rule (:func:`integer`, :func:`number`,
    :func:`array`, :func:`readable_file`, :func:`writable_file`) replaces the annotation's check
    of the parameter it names."""

    def decorate(target: Any) -> Any:
        if not callable(target) or not hasattr(target, "__name__"):
            raise ArgumentError(f"public decorates a function or a class; got {_shown(target)}")
        skip = frozenset(own)
        if isinstance(target, type):
            init = target.__init__  # type: ignore[misc]
            target.__init__ = _guarded(  # type: ignore[misc]
                init, target.__name__, error, skip, rules, tuple(lengths), tuple(broadcast)
            )
            return target
        qualname = getattr(target, "__qualname__", "")
        where = target.__name__ if not qualname or "<locals>" in qualname else qualname
        return _guarded(target, where, error, skip, rules, tuple(lengths), tuple(broadcast))

    return decorate if obj is None else decorate(obj)


def public_surface(torch: bool = True) -> dict[str, Callable[..., Any]]:
    """Every public callable of the package: the functions and classes each module of
    ``bastion`` (the simulator as ``bastion.sim``; the torch backend when ``torch`` is true and
    torch is installed; not the command line) names in its ``__all__`` and defines itself,
    protocols and exception classes left out — by qualified name. Importing is the only effect."""
    import importlib
    import importlib.util
    import pkgutil

    import bastion

    names = ["bastion"]
    for info in pkgutil.walk_packages(bastion.__path__, "bastion."):
        if info.name.startswith(("bastion.cli", "bastion.__main__")):
            continue
        no_torch = not torch or importlib.util.find_spec("torch") is None
        if info.name.startswith("bastion.backends.torch") and no_torch:
            continue
        names.append(info.name)
    found: dict[str, Callable[..., Any]] = {}
    for name in sorted(names):
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if not callable(obj) or getattr(obj, "__module__", None) != name:
                continue  # constants, and names re-exported from where they are defined
            if isinstance(obj, type) and (
                getattr(obj, "_is_protocol", False) or issubclass(obj, BaseException)
            ):
                continue
            found[f"{name}.{attr}"] = obj
    return found


def rules_table(surface: dict[str, Callable[..., Any]] | None = None) -> str:
    """The rules beyond the annotations, one Markdown row per argument of each public callable
    and of the guarded methods of each public class: what docs/errors.md lists (``python
    docs/make_guard_table.py`` rewrites it from this)."""
    rows = ["| callable | argument | accepts | error |", "|---|---|---|---|"]
    guarded: list[tuple[str, Any]] = []
    for name, obj in (surface or public_surface()).items():
        if not isinstance(obj, type):
            guarded.append((name, obj))
            continue
        guarded.append((name, obj.__init__))  # type: ignore[misc]
        for attr, raw in vars(obj).items():  # its guarded methods, constructors included
            method = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
            if not attr.startswith("_") and hasattr(method, "__guard__"):
                guarded.append((f"{name}.{attr}", method))
    for name, target in sorted(guarded):
        meta = getattr(target, "__guard__", None)
        if meta is None:
            continue
        short = name.removeprefix("bastion.")
        error = meta["error"]
        for arg, what in meta["rules"].items():
            rows.append(f"| `{short}` | `{arg}` | {what} | `{error}` |")
        for arg in meta["own"]:
            rows.append(f"| `{short}` | `{arg}` | checked by the function itself | — |")
        if meta["lengths"]:
            args = ", ".join(f"`{a}`" for a in meta["lengths"])
            rows.append(f"| `{short}` | {args} | the same length | `{error}` |")
        if meta["broadcast"]:
            args = ", ".join(f"`{a}`" for a in meta["broadcast"])
            rows.append(f"| `{short}` | {args} | shapes that broadcast together | `{error}` |")
    return "\n".join(rows) + "\n"


# the helpers are public too: their own arguments are checked when a caller outside the library
# hands them over (the library's own calls pass straight through)
as_int = public(as_int)
as_float = public(as_float)
finite_array = public(finite_array)
same_length = public(same_length)
forwarded = public(forwarded)
output_path = public(output_path)
integer = public(integer)
number = public(number)
array = public(array)
has = public(has)
each = public(each)
mapping_with = public(mapping_with)
public_surface = public(public_surface)
rules_table = public(rules_table)
public = public(public)  # the decorator's own options are checked too
