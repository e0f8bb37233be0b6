"""One simulation: several policies served on one simulated GPU, compared with AR decoding.

:func:`simulate` builds the simulated GPU for a (model, device) pair, calibrates the
controller's cost model by profiling that GPU (the cost model's 42-point sweep, 3 repeats, with
the tile-step term offered to the fit), then serves the same seeded requests with target-only
AR decoding and with each policy. Speedup is AR's mean TPOT over the policy's (the reference
benchmarks' definition); τ is macro-averaged over requests.

What this module does not do: sweep many settings (see :mod:`sim.experiments`) or print.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bastion.cost.calibration import CalibrationRecord, calibrate, profile_sweep
from bastion.cost.costmodel import CostMode, RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import ConfigError
from bastion.policies import AdaptivePolicy, make_policy
from sim.backend import SimRequest
from sim.gpu import GroundTruth, SimulatedGPU
from sim.serving import ServingResult, serve
from sim.workloads import SyntheticRequest, get_workload

__all__ = ["PolicyResult", "SimSpec", "SimulationResult", "calibrated_cost_model", "simulate"]

log = logging.getLogger(__name__)

DEFAULT_POLICIES = ("chain", "fixed:64", "bastion")


@dataclass(frozen=True)
class SimSpec:
    """Everything that determines a simulation's result (same spec → same numbers)."""

    model: str = "qwen3-8b"
    gpu: str = "h100-sxm"
    workload: str = "math"  # a preset name, or a trace file / directory (sim.replay)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    temperature: float = 0.0
    concurrency: int = 1
    requests: int = 8
    seed: int = 0
    output_len: int | None = None  # override the workload's tokens per request
    cost_mode: CostMode = "static"
    n_max: int = 1024  # the adaptive controller's cap
    truth: GroundTruth = field(default_factory=GroundTruth)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be ≥ 1; got {self.concurrency}")
        if self.requests < 1:
            raise ConfigError(f"requests must be ≥ 1; got {self.requests}")
        if self.output_len is not None and self.output_len < 2:
            raise ConfigError(f"output_len must be ≥ 2; got {self.output_len}")
        if not self.policies:
            raise ConfigError("at least one policy is needed")
        for p in self.policies:
            make_policy(p)  # raises on unknown or malformed specs

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["policies"] = list(self.policies)
        return d


@dataclass(frozen=True)
class PolicyResult:
    """One row of the comparison."""

    policy: str
    speedup: float  # AR TPOT / this TPOT
    tau: float
    mean_tree_size: float
    tpot_s: float
    throughput_tok_s: float
    draft_s: float
    prep_s: float
    verify_s: float
    steps: int
    mean_batch: float

    @classmethod
    def of(cls, r: ServingResult, ar_tpot_s: float) -> PolicyResult:
        return cls(
            policy=r.policy,
            speedup=ar_tpot_s / r.tpot_s if r.tpot_s > 0 else float("nan"),
            tau=r.tau,
            mean_tree_size=r.mean_tree_size,
            tpot_s=r.tpot_s,
            throughput_tok_s=r.throughput,
            draft_s=r.draft_s,
            prep_s=r.prep_s,
            verify_s=r.verify_s,
            steps=r.steps,
            mean_batch=r.mean_batch,
        )


@dataclass(frozen=True)
class SimulationResult:
    spec: SimSpec
    rows: tuple[PolicyResult, ...]  # AR first, then the spec's policies in order
    calibration_rmse_bare_s: float
    calibration_rmse_calibrated_s: float
    simulated_s: float  # total simulated time over all policies
    wall_s: float  # wall time of the whole simulation

    def row(self, policy: str) -> PolicyResult:
        for r in self.rows:
            if r.policy == policy:
                return r
        raise KeyError(policy)


def calibrated_cost_model(
    gpu: SimulatedGPU, mode: CostMode = "static", seed: int = 0
) -> tuple[RooflineCostModel, CalibrationRecord]:
    """The controller's belief: the nominal profile's roofline fitted to the simulated GPU."""
    probe = SimulatedGPU(gpu.hardware, gpu.model, gpu.drafter, gpu.truth, seed=seed + 7919)
    points = profile_sweep(lambda s, c: probe.verify_s([s], [c]), repeats=3, warmup=0)
    record = calibrate(gpu.model, gpu.hardware, points, backend="sim", tile_candidates=(0, 64, 128))
    model = RooflineCostModel(
        gpu.hardware,
        gpu.model,
        gpu.drafter,
        calibration=record if mode != "bare" and mode != "ema" else None,
        mode=mode,
        prep_s=float(np.median([probe.prep_truth([64])])),
    )
    return model, record


def _request_factory(spec: SimSpec) -> Callable[[int], SimRequest]:
    path = Path(spec.workload)
    if path.suffix == ".json" or path.is_dir():
        from sim.replay import replay_factory

        return replay_factory(path, spec.seed)
    workload = get_workload(spec.workload)
    if spec.output_len is not None:
        workload = workload.with_(output_len=spec.output_len)

    def make(index: int) -> SimRequest:
        rng = np.random.default_rng([spec.seed, index])
        return SyntheticRequest(workload, rng, spec.temperature, request_id=index)

    return make


def simulate(
    spec: SimSpec, progress: Callable[[str, int, int], None] | None = None
) -> SimulationResult:
    """Serve AR and every policy of ``spec`` on identical requests; compare."""
    start = time.perf_counter()
    hw = get_profile(spec.gpu)
    model = get_model(spec.model)
    drafter = DrafterSpec.dflash_for(model)

    def gpu() -> SimulatedGPU:
        return SimulatedGPU(
            hw, model, drafter, spec.truth, seed=spec.seed, max_tree_size=spec.n_max
        )

    cost_model, record = calibrated_cost_model(gpu(), spec.cost_mode, spec.seed)
    factory = _request_factory(spec)
    results: list[ServingResult] = []
    for name in ("ar", *[p for p in spec.policies if p != "ar"]):
        policy = make_policy(name)
        if isinstance(policy, AdaptivePolicy):
            policy = replace(policy, n_max=spec.n_max)
        cm = cost_model if isinstance(policy, AdaptivePolicy) else None
        if cm is not None and spec.cost_mode in ("ema", "ema+calib"):
            cm = calibrated_cost_model(gpu(), spec.cost_mode, spec.seed)[0]  # fresh γ
        tick = (lambda d, n, name=name: progress(name, d, n)) if progress else None
        results.append(
            serve(policy, gpu(), factory, spec.requests, spec.concurrency, cm, progress=tick)
        )
    ar_tpot = results[0].tpot_s
    rows = tuple(PolicyResult.of(r, ar_tpot) for r in results)
    return SimulationResult(
        spec=spec,
        rows=rows,
        calibration_rmse_bare_s=record.rmse_bare_s,
        calibration_rmse_calibrated_s=record.rmse_calibrated_s,
        simulated_s=sum(r.elapsed_s for r in results),
        wall_s=time.perf_counter() - start,
    )
