"""One simulation: several policies served on one simulated GPU, compared with AR decoding.

:func:`simulate` builds the simulated GPU for a (model, device) pair, calibrates the
controller's cost model by profiling that GPU (the cost model's 42-point sweep, 3 repeats, with
the tile-step term offered to the fit), then serves the same seeded requests with target-only
AR decoding and with each policy — in a closed loop (``concurrency`` clients) or an open loop
(Poisson arrivals at ``arrival_rate`` per second, or an arrivals file), prompts prefilled in
chunks of ``prefill_chunk`` tokens. Speedup is AR's mean TPOT over the policy's (the reference
benchmarks' definition); τ is macro-averaged over requests. Each row also carries the latency
percentiles (TTFT, TPOT, end-to-end) and the simulated and wall seconds its serving loop took.

What this module does not do: sweep many settings (see :mod:`bastion.sim.experiments`) or print.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cost.calibration import (
    CalibrationRecord,
    calibrate,
    check_record,
    profile_sweep,
    read_record,
)
from bastion.cost.costmodel import CostMode, RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import check_tp
from bastion.cost.profiled import cost_model_from_spec, split_profiled
from bastion.errors import ConfigError
from bastion.guard import public
from bastion.interfaces import CostModel
from bastion.learned import LearnedCostModel
from bastion.policies import make_policy, policy_label, policy_labels
from bastion.sim.arrivals import Arrival, poisson_arrivals, read_arrivals
from bastion.sim.backend import MAX_REQUESTS
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.memory import DEFAULT_GPU_MEMORY_UTILIZATION, MemoryPlan, memory_of
from bastion.sim.policy_result import PolicyResult
from bastion.sim.prefill import DEFAULT_PREFILL_CHUNK
from bastion.sim.serving import LengthSource, ServingResult, serve
from bastion.sim.slo import check_slo
from bastion.sim.startup import learned_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.truth import DEFAULT_TRUTH, get_truth
from bastion.sim.workloads import Workload, get_workload

__all__ = [
    "COST_MODES",
    "PolicyResult",
    "SimSpec",
    "SimulationResult",
    "calibrated_cost_model",
    "simulate",
]

log = logging.getLogger(__name__)

DEFAULT_POLICIES = ("chain", "fixed:64", "bastion")


@public(error=ConfigError)
@dataclass(frozen=True)
class SimSpec:
    """Everything that determines a simulation's result (same spec → same numbers)."""

    model: str = "qwen3-8b"
    gpu: str = "h100-sxm"
    workload: str = "math"  # a preset name, or a trace file / directory (bastion.sim.replay)
    policies: tuple[Any, ...] = DEFAULT_POLICIES  # spec strings or policy objects
    temperature: float = 0.0
    concurrency: int = 1  # closed loop: clients; open loop: the most requests in service
    requests: int = 8
    arrival_rate: float | None = None  # open loop: Poisson arrivals per second
    arrivals: str | None = None  # open loop: an arrivals file (bastion.sim.arrivals)
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # prompt tokens prefilled per step (0: none)
    seed: int = 0
    output_len: int | None = None  # override the workload's tokens per request
    # override the workload's prompt: every request's prompt exactly this many tokens
    prompt_len: int | None = None
    # the controller's belief: bare | static | ema | ema+calib, or profiled:[FORMAT:]FILE (a
    # measured per-operator table, bastion.cost.profiled; the roofline beyond it is calibrated)
    cost_mode: str = "static"
    n_max: int = 1024  # the adaptive controller's cap
    truth: str | GroundTruth = DEFAULT_TRUTH  # the simulated GPU: a truth name, path or object
    # decode steps a learning policy serves (other requests, not measured) before its run
    warmup_steps: int = 200
    # the drafter: a DFlash config.json (or its checkpoint directory); None: the published
    # 5-layer layout at the target's widths (DrafterSpec.dflash_for)
    drafter_config: str | None = None
    # the controller's belief: a calibration record (what `bastion calibrate` writes) instead
    # of the sweep on the simulated GPU; for cost modes static, ema+calib, profiled:…
    calibration_file: str | None = None
    # the share of the GPU's memory the server takes: weights, activations, the paged KV cache
    # (bastion.sim.memory); None: memory does not limit the run
    gpu_memory_utilization: float | None = DEFAULT_GPU_MEMORY_UTILIZATION
    # service-level objectives (seconds; None: none): a request meets them when its TTFT and
    # TPOT are at most these; records report slo_attainment and goodput_rps
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    # tensor parallelism: the model split over this many GPUs of ``gpu``, linked by its
    # profile's [interconnect] (bastion.cost.parallel); the truth and the belief alike
    tp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or self.concurrency < 1:
            raise ConfigError(f"concurrency must be an integer ≥ 1; got {self.concurrency!r}")
        if (
            isinstance(self.requests, bool)
            or not isinstance(self.requests, int)
            or not 1 <= self.requests <= MAX_REQUESTS
        ):
            raise ConfigError(
                f"requests must be an integer in [1, {MAX_REQUESTS}]; got {self.requests!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be an integer ≥ 0; got {self.seed!r}")
        if (
            isinstance(self.n_max, bool)
            or not isinstance(self.n_max, int)
            or not 1 <= self.n_max <= MAX_TREE_SIZE
        ):
            raise ConfigError(
                f"n_max must be an integer in 1 … {MAX_TREE_SIZE}; got {self.n_max!r}"
            )
        if self.arrival_rate is not None and self.arrivals is not None:
            raise ConfigError("give an arrival rate or an arrivals file, not both")
        if self.arrival_rate is not None and not 0 < self.arrival_rate < float("inf"):
            raise ConfigError(
                f"arrival_rate must be a finite number > 0 (requests/s); got {self.arrival_rate}"
            )
        if isinstance(self.prefill_chunk, bool) or self.prefill_chunk < 0:
            raise ConfigError(
                f"prefill_chunk must be an integer ≥ 0 (0: no prefill); got {self.prefill_chunk!r}"
            )
        if (
            isinstance(self.warmup_steps, bool)
            or not isinstance(self.warmup_steps, int)
            or not 0 <= self.warmup_steps <= 1_000_000
        ):
            raise ConfigError(
                f"warmup_steps must be an integer in 0 … 1000000; got {self.warmup_steps!r}"
            )
        if self.output_len is not None and self.output_len < 2:
            raise ConfigError(f"output_len must be ≥ 2; got {self.output_len}")
        if self.prompt_len is not None and not 1 <= self.prompt_len <= Workload.MAX_TOKENS:
            raise ConfigError(
                f"prompt_len must be an integer in 1 … {Workload.MAX_TOKENS}; "
                f"got {self.prompt_len!r}"
            )
        if self.prompt_len is not None and (self.arrivals is not None or _is_trace(self.workload)):
            raise ConfigError(
                "prompt_len sets a synthetic workload's prompts; an arrivals file or a replayed "
                "trace brings its own prompt lengths"
            )
        if not self.policies:
            raise ConfigError("at least one policy is needed")
        object.__setattr__(self, "policies", tuple(self.policies))
        # raises on unknown or malformed specs, non-policies, a spec given twice
        self.labels()
        get_truth(self.truth)  # raises on an unknown truth name or a bad truth file
        _check_cost_mode(self.cost_mode)
        if self.drafter_config is not None:  # a str (the guard checks the type)
            self.drafter()  # a missing, unreadable or non-DFlash file, or one not fitting
        if self.calibration_file is not None:
            if self.cost_mode in ("bare", "ema"):
                raise ConfigError(
                    f"a calibration record is the belief of cost modes static, ema+calib and "
                    f"profiled:…; cost mode {self.cost_mode!r} does not use one"
                )
            self.stored_calibration()  # unreadable, not a record, another device or model
        check_slo("slo_ttft_s", self.slo_ttft_s)
        check_slo("slo_tpot_s", self.slo_tpot_s)
        self._check_tp()
        u = self.gpu_memory_utilization
        if u is not None and (
            isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1
        ):
            raise ConfigError(
                f"gpu_memory_utilization must be a number in (0, 1], or None (memory not "
                f"limited); got {u!r}"
            )
        drafts = [getattr(make_policy(p), "uses_drafter", True) for p in self.compared()]
        for d in sorted(set(drafts)):
            self.memory_plan(drafts=d)  # a model too large for its GPU: MemoryLimitError

    def _check_tp(self) -> None:
        """``tp``: an integer ≥ 1 that splits the model's heads (bastion.cost.parallel.check_tp)
        over GPUs the profile's interconnect links; with tp > 1, a belief the simulator
        calibrates itself (a calibration record or a measured table is one GPU's)."""
        tp = self.tp
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"tp (tensor parallelism) must be an integer ≥ 1; got {tp!r}")
        if tp == 1:
            return
        check_tp(get_model(self.model), tp, get_profile(self.gpu))
        check_tp(self.drafter().model, tp)
        if self.calibration_file is not None:
            raise ConfigError(
                f"--tp {tp}: a calibration record is fitted on one GPU; with tensor "
                "parallelism the controller's belief is calibrated on the simulated GPUs (drop "
                "--calibration)"
            )
        if self.cost_mode.startswith("profiled:"):
            raise ConfigError(
                f"--tp {tp}: a measured per-operator table ({self.cost_mode}) is one GPU's; "
                "accepted with tensor parallelism: cost modes bare, static, ema, ema+calib"
            )
        if get_truth(self.truth).measured is not None:
            raise ConfigError(
                f"--tp {tp}: truth {self.truth!r} is measured on one machine's device; tensor "
                "parallelism needs a roofline truth (hf-eager, cudagraph, builtin)"
            )

    def memory_plan(self, drafts: bool) -> MemoryPlan | None:
        """The GPU's memory for a run of a policy that drafts (weights and cache of the drafter
        too) or not (:func:`bastion.sim.memory.plan_memory`); None without a memory limit. A
        :class:`MemoryLimitError` when the model does not fit."""
        if self.gpu_memory_utilization is None:
            return None
        return memory_of(
            get_profile(self.gpu),
            get_model(self.model),
            self.drafter() if drafts else None,
            get_truth(self.truth),
            float(self.gpu_memory_utilization),
            self.concurrency,
            self.prefill_chunk,
            self.tp,
        )

    def stored_calibration(self) -> tuple[CalibrationRecord, bool] | None:
        """``calibration_file``'s record, checked against the spec's profile and model
        (:func:`bastion.cost.calibration.check_record`), and whether its inputs digest is
        theirs; None without one."""
        if self.calibration_file is None:
            return None
        record = read_record(self.calibration_file)
        exact = check_record(
            record, get_profile(self.gpu), get_model(self.model), self.calibration_file
        )
        return record, exact

    def drafter(self) -> DrafterSpec:
        """The drafter the simulated GPU prices: ``drafter_config``'s, checked against the
        target, or the published DFlash layout for the target (5 layers, its widths)."""
        model = get_model(self.model)
        if self.drafter_config is None:
            return DrafterSpec.dflash_for(model)
        return DrafterSpec.from_dflash_config(self.drafter_config, target=model)

    def compared(self) -> tuple[Any, ...]:
        """What :func:`simulate` serves, in order: AR (the baseline), then every other policy."""
        return ("ar", *[p for p in self.policies if p != "ar"])

    def labels(self) -> list[str]:
        """The label each policy of :meth:`compared` is recorded under: its display name, or
        its spec where two would share a name (:func:`bastion.policies.policy_labels`)."""
        return policy_labels(self.compared())

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready); a policy object is recorded by :func:`policy_label`."""
        d: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "policies":
                value = [policy_label(p) for p in value]
            elif is_dataclass(value) and not isinstance(value, type):
                value = asdict(value)
            d[f.name] = value
        return d


@dataclass(frozen=True)
class SimulationResult:
    spec: SimSpec
    rows: tuple[PolicyResult, ...]  # AR first, then the spec's policies in order
    calibration_rmse_bare_s: float
    calibration_rmse_calibrated_s: float
    simulated_s: float  # total simulated time over all policies
    wall_s: float  # wall time of the whole simulation
    served: tuple[ServingResult, ...] = ()  # each policy's run, request by request

    def request_rows(self) -> list[dict[str, Any]]:
        """One row per policy and request: the policy, the latency columns
        (:data:`bastion.sim.latency.REQUEST_COLUMNS`), then the request's τ and mean tree size."""
        return [
            {
                "policy": r.policy,
                "policy_spec": row.policy_spec,
                **q.latency().row(),
                "tau": q.tau,
                "mean_tree_size": float(np.mean(q.tree_sizes)) if q.tree_sizes else 0.0,
            }
            for r, row in zip(self.served, self.rows, strict=True)
            for q in r.requests
        ]

    def row(self, policy: str) -> PolicyResult:
        for r in self.rows:
            if r.policy == policy:
                return r
        raise KeyError(policy)


