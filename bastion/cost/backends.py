"""A small registry of verification backends that a profiling sweep can time.

A backend factory takes ``(model, hardware, seed)`` and returns ``verify(s, c)``: a callable that
runs (or simulates) one verification pass of ``s`` tokens over ``c`` cached ones and returns its
time in seconds, or ``None`` to be timed by the wall clock. Later code (the simulator, the torch
backend) adds itself with :func:`register_backend`.

Registered here: ``synthetic``, a made-up GPU whose truth is the bare roofline with tile
quantisation steps and seeded noise, so that calibration can be exercised without hardware.

What this module does not do: fit anything (see :mod:`bastion.cost.calibration`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np

from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.roofline import verify_pass
from bastion.errors import UnknownNameError
from bastion.guard import public

__all__ = ["BackendFactory", "VerifyFn", "get_backend", "known_backends", "register_backend"]

VerifyFn = Callable[[int, int], "float | None"]
BackendFactory = Callable[[ModelSpec, HardwareProfile, int], VerifyFn]

_REGISTRY: dict[str, BackendFactory] = {}


@public
def register_backend(name: str, factory: BackendFactory, *, replace: bool = False) -> None:
    """Make ``factory`` available under ``name`` (``replace=True`` to override)."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"backend {name!r} is already registered")
    _REGISTRY[name] = factory


# Backends that live in optional parts of the project register themselves when their module is
# imported; a lookup by name imports the module first, so importing this module stays cheap.
_PLUGINS: dict[str, str] = {"sim": "bastion.sim.gpu"}


def known_backends() -> list[str]:
    return sorted(set(_REGISTRY) | set(_PLUGINS))


@public
def get_backend(name: str) -> BackendFactory:
    if name not in _REGISTRY and name in _PLUGINS:
        importlib.import_module(_PLUGINS[name])
    if name not in _REGISTRY:
        raise UnknownNameError(f"unknown backend {name!r}; known: {', '.join(known_backends())}")
    return _REGISTRY[name]


def synthetic_backend(
    model: ModelSpec,
    hw: HardwareProfile,
    seed: int = 0,
    *,
    slowdown: float = 1.3,
    tile_tokens: int = 64,
    noise: float = 0.02,
    overhead_s: float = 2e-4,
) -> VerifyFn:
    """A made-up device: bare roofline × ``slowdown`` on tile-padded GEMMs, + overhead, × noise.

    Deterministic for a given ``seed`` and call sequence; returns the time (nothing is run).
    """
    rng = np.random.default_rng(seed)
    opt = RooflineOptions(tile_tokens=tile_tokens)

    def verify(s: int, c: int) -> float:
        truth = float(verify_pass(model, hw, [(s, c)], opt).total_s) * slowdown + overhead_s
        return truth * float(np.exp(noise * rng.standard_normal()))

    return verify


register_backend("synthetic", synthetic_backend)
