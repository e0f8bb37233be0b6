"""Plug-ins: a researcher's own objects (policies, cost models…) by import path or by name.

A *plug-in spec* names something outside the package without editing it:

- ``package.module:Attr`` — import ``package.module`` and take ``Attr`` (dots allowed for a
  nested attribute, ``module:Outer.Inner``). A module that is not importable from ``sys.path`` is
  looked up in the current directory too, so ``mypolicies:Greedy`` works next to
  ``mypolicies.py`` from the ``bastion`` command as it does from ``python -m``.
- ``path/to/file.py:Attr`` — load the file as a module and take ``Attr``.
- ``NAME`` — a short name registered by an installed distribution under an entry-point group
  (``bastion.policies`` for policies)::

      [project.entry-points."bastion.policies"]
      greedy = "mypolicies:Greedy"

Any of them may end in ``:ARGS``, a comma-separated argument list: ``key=value`` items become
keyword arguments, the others positional ones; each value is read as an int, a float, ``true`` /
``false``, or else kept as a string (``mymod:Greedy:32,depth=7``). ``Attr`` may be a class or a
factory (called with the arguments) or a ready object (then no arguments are allowed).

What this module does not do: check what it loaded against a protocol; the caller does (see
:func:`bastion.policies.make_policy`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Collection
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from bastion.errors import ConfigError, UnknownNameError
from bastion.guard import public

__all__ = ["PluginSpec", "load", "parse_args", "parse_spec", "registered"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"^{_IDENT}(\.{_IDENT})*$")
_ATTR = _MODULE  # a dotted attribute path has the same shape


class PluginSpec:
    """A parsed spec: where the object comes from and the arguments to call it with."""

    __slots__ = ("args", "attr", "kwargs", "source", "text")

    def __init__(
        self,
        text: str,
        source: str,
        attr: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.text = text  # the spec as given
        self.source = source  # module name, .py file path, or registered name
        self.attr = attr  # None for a registered name
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"PluginSpec({self.text!r})"


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@public
def parse_args(text: str, spec: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``"32,depth=7"`` → ``((32,), {"depth": 7})``; ``""`` → no arguments."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if not text:
        return (), {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ConfigError(
                f"plug-in spec {spec!r} has an empty argument; expected ARG,ARG or KEY=VALUE items"
            )
        key, eq, value = item.partition("=")
        if eq:
            key = key.strip()
            if not re.fullmatch(_IDENT, key):
                raise ConfigError(f"plug-in spec {spec!r}: {key!r} is not an argument name")
            if key in kwargs:
                raise ConfigError(f"plug-in spec {spec!r} gives {key!r} twice")
            kwargs[key] = _value(value.strip())
        elif kwargs:
            raise ConfigError(
                f"plug-in spec {spec!r}: positional argument {item!r} after a keyword argument"
            )
        else:
            args.append(_value(item))
    return tuple(args), kwargs


@public
def parse_spec(text: str, names: Collection[str] = ()) -> PluginSpec:
    """Split ``SOURCE[:ATTR][:ARGS]`` (see the module docstring); ``names`` are the registered
    short names, whose spec is ``NAME[:ARGS]``. Raises :class:`ConfigError`."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(
            f"a plug-in spec must be a non-empty string like 'package.module:Name'; got {text!r}"
        )
    text = text.strip()
    if text.endswith(".py") or ".py:" in text:
        path, _, rest = text.rpartition(".py")
        source = path + ".py"
        attr, _, arg_text = rest.removeprefix(":").partition(":")
        if not attr:
            raise ConfigError(f"plug-in spec {text!r} names a file but no attribute: FILE.py:Name")
    else:
        source, _, rest = text.partition(":")
        if source in names:
            return PluginSpec(text, source, None, *parse_args(rest, text))
        if not _MODULE.match(source):
            raise ConfigError(
                f"plug-in spec {text!r}: {source!r} is not a module name; expected "
                "'package.module:Name[:ARGS]', 'file.py:Name[:ARGS]' or a registered name"
            )
        attr, _, arg_text = rest.partition(":")
        if not attr or ("." not in source and not _ATTR.match(attr)):
            return PluginSpec(text, source, None, (), {})  # NAME[:ARGS], a name not registered
    if not _ATTR.match(attr):
        raise ConfigError(f"plug-in spec {text!r}: {attr!r} is not an attribute name")
    return PluginSpec(text, source, attr, *parse_args(arg_text, text))


