"""The decorator public: a public callable's arguments checked where a caller hands them over.

Each argument is checked against its parameter's annotation (:mod:`bastion.guard.checks`) or the
rule given for it by name (:mod:`bastion.guard.rules`), and the agreements between parameters
(``lengths=``, ``broadcast=``). A call from the library's own modules is past the boundary and
goes straight to the function after one frame look-up.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bastion.errors import ArgumentError, BastionError
from bastion.guard.checks import Check, _checker, _shown, describe

__all__ = ["public"]

_INTERNAL = ("bastion.", "sim.")  # callers whose calls are past the boundary (not checked again)
_OUTSIDE = ("bastion.cli",)  # … except the command line, which hands over what a user typed
F = TypeVar("F", bound=Callable[..., Any])


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


public = public(public)  # the decorator's own options are checked too


def unchecked(fn: F) -> F:
    """The function a :func:`public` function's guard calls for the library's own callers
    (``fn`` itself where it is not guarded): what a per-step caller inside the library binds
    once, so a hot call skips even the guard's frame look-up."""
    return typing.cast(F, getattr(fn, "__wrapped__", fn))
