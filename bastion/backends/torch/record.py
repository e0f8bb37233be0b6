"""Dense trace recording: the drafter's marginals at *every* committed position of a run.

A run's own trace holds the marginals at the roots of its steps only, so only the recorded
policy can be replayed exactly. To replay any policy at T = 0 the simulator needs the marginals
at every position a policy might start a step from. Here the target runs once over the whole
sequence (prompt + output) to get the tapped hidden states, and the drafter drafts one block per
output position, batched (``DFlashDraftModel.block_hidden``), each seeing only the context
before it — what incremental decoding would have seen, up to floating-point differences between
pass shapes (which can flip near-tied top-K entries; the replay test measures how often).

What this module does not do: decode (see :mod:`.decode`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bastion.guard import has, public
from bastion.tree import DraftMarginals

from .drafter import DFlashDrafter

__all__ = ["dense_marginals"]


@public(target=has("config", "parameters"))
@torch.no_grad()
def dense_marginals(
    target: Any,
    drafter: DFlashDrafter,
    sequence: Sequence[int],
    first_root: int,
    chunk: int = 64,
) -> dict[int, DraftMarginals]:
    """Top-K marginals of the block drafted at each root position ``first_root`` … end."""
    device = drafter.device
    ids = torch.tensor([list(sequence)], dtype=torch.long, device=device)
    hidden = target(input_ids=ids, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[j + 1] for j in drafter.cfg.target_layer_ids], dim=-1)
    ctx = drafter.model.context(features)
    b = drafter.cfg.block_size
    out: dict[int, DraftMarginals] = {}
    roots = list(range(first_root, len(sequence)))
    for start in range(0, len(roots), chunk):
        anchors = torch.tensor(roots[start : start + chunk], dtype=torch.long, device=device)
        block = torch.full((anchors.numel(), b), drafter.cfg.mask_token_id, device=device)
        block[:, 0] = ids[0, anchors]
        embeds = drafter.embed(block) * drafter.cfg.input_embedding_scale
        seq = torch.zeros_like(anchors)
        h = drafter.model.block_hidden(ctx, anchors, seq, embeds)
        probs = drafter.probs_from_hidden(h[:, 1:])
        top = torch.topk(probs, drafter.top_k, dim=-1)
        for i, root in enumerate(anchors.tolist()):
            out[root] = DraftMarginals(
                top.indices[i].cpu().numpy(),
                top.values[i].double().clamp_(0.0, 1.0).cpu().numpy(),
            )
    return out
