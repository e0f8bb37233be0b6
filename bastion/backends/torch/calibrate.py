"""Calibrating the cost model on the real device, and using the records in ``generate``.

``calibrate_target`` runs the cost model's profiling sweep (``bastion.cost.calibration``)
against real verification passes of a Hugging Face target (``verify_timer``) and caches the
fitted record under the key (device profile, model, dtype, backend = ``torch-cpu`` or
``torch-cuda``; ``torch-cpu-stream`` where the weight-streaming kernel multiplies).
``cached_cost_model`` loads that record, if one exists, as the
``RooflineCostModel`` the adaptive policy uses.

The roofline record prices the target only. ``calibrate_drafter`` times the drafter's batched
pass (``drafter_timer``) over a grid of batch sizes × contexts and fits
T_draft(B, ΣC) = d0 + d_B·B + d_C·ΣC (:class:`~.timing.DraftTiming`), cached beside the
roofline records under (backend, device name, target, drafter shape, dtype);
``drafter_timing`` returns the cached fit or measures one (a few passes, then cached). A
session's set-up (:mod:`.prepare`) wraps the cost model with it
(:func:`~.timing.with_draft_timing`), so Ĉ(N) includes the drafter's measured pass.

The device profile: ``--gpu NAME`` for a GPU (one of ``bastion hw list``); on a CPU, a profile
measured once by ``bastion hw probe`` (quick) and kept beside the calibration records.

What this module does not do: fit anything itself (the cost model does) or decode.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bastion.cost.calibration import (
    DEFAULT_CONTEXTS,
    DEFAULT_TOKENS,
    CalibrationCache,
    CalibrationRecord,
    calibrate,
    calibration_key,
    profile_sweep,
)
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import HardwareProfile, get_profile, load_profile, profile_to_toml
from bastion.cost.models import ModelSpec
from bastion.cost.notices import announce_reuse, measured_here, warn_if_poor
from bastion.errors import BackendError, ConfigError
from bastion.files import write_json_atomic, write_text_atomic
from bastion.guard import has, public

from .cpu_linear import streams
from .timing import DraftTiming, drafter_timer, fit_draft_timing, verify_timer

__all__ = [
    "DRAFT_BATCHES",
    "DRAFT_CONTEXTS",
    "cached_cost_model",
    "cached_drafter_timing",
    "calibrate_drafter",
    "calibrate_target",
    "device_profile",
    "drafter_timing",
    "target_spec",
]

DRAFT_BATCHES = (1, 2, 4, 8)
DRAFT_CONTEXTS = (64, 256)

log = logging.getLogger(__name__)

CPU_PROFILE = "this-machine"


def _dtype_name(model: Any) -> str:
    dtype = next(model.parameters()).dtype
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype)
    )


@public(model=has("config", "parameters"))
def target_spec(model: Any) -> ModelSpec:
    """The cost model's spec of a loaded Hugging Face target (from its config).

    Its name — part of the calibration cache key — is the checkpoint directory's name plus a
    hash of the shape fields, so two different models in directories of the same name never
    share a record."""
    cfg = model.config.to_dict()
    base = Path(str(getattr(model.config, "_name_or_path", "") or "target")).name or "target"
    spec = ModelSpec.from_hf_config(cfg, name=base)
    return replace(spec, name=f"{base}-{spec.shape_digest()}")


def cpu_profile_path(cache: CalibrationCache) -> Path:
    """Where this machine's probed CPU profile is kept: keyed by the machine (host name,
    processor, core count), so a shared cache directory never serves another machine's probe."""
    import os
    import platform

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            names = (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
            model = next(names, "")
    except OSError:  # not Linux: the platform's own description is enough
        pass
    machine = [platform.node(), platform.machine(), platform.processor(), model, os.cpu_count()]
    digest = hashlib.sha256(json.dumps(machine).encode()).hexdigest()[:10]
    return cache.directory / f"{CPU_PROFILE}-{digest}.toml"


@public
def device_profile(
    device: torch.device, gpu: str | None, cache: CalibrationCache
) -> HardwareProfile:
    """The hardware profile for ``device``: ``gpu`` if named; on CPU, a cached probe."""
    if gpu is not None:
        return get_profile(gpu)
    if device.type != "cpu":
        raise BackendError(
            f"calibrating on {device} needs --gpu NAME (its profile; see `bastion hw list`)"
        )
    path = cpu_profile_path(cache)
    if path.exists():
        announce_reuse(path)
        return load_profile(path)
    from bastion.cost.probe import probe_profile

    log.info("probing this machine for a CPU profile (once; kept at %s)", path)
    profile = probe_profile(CPU_PROFILE, quick=True)
    write_text_atomic(path, profile_to_toml(profile))
    measured_here(path)
    return profile


@public(model=has("config", "parameters"))
def calibrate_target(
    model: Any,
    gpu: str | None = None,
    cache: CalibrationCache | None = None,
    refit: bool = False,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    repeats: int = 3,
) -> tuple[CalibrationRecord, HardwareProfile, ModelSpec]:
    """Sweep real verification passes of ``model`` and fit (or load) the calibration record."""
    store = cache or CalibrationCache()
    device = next(model.parameters()).device
    hw = device_profile(device, gpu, store)
    spec = target_spec(model)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max(tokens) + max(contexts) > int(limit):
        raise BackendError(
            f"the sweep's largest pass ({max(tokens)} + {max(contexts)} tokens) exceeds the "
            f"target's context of {limit}; pass smaller --tokens/--contexts"
        )
    backend, dtype = _backend_name(model), _dtype_name(model)
    key = calibration_key(hw, spec, dtype, backend)
    found = None if refit else store.load(key)
    if found is not None:
        announce_reuse(store.path_for(key))
        warn_if_poor(found, store.path_for(key))
        return found, hw, spec
    # calibrate_or_load's sweep and fit, with the record written atomically
    points = profile_sweep(
        verify_timer(model, repeats=1), tokens=tokens, contexts=contexts, repeats=repeats
    )
    record = calibrate(spec, hw, points, backend=backend, dtype=dtype, tile_candidates=(0, 64, 128))
    warn_if_poor(record, store.save(record))
    return record, hw, spec


@public(model=has("config", "parameters"))
def cached_cost_model(
    model: Any, gpu: str | None = None, cache: CalibrationCache | None = None
) -> RooflineCostModel | None:
    """The calibrated cost model for ``model`` on its device, if a record is cached."""
    store = cache or CalibrationCache()
    device = next(model.parameters()).device
    if gpu is not None:
        hw = get_profile(gpu)
    elif device.type == "cpu" and cpu_profile_path(store).exists():
        hw = load_profile(cpu_profile_path(store))
    else:
        return None  # never probe or sweep implicitly: that is `bastion calibrate --target`
    spec = target_spec(model)
    record = store.load(calibration_key(hw, spec, _dtype_name(model), _backend_name(model)))
    if record is None:
        return None
    return RooflineCostModel(hw, spec, calibration=record)


# --------------------------------------------------------------------------------------------
# The drafter's pass
# --------------------------------------------------------------------------------------------


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"torch-cuda-{torch.cuda.get_device_name(device)}"
    return "torch-cpu"


def _kernel_suffix(model: Any) -> str:
    """``-stream`` where ``model`` multiplies with the weight-streaming CPU kernel (its passes
    cost differently, so its records are kept apart), else nothing."""
    return "-stream" if streams(model) else ""


def _backend_name(model: Any) -> str:
    """The calibration key's backend: ``torch-cpu`` / ``torch-cuda`` and the kernel suffix."""
    return f"torch-{next(model.parameters()).device.type}" + _kernel_suffix(model)


def _drafter_name(drafter: Any) -> str:
    shape = json.dumps(
        {
            "block": drafter.cfg.block_size,
            "layers": drafter.cfg.num_hidden_layers,
            "hidden": drafter.cfg.hidden_size,
            "heads": [drafter.cfg.num_attention_heads, drafter.cfg.num_key_value_heads],
            "ffn": drafter.cfg.intermediate_size,
            "taps": list(drafter.cfg.target_layer_ids),
            "vocab": drafter.cfg.vocab_size,
            "top_k": drafter.top_k,
        },
        sort_keys=True,
    )
    return f"dflash-{hashlib.sha256(shape.encode()).hexdigest()[:8]}"


def _drafter_record_path(target: Any, drafter: Any, cache: CalibrationCache) -> Path:
    device = next(target.parameters()).device
    parts = (
        _device_name(device) + _kernel_suffix(target),
        target_spec(target).name,
        _drafter_name(drafter),
    )
    slug = "__".join("".join(c if c.isalnum() or c in "._-" else "_" for c in p) for p in parts)
    return cache.directory / f"drafter__{slug}__{_dtype_name(target)}.json"


@public(target=has("config", "parameters"), drafter=has("cfg", "top_k"))
def cached_drafter_timing(
    target: Any, drafter: Any, cache: CalibrationCache | None = None
) -> DraftTiming | None:
    """The drafter's cached timing fit on this device, if there is one."""
    path = _drafter_record_path(target, drafter, cache or CalibrationCache())
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    return DraftTiming.from_dict(data, origin=str(path))


@public(target=has("config", "parameters"), drafter=has("cfg", "top_k"))
def calibrate_drafter(
    target: Any,
    drafter: Any,
    cache: CalibrationCache | None = None,
    refit: bool = False,
    batch_sizes: Sequence[int] = DRAFT_BATCHES,
    contexts: Sequence[int] = DRAFT_CONTEXTS,
    repeats: int = 3,
) -> DraftTiming:
    """Time the drafter's batched pass over ``batch_sizes`` × ``contexts`` and fit (or load)
    T_draft(B, ΣC); the fit is cached (written atomically)."""
    store = cache or CalibrationCache()
    if not refit:
        found = cached_drafter_timing(target, drafter, store)
        if found is not None:
            return found
    if min(batch_sizes) < 1 or min(contexts) < 1:
        raise BackendError("drafter calibration needs batch sizes and contexts ≥ 1")
    timer = drafter_timer(drafter, repeats=repeats)
    points = [
        (int(b), int(b) * int(c), timer(int(b), int(c))) for b in batch_sizes for c in contexts
    ]
    timing = fit_draft_timing(points)
    path = _drafter_record_path(target, drafter, store)
    write_json_atomic(path, timing.to_dict())
    measured_here(path)
    log.info("drafter timing %s (RMSE %.3f ms) cached at %s", timing, timing.rmse_s * 1e3, path)
    return timing


@public(target=has("config", "parameters"), drafter=has("cfg", "top_k"))
def drafter_timing(
    target: Any,
    drafter: Any,
    batch_sizes: Sequence[int] = (1,),
    cache: CalibrationCache | None = None,
) -> DraftTiming:
    """The cached drafter timing, or a quick one measured now (``batch_sizes`` × 64, 256)."""
    found = cached_drafter_timing(target, drafter, cache)
    if found is not None:
        return found
    sizes = sorted({1, 2, *batch_sizes})
    return calibrate_drafter(target, drafter, cache, True, sizes, DRAFT_CONTEXTS, repeats=2)


def calibrate_cycles_on_device(
    learner: Any,
    target: Any,
    drafter: Any,
    *,
    n_max: int = 256,
    context_len: int = 128,
    repeats: int = 2,
) -> dict[str, Any]:
    """Start-up timing of the learning controller's cycle table on this device, at batch 1:
    every token-lattice size up to ``n_max``, one AR and one chain cycle (``calibrate_cycles``).

    A cycle is timed as its two device passes — the drafter's ``draft_batch``
    (``drafter_timer``) and a verification pass of the tree's size (``verify_timer``; AR: one
    token) — so the host's tree building, mask and commit are not in it: the engine reports
    every real step's whole cycle, and those observations correct the cells while decoding.
    Returns what ``calibrate_cycles`` returns (cells, passes, device seconds)."""
    from bastion.learned import calibrate_cycles

    from .timing import drafter_timer, verify_timer

    verify = verify_timer(target, repeats=1, warmup=1)
    draft = drafter_timer(drafter, repeats=1, warmup=1)
    depth = int(drafter.cfg.block_size) - 1

    def measure(kind: str, contexts: Any, sizes: Any) -> float:
        c = int(contexts[0])
        if kind == "ar":
            return float(verify(1, c))
        return float(draft(1, c) + verify(int(sizes.sum()), c))

    return calibrate_cycles(
        learner,
        measure,
        batch_sizes=(1,),
        n_max=n_max,
        context_len=context_len,
        depth=depth,
        repeats=repeats,
    )
