"""Counting what a request received: τ and draft acceptance from per-step counts.

Both backends count a step by the tokens a user receives from it. A step *commits* its accepted
draft tokens and the bonus token; a request that reaches its output length (or EOS, on the real
backend) mid-step receives only the tokens still wanted, and the rest are never delivered nor
counted. For such a cut step, *delivered* = min(committed, still wanted) enters τ (so the last
step of a request may count fewer than it committed, and at least 1), and its *accepted draft
tokens* are min(accepted, delivered): the bonus token goes first, then the deepest draft tokens.

What this module does not do: decode, or decide when a request stops (the backends do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["acceptance_stats", "delivered_counts"]


def delivered_counts(committed: int, wanted: int) -> tuple[int, int]:
    """(tokens delivered, draft tokens among them) of a step that committed ``committed``
    tokens (bonus included) for a request that still wants ``wanted`` (≥ 1)."""
    delivered = min(committed, wanted)
    return delivered, min(committed - 1, delivered)


def acceptance_stats(accepted: Sequence[int], sizes: Sequence[int]) -> dict[str, Any]:
    """Draft acceptance over steps: ``accepted[i]`` draft tokens delivered by a step whose tree
    had ``sizes[i]`` nodes (root included).

    ``acceptance_rate`` = accepted draft tokens / drafted nodes (the root — the previous step's
    bonus token — not counted), over every step with a draft; ``acceptance_by_position[d − 1]``
    = the share of those steps that accepted at least d draft tokens (position 1's share is the
    first draft token's acceptance rate). NaN and ``()`` when nothing was drafted (AR).
    """
    acc = np.asarray(accepted, dtype=np.int64)
    n = np.asarray(sizes, dtype=np.int64)
    drafted = n > 1  # a tree of N nodes counts its root
    if acc.shape != n.shape or not drafted.any():
        return {"acceptance_rate": float("nan"), "acceptance_by_position": ()}
    hits = acc[drafted]
    depth = int(hits.max())
    return {
        "acceptance_rate": float(hits.sum() / (n[drafted] - 1).sum()),
        "acceptance_by_position": tuple(float(np.mean(hits >= d)) for d in range(1, depth + 1)),
    }
