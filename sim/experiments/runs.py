"""What a run is, and its key: a hash of everything that determines its numbers.

A *run* is one :class:`bastion.sim.simulate.SimSpec` as a JSON-able dict (``run["spec"]``), the
tags it is recorded with (``run["tags"]``: the experiment's name), and its *key*
(``run["key"]``, :func:`run_key`): a hash of the spec, the tags and :func:`fingerprint` — the
*contents* behind every name the spec gives (hardware profile, model, drafter config, workload,
truth, arrivals and calibration record files, plug-in policy sources, a profiled cost model's
table), the bastion version and the digest of bastion's own source (:func:`code_digest`).
The run store (:class:`bastion.sim.results.RunStore`) files finished runs by this key, so an
interrupted experiment resumes where it stopped and a changed input is never served from a stale
record.

What this module does not do: execute runs (:mod:`.executors`) or read configs (:mod:`.config`).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError
from bastion.guard import mapping_with, public
from bastion.sim.results import package_version, spec_key
from bastion.sim.simulate import SimSpec

__all__ = [
    "Row",
    "Run",
    "code_digest",
    "file_digest",
    "fingerprint",
    "installed",
    "is_path",
    "make_run",
    "run_key",
]

Run = dict[str, Any]
Row = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]  # a checkout's root (sim/experiments/ is two below)


def _data(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return repr(obj)


MAX_DIGEST_FILES = 10_000  # a directory a run reads (recorded traces) holds fewer files


@public
def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of every file under a directory (names and bytes)."""
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    h = hashlib.sha256()
    try:
        files = [path]
        if path.is_dir():
            files = []
            for p in path.rglob("*"):
                if p.is_file():
                    files.append(p)
                if len(files) > MAX_DIGEST_FILES:
                    raise ConfigError(
                        f"{path}: more than {MAX_DIGEST_FILES} files; a run's inputs are fewer"
                    )
            files.sort()
        for p in files:
            h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
            h.update(p.read_bytes())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return h.hexdigest()


_CODE: list[str] = []  # this process's code digest, computed once


@public
def code_digest() -> str:
    """sha256 of the running bastion's source (every ``.py`` and ``.c`` file of the package
    and of the simulator, names and bytes): a run's numbers depend on the code as much as on
    its inputs, so a changed controller or cost model is never served a stored run. Computed
    once per process."""
    if not _CODE:
        import bastion

        root = Path(bastion.__file__).resolve().parent
        roots = {root, (root / "sim").resolve()}
        h = hashlib.sha256()
        for base in sorted(roots):
            for p in sorted(q for q in base.rglob("*") if q.suffix in (".py", ".c")):
                h.update(str(p.relative_to(base)).encode())
                h.update(p.read_bytes())
        _CODE.append(h.hexdigest())
    return _CODE[0]


@public
def is_path(value: str) -> bool:
    """A grid value that names a file (a separator, or a .toml/.json/.py suffix), not a name."""
    return os.sep in value or "/" in value or value.endswith((".toml", ".json", ".py"))


def _policy_source(spec: str) -> str | None:
    """The digest of a plug-in policy's source file (None for built-ins and installed code)."""
    from bastion.policies import make_policy

    path, sep, _ = spec.partition(".py:")
    if sep:
        return file_digest(Path(path + ".py"))
    if ":" not in spec:
        return None
    module = sys.modules.get(type(make_policy(spec)).__module__)
    file = getattr(module, "__file__", None)
    if file is None or installed(Path(file)):
        return None
    return file_digest(Path(file))


@public
def installed(path: Path) -> bool:
    """Code that ships with an installation (the bastion package, site-packages)."""
    parts = set(path.resolve().parts)
    inside = path.resolve().is_relative_to(REPO / "bastion") or path.resolve().is_relative_to(
        REPO / "sim"
    )
    return inside or "site-packages" in parts or "dist-packages" in parts


def _source_of(policy: str) -> Callable[[], str | None]:
    return lambda: _policy_source(policy)


@public(spec=mapping_with("gpu", "model", "workload", "truth", "policies"))
def fingerprint(spec: Mapping[str, Any], memo: dict[tuple[str, str], Any] | None = None) -> Any:
    """What a run reads besides its spec: the contents behind every name it gives."""
    from bastion.cost.hardware import get_profile, profile_to_dict
    from bastion.cost.models import get_model
    from bastion.sim.truth import get_truth
    from bastion.sim.workloads import get_workload

    memo = {} if memo is None else memo

    def once(kind: str, value: str, make: Callable[[], Any]) -> Any:
        if (kind, value) not in memo:
            memo[(kind, value)] = make()
        return memo[(kind, value)]

    def workload() -> Any:
        path = Path(spec["workload"])
        if path.suffix == ".json" or path.is_dir():
            return file_digest(path)
        return _data(get_workload(spec["workload"]))

    inputs = {
        "bastion_version": package_version(),
        "code": code_digest(),
        "gpu": once("gpu", spec["gpu"], lambda: profile_to_dict(get_profile(spec["gpu"]))),
        "model": once("model", spec["model"], lambda: _data(get_model(spec["model"]))),
        "workload": once("workload", spec["workload"], workload),
        "truth": once("truth", str(spec["truth"]), lambda: _data(get_truth(spec["truth"]))),
        "arrivals": (
            once("arrivals", spec["arrivals"], lambda: file_digest(Path(spec["arrivals"])))
            if spec.get("arrivals")
            else None
        ),
        "policies": [once("policy", p, _source_of(p)) for p in spec["policies"]],
        "cost_table": (  # a profiled cost model's measured table
            once("cost", spec["cost_mode"], lambda: file_digest(Path(_table_of(spec))))
            if str(spec.get("cost_mode", "")).startswith("profiled:")
            else None
        ),
    }
    if spec.get("drafter_config"):  # only when given: other runs keep their keys
        inputs["drafter"] = once("drafter", spec["drafter_config"], lambda: _data(_drafter(spec)))
    if spec.get("calibration_file"):
        record = spec["calibration_file"]
        inputs["calibration"] = once("calibration", record, lambda: file_digest(Path(record)))
    return inputs


def _drafter(spec: Mapping[str, Any]) -> Any:
    """The drafter a spec's ``drafter_config`` describes (its shape, not the file's bytes: a
    checkpoint directory's weights do not change what the simulator prices)."""
    from bastion.cost.models import DrafterSpec, get_model

    return DrafterSpec.from_dflash_config(spec["drafter_config"], get_model(spec["model"]))


def _table_of(spec: Mapping[str, Any]) -> str:
    from bastion.cost.profiled import split_profiled

    profiled = split_profiled(str(spec["cost_mode"]))
    assert profiled is not None
    return profiled[1]


@public(run=mapping_with("spec"))
def run_key(run: Mapping[str, Any], memo: dict[tuple[str, str], Any] | None = None) -> str:
    """The run's cache key: a hash of its spec, tags and :func:`fingerprint`."""
    return spec_key(
        {"spec": run["spec"], "tags": run.get("tags", {}), "inputs": fingerprint(run["spec"], memo)}
    )


@public
def make_run(tags: Mapping[str, Any] | None = None, **spec: Any) -> Run:
    """A run: the SimSpec fields (defaults filled in) as a JSON-able dict, with its key."""
    base = SimSpec(**spec).to_dict()
    run: Run = {"spec": base, "tags": dict(tags or {})}
    run["key"] = run_key(run)
    return run
