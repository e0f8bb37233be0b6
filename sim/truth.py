"""Truth files: the simulated GPU's ground truth per serving backend, as TOML data files.

A truth file says how the simulated device and its serving framework depart from the bare
roofline (:class:`bastion.sim.ground_truth.GroundTruth`). Shipped: ``hf-eager`` (Hugging Face
Transformers in eager mode, as the paper's batch-1 runs) and ``cudagraph`` (a serving engine that
replays CUDA graphs, as SGLang or vLLM), in ``sim/truths/``; ``builtin`` is the dataclass's
defaults (the bare roofline × constant efficiencies with tile steps; no file). Looked up, first
match wins:

1. directories in ``$BASTION_TRUTHS`` (``os.pathsep``-separated);
2. the files shipped with the package (``sim/truths/*.toml``).

``get_truth(NAME)`` or ``get_truth(PATH)`` (anything ending in ``.toml`` or holding a path
separator is a path). An unknown name is an error listing the known ones.

Layout: top-level ``name`` and ``description``; sections ``[device]``, ``[gemm_shape]``,
``[attention]``, ``[framework]``, ``[moe]``, ``[preparation]``, ``[host]``, ``[noise]`` whose keys
are :class:`~sim.ground_truth.GroundTruth` fields (in ``[gemm_shape]``: ``model = "kernel"``, or a
measured ``tokens`` and ``factor``), an optional ``[measured]`` (a measured truth: every cost
fitted from real steps on one machine, :mod:`bastion.sim.measured`), and
``[sources]`` (free text per key: where each number comes from). Every key is checked: an
unknown section or key, a wrong type or an out-of-range value is an error naming the file and
the key. ``docs/simulator.md`` ("The ground truth") documents every field.

``[gemm_shape] model = "kernel"`` (the shipped truths) gives every GEMM of every simulated GPU
its own steps: :func:`bastion.cost.kernels.step_factors` for that profile (SMs, clock, L2,
bandwidth) and model. ``python -m bastion.sim.truth gemm-shape CSV`` derives a measured
``[gemm_shape]`` table (``tokens``, ``factor``) from a Vidur-style per-operator CSV
(``docs/data/``): the measured GEMM time of a layer divided by its smooth roofline at the
measured efficiencies (memory at 1 token, compute at ≥ 2048 tokens) — one GPU's shape, kept as
validation data for the model (``docs/simulator.md``).
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from bastion.errors import ConfigError, UnknownNameError
from bastion.files import checked_table
from bastion.guard import public, readable_file
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.measured import measured_from_dict

__all__ = [
    "DEFAULT_TRUTH",
    "TRUTH_DIR_ENV",
    "gemm_shape_from_csv",
    "get_truth",
    "known_truths",
    "load_truth",
    "truth_dirs",
    "truth_from_dict",
]

TRUTH_DIR_ENV = "BASTION_TRUTHS"
DEFAULT_TRUTH = "hf-eager"
BUILTIN = "builtin"

_FIELDS = {f.name: f for f in fields(GroundTruth)}
# section → keys (GroundTruth fields; [gemm_shape] maps tokens/factor to gemm_shape_*)
SECTIONS: dict[str, tuple[str, ...]] = {
    "device": (
        "compute_scale",
        "memory_scale",
        "launch_scale",
        "tile_tokens",
        "tile_step_s",
        "weight_bytes",
        "activation_bytes",
        "interconnect_scale",
    ),
    "gemm_shape": ("model", "tokens", "factor"),
    "attention": ("tree_attention_penalty", "causal_reads_mask"),
    "framework": (
        "pass_overhead_s",
        "host_layer_s",
        "host_expert_s",
        "host_kernel_s",
        "host_adds",
    ),
    "moe": (
        "routing_skew",
        "routing_correlation",
        "moe_half_occupancy_per_sm",
        "moe_block_tokens",
    ),
    "preparation": (
        "prep_topk_bytes",
        "prep_argmax_bytes",
        "prep_tree_kernels",
        "prep_chain_kernels",
        "mask_bytes",
        "mask_kernels",
        "compaction_kernels_per_layer",
        "d2h_latency_s",
        "h2d_bandwidth",
        "h2d_latency_s",
    ),
    "host": (
        "tree_step_s",
        "tree_request_s",
        "tree_node_s",
        "mask_host_request_s",
        "mask_host_element_s",
        "controller_single_s",
        "controller_step_s",
        "controller_request_s",
        "controller_repeat_single_s",
        "controller_repeat_step_s",
        "controller_repeat_request_s",
        "controller_chain_single_s",
        "controller_chain_step_s",
        "controller_chain_request_s",
        "host_kernel_s",
    ),
    "noise": ("noise", "context_quantum"),
}
_INTS = {"tile_tokens", "moe_block_tokens", "prep_tree_kernels", "prep_chain_kernels"}
_INTS |= {"mask_kernels", "context_quantum"}


def _value(key: str, value: Any, where: str) -> Any:
    if key in ("causal_reads_mask", "host_adds"):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false; got {value!r}")
        return value
    if key == "model":
        if value != "kernel":
            raise ConfigError(
                f'{where}: {value!r}; accepted: "kernel" (each GPU\'s GEMM steps from the '
                "kernel-aware model), or give measured tokens and factor instead"
            )
        return value
    if key in ("tokens", "factor"):
        if not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{where}: must be a list of numbers; got {value!r}")
        return tuple(float(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: must be a number; got {value!r}")
    if key in _INTS:
        if value != int(value):
            raise ConfigError(f"{where}: must be a whole number; got {value!r}")
        return int(value)
    return float(value)


@public
def truth_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> GroundTruth:
    """Validate a parsed truth file (see the module docstring for the layout)."""
    known = {"name", "description", "sources", "measured", *SECTIONS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key(s) {', '.join(unknown)}; accepted: name, description, "
            f"[{'], ['.join(SECTIONS)}], [measured], [sources]"
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{origin}: 'name' must be a non-empty string")
    if "description" in data and not isinstance(data["description"], str):
        raise ConfigError(f"{origin}: 'description' must be a string")
    if "sources" in data and not isinstance(data["sources"], Mapping):
        raise ConfigError(f"{origin}: [sources] must be a table of strings")
    values: dict[str, Any] = {"name": name}
    for section, keys in SECTIONS.items():
        table = checked_table(origin, section, data.get(section, {}), keys)
        for key, raw in table.items():
            renamed = {
                "tokens": "gemm_shape_tokens",
                "factor": "gemm_shape_factor",
                "model": "gemm_shape_model",
            }
            field = renamed.get(str(key), str(key))
            if field in values:
                raise ConfigError(f"{origin}: {field} is given twice")
            values[field] = _value(key, raw, f"{origin}: [{section}].{key}")
    if "measured" in data:
        values["measured"] = measured_from_dict(data["measured"], origin)
    try:
        return GroundTruth(**values)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


@public
def load_truth(path: str | os.PathLike[str]) -> GroundTruth:
    """Read and validate one truth file."""
    from bastion.files import read_toml_file

    p = Path(path)
    data = read_toml_file(p, "truth file")  # missing, directory, binary, invalid: ConfigError
    return truth_from_dict(data, origin=str(p))


def truth_dirs() -> list[Path]:
    """Where truth files are looked up, first match wins (see the module docstring)."""
    dirs = [Path(d) for d in os.environ.get(TRUTH_DIR_ENV, "").split(os.pathsep) if d]
    shipped = Path(__file__).resolve().parent / "truths"  # shipped beside this module
    if shipped.is_dir() and shipped not in dirs:
        dirs.append(shipped)
    return dirs


def _index() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in truth_dirs():
        for p in sorted(d.glob("*.toml")):
            found.setdefault(p.stem, p)
    return found


def known_truths() -> list[str]:
    """Names of every truth on the search path, and ``builtin``, sorted."""
    return sorted({*_index(), BUILTIN})


@public
def get_truth(name_or_path: str | os.PathLike[str] | GroundTruth) -> GroundTruth:
    """A truth by name (``hf-eager``), by path to a TOML file, or a ``GroundTruth`` as is."""
    if isinstance(name_or_path, GroundTruth):
        return name_or_path
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return load_truth(text)
    index = _index()
    if text in index:
        return load_truth(index[text])
    if text == BUILTIN:
        return GroundTruth()
    raise UnknownNameError(
        f"unknown truth {text!r}; known: {', '.join(known_truths())} (or give a path to a "
        f".toml truth file, or add a directory of them to ${TRUTH_DIR_ENV})"
    )


# The shapes of the GEMMs in one layer of the measured model (Meta-Llama-3-8B): (in, out)
_LLAMA3_8B_GEMMS = {
    "qkv_proj_ms": (4096, 6144),
    "o_proj_ms": (4096, 4096),
    "gate_up_proj_ms": (4096, 28672),
    "down_proj_ms": (14336, 4096),
}


@public(path=readable_file)
def gemm_shape_from_csv(
    path: str | os.PathLike[str],
    peak_flops: float = 312e12,
    bandwidth: float = 2039e9,
    max_tokens: int = 4096,
) -> tuple[list[float], list[float], float, float]:
    """(tokens, factor, η_m, η_c) from a Vidur-style per-layer CSV of Llama-3-8B.

    factor(T) = measured Σ GEMM time / max(2·T·W / (η_c·peak), bytes(T) / (η_m·bandwidth)),
    with η_m the measured bandwidth fraction at the smallest T and η_c the median measured
    compute fraction at T ≥ 2048, so factor is 1 at both ends and shows what lies between:
    the gradual rise before the ridge and the steps at kernel and tile switches.
    """
    p = Path(path)
    with p.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    missing = [c for c in ("num_tokens", *_LLAMA3_8B_GEMMS) if rows and c not in rows[0]]
    if not rows or missing:
        raise ConfigError(f"{p}: needs columns num_tokens, {', '.join(_LLAMA3_8B_GEMMS)}")
    tokens = np.array([float(r["num_tokens"]) for r in rows])
    ms = np.array([[float(r[c]) for c in _LLAMA3_8B_GEMMS] for r in rows]).sum(axis=1)
    seconds = ms * 1e-3
    weights = sum(k * n for k, n in _LLAMA3_8B_GEMMS.values())
    io = sum(k + n for k, n in _LLAMA3_8B_GEMMS.values())
    compute = 2.0 * tokens * weights / peak_flops
    memory = 2.0 * (weights + tokens * io) / bandwidth
    first = int(np.argmin(tokens))
    eta_m = float(memory[first] / seconds[first])
    eta_c = float(np.median((compute / seconds)[tokens >= 2048]))
    factor = seconds / np.maximum(compute / eta_c, memory / eta_m)
    keep = tokens <= max_tokens
    return tokens[keep].tolist(), np.round(factor[keep], 3).tolist(), eta_m, eta_c


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "gemm-shape":
        print("usage: python -m bastion.sim.truth gemm-shape CSV", file=sys.stderr)
        return 2
    tokens, factor, eta_m, eta_c = gemm_shape_from_csv(argv[1])
    print(f"# derived by `python -m bastion.sim.truth gemm-shape {argv[1]}`")
    print(f"# measured efficiencies: memory {eta_m:.3f} at 1 token, compute {eta_c:.3f} (≥ 2048)")
    print("[gemm_shape]")
    print("tokens = [" + ", ".join(str(int(t)) for t in tokens) + "]")
    print("factor = [" + ", ".join(f"{f:g}" for f in factor) + "]")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