COST_MODES: tuple[CostMode, ...] = ("bare", "static", "ema", "ema+calib")


def _check_cost_mode(mode: object) -> None:
    if mode in COST_MODES:
        return
    profiled = split_profiled(mode) if isinstance(mode, str) else None
    if profiled is not None:
        file = profiled[1]
        if file and Path(file).is_file():
            return
        raise ConfigError(f"cost model {mode!r}: no measured table at {file!r}")
    raise ConfigError(
        f"unknown cost model {mode!r}; accepted: {', '.join(COST_MODES)}, profiled:FILE, "
        "profiled:FORMAT:FILE (FORMAT vidur or llmservingsim)"
    )


@public
def calibrated_cost_model(
    gpu: SimulatedGPU,
    mode: str = "static",
    seed: int = 0,
    record: CalibrationRecord | None = None,
) -> tuple[RooflineCostModel, CalibrationRecord]:
    """The controller's belief: the nominal profile's roofline fitted to the simulated GPU, or,
    for ``profiled:[FORMAT:]FILE``, the measured per-operator table with that calibrated
    roofline beyond it.

    With ``record`` (a calibration measured elsewhere, e.g. by ``bastion calibrate --target``
    on the real device) nothing is swept: the roofline is corrected by that record and T_aux is
    the record's ``prep_s``, as the real backend builds its cost model from a cached record;
    the drafter is priced on the roofline of ``gpu.drafter``."""
    _check_cost_mode(mode)
    # tensor parallelism: the belief prices one GPU's share and the all-reduces, as the truth
    options = RooflineOptions(tensor_parallel=gpu.tp) if gpu.tp > 1 else None
    if record is not None:
        prep_s = record.prep_s
    else:
        probe = SimulatedGPU(
            gpu.hardware, gpu.model, gpu.drafter, gpu.truth, seed=seed + 7919, tp=gpu.tp
        )
        points = profile_sweep(lambda s, c: probe.verify_s([s], [c]), repeats=3, warmup=0)
        record = calibrate(
            gpu.model,
            gpu.hardware,
            points,
            backend="sim",
            tile_candidates=(0, 64, 128),
            options=options,
        )
        prep_s = float(np.median([probe.prep_truth([64])]))
    if mode.startswith("profiled:"):
        profiled = cost_model_from_spec(
            mode, gpu.hardware, gpu.model, drafter=gpu.drafter, calibration=record, prep_s=prep_s
        )
        return profiled, record
    model = RooflineCostModel(
        gpu.hardware,
        gpu.model,
        gpu.drafter,
        calibration=record if mode != "bare" and mode != "ema" else None,
        mode=mode,  # type: ignore[arg-type]
        prep_s=prep_s,
        options=options,
    )
    return model, record


