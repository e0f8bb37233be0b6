"""Loading a Hugging Face target and running one request through the shared engine.

:func:`generate` is the Python API behind ``bastion generate``: prefill with the
:class:`TorchVerifier`, then :class:`bastion.engine.SpecEngine` with the chosen policy — ``ar``
(target-only autoregressive: a root-only tree, the drafter not called), ``chain`` (DFlash),
``fixed:N``, ``eagle``, ``bastion`` (adaptive, priced by a ``CostModel``). There is no second
decode loop. The result carries the reference benchmarks' fields.

What this module does not do: tokenise (the CLI does), batch requests, or calibrate the real cost
model (``bastion.cost``); without a cost model the adaptive policy gets an
:class:`~.timing.AffineCostModel` fitted on the spot from :func:`~.timing.verify_timer`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bastion.engine import SpecEngine
from bastion.errors import BackendError, BudgetError, CheckpointError
from bastion.interfaces import CostModel, DraftContext, Drafter, TreePolicy
from bastion.policies import AdaptivePolicy, AutoregressivePolicy, make_policy
from bastion.trace import Trace, TraceStep, write_trace
from bastion.tree import DraftMarginals

from .drafter import DFlashDrafter
from .sampling import SamplingParams
from .timing import device_clock, fit_affine_cost_model, verify_timer
from .verifier import TorchVerifier

__all__ = ["GenerationReport", "generate", "load_target", "resolve_device"]

log = logging.getLogger(__name__)


def resolve_device(device: str | torch.device) -> torch.device:
    """A torch device; CUDA asked for but absent is an error, not a silent CPU fallback."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BackendError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError("CUDA was asked for but no CUDA device is available; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise BackendError(f"device {device!r} is not supported; accepted: cpu, cuda, cuda:N")
    return dev


def load_target(
    path: str | os.PathLike[str], device: str = "cpu", dtype: torch.dtype | None = None
) -> Any:
    """A Hugging Face causal LM from a local directory, with SDPA attention (tree masks)."""
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    root = Path(path)
    if not (root / "config.json").is_file():
        raise CheckpointError(f"target {root} lacks config.json (a Hugging Face model directory)")
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(root), dtype=dtype, attn_implementation="sdpa"
        )
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot load target {root}: {exc}") from exc
    return model.to(dev).eval()  # type: ignore[arg-type]  # transformers' to() stub is narrow


@dataclass
class GenerationReport:
    """One request's result, with the reference benchmarks' fields (times in seconds)."""

    output_ids: list[int]
    num_input_tokens: int
    num_output_tokens: int
    time_to_first_token: float  # prefill
    time_per_output_token: float  # decode time after prefill ÷ output tokens
    acceptance_lengths: list[int]  # committed per step, bonus included
    stage_times: dict[str, float]  # draft, build, mask, verify, commit (sums over steps)
    trees: list[dict[str, Any]] = field(default_factory=list)  # per step
    policy: str = ""

    @property
    def tau(self) -> float:
        lens = self.acceptance_lengths
        return sum(lens) / len(lens) if lens else 0.0

    def to_dict(self, with_trees: bool = True) -> dict[str, Any]:
        d = {
            "output_ids": self.output_ids,
            "num_input_tokens": self.num_input_tokens,
            "num_output_tokens": self.num_output_tokens,
            "time_to_first_token": self.time_to_first_token,
            "time_per_output_token": self.time_per_output_token,
            "acceptance_lengths": self.acceptance_lengths,
            "tau": self.tau,
            "stage_times": self.stage_times,
            "policy": self.policy,
        }
        if with_trees:
            d["trees"] = self.trees
        return d


class _RecordingDrafter:
    """Wraps a drafter and keeps every DraftMarginals it returned (for traces)."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.marginals: list[DraftMarginals] = []

    def draft(self, context: DraftContext) -> DraftMarginals:
        m = self.inner.draft(context)
        self.marginals.append(m)
        return m


class _NoDrafter:
    """The AR baseline's drafter: never consulted by the root-only policy."""

    def draft(self, context: DraftContext) -> DraftMarginals:
        return DraftMarginals([[0]], [[0.0]])


def _default_eos(model: torch.nn.Module) -> int | None:
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        return int(eos[0]) if eos else None  # the engine stops on one id
    return None if eos is None else int(eos)


