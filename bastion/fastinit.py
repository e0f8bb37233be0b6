"""Trusted constructors of frozen dataclasses, for the few objects a decode step builds many of.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__``
(a call per field, after the class call itself): ≈ 1.6 µs for a nine-field record, and a
simulated step builds a dozen such records (its requests, trees, choice, verification and step
records). :func:`trusted_init` returns a function that builds the same object — the same class,
the same instance dictionary — by filling the new instance's ``__dict__`` with one
``dict.update`` of its fields (≈ 0.5 µs). It runs no ``__post_init__`` and checks nothing, so
it is only for classes without one (or whose one only normalises fields the caller passes
normalised), called by the library's own per-step code with arguments it built itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from bastion.errors import ArgumentError

__all__ = ["trusted_init"]

T = TypeVar("T")


def trusted_init(cls: type[T], *, normalised: bool = False) -> Callable[..., T]:
    """A constructor of the frozen dataclass ``cls`` taking its fields as its ``__init__`` does
    (positionally or by name, with the same defaults), without running ``__init__``.

    ``normalised``: ``cls`` may have a ``__post_init__`` that only normalises its fields (a
    dtype, a copy), and every caller passes fields already in that form; it is not run."""
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise ArgumentError(f"trusted_init: {cls!r} is not a dataclass")
    if not isinstance(normalised, bool):
        raise ArgumentError(f"trusted_init: normalised must be a bool; got {normalised!r}")
    if (hasattr(cls, "__post_init__") and not normalised) or hasattr(cls, "__slots__"):
        raise ArgumentError(f"trusted_init: {cls.__name__} needs its __init__ (post-init, slots)")
    names = [f.name for f in dataclasses.fields(cls)]
    # The generated function's own names (its globals and the new object) start with a prefix
    # no field name starts with: a field named like one of them would otherwise shadow it.
    pre = "_ti"
    while any(n.startswith(pre) for n in names):
        pre += "_"
    params, items = [], []
    env: dict[str, Any] = {f"{pre}new": object.__new__, f"{pre}cls": cls}
    for i, f in enumerate(dataclasses.fields(cls)):
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise ArgumentError(f"trusted_init: {cls.__name__}.{f.name} needs its __init__")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            env[f"{pre}d{i}"] = f.default
            params.append(f"{f.name}={pre}d{i}")
        items.append(f"{f.name!r}: {f.name}")
    # One dict.update of a literal, not a store per key: CPython 3.11 keeps an instance dict
    # filled key by key split (its keys shared with the class), and its attribute reads then
    # miss the interpreter's specialised fast path (≈ 250 more instructions a read);
    # ``update`` of an empty dict clones the literal into a combined table, which they hit.
    src = (
        f"def make({', '.join(params)}):\n    {pre}o = {pre}new({pre}cls)\n"
        f"    {pre}o.__dict__.update({{{', '.join(items)}}})\n    return {pre}o\n"
    )
    exec(src, env)  # the source: the dataclass's own field names
    make: Callable[..., T] = env["make"]
    make.__doc__ = f"{cls.__name__}(...) without its __init__ (bastion.fastinit.trusted_init)."
    return make
