"""Calibrating the cost model on the real device, and using the record in ``generate``.

``calibrate_target`` runs the cost model's profiling sweep (``bastion.cost.calibration``)
against real verification passes of a Hugging Face target (``verify_timer``) and caches the
fitted record under the key (device profile, model, dtype, backend = ``torch-cpu`` or
``torch-cuda``). ``cached_cost_model`` loads that record, if one exists, as the
``RooflineCostModel`` the adaptive policy uses.

The device profile: ``--gpu NAME`` for a GPU (one of ``bastion hw list``); on a CPU, a profile
measured once by ``bastion hw probe`` (quick) and kept beside the calibration records.

What this module does not do: fit anything itself (the cost model does) or decode.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from bastion.cost.calibration import (
    DEFAULT_CONTEXTS,
    DEFAULT_TOKENS,
    CalibrationCache,
    CalibrationRecord,
    calibrate_or_load,
)
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import HardwareProfile, get_profile, load_profile, profile_to_toml
from bastion.cost.models import ModelSpec
from bastion.errors import BackendError

from .timing import verify_timer

__all__ = ["cached_cost_model", "calibrate_target", "device_profile", "target_spec"]

log = logging.getLogger(__name__)

CPU_PROFILE = "this-machine"


def _dtype_name(model: Any) -> str:
    dtype = next(model.parameters()).dtype
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype)
    )


def target_spec(model: Any) -> ModelSpec:
    """The cost model's spec of a loaded Hugging Face target (from its config).

    Its name — part of the calibration cache key — is the checkpoint directory's name plus a
    hash of the shape fields, so two different models in directories of the same name never
    share a record."""
    cfg = model.config.to_dict()
    base = Path(str(getattr(model.config, "_name_or_path", "") or "target")).name or "target"
    spec = ModelSpec.from_hf_config(cfg, name=base)
    shape = json.dumps({k: v for k, v in asdict(spec).items() if k != "name"}, sort_keys=True)
    return replace(spec, name=f"{base}-{hashlib.sha256(shape.encode()).hexdigest()[:8]}")


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
    path = cache.directory / f"{CPU_PROFILE}.toml"
    if path.exists():
        return load_profile(path)
    from bastion.cost.probe import probe_profile

    log.info("probing this machine for a CPU profile (once; kept at %s)", path)
    profile = probe_profile(CPU_PROFILE, quick=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_to_toml(profile))
    return profile


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
    record = calibrate_or_load(
        spec,
        hw,
        verify_timer(model, repeats=1),
        backend=f"torch-{device.type}",
        dtype=_dtype_name(model),
        cache=store,
        refit=refit,
        sweep_kwargs={"tokens": tokens, "contexts": contexts, "repeats": repeats},
        tile_candidates=(0, 64, 128),
    )
    return record, hw, spec


def cached_cost_model(
    model: Any, gpu: str | None = None, cache: CalibrationCache | None = None
) -> RooflineCostModel | None:
    """The calibrated cost model for ``model`` on its device, if a record is cached."""
    store = cache or CalibrationCache()
    device = next(model.parameters()).device
    if gpu is not None:
        hw = get_profile(gpu)
    elif device.type == "cpu" and (store.directory / f"{CPU_PROFILE}.toml").exists():
        hw = load_profile(store.directory / f"{CPU_PROFILE}.toml")
    else:
        return None  # never probe or sweep implicitly: that is `bastion calibrate --target`
    spec = target_spec(model)
    record = store.load((hw.name, spec.name, _dtype_name(model), f"torch-{device.type}"))
    if record is None:
        return None
    return RooflineCostModel(hw, spec, calibration=record)
