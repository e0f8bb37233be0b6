"""Executing one run: top-level and picklable, so process pools and Ray workers can call it.

:func:`execute` simulates one run (shipped paths remapped and its ``python_path`` put on
``sys.path`` first, as a Ray worker needs) and returns its records; :func:`records_of` tags a
simulation's records with the run's spec as the user wrote it, its key, its tags and the
bastion version.

What this module does not do: schedule runs (:mod:`.executors`) or store them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from bastion.errors import ArgumentError
from bastion.guard import mapping_with, public
from bastion.sim.results import SPEC_COLUMNS, package_version
from bastion.sim.simulate import SimSpec, SimulationResult, simulate

from .runs import Row, Run

__all__ = ["execute", "records_of"]


def _spec(spec: Mapping[str, Any]) -> SimSpec:
    """A run's spec (a JSON-able dict) as a SimSpec."""
    d = dict(spec)
    if "policies" in d:
        d["policies"] = tuple(d["policies"])
    return SimSpec(**d)


# the spec fields that may name a file (a Ray cluster ships each to its workers)
FILE_KEYS = ("model", "gpu", "workload", "truth", "arrivals", "drafter_config", "calibration_file")


def _checked(run: Run) -> tuple[Mapping[str, Any], Mapping[str, str], list[str]]:
    """A run's spec, remap and python_path, or an :class:`ArgumentError` saying which is not
    what a run holds (a run comes from a file or over the wire, so it is checked here)."""
    spec = run["spec"]
    if not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec):
        raise ArgumentError(f"a run's spec must be a mapping of field names; got {spec!r:.80}")
    policies = spec.get("policies", ())
    if isinstance(policies, str | bytes) or not isinstance(policies, list | tuple):
        raise ArgumentError(f"a run's policies must be a list; got {policies!r:.80}")
    remap = run.get("remap", {})
    if not isinstance(remap, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in remap.items()
    ):
        raise ArgumentError(f"a run's remap must map paths to paths; got {remap!r:.80}")
    python_path = run.get("python_path", ())
    if not isinstance(python_path, list | tuple) or not all(
        isinstance(e, str) for e in python_path
    ):
        raise ArgumentError(f"a run's python_path must be a list of paths; got {python_path!r:.80}")
    return spec, remap, list(python_path)


def _remapped(spec: Mapping[str, Any], remap: Mapping[str, str]) -> dict[str, Any]:
    """``spec`` with its file paths replaced by their shipped copies (Ray workers)."""
    d = dict(spec)
    for key in FILE_KEYS:
        if isinstance(d.get(key), str) and d[key] in remap:
            d[key] = remap[d[key]]
    if "policies" not in d:
        return d
    policies = []
    for p in d["policies"]:
        if not isinstance(p, str):  # not a spec string: nothing to remap (SimSpec judges it)
            policies.append(p)
            continue
        path, sep, rest = p.partition(".py:")
        policies.append(remap[path + ".py"] + ":" + rest if sep and path + ".py" in remap else p)
    d["policies"] = policies
    return d


@public(run=mapping_with("spec"))
def execute(run: Run) -> tuple[list[Row], list[Row]]:
    """Run one spec: (one record per policy, one row per policy and request), each tagged with
    the run's spec, key, experiment and the bastion version that computed it."""
    given, remap, python_path = _checked(run)
    for entry in python_path:
        path = os.path.abspath(entry)
        if path not in sys.path:
            sys.path.insert(0, path)
    spec = _spec(_remapped(given, remap))
    return records_of(simulate(spec), run)


@public
def records_of(result: SimulationResult, run: Mapping[str, Any]) -> tuple[list[Row], list[Row]]:
    """A simulation's records (:data:`sim.results.RECORD_COLUMNS`) and per-request rows, with
    the run's spec as given (``run["spec"]``), its key, tags and the bastion version."""
    given = run["spec"]  # recorded as the user wrote it, not as shipped to a worker
    tags = run.get("tags", {})
    head = {"experiment": tags.get("experiment", ""), **{c: given.get(c) for c in SPEC_COLUMNS}}
    tail = {
        "run_key": run.get("key", ""),
        "bastion_version": package_version(),
        **{k: v for k, v in tags.items() if k != "experiment"},
    }
    calib = {
        "calib_rmse_bare_ms": result.calibration_rmse_bare_s * 1e3,
        "calib_rmse_ms": result.calibration_rmse_calibrated_s * 1e3,
    }
    rows = [{**head, **asdict(r), **calib, **tail} for r in result.rows]
    requests = [{**head, **q, **tail} for q in result.request_rows()]
    # policy specs as the user wrote them (a worker's are remapped to shipped file paths)
    specs = dict(zip([r.policy_spec for r in result.rows], _given_policies(given), strict=False))
    for row in (*rows, *requests):
        row["policy_spec"] = specs.get(row["policy_spec"], row["policy_spec"])
    return rows, requests


def _given_policies(spec: Mapping[str, Any]) -> list[str]:
    """The policy specs of a run as written, in the order simulate serves them (AR first)."""
    return ["ar", *[str(p) for p in spec.get("policies", ()) if p != "ar"]]
