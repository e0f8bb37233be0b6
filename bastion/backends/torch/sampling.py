"""The target's processed next-token distribution and sampling from it.

The processing order is Hugging Face's: temperature, then top-k, then top-p (nucleus). At
temperature 0 decoding is greedy (argmax) and nothing here is used. Sampling draws from an
explicit ``torch.Generator`` that lives on the logits' device, so a seeded run repeats exactly.

What this module does not do: acceptance (see :mod:`bastion.acceptance`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bastion.errors import BudgetError
from bastion.guard import public

__all__ = ["SamplingParams", "processed_probs", "sample_token"]


@public
@dataclass(frozen=True)
class SamplingParams:
    """How the target picks its token: greedy at ``temperature == 0``."""

    temperature: float = 0.0  # 0 → argmax
    top_k: int = 0  # 0 → no top-k filter
    top_p: float = 1.0  # 1 → no nucleus filter

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise BudgetError(f"temperature must be ≥ 0; got {self.temperature}")
        if self.top_k < 0:
            raise BudgetError(f"top_k must be ≥ 0 (0 disables it); got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise BudgetError(f"top_p must be in (0, 1]; got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@public
def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., V] (float32) after temperature, top-k and top-p; rows sum to 1."""
    if params.greedy:
        raise BudgetError("processed_probs needs temperature > 0; use argmax at temperature 0")
    x = logits.float() / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(p, dim=-1) - p  # mass of the strictly better tokens
        drop_sorted = mass_before >= params.top_p  # keeps the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


@public
def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from the processed distribution of a single row of logits [V]."""
    probs = processed_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator).item())
