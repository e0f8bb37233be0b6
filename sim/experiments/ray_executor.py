"""The Ray executor: runs on a local Ray instance, or on a cluster with ``--address``.

Workers do not share the driver's files, so :func:`run_ray` first stages what the runs read —
files the specs name, the ``BASTION_HWPROFILES`` / ``BASTION_WORKLOADS`` / ``BASTION_TRUTHS``
directories, plug-in policy modules not installed in site-packages — into a temporary directory
that Ray ships as the job's ``working_dir``, and each run is sent with the map from the driver's
paths to the shipped copies. A task's :class:`bastion.errors.BastionError` is re-raised as
itself, so a bad input reads the same on Ray as locally.

What this module does not do: simulate (:func:`.worker.execute` does, on the worker).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bastion.errors import BastionError, ConfigError
from bastion.guard import each, mapping_with, public

from .ray_connect import check_address, one_line
from .runs import Row, Run, installed, is_path
from .worker import FILE_KEYS, execute

__all__ = ["DATA_DIR_ENVS", "run_ray"]

DATA_DIR_ENVS = ("BASTION_HWPROFILES", "BASTION_WORKLOADS", "BASTION_TRUTHS")


def _stage(runs: Sequence[Run], root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Copy what the workers must read into ``root`` (Ray's ``working_dir``).

    Files the specs name (profiles, model and drafter configs, workloads, traces, truths,
    arrivals, ``file.py`` policies) go under ``_files/``; the directories of ``BASTION_HWPROFILES``,
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
        if not isinstance(spec, Mapping):
            raise ConfigError(f"a run's spec must be a mapping (a simulate spec); got {spec!r:.80}")
        for key in FILE_KEYS:
            value = spec.get(key)
            if isinstance(value, str) and is_path(value):
                ship(value)
        policies = spec.get("policies", ())
        if isinstance(policies, str) or not isinstance(policies, Sequence):
            raise ConfigError(f"a run's policies must be a list of specs; got {policies!r:.80}")
        for p in policies:
            if not isinstance(p, str):
                continue  # not a file or a module to ship: the worker's spec check names it
            path, sep, _ = p.partition(".py:")
            if sep:
                ship(path + ".py")
            elif ":" in p:
                modules.add(p.partition(":")[0].split(".")[0])
    for name in sorted(modules):
        found = importlib.util.find_spec(name)
        origin = getattr(found, "origin", None)
        if found is None or origin is None or installed(Path(origin)):
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


@public(todo=each(mapping_with("spec")))
def run_ray(
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
        check_address(address, connect_timeout)  # bounded: a hang or a refusal is one line
    with tempfile.TemporaryDirectory(prefix="bastion-ray-") as tmp:
        root = Path(tmp)
        remap, env = _stage(todo, root)
        runtime_env: dict[str, Any] = {"working_dir": str(root)}
        if env:
            runtime_env["env_vars"] = env
        started = not ray.is_initialized()
        if started:
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            try:
                ray.init(
                    include_dashboard=False, log_to_driver=False, runtime_env=runtime_env, **kwargs
                )
            except (ConnectionError, RuntimeError, TimeoutError) as exc:
                where = f"at {address}" if address else "locally"
                raise ConfigError(f"Ray could not start {where}: {one_line(str(exc))}") from None
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
