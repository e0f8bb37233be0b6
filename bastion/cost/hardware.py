"""Hardware profiles: the numbers a roofline needs about one device, read from TOML.

A profile is one TOML file in the repository's top-level ``hwprofiles/`` directory (shipped in
the wheel as ``bastion/hwprofiles``), with peak numbers in ``[peak]``, default achievable
fractions in ``[efficiency]``, the link between GPUs of a tensor-parallel group in
``[interconnect]`` (:class:`Interconnect`) and, in ``[sources]``, where every number comes from.
Units are the library's: FLOP/s, bytes/s, bytes, seconds.

What this module does not do: hold any hardware number itself (they live only in the TOML files),
or measure a machine (see :mod:`bastion.cost.probe`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError, UnknownNameError
from bastion.guard import is_finite, public

log = logging.getLogger(__name__)

__all__ = [
    "INTERCONNECT_KINDS",
    "PROFILE_DIR_ENV",
    "HardwareProfile",
    "Interconnect",
    "get_profile",
    "known_profiles",
    "load_profile",
    "profile_dirs",
    "profile_to_toml",
]

#: Extra directories (``os.pathsep``-separated) searched before the bundled profiles.
PROFILE_DIR_ENV = "BASTION_HWPROFILES"

_PEAK_REQUIRED = ("bf16_flops", "memory_bandwidth", "memory_bytes", "l2_bytes", "sm_count")
_PEAK_OPTIONAL = ("fp8_flops", "l2_bandwidth", "sm_clock_hz", "max_threads_per_sm")
_EFFICIENCY_REQUIRED = ("compute", "memory", "launch_overhead_s")

#: ``[interconnect] kind``: NVLink (SXM boards or a bridge), PCIe, or none (a single device).
INTERCONNECT_KINDS = ("nvlink", "pcie", "none")
_LINK_REQUIRED = ("bandwidth", "latency_s")  # besides kind and max_gpus, unless kind = "none"
# [sources] keys of the [interconnect] fields (its own names would clash with [peak]'s)
_LINK_SOURCES = {
    "kind": "interconnect_kind",
    "bandwidth": "interconnect_bandwidth",
    "latency_s": "interconnect_latency_s",
    "max_gpus": "interconnect_max_gpus",
}


@dataclass(frozen=True)
class Interconnect:
    """The link between the GPUs of one tensor-parallel group (the profile's ``[interconnect]``).

    ``bandwidth`` is bytes/s **per GPU, per direction** (unidirectional): what one GPU can send
    while it receives as much — half of NVIDIA's NVLink "total bandwidth" figures, which count
    both directions (H100 SXM: 900 GB/s total, 450 GB/s each way). ``latency_s`` is the latency
    of one step of a ring collective (one hop). ``max_gpus`` is the most GPUs one group can span
    over this link (a node's GPUs; two for an NVLink bridge). ``kind = "none"``: a single device
    (``max_gpus`` 1, no bandwidth or latency)."""

    kind: str  # one of INTERCONNECT_KINDS
    max_gpus: int  # GPUs one tensor-parallel group can span over this link
    bandwidth: float = 0.0  # bytes/s per GPU per direction (0 for kind "none")
    latency_s: float = 0.0  # seconds per ring step (0 for kind "none")


@dataclass(frozen=True)
class HardwareProfile:
    """One device's peak numbers and default achievable efficiencies."""

    name: str  # profile name, e.g. "a100-sxm-80gb"
    description: str
    bf16_flops: float  # FLOP/s, dense BF16/FP16 tensor throughput
    memory_bandwidth: float  # bytes/s, peak DRAM/HBM bandwidth
    memory_bytes: float  # bytes of device memory
    l2_bytes: float  # bytes of last-level (L2) cache
    sm_count: int  # streaming multiprocessors (CPU: cores)
    compute_efficiency: float  # achievable fraction of bf16_flops, in (0, 1]
    memory_efficiency: float  # achievable fraction of memory_bandwidth, in (0, 1]
    launch_overhead_s: float  # seconds added per kernel launch
    fp8_flops: float | None = None  # FLOP/s, dense FP8 tensor throughput where it exists
    l2_bandwidth: float | None = None  # bytes/s, peak L2 read bandwidth where it is published
    sm_clock_hz: float | None = None  # Hz, the SM clock at which bf16_flops is reached (boost)
    max_threads_per_sm: int | None = None  # resident threads per SM (compute capability)
    interconnect: Interconnect | None = None  # the link between GPUs (None: not given)
    sources: Mapping[str, str] = field(default_factory=dict)  # field -> where the number is from
    path: str | None = None  # file it was read from

    @public(error=ConfigError)
    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for ``dtype`` ("bf16", "fp16" or "fp8")."""
        if dtype in ("bf16", "fp16", "bfloat16", "float16"):
            return self.bf16_flops
        if dtype in ("fp8", "float8"):
            if self.fp8_flops is None:
                raise ConfigError(f"profile {self.name!r} has no fp8_flops; accepted: bf16, fp16")
            return self.fp8_flops
        raise ConfigError(f"unknown dtype {dtype!r}; accepted: bf16, fp16, fp8")

    def with_efficiency(
        self,
        compute: float | None = None,
        memory: float | None = None,
        launch_overhead_s: float | None = None,
    ) -> HardwareProfile:
        """A copy with other default efficiencies (validated like a file)."""
        data = profile_to_dict(self)
        eff = data["efficiency"]
        if compute is not None:
            eff["compute"] = compute
        if memory is not None:
            eff["memory"] = memory
        if launch_overhead_s is not None:
            eff["launch_overhead_s"] = launch_overhead_s
        return profile_from_dict(data, origin=f"{self.name} (modified)")

    def to_dict(self) -> dict[str, Any]:
        return profile_to_dict(self)


def _positive(value: Any, where: str, origin: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{origin}: {where} must be a positive number, got {value!r}")
    if not is_finite(value) or value <= 0:
        raise ConfigError(f"{origin}: {where} must be a positive finite number, got {value!r:.40}")
    return float(value)


def _table(data: Mapping[str, Any], key: str, origin: str) -> Mapping[str, Any]:
    table = data.get(key)
    if not isinstance(table, Mapping):
        raise ConfigError(f"{origin}: missing table [{key}]")
    return table


def profile_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> HardwareProfile:
    """Validate a parsed profile (the TOML layout) and build a :class:`HardwareProfile`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: a hardware profile is a table, got {type(data).__name__}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{origin}: missing field 'name' (a non-empty string)")
    if data.get("kind", "hardware-profile") != "hardware-profile":
        raise ConfigError(
            f"{origin}: key 'kind' is {data['kind']!r}; a hardware profile has "
            'kind = "hardware-profile" (or no kind key)'
        )
    peak = _table(data, "peak", origin)
    eff = _table(data, "efficiency", origin)
    sources = _table(data, "sources", origin)
    values: dict[str, float] = {}
    for key in _PEAK_REQUIRED:
        if key not in peak:
            raise ConfigError(
                f"{origin}: missing field [peak].{key}; required: {', '.join(_PEAK_REQUIRED)}"
            )
        values[key] = _positive(peak[key], f"[peak].{key}", origin)
    for key in _PEAK_OPTIONAL:
        if key in peak:
            values[key] = _positive(peak[key], f"[peak].{key}", origin)
    for key in _EFFICIENCY_REQUIRED:
        if key not in eff:
            raise ConfigError(
                f"{origin}: missing field [efficiency].{key}; "
                f"required: {', '.join(_EFFICIENCY_REQUIRED)}"
            )
        values[key] = _positive(eff[key], f"[efficiency].{key}", origin)
    for key in ("compute", "memory"):
        if values[key] > 1.0:
            raise ConfigError(f"{origin}: [efficiency].{key} must be in (0, 1], got {values[key]}")
    description = data.get("description", name)
    if not isinstance(description, str):
        raise ConfigError(f"{origin}: field 'description' must be a string")
    for key in values:
        if not isinstance(sources.get(key), str) or not sources[key].strip():
            raise ConfigError(f"{origin}: [sources].{key} missing; every number needs a source")
    if values["sm_count"] != int(values["sm_count"]) or values["sm_count"] > 2**31 - 1:
        raise ConfigError(f"{origin}: [peak].sm_count must be an integer in [1, 2**31 - 1]")
    threads = values.get("max_threads_per_sm")
    if threads is not None and (threads != int(threads) or not 32 <= threads <= 65536):
        raise ConfigError(
            f"{origin}: [peak].max_threads_per_sm must be a whole number in [32, 65536], "
            f"got {threads!r}"
        )
    clock = values.get("sm_clock_hz")
    if clock is not None and not 1e7 <= clock <= 1e11:
        raise ConfigError(
            f"{origin}: [peak].sm_clock_hz is in Hz and must be in [1e7, 1e11] "
            f"(e.g. 1.41e9 for 1410 MHz), got {clock!r}"
        )
    link = _interconnect(data, sources, origin)
    return HardwareProfile(
        name=name,
        description=description,
        bf16_flops=values["bf16_flops"],
        memory_bandwidth=values["memory_bandwidth"],
        memory_bytes=values["memory_bytes"],
        l2_bytes=values["l2_bytes"],
        sm_count=int(values["sm_count"]),
        compute_efficiency=values["compute"],
        memory_efficiency=values["memory"],
        launch_overhead_s=values["launch_overhead_s"],
        fp8_flops=values.get("fp8_flops"),
        l2_bandwidth=values.get("l2_bandwidth"),
        sm_clock_hz=values.get("sm_clock_hz"),
        max_threads_per_sm=None if threads is None else int(threads),
        interconnect=link,
        sources={str(k): str(v) for k, v in sources.items()},
        path=None if origin.startswith("<") else origin,
    )


def _interconnect(
    data: Mapping[str, Any], sources: Mapping[str, Any], origin: str
) -> Interconnect | None:
    """The ``[interconnect]`` table, checked (None when the profile has none): ``kind`` one of
    :data:`INTERCONNECT_KINDS`, ``max_gpus`` a whole number ≥ 1, ``bandwidth`` and
    ``latency_s`` positive numbers (not for kind "none", whose ``max_gpus`` is 1), every value
    with its source in ``[sources]`` (keys ``interconnect_<field>``)."""
    if "interconnect" not in data:
        return None
    table = data["interconnect"]
    where = f"{origin}: [interconnect]"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table (kind, bandwidth, latency_s, max_gpus)")
    kind = table.get("kind")
    if kind not in INTERCONNECT_KINDS:
        raise ConfigError(
            f"{where}.kind is {kind!r}; accepted: {', '.join(map(repr, INTERCONNECT_KINDS))}"
        )
    keys = ("kind", "max_gpus") if kind == "none" else ("kind", *_LINK_REQUIRED, "max_gpus")
    unknown = sorted(set(table) - set(_LINK_SOURCES))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(_LINK_SOURCES)}"
        )
    for key in keys:
        if key not in table:
            raise ConfigError(
                f"{where}.{key} missing; required for kind {kind!r}: {', '.join(keys)}"
            )
    if kind == "none":
        extra = [k for k in _LINK_REQUIRED if k in table]
        if extra:
            raise ConfigError(f'{where}: kind "none" has no {", ".join(extra)}')
    gpus = table["max_gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 65536:
        raise ConfigError(f"{where}.max_gpus must be a whole number in [1, 65536], got {gpus!r}")
    if kind == "none" and gpus != 1:
        raise ConfigError(f'{where}.max_gpus must be 1 for kind "none" (one device), got {gpus}')
    values = {
        k: _positive(table[k], f"[interconnect].{k}", origin) for k in _LINK_REQUIRED if k in table
    }
    for key in keys:
        src = sources.get(_LINK_SOURCES[key])
        if not isinstance(src, str) or not src.strip():
            raise ConfigError(
                f"{origin}: [sources].{_LINK_SOURCES[key]} missing (the source of "
                f"[interconnect].{key}); every number needs a source"
            )
    return Interconnect(
        kind=str(kind),
        max_gpus=int(gpus),
        bandwidth=values.get("bandwidth", 0.0),
        latency_s=values.get("latency_s", 0.0),
    )


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """The TOML layout of ``profile`` as nested dicts (inverse of :func:`profile_from_dict`)."""
    peak: dict[str, Any] = {
        "bf16_flops": profile.bf16_flops,
        "memory_bandwidth": profile.memory_bandwidth,
        "memory_bytes": profile.memory_bytes,
        "l2_bytes": profile.l2_bytes,
        "sm_count": profile.sm_count,
    }
    if profile.fp8_flops is not None:
        peak["fp8_flops"] = profile.fp8_flops
    if profile.l2_bandwidth is not None:
        peak["l2_bandwidth"] = profile.l2_bandwidth
    if profile.sm_clock_hz is not None:
        peak["sm_clock_hz"] = profile.sm_clock_hz
    if profile.max_threads_per_sm is not None:
        peak["max_threads_per_sm"] = profile.max_threads_per_sm
    out: dict[str, Any] = {
        "name": profile.name,
        "description": profile.description,
        "peak": peak,
        "efficiency": {
            "compute": profile.compute_efficiency,
            "memory": profile.memory_efficiency,
            "launch_overhead_s": profile.launch_overhead_s,
        },
    }
    link = profile.interconnect
    if link is not None:
        table: dict[str, Any] = {"kind": link.kind}
        if link.kind != "none":
            table.update(bandwidth=link.bandwidth, latency_s=link.latency_s)
        table["max_gpus"] = link.max_gpus
        out["interconnect"] = table
    out["sources"] = dict(profile.sources)
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


@public
def profile_to_toml(profile: HardwareProfile) -> str:
    """Serialise ``profile`` in the ``hwprofiles/*.toml`` layout."""
    data = profile_to_dict(profile)
    lines = [
        f"name = {_toml_value(data['name'])}",
        f"description = {_toml_value(data['description'])}",
    ]
    for table in ("peak", "efficiency", "interconnect", "sources"):
        if table not in data:
            continue
        lines.append("")
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in data[table].items())
    return "\n".join(lines) + "\n"


