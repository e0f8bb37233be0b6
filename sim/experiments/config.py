"""Experiment configs: a TOML file describing a grid of simulations, validated key by key.

A config (format: ``docs/experiments-config.md``) names the experiment, optionally a built-in
``report`` (:data:`.reports.REPORTS`), a ``python_path`` for plug-in policy modules, and one
``[grid]`` table (or several ``[[grid]]`` tables) whose keys (:data:`GRID_KEYS`) each take one
value or a list of values — an axis. :func:`load_config` checks every key and value, resolves
relative paths against the config's directory, checks that every model, GPU, workload and truth
it names exists, and expands the grid once, so a bad config fails before any run starts, with a
:class:`bastion.errors.ConfigError` naming the file and the key. :meth:`ExperimentConfig.runs`
expands the grid (or its ``[quick]`` override) into runs, the last axis varying fastest.

Shipped configs are found by name (:func:`resolve_config`) in ``$BASTION_EXPERIMENTS``, the
configs installed with the package, and a checkout's ``experiments/`` directory.

What this module does not do: run anything (:mod:`.executors`, :mod:`.runner`).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from bastion.errors import BastionError, ConfigError
from bastion.files import read_toml_file
from bastion.guard import is_finite, public
from bastion.sim.simulate import SimSpec

from .reports import REPORTS
from .runs import REPO, Run, is_path, run_key

__all__ = [
    "EXPERIMENT_DIR_ENV",
    "GRID_KEYS",
    "ExperimentConfig",
    "experiment_dirs",
    "known_experiments",
    "load_config",
    "resolve_config",
]

EXPERIMENT_DIR_ENV = "BASTION_EXPERIMENTS"

TOP_KEYS = ("name", "description", "report", "python_path", "grid", "quick")

COST_MODES = ("bare", "static", "ema", "ema+calib")


@dataclass(frozen=True)
class _Key:
    kind: str  # str, int, float
    low: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    path: bool = False  # a relative path is read from the config file's directory
    only_path: bool = False  # always a path (never a name), even without a separator
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
    "prompt_len": _Key("int", 1, what="an integer ≥ 1 (every request's prompt, in tokens)"),
    "prefill_chunk": _Key("int", 0, what="an integer ≥ 0"),
    "seed": _Key("int", 0, what="an integer ≥ 0"),
    "cost_mode": _Key(
        "str",
        choices=COST_MODES,
        what="one of " + ", ".join(COST_MODES) + ", profiled:[FORMAT:]FILE",
    ),
    "n_max": _Key("int", 1, what="an integer ≥ 1"),
    "drafter_config": _Key(
        "str",
        path=True,
        only_path=True,
        what="a DFlash drafter config.json path (or its checkpoint directory)",
    ),
    "gpu_memory_utilization": _Key(
        "share", what='a number in (0, 1], or "off" (memory does not limit the run)'
    ),
    "slo_ttft_s": _Key("float", 0.0, low_open=True, what="a number > 0 (seconds)"),
    "slo_tpot_s": _Key("float", 0.0, low_open=True, what="a number > 0 (seconds)"),
    "tp": _Key(
        "int",
        1,
        what="an integer ≥ 1 (tensor parallelism: GPUs the model is split over; it must divide "
        "the model's attention heads)",
    ),
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
        recorded: dict[str, str] = {}  # label -> the policy spec recorded under it
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
                    sim_spec = SimSpec(**point)
                    spec = sim_spec.to_dict()
                    labels = sim_spec.labels()
                except BastionError as exc:
                    raise ConfigError(f"{self.source}: grid point {point}: {exc}") from None
                compared = ["ar", *[p for p in spec["policies"] if p != "ar"]]
                for given, label in zip(compared, labels, strict=True):
                    first = recorded.setdefault(label, given)
                    if first != given:
                        raise ConfigError(
                            f"{self.source}: policies {first!r} and {given!r} are both recorded "
                            f"as {label!r} in different runs, so the summary would merge them; "
                            "list them in one policies list (each is then recorded by its spec) "
                            "or give the plug-in classes distinct names"
                        )
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
    checked: list[Any] = []
    for v in values:
        if spec.kind == "share":
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if v == "off" or (number and is_finite(v) and 0 < v <= 1):
                checked.append(None if v == "off" else float(v))
                continue
            raise _bad(source, where, f"expected {spec.what} or a list of them; got {v!r}")
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
        named = spec.path and (spec.only_path or is_path(v))
        if named and not Path(v).expanduser().is_absolute():
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
    root = REPO
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


@public
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
