"""The guard's checks of a value against a parameter's annotation, and the wording they share.

:func:`_checker` turns an annotation (``int``, ``float``, ``Path``, ``Sequence[X]``, ``Literal``,
a union, a class…) into a check: a function of the value returning None when it passes, else
what is accepted, in words. The decorator (:mod:`bastion.guard.decorator`) plans its checks
from here; the rules (:mod:`bastion.guard.rules`) reuse the basic ones.
"""

from __future__ import annotations

import collections.abc as cabc
import inspect
import math
import os
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = ["INT64_LIMIT", "Check"]

INT64_LIMIT = 2**63
Check = Callable[[object], str | None]  # None when the value passes, else what is accepted


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" ≥ {lo}"
    if hi is not None:
        return f" ≤ {hi}"
    return ""


def _described(check: Check, what: str) -> Check:
    """``check`` carrying ``what`` it accepts (docs/errors.md's table is made from it)."""
    check.what = what  # type: ignore[attr-defined]
    return check


def describe(check: Check) -> str:
    """What a rule accepts, in words."""
    return str(getattr(check, "what", getattr(check, "__doc__", "") or "")).strip()


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
