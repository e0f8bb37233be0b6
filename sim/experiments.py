"""Experiments: a grid of simulations from a TOML config, run by any executor, resumable.

``bastion experiment --config FILE.toml`` (or ``bastion experiment NAME`` for a shipped config)
expands the config's grid — models, GPUs, workloads, truths, policies (plug-ins included),
concurrency or arrival rates, requests, output length, seeds, cost models — into independent
*runs* (each a :class:`bastion.sim.simulate.SimSpec`), executes them with a pluggable executor —
``process`` (a local process pool, the default), ``serial``, or ``ray`` (a local Ray instance,
or a cluster with ``--address``) — and writes ``OUT/NAME/results.csv`` and ``results.json``
(one record per run and policy), ``requests.csv`` (one row per run, policy and request),
``summary.md`` and, for the paper's analyses, their plots. The config format is documented in
``docs/experiments-config.md``; :func:`load_config` validates every key.

Each finished run is stored atomically under ``OUT/NAME/runs/`` by its *key* — a hash of the
spec and of everything it reads (profile, model, workload, truth and arrivals contents, plug-in
policy sources, the bastion version; :func:`run_key`) — so an interrupted experiment resumes
where it stopped, and a changed input is never served from a stale record. Rows are assembled
in the order of the run list, so every executor gives identical results.

The paper's analyses ship as config files (``experiments/*.toml``: budget-sweep,
best-first-vs-beam, latency-model, moe, multi-batch); a config names a built-in ``report`` (see
:data:`REPORTS`) for its special plots and tables, or gets the generic table.

What this module does not do: simulate (sim.simulate) or define workloads (sim.workloads).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import itertools
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bastion.errors import BastionError, ConfigError
from bastion.files import read_toml_file
from bastion.guard import each, is_finite, mapping_with, public
from bastion.sim.results import (
    SPEC_COLUMNS,
    RunStore,
    package_version,
    spec_key,
    write_csv_atomic,
    write_records_json,
    write_text_atomic,
)
from bastion.sim.simulate import SimSpec, SimulationResult, simulate

__all__ = [
    "REPORTS",
    "ExperimentConfig",
    "execute",
    "experiment_dirs",
    "known_experiments",
    "load_config",
    "records_of",
    "run_all",
    "run_experiment",
    "run_key",
]

log = logging.getLogger(__name__)

Run = dict[str, Any]
Row = dict[str, Any]

FIXED_SWEEP = (16, 32, 64, 128, 256, 512, 1024)
EXPERIMENT_DIR_ENV = "BASTION_EXPERIMENTS"
EXECUTORS = ("process", "serial", "ray")
DATA_DIR_ENVS = ("BASTION_HWPROFILES", "BASTION_WORKLOADS", "BASTION_TRUTHS")


# ---------------------------------------------------------------------------------------------
# Executing one run (top-level and picklable: process pools and Ray call it)
# ---------------------------------------------------------------------------------------------


def _spec(spec: Mapping[str, Any]) -> SimSpec:
    d = dict(spec)
    d["policies"] = tuple(d["policies"])
    return SimSpec(**d)


def _remapped(spec: Mapping[str, Any], remap: Mapping[str, str]) -> dict[str, Any]:
    """``spec`` with its file paths replaced by their shipped copies (Ray workers)."""
    d = dict(spec)
    for key in ("model", "gpu", "workload", "truth", "arrivals"):
        if isinstance(d.get(key), str) and d[key] in remap:
            d[key] = remap[d[key]]
    policies = []
    for p in d["policies"]:
        path, sep, rest = p.partition(".py:")
        policies.append(remap[path + ".py"] + ":" + rest if sep and path + ".py" in remap else p)
    d["policies"] = policies
    return d


@public(run=mapping_with("spec"))
def execute(run: Run) -> tuple[list[Row], list[Row]]:
    """Run one spec: (one record per policy, one row per policy and request), each tagged with
    the run's spec, key, experiment and the bastion version that computed it."""
    for entry in run.get("python_path", ()):
        path = os.path.abspath(entry)
        if path not in sys.path:
            sys.path.insert(0, path)
    spec = _spec(_remapped(run["spec"], run.get("remap", {})))
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
    return rows, requests


# ---------------------------------------------------------------------------------------------
# Run keys: a hash of everything that determines a run
# ---------------------------------------------------------------------------------------------