def _fixed_lengths(workload: Workload, spec: SimSpec) -> Workload:
    """The workload with every request's prompt and output exactly ``spec.prompt_len`` and
    ``spec.output_len`` tokens, where given."""
    if spec.output_len is not None:
        top = max(workload.output_len_max, spec.output_len)
        workload = workload.with_(
            output_len=spec.output_len, output_len_sigma=0.0, output_len_max=top
        )
    if spec.prompt_len is not None:
        top = max(workload.prompt_len_max, spec.prompt_len)
        workload = workload.with_(
            prompt_len=spec.prompt_len, prompt_len_sigma=0.0, prompt_len_max=top
        )
    return workload


def _is_trace(workload: str) -> bool:
    """Whether ``workload`` names recorded traces (a .json file or a directory)."""
    path = Path(workload)
    return path.suffix == ".json" or path.is_dir()


def request_source(spec: SimSpec) -> LengthSource:
    """The drafter–target streams of ``spec``: a synthetic preset or recorded traces."""
    path = Path(spec.workload)
    if _is_trace(spec.workload):
        from bastion.sim.replay import trace_source

        return trace_source(path)
    workload = _fixed_lengths(get_workload(spec.workload), spec)
    return SyntheticSource(workload, spec.seed, spec.temperature)


def arrivals_of(spec: SimSpec) -> list[Arrival] | None:
    """The open-loop arrivals of ``spec`` (None for the closed loop)."""
    if spec.arrivals is not None:
        return read_arrivals(spec.arrivals)
    if spec.arrival_rate is None:
        return None
    path = Path(spec.workload)
    if path.suffix == ".json" or path.is_dir():  # replayed requests keep their own lengths
        workload = get_workload("math")
    else:
        workload = _fixed_lengths(get_workload(spec.workload), spec)
    rng = np.random.default_rng([spec.seed, 0x61727276])
    return poisson_arrivals(spec.arrival_rate, spec.requests, workload, rng)