@public
def registered(group: str) -> dict[str, metadata.EntryPoint]:
    """The entry points of ``group`` by name (installed distributions only)."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def _import_module(name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.split(".")[0]
        cwd = os.getcwd()
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise ConfigError(f"plug-in spec {spec!r}: cannot import {name!r} ({exc})") from exc
        sys.path.append(cwd)  # `bastion …` from the user's directory, like `python -m`
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc2:
            sys.path.remove(cwd)
            raise ConfigError(
                f"plug-in spec {spec!r}: no module {name!r} on sys.path or in {cwd}"
            ) from exc2
    except ConfigError:
        raise
    except Exception as exc:  # the user's module failed while importing: say which
        raise ConfigError(
            f"plug-in spec {spec!r}: importing {name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def _load_file(path: str, spec: str) -> ModuleType:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"plug-in spec {spec!r}: {path} is not a file")
    name = f"bastion_plugin_{abs(hash(str(file))):x}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:  # pragma: no cover - .py always loads
        raise ConfigError(f"plug-in spec {spec!r}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # pickling by reference in this process needs it registered
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"plug-in spec {spec!r}: running {path} raised {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _attribute(module: ModuleType, attr: str, spec: str, where: str) -> Any:
    """``module.attr``; ``where`` names the module for the user (its file, or its name)."""
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = (
                [n for n in vars(obj) if not n.startswith("_")] if hasattr(obj, "__dict__") else []
            )
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            public = ", ".join(sorted(n for n in names if callable(getattr(obj, n, None))))
            raise ConfigError(
                f"plug-in spec {spec!r}: {where} has no attribute {attr!r}{hint} "
                f"(it defines: {public or 'nothing callable'})"
            ) from None
    return obj


def _origin(spec: PluginSpec, entry_point: str | None = None) -> str:
    """Where a spec's object comes from, for error messages: the user's file, module or entry
    point (never the internal name a file is loaded under)."""
    if entry_point is not None:
        return f"entry point {spec.source!r} = {entry_point!r}"
    if spec.source.endswith(".py"):
        return f"{spec.attr} in {Path(spec.source).expanduser().resolve()}"
    return f"{spec.source}:{spec.attr}"


@public
def load(
    text: str, group: str, what: str = "plug-in", ready: Callable[[Any], bool] = lambda _: False
) -> Any:
    """The object a spec names, called with its arguments when it is a class or factory.

    ``group`` is the entry-point group for short names; ``what`` names the kind in errors;
    ``ready(obj)`` tells a finished object (returned as it is) from a factory (called).
    Raises :class:`ConfigError` (bad spec, failed import, failed construction) or
    :class:`UnknownNameError` (a short name nothing registered).
    """
    eps = registered(group)
    spec = parse_spec(text, eps)
    if spec.attr is None:
        if spec.source not in eps:
            known = ", ".join(sorted(eps)) or "none installed"
            raise UnknownNameError(
                f"unknown {what} {text!r}: not a built-in and not registered under the "
                f"entry-point group {group!r} (registered: {known}); a {what} outside the "
                "package is named 'package.module:Name[:ARGS]' or 'file.py:Name[:ARGS]'"
            )
        try:
            obj = eps[spec.source].load()
        except Exception as exc:
            raise ConfigError(
                f"{what} {spec.source!r} (entry point {eps[spec.source].value!r}) failed to "
                f"load: {type(exc).__name__}: {exc}"
            ) from exc
        origin = _origin(spec, eps[spec.source].value)
    elif spec.source.endswith(".py"):
        file = Path(spec.source).expanduser().resolve()
        obj = _attribute(_load_file(spec.source, text), spec.attr, text, str(file))
        origin = _origin(spec)
    else:
        obj = _attribute(_import_module(spec.source, text), spec.attr, text, spec.source)
        origin = _origin(spec)
    return _construct(obj, spec, what, ready, origin)


def _construct(
    obj: Any, spec: PluginSpec, what: str, ready: Callable[[Any], bool], origin: str
) -> Any:
    if (ready(obj) and not isinstance(obj, type)) or not callable(obj):
        if spec.args or spec.kwargs:
            raise ConfigError(
                f"{what} spec {spec.text!r} ({origin}) passes arguments, but it names a ready "
                "object, not a class or factory"
            )
        return obj
    try:
        return obj(*spec.args, **spec.kwargs)
    except Exception as exc:
        given = ", ".join([*map(repr, spec.args), *(f"{k}={v!r}" for k, v in spec.kwargs.items())])
        raise ConfigError(
            f"{what} spec {spec.text!r} ({origin}): {getattr(obj, '__qualname__', obj)}"
            f"({given}) raised {type(exc).__name__}: {exc}"
        ) from exc
