"""Decoding many requests on a Hugging Face target through the shared engine: the sessions.

:func:`generate_batch` is the Python API behind ``bastion generate``: continuous batching over
:meth:`bastion.engine.SpecEngine.step` — up to ``batch_size`` requests decode together, one
``step`` call per batched step (one drafter pass and one target pass for the whole batch); a
request that finishes (EOS or ``max_new_tokens``) leaves the batch at once and the next prompt
joins after its own prefill. Policies: ``ar`` (target-only autoregressive: root-only trees, the
drafter not called), ``chain`` (DFlash), ``fixed:N``, ``beam:WxD``, ``eagle``, ``bastion``
(adaptive, priced by a ``CostModel``; at batch > 1 one joint budget per step). There is no
second decode loop: the step is the engine's. :func:`generate` is one prompt at batch 1.

Timing: ``warmup`` untimed runs (a few tokens of the first batch) come first, then ``repeats``
timed runs of the whole workload; the report carries every repeat's time per output token and
throughput (median and spread) and the records of the first timed run. All prompts are submitted
at the start, so a request's time to first token includes its wait for a free slot.

A session (:func:`_session`) is set up by :mod:`.prepare` (checks, the verifier, the cost
model), decodes with :mod:`.decode` (the loop over ``SpecEngine.step``) and reports with
:mod:`.reports` (the reports and the traces); the names they define for the API
(:func:`load_target`, :func:`resolve_device`, :func:`resolve_cost_model`, the report classes)
are also read from here.

What this module does not do: tokenise (the CLI does) or calibrate the roofline model
(``bastion calibrate --target``); without a record the adaptive policy gets an
:class:`~.timing.AffineCostModel` fitted on the spot, and its T_draft is the drafter's measured
pass (:func:`~.calibrate.drafter_timing`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from bastion.engine import SpecEngine
from bastion.guard import has, public
from bastion.interfaces import BatchDrafter, CostModel, Drafter, TreePolicy
from bastion.policies import make_policy, policy_label

from .clock import Clock
from .decode import _decoding, _finish, _Run
from .prepare import _prepare, load_target, resolve_cost_model, resolve_device
from .reports import (
    BatchGenerationReport,
    GenerationReport,
    RunTiming,
    _batch_report,
    _write_traces,
)
from .sampling import SamplingParams
from .verifier import TorchVerifier

__all__ = [
    "BatchGenerationReport",
    "GenerationReport",
    "RunTiming",
    "generate",
    "generate_batch",
    "load_target",
    "resolve_cost_model",
    "resolve_device",
]

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8  # new tokens per request of a warm-up run


@public(target=has("config", "parameters"))
def generate_batch(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: str | TreePolicy,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 1,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = -1,
    cost_model: CostModel | None = None,
    record_traces: Sequence[str | os.PathLike[str]] | None = None,
    trace_metadata: Mapping[str, Any] | None = None,
    dense_trace: bool = False,
    verifier: TorchVerifier | None = None,
    repeats: int = 1,
    warmup: int = 0,
    predict_cycles: CostModel | None = None,
    policy_spec: str | None = None,
) -> BatchGenerationReport:
    """Generate up to ``max_new_tokens`` tokens after each prompt, ``batch_size`` at a time.

    ``eos_token_id=-1`` uses the target's (every id of a list); ``None`` disables stopping at
    EOS. ``drafter`` may be ``None`` only for the ``ar`` policy. ``record_traces`` gives one
    trace path per prompt, written after a successful run (never a partial one).
    ``predict_cycles`` prices the run's steps with that cost model for the report's ``cycle``
    when the policy's own cost model is not one (e.g. to compare static policies).
    ``policy_spec`` is the spec the records name (default: ``policy`` when it is a string, else
    :func:`~bastion.policies.policy_label` of the object).
    """
    return _finish(
        _session(
            target,
            drafter,
            policy,
            prompts,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            seed=seed,
            eos_token_id=eos_token_id,
            cost_model=cost_model,
            record_traces=record_traces,
            trace_metadata=trace_metadata,
            dense_trace=dense_trace,
            verifier=verifier,
            repeats=repeats,
            warmup=warmup,
            predict_cycles=predict_cycles,
            policy_spec=policy_spec,
            clock=None,
        )
    )


def _session(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: str | TreePolicy,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_new_tokens: int,
    sampling: SamplingParams | None,
    seed: int,
    eos_token_id: int | Sequence[int] | None,
    cost_model: CostModel | None,
    record_traces: Sequence[str | os.PathLike[str]] | None,
    trace_metadata: Mapping[str, Any] | None,
    dense_trace: bool,
    verifier: TorchVerifier | None,
    repeats: int,
    warmup: int,
    predict_cycles: CostModel | None,
    policy_spec: str | None,
    clock: Clock | None,
    on_run: Callable[[int], None] | None = None,
) -> Generator[bool, None, BatchGenerationReport]:
    """:func:`generate_batch` as a generator: checks and sets up (raising before the first
    yield), runs the warm-ups, yields ``True`` once timing begins and ``False`` after every
    timed step (so that :mod:`.lockstep` can run other sessions' steps in between), and
    returns the report; ``on_run(k)`` after its k-th timed run. ``clock`` None: the target's
    device clock."""
    pol = make_policy(policy)  # a spec string (built-in or plug-in) or a policy object
    s = _prepare(
        target,
        drafter,
        pol,
        prompts,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        eos_token_id=eos_token_id,
        cost_model=cost_model,
        record_traces=record_traces,
        verifier=verifier,
        repeats=repeats,
        warmup=warmup,
        clock=clock,
    )
    rng_state = s.verifier.generator.get_state()
    for _ in range(warmup):
        engine = SpecEngine(s.drafter, pol, s.verifier, s.cost_model, s.clock)
        first = [list(p) for p in prompts[:batch_size]]
        tokens = min(WARMUP_TOKENS, max_new_tokens)
        _finish(_decoding(engine, s.verifier, s.drafter, first, batch_size, tokens, s.eos, s.clock))
    runs: list[_Run] = []
    yield True  # timing begins
    for r in range(repeats):
        s.verifier.generator.set_state(rng_state)
        part = s.recorder if (s.recorder is not None and r == 0) else s.drafter
        engine = SpecEngine(part, pol, s.verifier, s.cost_model, s.clock)
        decoding = _decoding(
            engine, s.verifier, s.drafter, prompts, batch_size, max_new_tokens, s.eos, s.clock, r
        )
        runs.append((yield from decoding))  # yields False after every step
        if on_run is not None:
            on_run(len(runs))
    agree = all(
        [x.out for x in other.lives] == [x.out for x in runs[0].lives] for other in runs[1:]
    )
    if not agree:
        log.warning("repeats of the same seeded run produced different outputs")
    spec = policy_spec or (policy if isinstance(policy, str) else policy_label(pol))
    pricer = s.cost_model if s.cost_model is not None else predict_cycles
    report = _batch_report(
        runs, pol.name, spec, prompts, batch_size, pricer, not s.is_ar, warmup, agree
    )
    if s.recorder is not None and record_traces is not None:
        _write_traces(
            target,
            drafter,
            pol.name,
            prompts,
            report,
            s.recorder.marginals,
            record_traces,
            s.sampling,
            seed,
            trace_metadata,
            dense_trace,
        )
    return report


@public(target=has("config", "parameters"))
def generate(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: str | TreePolicy,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = -1,
    cost_model: CostModel | None = None,
    record_trace: str | os.PathLike[str] | None = None,
    trace_metadata: Mapping[str, Any] | None = None,
    dense_trace: bool = False,
    verifier: TorchVerifier | None = None,
) -> GenerationReport:
    """One prompt at batch 1 (:func:`generate_batch` with one prompt); see there."""
    report = generate_batch(
        target,
        drafter,
        policy,
        [prompt_ids],
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        eos_token_id=eos_token_id,
        cost_model=cost_model,
        record_traces=None if record_trace is None else [record_trace],
        trace_metadata=trace_metadata,
        dense_trace=dense_trace,
        verifier=verifier,
    )
    return report.records[0]
