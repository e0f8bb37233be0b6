"""Writing a measured truth (:mod:`bastion.sim.measured`) as a whole truth file (TOML).

``bastion truth measure`` and ``bastion twin --out`` write what they fitted with
:func:`measured_truth_toml`; :mod:`bastion.sim.truth` reads it back unchanged. What this module
does not do: fit (:mod:`bastion.sim.measured_fit`) or price anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.measured import MeasuredCosts

__all__ = ["measured_truth_toml"]


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"a truth file cannot hold {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"a truth file cannot hold {value!r:.60}")  # pragma: no cover


def _toml_table(name: str, table: Mapping[str, Any], out: list[str]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    nested = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    if plain or not nested:
        out.append(f"\n[{name}]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in plain.items())
    for key, sub in nested.items():
        _toml_table(f"{name}.{key}", sub, out)


@public
def measured_truth_toml(
    measured: MeasuredCosts, name: str, description: str, sources: Mapping[str, str]
) -> str:
    """A whole truth file (TOML) holding ``measured``; read back by ``bastion.sim.truth``."""
    if not isinstance(name, str) or not name:
        raise ConfigError("a truth needs a non-empty name")
    out = [
        "# A measured truth: every pass and host cost fitted from real steps on one machine",
        "# (bastion.sim.measured; docs/sim-to-real.md). Written by Bastion; edit with care.",
        f"name = {_toml_value(name)}",
        f"description = {_toml_value(description)}",
    ]
    _toml_table("noise", {"noise": round(measured.noise, 6)}, out)
    _toml_table("measured", measured.to_dict(), out)
    _toml_table("sources", dict(sources), out)
    return "\n".join(out) + "\n"
