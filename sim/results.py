"""Results a team can share: one record shape, stable CSV columns, a resumable run store.

**Records.** Every result — a ``bastion simulate`` row, an experiment row — is one flat record
with the columns of :data:`RECORD_COLUMNS`, in that order: the experiment's name, the run's full
spec (model, GPU, workload, truth, … seed), the policy, its metrics (means beside p50 / p99,
draft acceptance beside τ), the calibration's fit, then provenance (the run's cache key and the
bastion version that computed it). CSV files put these columns first, in this order, then any
other column (sorted); lists are written as JSON text. JSON files are one object with a
``records`` list (``write_records_json``).

**Files.** Every file is written to a temporary sibling and moved into place with
``os.replace`` (:mod:`bastion.files`), with the user's umask, so a reader (or a crash) never
sees half a file.

**The run store.** :class:`RunStore` keeps one JSON file per finished run under ``runs/``, named
by the run's *key*: a hash of everything that determines its numbers — the spec, the hardware
profile, model, workload, truth and arrivals *contents* (not just their names), the source of
plug-in policies, and the bastion version (``sim.experiments.run_key``). Change any of them and
the run is recomputed; an unchanged run is reused, and the reuse is said on stderr. A run file
that cannot be read back (truncated by a crash, empty, or not a run record) is renamed
``*.corrupt``, reported, and the run computed again.

What this module does not do: run anything or decide what a run is (see bastion.sim.experiments).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError
from bastion.files import write_json_atomic, write_text_atomic
from bastion.guard import public, writable_file
from bastion.records import json_safe as _json_safe
from bastion.records import upgrade

__all__ = [
    "METRIC_COLUMNS",
    "RECORD_COLUMNS",
    "SPEC_COLUMNS",
    "RunStore",
    "ordered_columns",
    "package_version",
    "spec_key",
    "write_csv_atomic",
    "write_json_atomic",
    "write_records_json",
    "write_text_atomic",
]

log = logging.getLogger(__name__)

SPEC_COLUMNS = (
    "model",  # bundled model name or config.json path
    "gpu",  # hardware profile name or .toml path
    "workload",  # workload preset, workload file, or trace file / directory
    "truth",  # the simulated GPU's ground truth (name or .toml path)
    "temperature",
    "concurrency",  # closed loop: clients; open loop: most requests in service
    "arrival_rate",  # open loop: Poisson requests per second (empty: closed loop)
    "arrivals",  # open loop: arrivals file (empty: none)
    "requests",  # requests per policy
    "output_len",  # tokens per request (empty: the workload's distribution)
    "prompt_len",  # every request's prompt tokens (empty: the workload's distribution)
    "prefill_chunk",  # prompt tokens prefilled per step (0: no prefill)
    "seed",
    "cost_mode",  # the controller's cost model: bare, static, ema, ema+calib
    "n_max",  # the adaptive controller's cap
    "drafter_config",  # the drafter's DFlash config.json (empty: the published layout)
    "calibration_file",  # the controller's calibration record (empty: the simulated sweep's)
    "gpu_memory_utilization",  # the server's share of GPU memory (empty: memory not limited)
    "slo_ttft_s",  # the TTFT SLO (empty: none)
    "slo_tpot_s",  # the TPOT SLO (empty: none)
    "tp",  # tensor parallelism: GPUs the model is split over
)
"""The run's spec (:class:`sim.simulate.SimSpec`), one column per field, policies excluded."""

METRIC_COLUMNS = (
    "policy",  # the policy's label (ar: target-only autoregressive decoding)
    "policy_spec",  # the full spec it was made from
    "speedup",  # AR's mean TPOT / this mean TPOT (same requests)
    "tau",  # τ: committed tokens per step (bonus included), mean over requests
    "mean_tree_size",  # drafted nodes per step
    "tpot_s",  # mean time per output token after the first
    "throughput_tok_s",  # generated tokens per simulated second
    "draft_s",  # simulated seconds in drafter passes (summed over steps)
    "prep_s",  # … in host preparation
    "verify_s",  # … in verification passes
    "steps",  # decode steps
    "mean_batch",  # requests per decode step
    "simulated_s",  # simulated time of the policy's serving run
    "wall_s",  # wall time of its serving loop (the one machine-dependent column)
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "ttft_mean_s",
    "e2e_mean_s",
    "acceptance_rate",  # accepted draft tokens / drafted nodes (root excluded); empty for AR
    "acceptance_by_position",  # [d-1]: share of drafting steps accepting ≥ d draft tokens
    "tokens",  # output tokens generated
    "cycle_predicted_s",  # a learning controller's mean predicted cycle (empty otherwise)
    "cycle_observed_s",  # … beside the mean simulated cycle of the same steps
    "kv_capacity_tokens",  # the KV cache's tokens (empty: memory not limited)
    "kv_peak_tokens",  # the most KV token slots held at once (trees' slots included)
    "max_running",  # the most requests admitted at once
    "preemptions",  # requests preempted (recomputed) for lack of KV blocks
    "queue_delay_p50_s",  # median time a request waited for admission
    "queue_delay_p99_s",  # … its 99th percentile
    "slo_attainment",  # share of requests meeting every SLO given (empty: none given)
    "goodput_rps",  # requests meeting them per simulated second
)
"""A policy's metrics, the fields of :class:`bastion.sim.simulate.PolicyResult` in order."""

