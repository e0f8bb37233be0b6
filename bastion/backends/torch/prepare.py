"""Setting up a decoding session: the target and its device, the checks, verifier and cost model.

:func:`load_target` loads a Hugging Face causal LM (:func:`resolve_device` refuses a device
that is absent rather than falling back to the CPU). :func:`_prepare` is a session's set-up,
before anything is decoded: it checks the arguments and the prompts against the target, builds
the stop set, the verifier (its generator seeded, its taps those the drafter reads) and the
drafter the engine calls (:class:`_NoDrafter` for AR; :class:`_RecordingDrafter` keeping the
marginals for traces), and resolves the cost model (:func:`resolve_cost_model`: the given
one, else the calibrated roofline or an :class:`~.timing.AffineCostModel` fitted on the spot,
with the drafter's measured T_draft; wrapped in a :class:`~bastion.learned.LearnedCostModel`
for a learning policy).

What this module does not do: calibrate the roofline model (``bastion calibrate --target``,
:mod:`.calibrate`) or decode (:mod:`.decode`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bastion.batch import BatchMarginals, StepRequests
from bastion.errors import BackendError, BudgetError, CheckpointError, ConfigError
from bastion.guard import has, public
from bastion.interfaces import BatchDrafter, CostModel, DraftContext, Drafter, TreePolicy
from bastion.tree import DraftMarginals

from .clock import Clock, device_clock
from .drafter import DFlashDrafter
from .sampling import SamplingParams
from .timing import fit_affine_cost_model, verify_timer, with_draft_timing
from .verifier import TorchVerifier

__all__ = ["load_target", "resolve_cost_model", "resolve_device"]

log = logging.getLogger(__name__)


@public
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


@public
def load_target(
    path: str | os.PathLike[str],
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    linears: str = "auto",
) -> Any:
    """A Hugging Face causal LM from a local directory, with SDPA attention (tree masks).

    ``linears``: ``auto`` (the default) multiplies fp32 models on CPU with the weight-streaming
    kernel where it is available (:mod:`bastion.backends.torch.cpu_linear`), ``stream`` requires
    it, ``torch`` keeps PyTorch's own products. A drafter built on the target follows it.
    """
    from transformers import AutoModelForCausalLM

    from bastion.backends.torch.cpu_linear import apply_linears, check_linears

    check_linears(linears)

    dev = resolve_device(device)
    root = Path(path)
    if not (root / "config.json").is_file():
        raise CheckpointError(f"target {root} lacks config.json (a Hugging Face model directory)")
    from bastion.cost.models import read_config_json

    read_config_json(root, "target config")  # a binary, deeply nested or non-object file: refused
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(root), dtype=dtype, attn_implementation="sdpa"
        )
    except Exception as exc:  # transformers and safetensors raise many types on bad files
        raise CheckpointError(f"cannot load target {root}: {exc}") from exc
    model = model.to(dev).eval()  # type: ignore[arg-type]  # transformers' to() stub is narrow
    apply_linears(model, linears, dev, dtype)
    return model


class _NoDrafter:
    """The AR baseline's drafter: never consulted by the root-only policy."""

    def draft(self, context: DraftContext) -> DraftMarginals:
        return DraftMarginals([[0]], [[0.0]])


class _RecordingDrafter:
    """Drafts a batch through ``inner`` and keeps every request's marginals (for traces)."""

    def __init__(self, inner: Drafter | BatchDrafter) -> None:
        self.inner = inner
        self.marginals: dict[int, list[DraftMarginals]] = {}

    def draft_batch(self, requests: StepRequests) -> BatchMarginals:
        ids = requests.request_ids.tolist()
        if isinstance(self.inner, BatchDrafter):
            batch = self.inner.draft_batch(requests)
            rows = [batch.row(j) for j in range(len(ids))]
        else:
            feedback = requests.feedback or (None,) * len(ids)
            committed = requests.committed or ((),) * len(ids)
            rows = [
                self.inner.draft(DraftContext(rid, tuple(c), int(b), fb))
                for rid, c, b, fb in zip(
                    ids, committed, requests.bonus_tokens.tolist(), feedback, strict=True
                )
            ]
            batch = BatchMarginals.from_rows(rows)
        for rid, m in zip(ids, rows, strict=True):
            self.marginals.setdefault(rid, []).append(m)
        return batch


