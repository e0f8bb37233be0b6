"""Rules for what an annotation cannot say, given to :func:`public` by parameter name.

``@public(n=integer(lo=1))``: each rule is a check (None when the value passes, else what is
accepted) carrying what it accepts in words, from which docs/errors.md's table is made.
"""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bastion.guard.checks import (
    INT64_LIMIT,
    Check,
    _array_check,
    _described,
    _float_check,
    _int_check,
    _path_check,
    _range,
    describe,
)
from bastion.guard.decorator import public

__all__ = [
    "array",
    "each",
    "has",
    "integer",
    "mapping_with",
    "number",
    "readable_file",
    "writable_file",
]


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


# the rule makers are public too: their own arguments are checked when a caller outside the
# library hands them over
integer = public(integer)
number = public(number)
array = public(array)
has = public(has)
each = public(each)
mapping_with = public(mapping_with)
