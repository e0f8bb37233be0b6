"""A Hugging Face-style entry point: swap :func:`speculative_generate` in for ``model.generate``.

It takes what ``model.generate`` takes — a loaded ``PreTrainedModel``, a tokenised batch
(``input_ids`` and ``attention_mask`` tensors, as a tokenizer returns them) and the usual
generation arguments (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
``eos_token_id``, ``pad_token_id``) — plus a drafter and a tree policy, and returns the sequences
laid out as ``model.generate`` returns them: each row is its input row as given (padding and
prompt) followed by its new tokens, rows that stopped early (EOS) padded with ``pad_token_id``
to the longest, so the width is the input's plus the most tokens any row generated. The
per-request statistics (τ, acceptance lengths, TTFT, TPOT, trees) come alongside.

Arguments left ``None`` are resolved as transformers does: from ``model.generation_config``,
then transformers' defaults (temperature 1.0, top-k 50, top-p 1.0 when sampling; 20 tokens in
all when neither ``max_new_tokens`` nor ``max_length`` is set).

Each row's prompt is the tokens its attention mask marks (left padding, the decoder-only
convention, or right padding; a mask with holes is refused), and every prompt is decoded as if
alone — prefill of that prompt, then batched speculative steps — which is what
``model.generate`` computes for a padded batch. Decoding runs :func:`.runner.generate_batch`
(continuous batching, ``batch_size`` requests at a time, all rows by default).

What this module does not do: tokenise, beam search, logits processors other than
temperature/top-k/top-p, or ``return_dict_in_generate`` extras (scores, attentions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bastion.errors import BudgetError
from bastion.guard import public
from bastion.interfaces import BatchDrafter, CostModel, Drafter, TreePolicy

from .reports import BatchGenerationReport, GenerationReport
from .runner import generate_batch
from .sampling import SamplingParams

__all__ = ["SpeculativeGenerateOutput", "speculative_generate"]

_HF_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "max_length": 20}


@dataclass
class SpeculativeGenerateOutput:
    """``sequences`` as ``model.generate`` returns them; per-request statistics alongside."""

    sequences: torch.Tensor  # [B, input length + most new tokens of any row]
    records: list[GenerationReport]  # per row: output_ids, committed_per_step, ttft_s, tpot_s …
    report: BatchGenerationReport  # the run: throughput, steps, stage times, cycle

    @property
    def num_new_tokens(self) -> list[int]:
        return [r.output_len for r in self.records]


def _gen_default(model: Any, name: str, given: Any) -> Any:
    if given is not None:
        return given
    value = getattr(getattr(model, "generation_config", None), name, None)
    return value if value is not None else _HF_DEFAULTS.get(name)


def _rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise BudgetError(
            f"input_ids must be a non-empty [batch, length] tensor; got shape "
            f"{tuple(input_ids.shape)}"
        )
    if attention_mask is None:
        return [row.tolist() for row in input_ids.cpu()]
    mask = attention_mask if attention_mask.dim() == 2 else attention_mask[None]
    if mask.shape != input_ids.shape:
        raise BudgetError(
            f"attention_mask has shape {tuple(mask.shape)}; input_ids has {tuple(input_ids.shape)}"
        )
    prompts = []
    for i, (ids, keep) in enumerate(zip(input_ids.cpu(), mask.cpu().bool(), strict=True)):
        where = torch.nonzero(keep).flatten()
        if where.numel() == 0:
            raise BudgetError(f"row {i} of attention_mask marks no token")
        a, e = int(where[0]), int(where[-1]) + 1
        if e - a != where.numel():
            raise BudgetError(
                f"row {i} of attention_mask has holes; only left or right padding is accepted"
            )
        prompts.append(ids[a:e].tolist())
    return prompts


@public
@torch.no_grad()
def speculative_generate(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    drafter: Drafter | BatchDrafter | None = None,
    policy: str | TreePolicy = "bastion",
    max_new_tokens: int | None = None,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    batch_size: int | None = None,
    cost_model: CostModel | None = None,
    seed: int = 0,
    repeats: int = 1,
    warmup: int = 0,
) -> SpeculativeGenerateOutput:
    """Speculative decoding of a tokenised batch; ``.sequences`` is ``model.generate``'s output.

    ``drafter`` may be ``None`` only with ``policy="ar"``. ``batch_size`` (default: every row)
    caps how many rows decode together; ``seed`` seeds sampling at ``do_sample=True``.
    """
    prompts = _rows(input_ids, attention_mask)
    width = int(input_ids.shape[-1])
    if max_new_tokens is None:
        max_new_tokens = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
    if max_new_tokens is None:
        max_new_tokens = int(_gen_default(model, "max_length", None)) - width
        if max_new_tokens < 1:
            raise BudgetError(
                f"the input is {width} tokens, as long as max_length; give max_new_tokens"
            )
    if do_sample:
        t = float(_gen_default(model, "temperature", temperature))
        if not t > 0:
            raise BudgetError(f"do_sample needs a temperature > 0; got {t}")
        sampling = SamplingParams(
            t, int(_gen_default(model, "top_k", top_k)), float(_gen_default(model, "top_p", top_p))
        )
    else:
        sampling = SamplingParams(0.0)
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    report = generate_batch(
        model,
        drafter,
        policy,
        prompts,
        batch_size=batch_size or len(prompts),
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        eos_token_id=eos_token_id,
        cost_model=cost_model,
        repeats=repeats,
        warmup=warmup,
    )
    new = [r.output_ids for r in report.records]
    longest = max(len(n) for n in new)
    if any(len(n) < longest for n in new):
        if pad_token_id is None:
            pad_token_id = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
        if pad_token_id is None:
            eos = eos_token_id
            pad_token_id = eos if isinstance(eos, int) else (next(iter(eos)) if eos else None)
        if pad_token_id is None:
            raise BudgetError("rows stopped at different lengths; give pad_token_id to pad them")
    base = input_ids if input_ids.dim() == 2 else input_ids[None]
    tail = torch.full(
        (base.shape[0], longest),
        int(pad_token_id) if pad_token_id is not None else 0,
        dtype=base.dtype,
        device=base.device,
    )
    for i, n in enumerate(new):
        tail[i, : len(n)] = torch.tensor(n, dtype=base.dtype)
    return SpeculativeGenerateOutput(torch.cat((base, tail), dim=1), report.records, report)