RECORD_COLUMNS = (
    "experiment",  # the experiment's name (empty for `bastion simulate`)
    *SPEC_COLUMNS,
    *METRIC_COLUMNS,
    "calib_rmse_bare_ms",  # the bare roofline's RMSE on the calibration sweep
    "calib_rmse_ms",  # the calibrated cost model's RMSE on it
    "run_key",  # the run's cache key (bastion.sim.experiments.run_key)
    "bastion_version",  # the package version that computed the record
)
"""Every record's columns, in the order CSV files write them (each defined, with its unit and
meaning, in :data:`bastion.records.FIELDS`)."""


@public
def ordered_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """:data:`RECORD_COLUMNS` present in ``rows`` in their order, then any others, sorted."""
    seen: set[str] = set()
    for row in rows:
        seen.update(row)
    known = [c for c in RECORD_COLUMNS if c in seen]
    return known + sorted(seen - set(known))


def _cell(value: Any) -> Any:
    if isinstance(value, list | tuple | dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError) as exc:  # a value JSON cannot hold, a circular list
            raise ConfigError(
                f"a CSV cell must hold JSON-able data; got {value!r:.80} ({exc})"
            ) from None
    if value is None:
        return ""
    return value


@public(path=writable_file)
def write_csv_atomic(
    path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
) -> None:
    """``rows`` as CSV, columns in :func:`ordered_columns` order (or ``columns``); atomic."""
    fields = list(columns) if columns is not None else ordered_columns(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _cell(row.get(k)) for k in fields} for row in rows)
    write_text_atomic(path, buf.getvalue())


@public(path=writable_file)
def write_records_json(path: Path, records: Sequence[Mapping[str, Any]], **meta: Any) -> None:
    """The one JSON shape: ``{**meta, "records": [...]}``, atomically."""
    write_json_atomic(path, _json_safe({**meta, "records": [dict(r) for r in records]}))


def package_version() -> str:
    """The installed bastion's version (the source tree's when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("bastion")
    except metadata.PackageNotFoundError:
        import bastion

        return bastion.__version__


@public
def spec_key(spec: Mapping[str, Any]) -> str:
    """A stable short hash of JSON-able data (its JSON with sorted keys)."""
    try:
        blob = json.dumps(spec, sort_keys=True, default=str).encode()
    except (TypeError, ValueError) as exc:  # keys of mixed types, a circular reference
        raise ConfigError(f"spec_key: cannot write the spec as JSON ({exc})") from None
    return hashlib.sha256(blob).hexdigest()[:16]


RUN_FORMAT = "bastion-run"
RUN_VERSION = 2


@public
class RunStore:
    """One JSON file per finished run under ``directory``, named by the run's key; resumable.

    A run is a mapping; its key is ``run["key"]`` when it has one (the experiment runner sets
    it: a hash of everything that determines the run), else :func:`spec_key` of the run.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.reused = 0  # runs loaded from files this store did not write
        self.set_aside: list[Path] = []  # unreadable run files renamed *.corrupt
        self._written: set[str] = set()

    @staticmethod
    @public(error=ConfigError)
    def key(run: Mapping[str, Any]) -> str:
        key = run.get("key")
        return str(key) if key else spec_key(run)

    def path(self, run: Mapping[str, Any]) -> Path:
        return self.directory / f"{self.key(run)}.json"

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._corrupt(path, f"cannot be read ({exc})")
            return None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            self._corrupt(path, "is not a run record (no 'rows' list)")
            return None
        if not all(isinstance(r, dict) for r in data["rows"]) or not data["rows"]:
            self._corrupt(path, "has no rows")
            return None
        return data

    def _corrupt(self, path: Path, why: str) -> None:
        """Rename an unreadable run file to ``*.corrupt`` (kept for inspection) and say so."""
        target = path.with_suffix(".corrupt")
        path.replace(target)
        self.set_aside.append(target)
        log.warning("run file %s %s: set aside as %s; the run is computed again", path, why, target)

    def has(self, run: Mapping[str, Any]) -> bool:
        """Whether the run is stored and readable (an unreadable file is set aside)."""
        return self._read(self.path(run)) is not None

    def record(self, run: Mapping[str, Any]) -> dict[str, Any]:
        """The stored record of a run (rows, request rows, spec, key, version)."""
        path = self.path(run)
        data = self._read(path)
        if data is None:
            raise KeyError(f"run {self.key(run)} is not stored in {self.directory}")
        if self.key(run) not in self._written:
            self.reused += 1
        # a run stored by the previous release: its names read as this release's
        for part in ("rows", "requests"):
            if isinstance(data.get(part), list):
                data[part] = [upgrade(r, f"run file {path}") for r in data[part]]
        return data

    def load(self, run: Mapping[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.record(run)["rows"]
        return rows

    def save(
        self,
        run: Mapping[str, Any],
        rows: list[dict[str, Any]],
        requests: list[dict[str, Any]] | None = None,
    ) -> None:
        data: dict[str, Any] = {
            "format": RUN_FORMAT,
            "version": RUN_VERSION,
            "key": self.key(run),
            "run": dict(run),
            "rows": rows,
            "requests": requests or [],
        }
        write_json_atomic(self.path(run), _json_safe(data))
        self._written.add(self.key(run))
