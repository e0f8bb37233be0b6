"""Synthetic workloads: drafter marginals and the target's tokens, with real structure.

A synthetic request is a stream of speculative steps. At each step the drafter proposes a row of
top-K marginals q_k for each of ``depth`` future positions, and the target's token at each of
those positions is drawn *relative to the drafter's row*:

    P(target token = the drafter's rank-r candidate at position k) = c_r · a_k · q_k[r],
    P(target token is outside the drafter's top-K)                 = the rest,

with c_r = λ (``alignment``) for the head candidates (the top-1, and a fork's second), c_r = λ₂
(``runner_alignment``, default λ) for the other runners-up, and a_k an optional per-depth
multiplier (``alignment_by_depth``). λ < 1 is an over-confident drafter, λ > 1 an
under-confident one (a row whose law would exceed 1 is scaled down to 1). λ = λ₂ = 1 is the
self-verification model of Prop. 3.2, where Â is exact.

**Rows.** The *head mass* h of position k at step s of request r is a logistic of

    logit(top1 · decay^(k−1))  (or of ``top1_by_depth[k]``)  + d_r + e_s + η_{s,k},

with d_r ~ N(0, ``difficulty_sd``) per request (difficulty), e_s ~ N(0, ``step_sd``) per step
(confidence that varies from step to step, shared by the step's positions) and η_{s,k} ~
N(0, ``position_sd``) per position. Forks — a second candidate close to the first — come two
ways. An isolated fork (probability ``fork_rate`` per position) splits the head mass between two
candidates, q₁ = h/(1+v), q₂ = h·v/(1+v), v ~ U(``fork_ratio_min``, 1); the target takes the
second with probability λ·q₂. A *branch* (probability ``branch_rate`` per step, from a uniform
depth, lasting a geometric number of positions with mean ``branch_len``) is a run of such forks
where the drafter cannot tell two continuations apart: the target follows one side through the
whole run (the second with probability v/(1+v)), so its runner-ups are correlated over depth
and a tree catches them along one path. The rest of a row, 1 − h, spreads over the remaining
ranks by a Dirichlet (``concentration``: small = peaky, large = flat; ``tail_alpha``: the share
outside the top-K).

**Temperature.** At T > 0 the target samples: it agrees less with the drafter's top-1 and lands
more often on a runner-up. λ is multiplied by exp(−``temperature_penalty``·T) and λ₂ by
exp(−``temperature_penalty``·T)·(1 + ``temperature_spread``·T). With the new fields at their
defaults (no step or position noise, no forks, λ₂ = λ, no spread) this is the earlier model.

**Files.** A workload is a TOML file (``workloads/*.toml``, see docs/workloads.md): looked up by
name in the directories of ``$BASTION_WORKLOADS`` (``os.pathsep``-separated), then the package's
own; or given by path. A file may declare ``aliases``: the shipped ``qwen3-8b-math``,
``qwen3-8b-code`` and ``qwen3-8b-chat`` answer to ``math``, ``code`` and ``chat``. Its ``[fit]``
table records what the parameters were fitted to (not read by the generator).

What this module does not do: draw the streams (sim.synthetic does, for a whole batch at once),
fit workloads (sim.workload_fit), time anything (sim.gpu) or run policies (the engine does).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError, UnknownNameError
from bastion.files import checked_table, config_kind, read_toml_file, write_text_atomic
from bastion.guard import public, writable_file

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "PRESETS",
    "WORKLOAD_DIR_ENV",
    "Workload",
    "get_workload",
    "known_workloads",
    "load_workload",
    "read_workload_file",
    "workload_dirs",
    "workload_to_toml",
    "write_workload",
]

WORKLOAD_DIR_ENV = "BASTION_WORKLOADS"


@dataclass(frozen=True)
class Workload:
    """Parameters of a synthetic drafter–target pair on one kind of task (see the module doc).

    Lengths. ``prompt_len`` and ``output_len`` are the medians of log-normal length
    distributions: a request's length is ``round(median · exp(σ·Z))`` with Z standard normal,
    clipped to [1, ``*_len_max``] (see :meth:`sample_lengths`). σ = 0 (the default) gives every
    request exactly the median. The presets' σ and clip values are assumptions chosen to give
    plausible shapes (math and code prompts shorter-tailed than chat, chat spread like
    ShareGPT-style conversations), not measurements of any dataset.
    """

    name: str
    top1: float  # drafter's head mass (top-1, or top-2 of a fork) at position 1, at d = e = η = 0
    decay: float  # multiplicative decay of that head mass per position
    concentration: float  # Dirichlet parameter of the runner-up mass (entropy knob)
    alignment: float  # λ: target agreement with the top-1 per unit of drafter probability
    difficulty_sd: float = 0.5  # per-request spread of the head log-odds
    temperature_penalty: float = 0.08  # λ_T = λ · exp(−penalty · T)
    tail_alpha: float = 2.0  # Dirichlet weight of the mass outside the top-K
    output_len: int = 512  # tokens generated per request (the median when sampled)
    prompt_len: int = 256  # context before the first step (the median when sampled)
    depth: int = 15  # drafted positions per step (block size 16 → 15)
    k: int = 16  # candidates kept per position
    prompt_len_sigma: float = 0.0  # σ of the log-normal prompt length around its median (0: fixed)
    output_len_sigma: float = 0.0  # σ of the log-normal output length around its median
    prompt_len_max: int = 32_768  # sampled prompt lengths are clipped to this
    output_len_max: int = 32_768  # sampled output lengths are clipped to this
    step_sd: float = 0.0  # per-step spread of the head log-odds (shared by a step's positions)
    position_sd: float = 0.0  # per-position spread of the head log-odds
    fork_rate: float = 0.0  # probability that a position is an isolated fork
    branch_rate: float = 0.0  # probability that a step holds a branch (a run of forks)
    branch_len: float = 3.0  # mean length of a branch in positions (geometric, ≥ 1)
    fork_ratio_min: float = 0.5  # a fork's q₂/q₁ is uniform in [fork_ratio_min, 1]
    runner_alignment: float | None = None  # λ₂ for runners-up but a fork's second (None: λ)
    temperature_spread: float = 0.0  # λ₂_T = λ₂ · exp(−penalty · T) · (1 + spread · T)
    top1_by_depth: tuple[float, ...] | None = None  # head mass per position (replaces top1·decay^k)
    alignment_by_depth: tuple[float, ...] | None = None  # multiplier a_k of λ and λ₂ per position
    description: str = field(default="", compare=False)

    MAX_TOKENS = 1_000_000  # (not a field) no prompt or output may be longer than this
    MAX_ALIGNMENT = 20.0  # (not a field) the largest λ, λ₂ or a_k accepted

    def __post_init__(self) -> None:
        top = self.MAX_TOKENS
        for name in ("top1_by_depth", "alignment_by_depth"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                try:
                    object.__setattr__(self, name, tuple(float(v) for v in value))
                except (TypeError, ValueError, OverflowError):  # the check below names it
                    object.__setattr__(self, name, (math.nan,))

        def whole(value: object, low: int, high: int) -> bool:
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                return False
            return low <= int(value) <= high

        def number(value: object, low: float, high: float, *, open_low: bool = False) -> bool:
            if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                return False
            if isinstance(value, int) and abs(value) > 2**1000:  # beyond a float
                return False
            v = float(value)
            return math.isfinite(v) and (v > low if open_low else v >= low) and v <= high

        def curve(values: tuple[float, ...] | None, low: float, high: float) -> bool:
            if values is None:
                return True
            ok_depth = whole(self.depth, 1, 4096) and len(values) == self.depth
            return ok_depth and all(number(v, low, high, open_low=True) for v in values)

        prompt_ok = whole(self.prompt_len, 1, top)
        output_ok = whole(self.output_len, 1, top)
        big = self.MAX_ALIGNMENT
        runner = self.runner_alignment

        checks = {
            "top1": (number(self.top1, 0, 1, open_low=True) and self.top1 < 1, "0 < top1 < 1"),
            "decay": (number(self.decay, 0, 1, open_low=True), "0 < decay ≤ 1"),
            "concentration": (number(self.concentration, 0, math.inf, open_low=True), "> 0"),
            "alignment": (number(self.alignment, 0, big, open_low=True), f"0 < alignment ≤ {big}"),
            "difficulty_sd": (number(self.difficulty_sd, 0, math.inf), "a finite number ≥ 0"),
            "temperature_penalty": (number(self.temperature_penalty, 0, math.inf), "≥ 0"),
            "tail_alpha": (number(self.tail_alpha, 0, math.inf, open_low=True), "> 0"),
            "output_len": (output_ok, f"an integer in 1 … {top}"),
            "prompt_len": (prompt_ok, f"an integer in 1 … {top}"),
            "depth": (whole(self.depth, 1, 4096), "an integer in 1 … 4096"),
            "k": (whole(self.k, 1, 4096), "an integer in 1 … 4096"),
            "prompt_len_sigma": (number(self.prompt_len_sigma, 0, math.inf), "a finite number ≥ 0"),
            "output_len_sigma": (number(self.output_len_sigma, 0, math.inf), "a finite number ≥ 0"),
            "prompt_len_max": (
                whole(self.prompt_len_max, self.prompt_len if prompt_ok else 1, top),
                f"an integer in prompt_len ({self.prompt_len!r}) … {top}",
            ),
            "output_len_max": (
                whole(self.output_len_max, self.output_len if output_ok else 1, top),
                f"an integer in output_len ({self.output_len!r}) … {top}",
            ),
            "step_sd": (number(self.step_sd, 0, math.inf), "a finite number ≥ 0"),
            "position_sd": (number(self.position_sd, 0, math.inf), "a finite number ≥ 0"),
            "fork_rate": (number(self.fork_rate, 0, 1) and self.fork_rate < 1, "0 ≤ fork_rate < 1"),
            "branch_rate": (number(self.branch_rate, 0, 1), "0 ≤ branch_rate ≤ 1"),
            "branch_len": (number(self.branch_len, 1, 4096), "a number in 1 … 4096"),
            "fork_ratio_min": (number(self.fork_ratio_min, 0, 1, open_low=True), "0 < … ≤ 1"),
            "runner_alignment": (
                runner is None or number(runner, 0, big, open_low=True),
                f"absent, or 0 < runner_alignment ≤ {big}",
            ),
            "temperature_spread": (number(self.temperature_spread, 0, math.inf), "≥ 0"),
            "top1_by_depth": (
                curve(self.top1_by_depth, 0, 1) and max(self.top1_by_depth or (0,)) < 1,
                f"absent, or {self.depth!r} numbers in (0, 1), one per drafted position",
            ),
            "alignment_by_depth": (
                curve(self.alignment_by_depth, 0, big),
                f"absent, or {self.depth!r} numbers in (0, {big}], one per drafted position",
            ),
        }
        bad = [(name, accepted) for name, (ok, accepted) in checks.items() if not ok]
        if bad:
            values = "; ".join(f"{b}={getattr(self, b)!r} (accepted: {a})" for b, a in bad)
            raise ConfigError(f"workload {self.name!r} has out-of-range parameters: {values}")

    def with_(self, **changes: object) -> Workload:
        return replace(self, **changes)  # type: ignore[arg-type]

    def head_curve(self) -> npt.NDArray[np.float64]:
        """The head mass per drafted position before any per-request, step or position noise."""
        if self.top1_by_depth is not None:
            return np.asarray(self.top1_by_depth, dtype=np.float64)
        return np.asarray(self.top1 * self.decay ** np.arange(self.depth), dtype=np.float64)

    def rank_alignment(self, temperature: float = 0.0) -> npt.NDArray[np.float64]:
        """``[depth, K]``: the factor c_r·a_k of the target's law at temperature T."""
        cool = math.exp(-self.temperature_penalty * temperature)
        first = self.alignment * cool
        runner = self.alignment if self.runner_alignment is None else self.runner_alignment
        runner *= cool * (1.0 + self.temperature_spread * temperature)
        row = np.full(self.k, runner)
        row[0] = first
        by_depth = (
            np.ones(self.depth) if self.alignment_by_depth is None else self.alignment_by_depth
        )
        return np.asarray(np.outer(by_depth, row), dtype=np.float64)

    def sample_lengths(
        self, rng: np.random.Generator, n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Prompt and output lengths of ``n`` requests: two int64 arrays, each in [1, max].

        Draws one standard-normal matrix of shape (2, n) — prompts in row 0, outputs in row 1 —
        whatever the σ, so that a given generator state gives the same output lengths whether or
        not the prompts are spread. Length = clip(round(median · exp(σ·Z)), 1, ``*_len_max``).
        """
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ConfigError(f"sample_lengths needs a whole number n ≥ 0 of requests; got {n!r}")
        if n == 1:  # one request (a call per request admitted)
            prompt, out = self._lengths_of_one(rng)
            return np.array([prompt], np.int64), np.array([out], np.int64)
        z = rng.standard_normal((2, int(n)))
        # both rows in one pass: each entry is its row's round(median · exp(σ·z)), then
        # np.clip(…, 1, max)'s values (never NaN) without its per-call cost
        median, sigma, high = np.array(
            (
                (self.prompt_len, self.prompt_len_sigma, self.prompt_len_max),
                (self.output_len, self.output_len_sigma, self.output_len_max),
            ),
            dtype=np.float64,
        ).T[:, :, None]
        lengths = np.rint(median * np.exp(sigma * z))
        clipped = np.minimum(np.maximum(lengths, 1), high).astype(np.int64)
        return clipped[0], clipped[1]

    def _lengths_of_one(self, rng: np.random.Generator) -> tuple[int, int]:
        """``sample_lengths(rng, 1)``'s two lengths as Python ints: the same draws (two
        standard normals) and values on Python numbers — numpy's exp of both σ·z at once,
        Python's round() rounds half to even as np.rint does."""
        e_prompt, e_out = np.exp(rng.standard_normal(2) * self._length_sigmas).tolist()
        prompt = min(max(round(self.prompt_len * e_prompt), 1), self.prompt_len_max)
        out = min(max(round(self.output_len * e_out), 1), self.output_len_max)
        return prompt, out

    @functools.cached_property
    def _length_sigmas(self) -> npt.NDArray[np.float64]:
        """(σ of the prompts, σ of the outputs), read-only: made once, not per request."""
        sigmas = np.array((self.prompt_len_sigma, self.output_len_sigma), np.float64)
        sigmas.flags.writeable = False
        return sigmas


