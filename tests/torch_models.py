"""Tiny randomly initialised targets and test drafters for the torch backend tests (CPU, fp32).

Not a test module. Helpers: :func:`tiny_target` (Qwen3 or Llama, built from the configs' field
names with small numbers), :class:`OracleDrafter` (a "cheating" drafter that reads the target's
own greedy continuation, so trees are accepted deep and KV compaction is exercised).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bastion.interfaces import DraftContext
from bastion.tree import DraftMarginals


def tiny_target(
    family: str = "qwen3", *, vocab: int = 96, layers: int = 4, seed: int = 0
) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(family)
    with torch.no_grad():  # larger logits: a peaked target, fewer near-ties at argmax
        model.lm_head.weight.mul_(4.0)
    return model.eval()


def greedy_reference(
    model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int, eos: int | None = None
) -> list[int]:
    """``model.generate(do_sample=False)``'s new tokens, EOS included, padding removed."""
    out = model.generate(
        torch.tensor([list(prompt)]),
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out


class OracleDrafter:
    """Proposes the target's greedy continuation ``truth`` (sequence indices → tokens).

    At each position the true token gets rank ``rank_of(position)`` (0 or 1), so chains break
    where it is 1 while best-first trees still accept through a rank-1 branch — the accepted path
    is then not a prefix of the tree's node order and KV compaction must gather.
    """

    def __init__(self, truth: Sequence[int], vocab: int, depth: int = 6, k: int = 3) -> None:
        self.truth, self.vocab, self.depth, self.k = list(truth), vocab, depth, k

    def rank_of(self, position: int) -> int:
        return 1 if position % 4 == 3 else 0

    def draft(self, context: DraftContext) -> DraftMarginals:
        root = len(context.committed) - 1
        ids = np.zeros((self.depth, self.k), dtype=np.int64)
        for row in range(self.depth):
            pos = root + 1 + row
            true = self.truth[pos] if pos < len(self.truth) else 0
            others = [t for t in range(self.vocab) if t != true][: self.k - 1]
            r = self.rank_of(pos)
            ids[row] = [*others[:r], true, *others[r:]][: self.k]
        probs = np.tile(np.array([0.5, 0.3, 0.1][: self.k]), (self.depth, 1))
        return DraftMarginals(ids, probs)


class BatchOracleDrafter(OracleDrafter):
    """:class:`OracleDrafter` for several requests: ``truths[request_id]`` is each one's greedy
    sequence (prompt + continuation)."""

    def __init__(
        self, truths: dict[int, Sequence[int]], vocab: int, depth: int = 6, k: int = 3
    ) -> None:
        super().__init__([], vocab, depth, k)
        self.truths = {i: list(t) for i, t in truths.items()}

    def draft(self, context: DraftContext) -> DraftMarginals:
        self.truth = self.truths[context.request_id]
        return super().draft(context)
