"""Measured per-operator tables with the model and GPU they were measured on.

``bastion validate --transfer-from`` needs, for every other table, its model and its GPU's
profile. A table names them in one of two ways:

- ``FILE@MODEL@GPU``: inline (MODEL a bundled name or a config.json path, GPU a profile name
  or a .toml path; the format is ``--format``'s);
- ``FILE`` alone: looked up in ``datasets.toml`` beside the file, a manifest of
  ``[[dataset]]`` tables with ``file``, ``format``, ``model`` and ``gpu`` (paths relative to
  the manifest). The shipped ``docs/data/datasets.toml`` lists the shipped tables.

Every problem is a :class:`~bastion.errors.ConfigError` (a missing or unreadable table:
:class:`~bastion.cost.measured.MeasuredDataError`) that names the offending entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError
from bastion.guard import public

__all__ = ["MANIFEST", "DatasetRef", "parse_transfer_specs", "read_manifest"]

MANIFEST = "datasets.toml"
_KEYS = ("file", "format", "model", "gpu")


@dataclass(frozen=True)
class DatasetRef:
    """Where a measured table is and what it measured."""

    path: Path
    format: str
    model: str  # bundled model name or config.json path
    gpu: str  # profile name or .toml path


@public
def read_manifest(path: str | os.PathLike[str]) -> list[DatasetRef]:
    """The ``[[dataset]]`` entries of a manifest, paths resolved against its directory."""
    from bastion.cost.measured import FORMATS
    from bastion.files import read_toml_file

    p = Path(path)
    data = read_toml_file(p, "dataset manifest")
    entries = data.get("dataset")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{p}: needs one or more [[dataset]] tables with {', '.join(_KEYS)}")
    out = []
    for i, entry in enumerate(entries, 1):
        where = f"{p}: [[dataset]] {i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table")
        unknown = sorted(set(entry) - set(_KEYS))
        missing = [k for k in _KEYS if k not in entry]
        if unknown or missing:
            raise ConfigError(
                f"{where}: "
                + (f"unknown key(s) {', '.join(unknown)}; " if unknown else "")
                + (f"missing {', '.join(missing)}; " if missing else "")
                + f"accepted: {', '.join(_KEYS)}"
            )
        values: dict[str, Any] = {}
        for k in _KEYS:
            if not isinstance(entry[k], str) or not entry[k].strip():
                raise ConfigError(f"{where}: {k} must be a non-empty string, got {entry[k]!r}")
            values[k] = entry[k]
        if values["format"] not in FORMATS:
            raise ConfigError(
                f"{where}: format {values['format']!r}; accepted: {', '.join(FORMATS)}"
            )
        model = values["model"]
        if model.endswith(".json") or "/" in model:
            model = str(p.parent / model)
        gpu = values["gpu"]
        if gpu.endswith(".toml") or "/" in gpu:
            gpu = str(p.parent / gpu)
        out.append(DatasetRef(p.parent / values["file"], values["format"], model, gpu))
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


@public
def parse_transfer_specs(
    text: str, measured: str | os.PathLike[str], default_format: str
) -> list[DatasetRef]:
    """The tables of ``--transfer-from`` (comma-separated ``FILE`` or ``FILE@MODEL@GPU``).

    Refused: an empty list, an empty entry, a table named twice, the ``--measured`` file itself
    (transfer predicts a GPU from *other* tables), a ``FILE`` with no manifest entry.
    """
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in items):
        raise ConfigError(
            f"--transfer-from {text!r}: give one or more tables, comma-separated, each FILE "
            f"(listed in a {MANIFEST} beside it) or FILE@MODEL@GPU"
        )
    target = Path(measured)
    refs: list[DatasetRef] = []
    for item in items:
        if "@" in item:
            parts = item.split("@")
            if len(parts) != 3 or not all(x.strip() for x in parts):
                raise ConfigError(
                    f"--transfer-from entry {item!r}: accepted FILE@MODEL@GPU (three parts) or "
                    f"FILE listed in a {MANIFEST} beside it"
                )
            ref = DatasetRef(Path(parts[0]), default_format, parts[1], parts[2])
        else:
            path = Path(item)
            manifest = path.parent / MANIFEST
            if not path.is_file():
                from bastion.cost.measured import MeasuredDataError

                raise MeasuredDataError(f"--transfer-from: measured data not found: {path}")
            if not manifest.is_file():
                raise ConfigError(
                    f"--transfer-from entry {item!r}: no {manifest} names its model and GPU; "
                    "write FILE@MODEL@GPU"
                )
            found = [r for r in read_manifest(manifest) if _same_file(r.path, path)]
            if not found:
                raise ConfigError(
                    f"--transfer-from entry {item!r} is not listed in {manifest}; add a "
                    "[[dataset]] entry or write FILE@MODEL@GPU"
                )
            ref = found[0]
        if _same_file(ref.path, target):
            raise ConfigError(
                f"--transfer-from {item!r} is the --measured file itself; transfer predicts "
                "a GPU from other GPUs' tables only"
            )
        if any(_same_file(ref.path, r.path) for r in refs):
            raise ConfigError(f"--transfer-from names {ref.path} twice")
        refs.append(ref)
    return refs