# -- files ------------------------------------------------------------------------------------

# The file's tables and the fields each holds; every field of Workload but ``name`` and
# ``description`` is in exactly one table.
_TABLES: dict[str, tuple[str, ...]] = {
    "drafter": (
        "top1",
        "decay",
        "top1_by_depth",
        "concentration",
        "tail_alpha",
        "difficulty_sd",
        "step_sd",
        "position_sd",
        "fork_rate",
        "branch_rate",
        "branch_len",
        "fork_ratio_min",
        "depth",
        "k",
    ),
    "target": (
        "alignment",
        "runner_alignment",
        "alignment_by_depth",
        "temperature_penalty",
        "temperature_spread",
    ),
    "lengths": (
        "prompt_len",
        "output_len",
        "prompt_len_sigma",
        "output_len_sigma",
        "prompt_len_max",
        "output_len_max",
    ),
}
_TOP_KEYS = ("name", "kind", "description", "aliases", "fit", *_TABLES)
_REQUIRED = ("top1", "decay", "concentration", "alignment")


@dataclass(frozen=True)
class WorkloadFile:
    """A workload as read from its file: the parameters, the names it answers to, its path and
    its ``[fit]`` table (provenance: what it was fitted to; ignored by the generator)."""

    workload: Workload
    aliases: tuple[str, ...]
    path: Path
    fit: Mapping[str, Any]