@public(error=ConfigError)
def load_profile(path: str | os.PathLike[str]) -> HardwareProfile:
    """Read and validate one profile file."""
    from bastion.files import config_kind, read_toml_file

    p = Path(path)
    data = read_toml_file(p, "hardware profile file")
    if isinstance(data, dict) and config_kind(data, str(p)) != "hardware-profile":
        raise ConfigError(
            f'{p} is a workload (no [peak] table, or kind = "workload"), not a hardware '
            "profile; use it as --workload"
        )
    return profile_from_dict(data, origin=str(p))


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins.

    1. directories in ``$BASTION_HWPROFILES``;
    2. the profiles installed with the package (``bastion/hwprofiles`` in a wheel);
    3. the repository's top-level ``hwprofiles/`` (an editable checkout).
    """
    dirs = [Path(d) for d in os.environ.get(PROFILE_DIR_ENV, "").split(os.pathsep) if d]
    installed = Path(str(resources.files("bastion"))) / "hwprofiles"
    root = Path(__file__).resolve().parents[2]
    checkout = root / "hwprofiles" if (root / "pyproject.toml").is_file() else installed
    for d in (installed, checkout):
        if d.is_dir() and d not in dirs:
            dirs.append(d)
    return dirs


def _is_profile(path: Path) -> bool:
    """Whether a file on the search path is a hardware profile: a workload file in the same
    directory (``kind = "workload"``, or no ``[peak]`` table) is skipped with a note; a file
    that cannot be read is kept, so its error shows when it is asked for by name."""
    from bastion.files import config_kind, read_toml_file

    try:
        kind = config_kind(read_toml_file(path, "hardware profile file"), str(path))
    except ConfigError:
        return True
    if kind != "hardware-profile":
        log.info("%s is a %s, not a hardware profile: skipped", path, kind)
    return kind == "hardware-profile"


def _index() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for p in sorted(d.glob("*.toml")):
            if p.stem not in found and _is_profile(p):
                found[p.stem] = p
    return found


def known_profiles() -> list[str]:
    """Names of every profile found on the search path, sorted."""
    return sorted(_index())


@public(error=ConfigError)
def get_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A profile by name (``a100-sxm-80gb``) or by path to a TOML file."""
    if not isinstance(name_or_path, str | os.PathLike) or not os.fspath(name_or_path):
        raise ConfigError(
            f"a hardware profile is a name (see `bastion hw list`) or a .toml path; "
            f"got {name_or_path!r}"
        )
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return load_profile(text)
    index = _index()
    if text not in index:
        raise UnknownNameError(
            f"unknown hardware profile {text!r}; known: {', '.join(sorted(index)) or '(none)'}"
            f" (or give a path to a .toml file)"
        )
    return load_profile(index[text])
