"""The guard's checks for the body of a public function: a value as an int, a float, an array.

Plain functions raising :class:`ArgumentError` (or the error the caller names) whose message
names the argument: :func:`as_int`, :func:`as_float`, :func:`finite_array`,
:func:`same_length`, :func:`output_path`, the test :func:`is_finite`, and :func:`forwarded` for
a caller's arguments the library hands on to another public function as they came.
"""

from __future__ import annotations

import collections.abc as cabc
import math
import os
from pathlib import Path

import numpy as np

from bastion.errors import ArgumentError, BastionError, ConfigError
from bastion.guard.checks import _range, _shown
from bastion.guard.decorator import F, public

__all__ = [
    "as_float",
    "as_int",
    "finite_array",
    "forwarded",
    "is_finite",
    "output_path",
    "same_length",
]


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


# the helpers are public too: their own arguments are checked when a caller outside the library
# hands them over (the library's own calls pass straight through)
as_int = public(as_int)
as_float = public(as_float)
finite_array = public(finite_array)
same_length = public(same_length)
forwarded = public(forwarded)
output_path = public(output_path)
