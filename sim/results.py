"""Writing results so that nothing is lost: atomic files and a resumable run store.

Every file is written to a temporary sibling and moved into place with ``os.replace``, so a
reader (or a crash) never sees half a file. :class:`RunStore` keeps one JSON file per finished
run, named by a hash of the run's spec: an interrupted experiment, started again, skips the runs
already stored and recomputes nothing.

What this module does not do: run anything or decide what a run is (see sim.experiments).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bastion.files import write_json_atomic, write_text_atomic

__all__ = ["RunStore", "spec_key", "write_csv_atomic", "write_json_atomic", "write_text_atomic"]


def write_csv_atomic(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def spec_key(spec: Mapping[str, Any]) -> str:
    """A stable short hash of a run's spec (its JSON with sorted keys)."""
    blob = json.dumps(spec, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class RunStore:
    """One JSON file per finished run under ``directory``; resumable."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, spec: Mapping[str, Any]) -> Path:
        return self.directory / f"{spec_key(spec)}.json"

    def has(self, spec: Mapping[str, Any]) -> bool:
        return self.path(spec).exists()

    def load(self, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
        data = json.loads(self.path(spec).read_text())
        rows: list[dict[str, Any]] = data["rows"]
        return rows

    def save(self, spec: Mapping[str, Any], rows: list[dict[str, Any]]) -> None:
        write_json_atomic(self.path(spec), {"spec": dict(spec), "rows": rows})