def generate(
    target: torch.nn.Module,
    drafter: Drafter | None,
    policy: str | TreePolicy,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    eos_token_id: int | None = -1,
    cost_model: CostModel | None = None,
    request_id: int = 0,
    record_trace: str | os.PathLike[str] | None = None,
    trace_metadata: Mapping[str, Any] | None = None,
    dense_trace: bool = False,
    verifier: TorchVerifier | None = None,
) -> GenerationReport:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` (EOS included if produced).

    ``eos_token_id=-1`` uses the target's; ``None`` disables stopping at EOS. ``drafter`` may be
    ``None`` only for the ``ar`` policy. With ``record_trace`` a trace file is written after a
    successful run (never a partial one).
    """
    pol = make_policy(policy) if isinstance(policy, str) else policy
    is_ar = isinstance(pol, AutoregressivePolicy)
    if drafter is None and not is_ar:
        raise BudgetError(f"policy {pol.name} needs a drafter; only 'ar' runs without one")
    if max_new_tokens < 1:
        raise BudgetError(f"max_new_tokens must be ≥ 1; got {max_new_tokens}")
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and len(prompt_ids) + max_new_tokens > int(limit):
        raise BudgetError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"target's context of {limit} tokens (max_position_embeddings)"
        )
    sampling = sampling or SamplingParams()
    device = next(target.parameters()).device
    if verifier is None:
        taps = (
            () if is_ar or not isinstance(drafter, DFlashDrafter) else drafter.cfg.target_layer_ids
        )
        gen = torch.Generator(device=device).manual_seed(seed)
        verifier = TorchVerifier(target, tap_layer_ids=taps, sampling=sampling, generator=gen)
    if eos_token_id == -1:
        eos_token_id = _default_eos(target)
    if isinstance(pol, AdaptivePolicy) and cost_model is None:
        from .calibrate import cached_cost_model

        cost_model = cached_cost_model(target)
        if cost_model is not None:
            log.info("adaptive policy: calibrated roofline from the cached record")
        else:
            cost_model = fit_affine_cost_model(verify_timer(target), max(len(prompt_ids), 1))
            log.info(
                "adaptive policy: no calibration record (run `bastion calibrate --target`); "
                "fitted %s",
                cost_model,
            )
    used_drafter: Drafter = _NoDrafter() if is_ar or drafter is None else drafter
    recorder = _RecordingDrafter(used_drafter) if record_trace else None
    clock = device_clock(device)
    engine = SpecEngine(recorder or used_drafter, pol, verifier, cost_model, clock)
    for d in (drafter, verifier):
        release = getattr(d, "release", None)
        if release is not None:
            release(request_id)
    t0 = clock()
    first, feedback = verifier.prefill(request_id, prompt_ids)
    ttft = clock() - t0
    result = engine.generate(
        request_id, prompt_ids, first, max_new_tokens, eos_token_id, feedback=feedback
    )
    timings = verifier.timings(request_id)
    stage_times = {
        "draft": sum(s.draft_s for s in result.steps),
        "build": sum(s.build_s for s in result.steps),
        "mask": sum(t.mask_s for t in timings),
        "verify": sum(t.forward_s + t.accept_s for t in timings),
        "commit": sum(t.commit_s for t in timings),
    }
    trees = [
        {
            "size": s.tree.size,
            "parents": s.tree.parents.tolist(),
            "tokens": s.tree.tokens.tolist(),
            "accepted_path": list(s.result.accepted_nodes),
        }
        for s in result.steps
    ]
    report = GenerationReport(
        output_ids=list(result.output_ids),
        num_input_tokens=len(prompt_ids),
        num_output_tokens=len(result.output_ids),
        time_to_first_token=ttft,
        time_per_output_token=result.time_per_output_token,
        acceptance_lengths=result.acceptance_lengths,
        stage_times=stage_times,
        trees=trees,
        policy=pol.name,
    )
    if recorder is not None and record_trace is not None:
        position = len(prompt_ids)  # sequence index of the first step's root (the first token)
        steps = []
        # target-only AR never drafts (the engine skips the drafter): its trace has no steps
        drafted = recorder.marginals if recorder.marginals else []
        for rec, marg in zip(result.steps if drafted else [], drafted, strict=True):
            steps.append(TraceStep(position, marg, rec.tree.size, rec.committed_len))
            position += rec.committed_len
        meta = {
            "policy": pol.name,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": seed,
            "target": getattr(target.config, "_name_or_path", "") or type(target).__name__,
            **(trace_metadata or {}),
        }
        dense = {}
        if dense_trace and isinstance(drafter, DFlashDrafter):
            from .record import dense_marginals

            sequence = [*prompt_ids, *report.output_ids]
            dense = dense_marginals(target, drafter, sequence, len(prompt_ids))
            meta["vocab_size"] = int(getattr(target.config, "vocab_size"))  # noqa: B009
        write_trace(
            record_trace,
            Trace(tuple(prompt_ids), tuple(report.output_ids), tuple(steps), meta, dense),
        )
    return report