def _workload_from_dict(data: Mapping[str, Any], origin: str) -> WorkloadFile:
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key(s) {', '.join(unknown)}; accepted at the top level: "
            f"{', '.join(_TOP_KEYS)}"
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{origin}: key 'name' must be a non-empty string; got {name!r}")
    if data.get("kind", "workload") != "workload":
        raise ConfigError(
            f"{origin}: key 'kind' is {data['kind']!r}; a workload has kind = \"workload\" "
            "(or no kind key)"
        )
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{origin}: key 'aliases' must be a list of names; got {aliases!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{origin}: key 'description' must be a string")
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ConfigError(f"{origin}: [fit] must be a table")
    params: dict[str, Any] = {}
    for table, keys in _TABLES.items():
        section = checked_table(origin, table, data.get(table, {}), keys)
        for key, value in section.items():
            if key.endswith("_by_depth"):
                if not isinstance(value, list):
                    raise ConfigError(f"{origin}: [{table}] {key} must be a list of numbers")
                value = tuple(value)
            params[key] = value
    missing = [k for k in _REQUIRED if k not in params]
    if missing:
        raise ConfigError(f"{origin}: missing key(s) {', '.join(missing)} (needed in a workload)")
    try:
        workload = Workload(name=name, description=description, **params)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except TypeError as exc:  # a list where a number belongs, and the like
        raise ConfigError(f"{origin}: {exc}") from None
    return WorkloadFile(workload, tuple(aliases), Path(origin), fit)


@public
def read_workload_file(path: str | os.PathLike[str]) -> WorkloadFile:
    """Read and validate one workload file (errors name the file and the key)."""
    p = Path(path)
    data = read_toml_file(p, "workload file")  # missing, directory, binary, invalid: ConfigError
    if config_kind(data, str(p)) != "workload":
        raise ConfigError(
            f'{p} is a hardware profile (a [peak] table or kind = "hardware-profile"), not a '
            "workload; use it as --gpu"
        )
    return _workload_from_dict(data, str(p))


@public
def load_workload(path: str | os.PathLike[str]) -> Workload:
    """The workload of one file."""
    return read_workload_file(path).workload


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return repr(round(float(value), 6))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


@public
def workload_to_toml(
    workload: Workload, aliases: tuple[str, ...] = (), fit: Mapping[str, Any] | None = None
) -> str:
    """Serialise ``workload`` in the ``workloads/*.toml`` layout (fields at their defaults
    included, so a file says everything it means)."""
    lines = [f"name = {_toml_value(workload.name)}"]
    if workload.description:
        lines.append(f"description = {_toml_value(workload.description)}")
    if aliases:
        lines.append(f"aliases = {_toml_value(list(aliases))}")
    for table, keys in _TABLES.items():
        lines += ["", f"[{table}]"]
        for key in keys:
            value = getattr(workload, key)
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
    if fit:
        scalars = {k: v for k, v in fit.items() if not isinstance(v, list | dict)}
        lines += ["", "[fit]"]
        lines += [f"{_key(k)} = {_toml_value(v)}" for k, v in scalars.items()]
        for k, v in fit.items():
            if isinstance(v, dict):
                lines += ["", f"[fit.{_key(k)}]"]
                lines += [f"{_key(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
            elif isinstance(v, list) and all(isinstance(x, dict) for x in v):
                for item in v:
                    lines += ["", f"[[fit.{_key(k)}]]"]
                    lines += [f"{_key(kk)} = {_toml_value(vv)}" for kk, vv in item.items()]
            elif isinstance(v, list):
                lines.append(f"{_key(k)} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


@public(path=writable_file)
def write_workload(
    path: str | os.PathLike[str],
    workload: Workload,
    aliases: tuple[str, ...] = (),
    fit: Mapping[str, Any] | None = None,
) -> None:
    """Write ``workload`` to ``path`` atomically; reading it back gives the same workload."""
    text = workload_to_toml(workload, aliases, fit)
    _workload_from_dict(tomllib.loads(text), str(path))  # what we write must read back
    write_text_atomic(path, text)


# -- lookup -----------------------------------------------------------------------------------


def workload_dirs() -> list[Path]:
    """Where workloads are looked up by name, first match wins.

    1. directories in ``$BASTION_WORKLOADS``;
    2. the workloads installed with the package (``bastion/workloads`` in a wheel);
    3. the repository's top-level ``workloads/`` (an editable checkout).
    """
    dirs = [Path(d) for d in os.environ.get(WORKLOAD_DIR_ENV, "").split(os.pathsep) if d]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(
                f"${WORKLOAD_DIR_ENV} names {d}, which is not a directory; it takes directories "
                f"of workload files (*.toml) separated by {os.pathsep!r}"
            )
    installed = Path(str(resources.files("bastion"))) / "workloads"
    root = Path(__file__).resolve().parents[1]
    checkout = root / "workloads" if (root / "pyproject.toml").is_file() else installed
    for d in (installed, checkout):
        if d.is_dir() and d not in dirs:
            dirs.append(d)
    return dirs


def _index(dirs: list[Path]) -> dict[str, WorkloadFile]:
    """Every name and alias on the search path → its file; within one directory a name may
    not be claimed twice."""
    found: dict[str, WorkloadFile] = {}
    for d in dirs:
        here: dict[str, Path] = {}
        for p in sorted(d.glob("*.toml")):
            data = read_toml_file(p, "workload file")
            kind = config_kind(data, str(p))
            if kind != "workload":  # a directory may hold hardware profiles too
                log.info("%s is a %s, not a workload: skipped", p, kind)
                continue
            wf = _workload_from_dict(data, str(p))
            if wf.workload.name != p.stem:
                raise ConfigError(
                    f"{p}: key 'name' is {wf.workload.name!r}; a workload file's name must be "
                    f"its file name without .toml ({p.stem!r})"
                )
            for n in (wf.workload.name, *wf.aliases):
                if n in here:
                    raise ConfigError(f"{p}: name {n!r} is also claimed by {here[n]}")
                here[n] = p
                found.setdefault(n, wf)
    return found


def known_workloads() -> dict[str, WorkloadFile]:
    """Every workload name and alias on the search path, with its file."""
    return _index(workload_dirs())


@public
def get_workload(name_or_path: str | os.PathLike[str]) -> Workload:
    """A workload by name or alias (``math``, ``qwen3-8b-code``) or by path to a TOML file."""
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return load_workload(text)
    index = known_workloads()
    if text not in index:
        raise UnknownNameError(
            f"unknown workload {text!r}; known: {', '.join(sorted(index)) or '(none)'} "
            f"(or a workload .toml file, or a trace path for replay)"
        )
    return index[text].workload


class _Presets(Mapping[str, Workload]):
    """The shipped workloads by name and alias, read on first use (not at import)."""

    def __init__(self) -> None:
        self._data: dict[str, Workload] | None = None

    def _load(self) -> dict[str, Workload]:
        if self._data is None:
            dirs = [d for d in workload_dirs() if d.name == "workloads" and _shipped(d)]
            self._data = {n: wf.workload for n, wf in _index(dirs).items()}
        return self._data

    def __getitem__(self, name: str) -> Workload:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def _shipped(d: Path) -> bool:
    installed = Path(str(resources.files("bastion"))) / "workloads"
    root = Path(__file__).resolve().parents[1] / "workloads"
    return d in (installed, root)


PRESETS: Mapping[str, Workload] = _Presets()
