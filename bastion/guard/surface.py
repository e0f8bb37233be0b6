"""The package's public surface and the table of its argument rules (docs/errors.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bastion.guard.decorator import public

__all__ = ["public_surface", "rules_table"]


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


public_surface = public(public_surface)
rules_table = public(rules_table)