def _data(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return repr(obj)


def _file_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of every file under a directory (names and bytes)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _is_path(value: str) -> bool:
    return os.sep in value or "/" in value or value.endswith((".toml", ".json", ".py"))


def _policy_source(spec: str) -> str | None:
    """The digest of a plug-in policy's source file (None for built-ins and installed code)."""
    from bastion.policies import make_policy

    path, sep, _ = spec.partition(".py:")
    if sep:
        return _file_digest(Path(path + ".py"))
    if ":" not in spec:
        return None
    module = sys.modules.get(type(make_policy(spec)).__module__)
    file = getattr(module, "__file__", None)
    if file is None or _installed(Path(file)):
        return None
    return _file_digest(Path(file))


def _installed(path: Path) -> bool:
    """Code that ships with an installation (the bastion package, site-packages)."""
    parts = set(path.resolve().parts)
    here = Path(__file__).resolve().parents[1]
    inside = path.resolve().is_relative_to(here / "bastion") or path.resolve().is_relative_to(
        here / "sim"
    )
    return inside or "site-packages" in parts or "dist-packages" in parts


def _source_of(policy: str) -> Callable[[], str | None]:
    return lambda: _policy_source(policy)


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
            return _file_digest(path)
        return _data(get_workload(spec["workload"]))

    return {
        "bastion_version": package_version(),
        "gpu": once("gpu", spec["gpu"], lambda: profile_to_dict(get_profile(spec["gpu"]))),
        "model": once("model", spec["model"], lambda: _data(get_model(spec["model"]))),
        "workload": once("workload", spec["workload"], workload),
        "truth": once("truth", str(spec["truth"]), lambda: _data(get_truth(spec["truth"]))),
        "arrivals": (
            once("arrivals", spec["arrivals"], lambda: _file_digest(Path(spec["arrivals"])))
            if spec.get("arrivals")
            else None
        ),
        "policies": [once("policy", p, _source_of(p)) for p in spec["policies"]],
        "cost_table": (  # a profiled cost model's measured table
            once("cost", spec["cost_mode"], lambda: _file_digest(Path(_table_of(spec))))
            if str(spec.get("cost_mode", "")).startswith("profiled:")
            else None
        ),
    }


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


def make_run(tags: Mapping[str, Any] | None = None, **spec: Any) -> Run:
    """A run: the SimSpec fields (defaults filled in) as a JSON-able dict, with its key."""
    base = SimSpec(**spec).to_dict()
    run: Run = {"spec": base, "tags": dict(tags or {})}
    run["key"] = run_key(run)
    return run


# ---------------------------------------------------------------------------------------------
# Executors
# ---------------------------------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    """In a pool worker: exit when the process that started it dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        try:  # the kernel sends SIGKILL the moment the parent dies
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - not glibc
            pass
    if os.getppid() != parent:  # it died before the watch began
        os._exit(1)

    def watch() -> None:  # elsewhere (and as a fallback): poll for re-parenting
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="bastion-parent-watch", daemon=True).start()


@public(runs=each(mapping_with("spec")))
def run_all(
    runs: Sequence[Run],
    store: RunStore,
    executor: str = "process",
    workers: int | None = None,
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    connect_timeout: float = 30.0,
) -> list[Row]:
    """Execute the runs not yet in ``store``; return every run's rows in ``runs`` order."""
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    todo = [r for r in runs if not store.has(r)]
    stored = len(runs) - len(todo)
    if stored:
        print(
            f"bastion: reusing {stored} stored run(s) of {len(runs)} from {store.directory} "
            "(keyed by spec, input contents and bastion version)",
            file=sys.stderr,
        )
    total, done = len(todo), 0
    if todo:
        log.info("%d of %d runs to compute", total, len(runs))

    def finished(run: Run, out: tuple[list[Row], list[Row]]) -> None:
        nonlocal done
        store.save(run, *out)
        done += 1
        if progress is not None:
            progress(done, total)

    if executor == "serial" or (executor == "process" and len(todo) <= 1):
        for run in todo:
            finished(run, execute(run))
    elif executor == "process":
        with ProcessPoolExecutor(
            max_workers=workers or os.cpu_count() or 1,
            initializer=_watch_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = {pool.submit(execute, run): run for run in todo}
            try:
                for fut in as_completed(futures):
                    finished(futures[fut], fut.result())
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    else:
        _run_ray(todo, finished, address, workers, connect_timeout)
    return [row for run in runs for row in store.load(run)]


def _check_address(address: str, timeout: float) -> None:
    """Fail fast, with a clear message, when nothing answers at a Ray address."""
    if address in ("auto", "local"):
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"--address {address!r}: expected HOST:PORT (the head node's GCS address that "
            "`ray start --head` prints, port 6379 by default), ray://HOST:PORT (Ray Client, "
            "port 10001 by default) or 'auto'"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach a Ray cluster at {address} within {timeout:g} s ({exc}); is the head "
            "node up (`ray status` on it), is the port open, and is this the GCS address "
            "(HOST:6379) or a Ray Client address (ray://HOST:10001)?"
        ) from None