def _check_prompts(target: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    if not prompts:
        raise BudgetError("no prompts: give at least one")
    limit = getattr(target.config, "max_position_embeddings", None)
    vocab = int(target.config.vocab_size)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise BudgetError(f"prompt {i} is empty; give at least one token id")
        if min(p) < 0 or max(p) >= vocab:
            raise BudgetError(f"prompt {i}: token ids must be in [0, {vocab})")
        if limit is not None and len(p) + max_new_tokens > int(limit):
            raise BudgetError(
                f"prompt {i} ({len(p)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"target's context of {limit} tokens (max_position_embeddings)"
            )


def _eos_set(target: Any, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id == -1:
        gen = getattr(target, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(target.config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({int(eos_token_id)})
    return frozenset(int(e) for e in eos_token_id)


@public(target=has("config", "parameters"))
def resolve_cost_model(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    policy: TreePolicy,
    cost_model: CostModel | None,
    context_len: int,
    batch_size: int = 1,
) -> CostModel | None:
    """The cost model of a policy that declares ``uses_cost_model = True``: ``cost_model`` if
    given; else the cached calibrated roofline (``bastion calibrate --target``) or an
    :class:`AffineCostModel` fitted now, with T_draft from the drafter's timing record (measured
    now and cached if there is none). Other policies get ``cost_model`` as it is (``None`` is
    fine)."""
    if cost_model is not None or not getattr(policy, "uses_cost_model", False):
        return cost_model
    from .calibrate import cached_cost_model, drafter_timing

    inner: CostModel | None = cached_cost_model(target)
    if inner is not None:
        log.info("adaptive policy: calibrated roofline from the cached record")
    else:
        inner = fit_affine_cost_model(verify_timer(target), max(context_len, 1))
        log.info(
            "adaptive policy: no calibration record (run `bastion calibrate --target`); fitted %s",
            inner,
        )
    if isinstance(drafter, DFlashDrafter):
        timing = drafter_timing(target, drafter, batch_sizes=sorted({1, batch_size}))
        log.info("adaptive policy: T_draft from the drafter's timing %s", timing)
        return with_draft_timing(inner, timing)
    return inner


@dataclass(frozen=True)
class _Setup:
    """What a session decodes with (:func:`_prepare`)."""

    is_ar: bool  # target-only autoregressive: the drafter is never called
    sampling: SamplingParams
    clock: Clock
    verifier: TorchVerifier
    eos: frozenset[int]
    drafter: Drafter | BatchDrafter  # the one the engine calls (a stand-in for AR)
    recorder: _RecordingDrafter | None  # it, recording, for the first timed run's traces
    cost_model: CostModel | None


def _prepare(
    target: Any,
    drafter: Drafter | BatchDrafter | None,
    pol: TreePolicy,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_new_tokens: int,
    sampling: SamplingParams | None,
    seed: int,
    eos_token_id: int | Sequence[int] | None,
    cost_model: CostModel | None,
    record_traces: Sequence[str | os.PathLike[str]] | None,
    verifier: TorchVerifier | None,
    repeats: int,
    warmup: int,
    clock: Clock | None,
) -> _Setup:
    """A session's checks and set-up for the policy ``pol`` (the other arguments as
    :func:`.runner.generate_batch` takes them); raises before anything is decoded. ``clock``
    None: the target's device clock."""
    is_ar = not getattr(pol, "uses_drafter", True)
    if drafter is None and not is_ar:
        raise BudgetError(f"policy {pol.name} needs a drafter; only 'ar' runs without one")
    if max_new_tokens < 1:
        raise BudgetError(f"max_new_tokens must be ≥ 1; got {max_new_tokens}")
    if batch_size < 1:
        raise BudgetError(f"batch_size must be ≥ 1; got {batch_size}")
    if repeats < 1:
        raise BudgetError(f"repeats must be ≥ 1; got {repeats}")
    if warmup < 0:
        raise BudgetError(f"warmup must be ≥ 0; got {warmup}")
    _check_prompts(target, prompts, max_new_tokens)
    if record_traces is not None and len(record_traces) != len(prompts):
        raise BudgetError(
            f"{len(record_traces)} trace paths for {len(prompts)} prompts; give one per prompt"
        )
    eos = _eos_set(target, eos_token_id)
    sampling = sampling or SamplingParams()
    device = next(target.parameters()).device
    clock = clock or device_clock(device)
    taps = () if is_ar or not isinstance(drafter, DFlashDrafter) else drafter.cfg.target_layer_ids
    if verifier is None:
        gen = torch.Generator(device=device).manual_seed(seed)
        verifier = TorchVerifier(target, tap_layer_ids=taps, sampling=sampling, generator=gen)
    elif taps and tuple(verifier.tap_layer_ids) != tuple(taps):
        raise ConfigError(
            f"the verifier taps target layers {tuple(verifier.tap_layer_ids)}; the DFlash "
            f"drafter reads {tuple(taps)}: pass TorchVerifier(..., tap_layer_ids="
            "drafter.cfg.target_layer_ids)"
        )
    used: Drafter | BatchDrafter = _NoDrafter() if is_ar or drafter is None else drafter
    recorder = _RecordingDrafter(used) if record_traces is not None else None
    cost_model = resolve_cost_model(
        target, drafter, pol, cost_model, max(len(p) for p in prompts), batch_size
    )
    if getattr(pol, "learns", False) and cost_model is not None:
        from bastion.learned import LearnedCostModel

        if not isinstance(cost_model, LearnedCostModel):  # one learner for warm-up and repeats
            cost_model = LearnedCostModel(cost_model)
        if record_traces is not None:  # a trace holds the drafter's view of every step
            cost_model.always_draft = True
    return _Setup(is_ar, sampling, clock, verifier, eos, used, recorder, cost_model)