@public
def simulate(
    spec: SimSpec,
    progress: Callable[[str, int, int], None] | None = None,
    *,
    cost_model: CostModel | None = None,
) -> SimulationResult:
    """Serve AR and every policy of ``spec`` on identical requests; compare.

    Policies that declare ``uses_cost_model = True`` are given ``cost_model`` when one is passed
    (a researcher's own belief about the GPU), else the roofline calibrated on the simulated GPU
    as ``spec.cost_mode`` says — or, with ``spec.calibration_file``, corrected by that record (no
    sweep; its own errors are reported). The calibration is run either way: its errors are
    reported.
    """
    start = time.perf_counter()
    hw = get_profile(spec.gpu)
    model = get_model(spec.model)
    drafter = spec.drafter()

    truth = get_truth(spec.truth)
    stored = spec.stored_calibration()
    belief = stored[0] if stored is not None else None
    if stored is not None and not stored[1]:
        log.warning(
            "calibration record %s: fitted against other inputs (the profile's contents, the "
            "model's shape or the bastion version differ from this simulation's); used as is",
            spec.calibration_file,
        )

    def gpu() -> SimulatedGPU:
        return SimulatedGPU(
            hw, model, drafter, truth, seed=spec.seed, max_tree_size=spec.n_max, tp=spec.tp
        )

    calibrated, record = calibrated_cost_model(gpu(), spec.cost_mode, spec.seed, belief)
    learned: LearnedCostModel | None = None  # the learning controller's, calibrated once
    arrivals = arrivals_of(spec)
    n_requests = None if arrivals is not None else spec.requests
    results: list[tuple[ServingResult, float]] = []
    givens = spec.compared()
    for given, name in zip(givens, spec.labels(), strict=True):
        policy = make_policy(given, n_max=spec.n_max)
        cm: CostModel | None = None
        if getattr(policy, "uses_cost_model", False):
            cm = cost_model
            if cm is None:
                cm = calibrated
                if spec.cost_mode in ("ema", "ema+calib"):  # fresh γ for every policy
                    cm = calibrated_cost_model(gpu(), spec.cost_mode, spec.seed, belief)[0]
            if getattr(policy, "learns", False):  # start-up timing once; each run learns anew
                if learned is None or not isinstance(cm, LearnedCostModel):
                    learned = learned_cost_model(
                        gpu(), cm, n_max=spec.n_max, concurrency=spec.concurrency, seed=spec.seed
                    )
                cm = learned.copy()
                if spec.warmup_steps:  # other requests (another seed), closed loop, unmeasured
                    warm = replace(spec, seed=spec.seed + 1_000_003)
                    serve(
                        policy,
                        gpu(),
                        request_source(warm),
                        1_000_000,
                        spec.concurrency,
                        cm,
                        prefill_chunk=spec.prefill_chunk,
                        max_steps=spec.warmup_steps,
                    )
        tick = (lambda d, n, name=name: progress(name, d, n)) if progress else None
        memory = spec.memory_plan(drafts=getattr(policy, "uses_drafter", True))
        source = request_source(spec)
        t0 = time.perf_counter()
        served = serve(
            policy,
            gpu(),
            source,
            n_requests,
            spec.concurrency,
            cm,
            progress=tick,
            arrivals=arrivals,
            prefill_chunk=spec.prefill_chunk,
            memory=memory,
        )
        served.policy = name  # its display name, or its spec where two would share one
        results.append((served, time.perf_counter() - t0))
    ar_tpot = results[0][0].tpot_s
    rows = tuple(
        PolicyResult.of(r, ar_tpot, wall, policy_label(given), spec.slo_ttft_s, spec.slo_tpot_s)
        for (r, wall), given in zip(results, givens, strict=True)
    )
    return SimulationResult(
        spec=spec,
        rows=rows,
        calibration_rmse_bare_s=record.rmse_bare_s,
        calibration_rmse_calibrated_s=record.rmse_calibrated_s,
        simulated_s=sum(r.elapsed_s for r, _ in results),
        served=tuple(r for r, _ in results),
        wall_s=time.perf_counter() - start,
    )
