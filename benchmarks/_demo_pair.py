"""A shipped demo pair loaded for a benchmark: the target in a dtype, its tokenizer's held-out
prompts as token ids, and the end-of-text id (shared by the benchmarks that decode for real)."""

from __future__ import annotations

from typing import Any


def load_demo_pair(
    name: str, dtype: str, prompts: int, linears: str = "auto"
) -> tuple[Any, Any, list[list[int]], int]:
    """(pair, target, the first ``prompts`` held-out prompts as ids, the end-of-text id)."""
    import torch
    from transformers import AutoTokenizer

    from bastion.backends.torch import load_target
    from bastion.demo import get_pair
    from bastion.demo.run import load_prompts

    pair = get_pair(name)
    pair.require_installed()
    target = load_target(pair.target, "cpu", dtype=getattr(torch, dtype), linears=linears)
    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    ids = [list(tokenizer(t)["input_ids"]) for t in load_prompts()[:prompts]]
    eos = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    return pair, target, ids, eos