def _stage(runs: Sequence[Run], root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Copy what the workers must read into ``root`` (Ray's ``working_dir``).

    Files the specs name (profiles, model configs, workloads, traces, truths, arrivals,
    ``file.py`` policies) go under ``_files/``; the directories of ``BASTION_HWPROFILES``,
    ``BASTION_WORKLOADS`` and ``BASTION_TRUTHS`` under ``_data/`` (the workers' variables point
    there); plug-in policy modules not installed in site-packages at the top of ``root``, which
    Ray puts on the workers' ``sys.path``. Returns (path → shipped path, environment).
    """
    remap: dict[str, str] = {}

    def ship(path: str) -> None:
        if path in remap or not Path(path).exists():
            return
        src = Path(path)
        digest = hashlib.sha256(str(src.resolve()).encode()).hexdigest()[:12]
        target = root / "_files" / digest / src.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target)
        else:
            shutil.copy2(src, target)
        remap[path] = str(target.relative_to(root))

    modules: set[str] = set()
    for run in runs:
        spec = run["spec"]
        for key in ("model", "gpu", "workload", "truth", "arrivals"):
            value = spec.get(key)
            if isinstance(value, str) and _is_path(value):
                ship(value)
        for p in spec["policies"]:
            path, sep, _ = p.partition(".py:")
            if sep:
                ship(path + ".py")
            elif ":" in p:
                modules.add(p.partition(":")[0].split(".")[0])
    for name in sorted(modules):
        found = importlib.util.find_spec(name)
        origin = getattr(found, "origin", None)
        if found is None or origin is None or _installed(Path(origin)):
            continue  # installed on the cluster like bastion itself (or a registered name)
        src = Path(origin)
        if src.name == "__init__.py":
            shutil.copytree(src.parent, root / name, dirs_exist_ok=True)
        else:
            shutil.copy2(src, root / src.name)
    env: dict[str, str] = {}
    for var in DATA_DIR_ENVS:
        dirs = [d for d in os.environ.get(var, "").split(os.pathsep) if d and Path(d).is_dir()]
        shipped = []
        for i, d in enumerate(dirs):
            target = root / "_data" / var.lower() / str(i)
            shutil.copytree(d, target)
            shipped.append(str(target.relative_to(root)))
        if shipped:
            env[var] = os.pathsep.join(shipped)
    return remap, env


def _run_ray(
    todo: Sequence[Run],
    finished: Callable[[Run, tuple[list[Row], list[Row]]], None],
    address: str | None,
    workers: int | None,
    connect_timeout: float,
) -> None:
    """Run on Ray: a local instance (``workers`` CPUs), or the cluster at ``address`` (then
    ``workers`` caps the runs in flight; the cluster's own CPUs decide where they go)."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("the ray executor needs Ray: pip install 'bastion[ray]'") from exc
    if not todo:
        return
    if address:
        _check_address(address, connect_timeout)
    with tempfile.TemporaryDirectory(prefix="bastion-ray-") as tmp:
        root = Path(tmp)
        remap, env = _stage(todo, root)
        runtime_env: dict[str, Any] = {"working_dir": str(root)}
        if env:
            runtime_env["env_vars"] = env
        started = not ray.is_initialized()
        if started:
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            ray.init(
                include_dashboard=False, log_to_driver=False, runtime_env=runtime_env, **kwargs
            )
        try:
            remote = ray.remote(num_cpus=1)(execute)
            options = {} if started else {"runtime_env": runtime_env}
            limit = workers if (address and workers) else len(todo)
            queue = list(todo)
            pending: dict[Any, Run] = {}
            while queue or pending:
                while queue and len(pending) < limit:
                    run = queue.pop(0)
                    shipped = {**run, "remap": remap, "python_path": ["."]}
                    pending[remote.options(**options).remote(shipped)] = run
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = exc.cause if isinstance(exc.cause, BastionError) else None
                        if cause is not None:
                            raise cause from None
                        raise
                    finished(pending.pop(ref), out)
        finally:
            if started:
                ray.shutdown()


# ---------------------------------------------------------------------------------------------
# Config files
# ---------------------------------------------------------------------------------------------

TOP_KEYS = ("name", "description", "report", "python_path", "grid", "quick")

COST_MODES = ("bare", "static", "ema", "ema+calib")


@dataclass(frozen=True)
class _Key:
    kind: str  # str, int, float
    low: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    path: bool = False  # a relative path is read from the config file's directory
    what: str = ""


GRID_KEYS: dict[str, _Key] = {
    "model": _Key("str", path=True, what="a bundled model name or a config.json path"),
    "gpu": _Key("str", path=True, what="a hardware profile name or a .toml path"),
    "workload": _Key("str", path=True, what="a workload preset, workload .toml or trace path"),
    "truth": _Key("str", path=True, what="a truth name or a truth .toml path"),
    "temperature": _Key("float", 0.0, what="a number ≥ 0"),
    "concurrency": _Key("int", 1, what="an integer ≥ 1"),
    "arrival_rate": _Key("float", 0.0, low_open=True, what="a number > 0 (requests/s)"),
    "arrivals": _Key("str", path=True, what="an arrivals file path"),
    "requests": _Key("int", 1, what="an integer ≥ 1"),
    "min_requests_per_client": _Key("int", 0, what="an integer ≥ 0"),
    "output_len": _Key("int", 2, what="an integer ≥ 2"),
    "prefill_chunk": _Key("int", 0, what="an integer ≥ 0"),
    "seed": _Key("int", 0, what="an integer ≥ 0"),
    "cost_mode": _Key(
        "str",
        choices=COST_MODES,
        what="one of " + ", ".join(COST_MODES) + ", profiled:[FORMAT:]FILE",
    ),
    "n_max": _Key("int", 1, what="an integer ≥ 1"),
    "policies": _Key("policies", what="a list of policy specs, or a list of such lists"),
}
"""The keys of a ``[grid]`` table. Each takes one value or a list of values (an axis of the
grid); ``policies`` takes one list of specs (all compared in every run) or a list of lists."""


@dataclass(frozen=True)
class ExperimentConfig:
    """A parsed, validated experiment config."""

    name: str
    source: str  # the file it came from
    grids: tuple[dict[str, list[Any]], ...]  # each key's values (axes), paths resolved
    quick: dict[str, list[Any]] = field(default_factory=dict)
    report: str | None = None
    description: str = ""
    python_path: tuple[str, ...] = ()

    def runs(self, quick: bool = False) -> list[Run]:
        """The runs of the grid(s), in order (the last axis varies fastest); validated."""
        out: list[Run] = []
        memo: dict[tuple[str, str], Any] = {}
        tags = {"experiment": self.name}
        for grid in self.grids:
            axes = {**grid, **(self.quick if quick else {})}
            names = list(axes)
            for combo in itertools.product(*(axes[k] for k in names)):
                point = dict(zip(names, combo, strict=True))
                per_client = point.pop("min_requests_per_client", 0)
                if "arrival_rate" in point and "concurrency" not in point:
                    point["concurrency"] = 64  # as `bastion simulate` in the open loop
                if per_client:
                    point["requests"] = max(
                        point.get("requests", 1), per_client * point.get("concurrency", 1)
                    )
                try:
                    spec = SimSpec(**point).to_dict()
                except BastionError as exc:
                    raise ConfigError(f"{self.source}: grid point {point}: {exc}") from None
                run: Run = {"spec": spec, "tags": dict(tags)}
                if self.python_path:
                    run["python_path"] = list(self.python_path)
                run["key"] = run_key(run, memo)
                out.append(run)
        return out


def _bad(source: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {key}: {message}")


def _values(source: str, where: str, key: str, raw: Any, base: Path) -> list[Any]:
    """One grid key's values as a list, each checked (and a relative path resolved)."""
    spec = GRID_KEYS[key]
    if spec.kind == "policies":
        if not isinstance(raw, list) or not raw:
            raise _bad(source, where, f"expected {spec.what}; got {raw!r}")
        groups = raw if all(isinstance(x, list) for x in raw) else [raw]
        out = []
        for group in groups:
            if not group or not all(isinstance(p, str) and p.strip() for p in group):
                raise _bad(source, where, f"expected {spec.what} (non-empty strings); got {raw!r}")
            out.append([_policy_path(p, base) for p in group])
        return out
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise _bad(source, where, f"an empty list gives no runs; expected {spec.what}")
    checked = []
    for v in values:
        ok = {
            "str": isinstance(v, str) and bool(v.strip()),
            "int": isinstance(v, int) and not isinstance(v, bool),
            "float": isinstance(v, int | float) and not isinstance(v, bool),
        }[spec.kind]
        if ok and spec.kind != "str":
            ok = is_finite(v) and (
                spec.low is None or (v > spec.low if spec.low_open else v >= spec.low)
            )
        if ok and spec.choices:
            ok = v in spec.choices or (key == "cost_mode" and v.startswith("profiled:"))
            if ok and key == "cost_mode" and v.startswith("profiled:"):  # a measured table
                from bastion.cost.profiled import split_profiled

                fmt, file = split_profiled(v) or (None, "")
                if not Path(file).expanduser().is_absolute():
                    file = str((base / file).resolve())
                v = "profiled:" + (f"{fmt}:" if fmt else "") + file
        if not ok:
            raise _bad(source, where, f"expected {spec.what} or a list of them; got {v!r}")
        if spec.path and _is_path(v) and not Path(v).expanduser().is_absolute():
            v = str((base / v).resolve())
        checked.append(float(v) if spec.kind == "float" else v)
    return checked


def _policy_path(policy: str, base: Path) -> str:
    path, sep, rest = policy.strip().partition(".py:")
    if sep and not Path(path).expanduser().is_absolute():
        return str((base / (path + ".py")).resolve()) + ":" + rest
    return policy.strip()


def _grid(source: str, where: str, table: Any, base: Path) -> dict[str, list[Any]]:
    if not isinstance(table, dict):
        raise _bad(source, where, f"expected a table of grid keys; got {table!r}")
    unknown = sorted(set(table) - set(GRID_KEYS))
    if unknown:
        raise _bad(
            source,
            f"{where}.{unknown[0]}",
            f"unknown key; accepted: {', '.join(GRID_KEYS)}",
        )
    return {k: _values(source, f"{where}.{k}", k, v, base) for k, v in table.items()}


def _check_names(source: str, grids: Mapping[str, Mapping[str, list[Any]]]) -> None:
    """Every model, GPU, workload and truth the grid names exists (before any run starts)."""
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import get_model
    from bastion.sim.truth import get_truth
    from bastion.sim.workloads import get_workload

    def workload(name: str) -> Any:
        path = Path(name)
        if path.suffix == ".json" or path.is_dir():
            if not path.exists():
                raise ConfigError(f"trace {name} not found")
            return None
        return get_workload(name)

    checks: dict[str, Callable[[str], Any]] = {
        "model": get_model,
        "gpu": get_profile,
        "workload": workload,
        "truth": get_truth,
    }
    for where, grid in grids.items():
        for key, check in checks.items():
            for value in grid.get(key, ()):
                try:
                    check(value)
                except BastionError as exc:
                    raise _bad(source, f"{where}.{key}", str(exc)) from None


@public
def load_config(path: str | os.PathLike[str]) -> ExperimentConfig:
    """Read and validate an experiment config (TOML); raises :class:`ConfigError` naming the
    file and the key for anything wrong."""
    file = Path(path)
    source = str(file)
    data = read_toml_file(file, "experiment config")  # missing, directory, binary: ConfigError
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise _bad(source, unknown[0], f"unknown key; accepted: {', '.join(TOP_KEYS)}")
    base = file.resolve().parent
    name = data.get("name", file.stem)
    if not isinstance(name, str) or not name.strip() or "/" in name or name.startswith("."):
        raise _bad(source, "name", f"expected a non-empty name without '/'; got {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _bad(source, "description", f"expected a string; got {description!r}")
    report = data.get("report")
    if report is not None and report not in REPORTS:
        raise _bad(source, "report", f"unknown report {report!r}; known: {', '.join(REPORTS)}")
    python_path = data.get("python_path", [])
    if isinstance(python_path, str):
        python_path = [python_path]
    if not isinstance(python_path, list) or not all(isinstance(p, str) for p in python_path):
        raise _bad(source, "python_path", f"expected a list of directories; got {python_path!r}")
    dirs = tuple(str((base / p).resolve()) for p in python_path)
    for d in dirs:
        if not Path(d).is_dir():
            raise _bad(source, "python_path", f"{d} is not a directory")
        if d not in sys.path:
            sys.path.insert(0, d)  # plug-in modules are imported while validating
    if "grid" not in data:
        raise _bad(source, "grid", "missing: a [grid] table (or [[grid]] tables) is required")
    raw = data["grid"]
    tables = raw if isinstance(raw, list) else [raw]
    if not tables:
        raise _bad(source, "grid", "an empty list of grids gives no runs")
    grids = tuple(
        _grid(source, "grid" if len(tables) == 1 else f"grid[{i}]", t, base)
        for i, t in enumerate(tables)
    )
    quick = _grid(source, "quick", data.get("quick", {}), base)
    where = ["grid"] if len(grids) == 1 else [f"grid[{i}]" for i in range(len(grids))]
    _check_names(source, {**dict(zip(where, grids, strict=True)), "quick": quick})
    config = ExperimentConfig(name, source, grids, quick, report, description, dirs)
    config.runs(quick=False)  # every grid point is a valid spec (policies included)
    return config


def experiment_dirs() -> list[Path]:
    """Where ``bastion experiment NAME`` looks for NAME.toml, first match wins:
    ``$BASTION_EXPERIMENTS`` directories, the configs installed with the package
    (``bastion/experiments``), then the repository's ``experiments/`` (a checkout)."""
    dirs = [Path(d) for d in os.environ.get(EXPERIMENT_DIR_ENV, "").split(os.pathsep) if d]
    installed = Path(str(resources.files("bastion"))) / "experiments"
    root = Path(__file__).resolve().parents[1]
    checkout = root / "experiments" if (root / "pyproject.toml").is_file() else installed
    for d in (installed, checkout):
        if d.is_dir() and d not in dirs:
            dirs.append(d)
    return dirs


def known_experiments() -> dict[str, Path]:
    """Shipped (and ``$BASTION_EXPERIMENTS``) experiment configs by name."""
    found: dict[str, Path] = {}
    for d in experiment_dirs():
        for p in sorted(d.glob("*.toml")):
            found.setdefault(p.stem, p)
    return found


def resolve_config(name_or_path: str | os.PathLike[str]) -> ExperimentConfig:
    """A config by shipped name (``budget-sweep``) or by path to a .toml file."""
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return load_config(text)
    known = known_experiments()
    if text not in known:
        raise ConfigError(
            f"unknown experiment {text!r}; known: {', '.join(known) or 'none'} "
            "(or give a config file: --config FILE.toml)"
        )
    return load_config(known[text])


# ---------------------------------------------------------------------------------------------
# Reports: the generic table, and the paper's analyses with their plots
# ---------------------------------------------------------------------------------------------


def _group(rows: Sequence[Row], keys: Sequence[str]) -> dict[tuple[Any, ...], list[Row]]:
    out: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _unimodal(values: Sequence[float], rtol: float = 0.01) -> bool:
    """Rises then falls (within rtol of noise)."""
    v = np.asarray(values)
    peak = int(np.argmax(v))
    up = np.all(np.diff(v[: peak + 1]) >= -rtol * v.max())
    down = np.all(np.diff(v[peak:]) <= rtol * v.max())
    return bool(up and down)


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: plots skipped (pip install 'bastion[plot]')")
        return None
    return plt


def _savefig(fig: Any, path: Path) -> None:
    """A figure as PNG, written atomically (a crash never leaves half an image)."""
    from bastion.files import save_figure_atomic

    save_figure_atomic(fig, path, dpi=110)
    _plt().close(fig)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(x: Any) -> str:
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


GENERIC_METRICS = (
    ("speedup", "speedup ×", 1.0),
    ("tau", "τ", 1.0),
    ("acceptance_rate", "acceptance", 1.0),
    ("mean_tree_size", "mean N", 1.0),
    ("tpot_s", "TPOT ms", 1e3),
    ("tpot_p99_s", "TPOT p99 ms", 1e3),
    ("ttft_p50_s", "TTFT p50 ms", 1e3),
    ("throughput_tok_s", "tok/s", 1.0),
)


def generic_report(rows: list[Row], out: Path) -> str:
    """One line per setting and policy: the spec columns that vary, then the metrics (means
    over seeds when the seed varies)."""
    varying = [c for c in SPEC_COLUMNS if c != "seed" and len({str(r.get(c)) for r in rows}) > 1]
    keys = [*varying, "policy"]
    table = []
    for key, rs in _group(rows, keys).items():
        values = []
        for name, _, scale in GENERIC_METRICS:
            xs = [r[name] for r in rs if isinstance(r.get(name), int | float)]
            values.append(scale * float(np.mean(xs)) if xs else float("nan"))
        table.append((*key, len(rs), *values))
    header = (*keys, "seeds", *[label for _, label, _ in GENERIC_METRICS])
    fixed = {c: rows[0].get(c) for c in SPEC_COLUMNS if c not in varying and c != "seed"}
    setting = ", ".join(f"{k} {v}" for k, v in fixed.items() if v is not None)
    return f"Fixed: {setting}.\n\n" + _md_table(header, table)


# budget-sweep ---------------------------------------------------------------------------------


def budget_sweep_report(rows: list[Row], out: Path) -> str:
    table = []
    groups = _group(rows, ("model", "gpu", "workload"))
    for key, rs in groups.items():
        by = {r["policy"]: r for r in rs}
        fixed = [by[f"fixed:{n}"]["speedup"] for n in FIXED_SWEEP]
        best = int(np.argmax(fixed))
        adaptive = by["bastion"]
        ratio = adaptive["speedup"] / fixed[best]
        paper = by.get("bastion:paper", {}).get("speedup", float("nan")) / fixed[best]
        table.append(
            (
                *key,
                FIXED_SWEEP[best],
                fixed[best],
                adaptive["speedup"],
                adaptive["mean_tree_size"],
                ratio,
                paper,
                "yes" if _unimodal(fixed) else "no",
            )
        )
    _budget_sweep_figure(groups, out)
    ratios = [t[-3] for t in table]
    papers = [t[-2] for t in table if t[-2] == t[-2]]
    uni = sum(t[-1] == "yes" for t in table)
    header = (
        "model",
        "gpu",
        "workload",
        "oracle N",
        "oracle ×",
        "adaptive ×",
        "adaptive N",
        "adaptive/oracle",
        "paper's controller/oracle",
        "unimodal",
    )
    paper_line = (
        f"; the paper's controller (bastion:paper)/oracle median {np.median(papers):.3f}, "
        f"min {min(papers):.3f}"
        if papers
        else ""
    )
    kept = sum(r >= 0.98 for r in ratios)
    return (
        _md_table(header, table)
        + "\n\nClaim (Fig. 6): fixed-N speedup curves are peaked, with a peak that moves with "
        f"model, GPU and workload; adaptive tracks the oracle. Simulator: unimodal in {uni}/"
        f"{len(table)} settings; oracle N ranges {min(t[3] for t in table)}–"
        f"{max(t[3] for t in table)}; adaptive (bastion, learning)/oracle median "
        f"{np.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}, ≥ 0.98 in "
        f"{kept}/{len(ratios)}{paper_line}."
    )


def _budget_sweep_figure(groups: Mapping[tuple[Any, ...], list[Row]], out: Path) -> None:
    """One row of panels per model × GPU (shared y axis), one column per workload; the
    adaptive controller's choice (its mean N and speedup) marked on each curve."""
    plt = _plt()
    if plt is None:
        return
    pairs = list(dict.fromkeys(k[:2] for k in groups))
    workloads = list(dict.fromkeys(k[2] for k in groups))
    width = max(3.6 * len(workloads), 7.0)
    ncol = 5 if width >= 10 else 3
    legend_in = 0.3 * math.ceil(5 / ncol)  # the figure legend's height (inches)
    fig, axes = plt.subplots(
        len(pairs),
        len(workloads),
        figsize=(width, 2.7 * len(pairs) + legend_in + 0.2),
        squeeze=False,
        sharex=True,
        sharey="row",
    )
    for (model, gpu, workload), rs in groups.items():
        i, j = pairs.index((model, gpu)), workloads.index(workload)
        ax = axes[i][j]
        by = {r["policy"]: r for r in rs}
        fixed = [by[f"fixed:{n}"]["speedup"] for n in FIXED_SWEEP]
        best = int(np.argmax(fixed))
        adaptive = by["bastion"]
        ax.semilogx(FIXED_SWEEP, fixed, "o-", color="C0", ms=3, label="fixed N")
        ax.plot(
            FIXED_SWEEP[best],
            fixed[best],
            "s",
            color="C0",
            mfc="none",
            ms=8,
            label="oracle (best fixed N)",
        )
        ax.axhline(adaptive["speedup"], color="C3", ls="--", lw=1, label="adaptive")
        ax.plot(
            max(adaptive["mean_tree_size"], FIXED_SWEEP[0] / 2),
            adaptive["speedup"],
            "*",
            color="C3",
            ms=10,
            label="adaptive: its mean N",
        )
        ax.axhline(by["chain"]["speedup"], color="C2", ls=":", lw=1, label="chain")
        ax.set_title(f"{model} · {gpu} · {workload}", fontsize=8)
        ax.grid(alpha=0.3)
        if i == len(pairs) - 1:
            ax.set_xlabel("tree size N")
        if j == 0:
            ax.set_ylabel("speedup over AR ×")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - (legend_in + 0.1) / fig.get_figheight()))
    _savefig(fig, out / "budget-sweep.png")


# best-first-vs-beam ---------------------------------------------------------------------------


def beam_report(rows: list[Row], out: Path) -> str:
    table = []
    for key, rs in _group(rows, ("model", "workload")).items():
        by = {r["policy"]: r for r in rs}
        bf, bm, ch = by["fixed:61"], by["beam:4x15"], by["chain"]
        table.append(
            (
                *key,
                ch["speedup"],
                bm["speedup"],
                bf["speedup"],
                bm["tau"],
                bf["tau"],
                100 * (bf["speedup"] / bm["speedup"] - 1),
            )
        )
    plt = _plt()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        x = np.arange(len(table))
        for j, (label, col) in enumerate((("chain", 2), ("beam 4×15", 3), ("best-first N=61", 4))):
            ax.bar(x + (j - 1) * 0.27, [t[col] for t in table], 0.27, label=label)
        ax.set_xticks(x, [f"{t[0]}\n{t[1]}" for t in table], fontsize=7)
        ax.set_ylabel("speedup ×")
        ax.legend(fontsize=7)
        fig.tight_layout()
        _savefig(fig, out / "best-first-vs-beam.png")
        plt.close(fig)
    gains = [t[-1] for t in table]
    wins = sum(g > 0 and t[6] >= t[5] for g, t in zip(gains, table, strict=True))
    header = (
        "model",
        "workload",
        "chain ×",
        "beam ×",
        "best-first ×",
        "beam τ",
        "best-first τ",
        "best-first gain %",
    )
    return (
        _md_table(header, table)
        + "\n\nClaim (Fig. 5): at a matched budget (beam 4×15 = 61 nodes) best-first has higher "
        f"τ and speedup (paper: +6–7 %). Simulator: best-first wins on both in {wins}/{len(table)}"
        f" settings; mean speedup gain {np.mean(gains):+.1f} %."
    )


# multi-batch ----------------------------------------------------------------------------------


def multi_batch_report(rows: list[Row], out: Path) -> str:
    policies = ["ar", "chain", "fixed:16", "fixed:32", "fixed:64", "bastion:per-request", "bastion"]
    if any(r["policy"] == "bastion:paper" for r in rows):  # the paper's controller, joint
        policies.insert(-1, "bastion:paper")
    levels = sorted({r["concurrency"] for r in rows})
    thr: dict[tuple[int, str], list[float]] = {(r["concurrency"], r["policy"]): [] for r in rows}
    for r in rows:
        thr[(r["concurrency"], r["policy"])].append(r["throughput_tok_s"])
    mean = {k: float(np.mean(v)) for k, v in thr.items()}
    table = []
    recover = []
    joint_gain = []
    for c in levels:
        best_fixed = max(mean[(c, p)] for p in policies if p.startswith("fixed"))
        recover.append(mean[(c, "bastion")] / best_fixed)
        joint_gain.append(mean[(c, "bastion")] / mean[(c, "bastion:per-request")])
        per_request = mean[(c, "bastion:per-request")] / best_fixed
        table.append((c, *[mean[(c, p)] for p in policies], per_request, recover[-1]))
    # Table 3: per-step decomposition, chain vs fixed:16, at the largest concurrency
    c_hi = levels[-1]
    parts = []
    for p in ("chain", "fixed:16"):
        rs = [r for r in rows if r["concurrency"] == c_hi and r["policy"] == p]
        steps = sum(r["steps"] for r in rs)
        parts.append(
            (
                p,
                *(1e3 * sum(r[k] for r in rs) / steps for k in ("draft_s", "prep_s", "verify_s")),
                float(np.mean([r["tau"] for r in rs])),
                float(np.mean([r["mean_batch"] for r in rs])),
            )
        )
    plt = _plt()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for p in policies[1:]:
            ax.plot(levels, [mean[(c, p)] for c in levels], "o-", label=p)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency C")
        ax.set_ylabel("throughput (tokens/s)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        _savefig(fig, out / "multi-batch.png")
        plt.close(fig)
    fastest = [max(policies[1:], key=lambda p, c=c: mean[(c, p)]) for c in levels]  # type: ignore[misc]
    header = (
        "C",
        *[f"{p} tok/s" for p in policies],
        "per-request/best fixed",
        "joint/best fixed",
    )
    dec = _md_table(
        ("policy", "draft ms/step", "prep ms/step", "verify ms/step", "τ", "batch"), parts
    )
    ch, tr = parts[0], parts[1]
    return (
        _md_table(header, table) + f"\n\nStep decomposition at C = {c_hi} (Table 3):\n\n{dec}\n\n"
        "Claims (Tables 2–3): untuned adaptive reaches ~98.6 % of the best fixed budget; larger "
        "fixed trees lose their lead as C grows; a tree costs more preparation and verification "
        f"than the chain under batching. Simulator: adaptive (joint budget)/best-fixed mean "
        f"{np.mean(recover):.3f} (min {min(recover):.3f}); joint/per-request mean "
        f"{np.mean(joint_gain):.3f} (min {min(joint_gain):.3f}, at C ≥ 4: min "
        f"{min(g for c, g in zip(levels, joint_gain, strict=True) if c >= 4):.3f}); "
        f"fastest policy per C: "
        f"{dict(zip(levels, fastest, strict=True))}; at C = {c_hi} the N=16 tree costs "
        f"{100 * ((tr[1] + tr[2]) / (ch[1] + ch[2]) - 1):+.0f} % preparation (drafting and "
        f"host preparation, as the paper counts it; host preparation alone "
        f"{100 * (tr[2] / ch[2] - 1):+.0f} %) and {100 * (tr[3] / ch[3] - 1):+.0f} % "
        f"verification per step for {100 * (tr[4] / ch[4] - 1):+.1f} % τ "
        "(paper: +49.3 %, +15.1 %, +8.9 %)."
    )


# moe ------------------------------------------------------------------------------------------


def moe_report(rows: list[Row], out: Path) -> str:
    by = {r["policy"]: r for r in rows}
    fixed = [p for p in by if p.startswith("fixed:")]
    table = [
        (p, by[p]["speedup"], by[p]["tau"], by[p]["mean_tree_size"])
        for p in [*fixed, "chain", "bastion:paper", "bastion"]
        if p in by
    ]
    plt = _plt()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ns = [int(p.split(":")[1]) for p in fixed]
        ax.semilogx(ns, [by[p]["speedup"] for p in fixed], "o-", label="fixed N")
        ax.axhline(by["bastion"]["speedup"], color="C3", ls="--", label="adaptive")
        ax.axhline(by["chain"]["speedup"], color="C2", ls=":", label="chain")
        ax.set_xlabel("tree size N")
        ax.set_ylabel("speedup ×")
        ax.set_title("qwen3-coder-30b-a3b · a100-sxm-80gb · code", fontsize=8)
        ax.legend(fontsize=7)
        fig.tight_layout()
        _savefig(fig, out / "moe.png")
        plt.close(fig)
    sp = [by[p]["speedup"] for p in fixed]
    taus = [by[p]["tau"] for p in fixed]
    falling = all(b <= a * 1.01 for a, b in itertools.pairwise(sp))
    rising = all(b >= a * 0.99 for a, b in itertools.pairwise(taus))
    return (
        _md_table(("policy", "speedup ×", "τ", "mean N"), table)
        + "\n\nClaims (Tables 7–8): on the MoE target τ rises with N while speedup falls from "
        "N = 16 on, and adaptive beats the DFlash chain. Simulator: τ rising "
        f"{'yes' if rising else 'no'}; speedup falling {'yes' if falling else 'no'}; adaptive "
        f"{by['bastion']['speedup']:.2f}× vs chain {by['chain']['speedup']:.2f}×"
        + (
            f"; the paper's controller {by['bastion:paper']['speedup']:.2f}×."
            if "bastion:paper" in by
            else "."
        )
    )


# latency-model --------------------------------------------------------------------------------


def latency_report(rows: list[Row], out: Path) -> str:
    rows = [r for r in rows if r["policy"] == "bastion"]
    table = []
    for (model, mode), rs in _group(rows, ("model", "cost_mode")).items():
        table.append(
            (
                model,
                mode,
                float(np.mean([r["speedup"] for r in rs])),
                float(np.mean([r["tau"] for r in rs])),
                float(np.mean([r["mean_tree_size"] for r in rs])),
            )
        )
    fits = {r["model"]: (r["calib_rmse_bare_ms"], r["calib_rmse_ms"]) for r in rows}
    _latency_figure(sorted(fits), out)
    fit_lines = "; ".join(
        f"{m}: RMSE {b:.2f} → {c:.2f} ms ({100 * (1 - c / b):.0f} % lower)"
        for m, (b, c) in fits.items()
    )
    static = {t[0]: t[2] for t in table if t[1] == "static"}
    best = {m: max(t[2] for t in table if t[0] == m) for m in static}
    return (
        _md_table(("model", "cost model", "speedup ×", "τ", "mean N"), table)
        + "\n\nClaims (§5.2, Fig. 7): linear calibration cuts the bare roofline's RMSE by "
        "87–90 %; Static is the most robust default; EMA alone is fragile. Simulator: "
        f"{fit_lines}. Static is within "
        + ", ".join(f"{m}: {100 * (1 - static[m] / best[m]):.1f} %" for m in static)
        + " of the best mode."
    )


def _latency_figure(models: Sequence[str], out: Path) -> None:
    """Measured (the simulated GPU) vs predicted (bare, calibrated) verification latency."""
    plt = _plt()
    if plt is None:
        return
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model
    from bastion.interfaces import StepLoad
    from bastion.sim.gpu import SimulatedGPU
    from bastion.sim.simulate import calibrated_cost_model

    hw = get_profile("a100-sxm-80gb")
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.4), squeeze=False)
    s = np.arange(1, 513)
    for ax, name in zip(axes[0], models, strict=True):
        model = get_model(name)
        gpu = SimulatedGPU(hw, model, DrafterSpec.dflash_for(model))
        static = calibrated_cost_model(gpu, "static")[0]
        bare = calibrated_cost_model(gpu, "bare")[0]
        for j, c in enumerate((64, 256, 1024)):
            truth = [gpu.verify_truth([n], [c]) * 1e3 for n in s]
            ax.plot(s, truth, color=f"C{j}", lw=1, label=f"measured c={c}")
            load = StepLoad(c)
            ax.plot(s, static.cost_curve(512, load).verify_s * 1e3, "--", color=f"C{j}", lw=1)
            ax.plot(s, bare.cost_curve(512, load).verify_s * 1e3, ":", color=f"C{j}", lw=1)
        ax.set_title(f"{name} · a100-sxm-80gb (-- calibrated, ··· bare)", fontsize=8)
        ax.set_xlabel("tokens verified")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    _savefig(fig, out / "latency-model.png")
    plt.close(fig)


def _regret_report(rows: list[Row], out: Path) -> str:
    from bastion.sim.regret import regret_report

    return regret_report(rows, out)


REPORTS: dict[str, Callable[[list[Row], Path], str]] = {
    "generic": generic_report,
    "budget-sweep": budget_sweep_report,
    "best-first-vs-beam": beam_report,
    "multi-batch": multi_batch_report,
    "moe": moe_report,
    "latency-model": latency_report,
    "controller-regret": _regret_report,
}
"""Reports a config may name (``report = "…"``); without one an experiment gets ``generic``."""


# ---------------------------------------------------------------------------------------------
# Running an experiment
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What an experiment would do: its runs, how many are stored, where it writes."""

    config: ExperimentConfig
    runs: list[Run]
    target: Path
    stored: int

    @property
    def simulations(self) -> int:
        return sum(len(r["spec"]["policies"]) + 1 for r in self.runs)  # + AR

    def describe(self) -> str:
        axes: dict[str, list[Any]] = {}
        for grid in self.config.grids:
            for k, v in grid.items():
                axes.setdefault(k, []).extend(x for x in v if x not in axes.get(k, []))
        shape = " × ".join(
            f"{len(v)} {k}" for k, v in axes.items() if len(v) > 1 and k != "policies"
        )
        return (
            f"{self.config.name}: {len(self.runs)} runs ({shape or 'one setting'}), "
            f"{self.simulations} policy simulations (AR included); {self.stored} stored, "
            f"{len(self.runs) - self.stored} to compute; results in {self.target}"
        )


def plan(config: ExperimentConfig, out: Path, quick: bool = False) -> Plan:
    target = out / config.name
    runs = config.runs(quick)
    directory = target / ("runs-quick" if quick else "runs")
    stored = sum((directory / f"{r['key']}.json").is_file() for r in runs)
    return Plan(config, runs, target, stored)


def _progress_bar(name: str) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar: Any = None

    def tick(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=name, unit="run", file=sys.stderr, dynamic_ncols=True)
        bar.update(done - bar.n)

    def close() -> None:
        if bar is not None:
            bar.close()

    return tick, close


@public
def run_experiment(
    name: str | os.PathLike[str] | ExperimentConfig,
    out: Path,
    executor: str = "process",
    address: str | None = None,
    workers: int | None = None,
    quick: bool = False,
    progress: bool = False,
    connect_timeout: float = 30.0,
) -> str:
    """Run or resume an experiment (a shipped name, a config path, or a loaded config); write
    results.csv, results.json, requests.csv, plots and summary.md; return the summary."""
    config = name if isinstance(name, ExperimentConfig) else resolve_config(name)
    p = plan(config, out, quick)
    store = RunStore(p.target / ("runs-quick" if quick else "runs"))
    tick, close = _progress_bar(config.name) if progress else (None, lambda: None)
    try:
        rows = run_all(p.runs, store, executor, workers, address, tick, connect_timeout)
    finally:
        close()
    requests = [q for run in p.runs for q in store.record(run).get("requests", [])]
    write_csv_atomic(p.target / "results.csv", rows)
    write_records_json(
        p.target / "results.json", rows, experiment=config.name, config=config.source
    )
    write_csv_atomic(p.target / "requests.csv", requests)
    report = REPORTS[config.report or "generic"]
    title = f"# {config.name}{' (quick)' if quick else ''}\n\n"
    if config.description:
        title += config.description.strip() + "\n\n"
    summary = title + report(rows, p.target) + "\n"
    write_text_atomic(p.target / "summary.md", summary)
    return summary
