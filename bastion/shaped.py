"""Beam and EAGLE trees for a whole batch in one compiled call (the policies' ``choose_batch``).

:class:`bastion.policies.BeamPolicy` and :class:`bastion.policies.EaglePolicy` build one
request's tree in numpy (their ``choose``: the reference). A serving step asks for B trees, and
B numpy builds cost the simulator far more than the rest of its step; the compiled kernel
(``_bestfirst_shaped.c``) builds all B node for node as ``choose`` does — the scores are the
same products, the orders the same stable sorts — so the :class:`~bastion.batch.TreeBatch` it
gives is the B trees of ``choose`` concatenated (the tests compare them).

Without the kernel each function returns None and the policy builds tree by tree.
"""

from __future__ import annotations

import numpy as np

from bastion.batch import BatchMarginals, TreeBatch
from bastion.errors import BudgetError, MarginalsError

try:  # the optional compiled kernel (setup.py); None without a C compiler
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _compiled = None

__all__: list[str] = []  # a part of BeamPolicy's and EaglePolicy's choose_batch, public there


_WIDEST = 1 << 20  # the kernel's limit on a beam's width or EAGLE's top-k


def _fits(marginals: BatchMarginals, width: int) -> bool:
    """Whether the kernel builds these trees (else the policy builds them tree by tree)."""
    return marginals.probs.ndim == 3 and marginals.probs.size > 0 and width <= _WIDEST


def _flat(marginals: BatchMarginals) -> tuple[np.ndarray, int, int]:
    probs = np.ascontiguousarray(marginals.probs, dtype=np.float64)
    return probs, int(probs.shape[1]), int(probs.shape[2])


# what the kernel answers instead of trees, and the error the reference raises then (the first
# tree it refuses: marginals outside [0, 1])
_REFUSED = {
    -1: BudgetError("internal error: rerank dropped a parent"),
    -2: MarginalsError("tree scores ρ must be finite and ≥ 0"),
    -3: MarginalsError("a node's score ρ cannot exceed its parent's"),
    -4: MarginalsError("every non-root node's parent must come before it (prefix-closed)"),
}


def _batch(marginals: BatchMarginals, built: tuple[bytes, ...] | int) -> TreeBatch:
    """The kernel's flat arrays as a TreeBatch, tokens read off the marginals (roots −1)."""
    if isinstance(built, int):
        error = _REFUSED[built]
        raise type(error)(*error.args)
    parents, depths, ranks = (np.frombuffer(x, dtype=np.int64) for x in built[:3])
    scores = np.frombuffer(built[3], dtype=np.float64)
    offsets = np.frombuffer(built[4], dtype=np.int64)
    request = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    tokens = marginals.token_ids[request, np.maximum(depths - 1, 0), np.maximum(ranks, 0)]
    tokens[offsets[:-1]] = -1
    return TreeBatch(offsets, parents, tokens, depths, scores, ranks)


def beam_batch(marginals: BatchMarginals, width: int, depth: int) -> TreeBatch | None:
    """Every request's ``beam:WIDTHxDEPTH`` tree (:class:`bastion.policies.BeamPolicy`), or
    None without the compiled kernel."""
    beam = getattr(_compiled, "beam", None)
    if beam is None or not _fits(marginals, width):
        return None
    probs, d, k = _flat(marginals)
    return _batch(marginals, beam(probs, d, k, width, min(depth, d)))


def eagle_batch(marginals: BatchMarginals, top_k: int, depth: int, total: int) -> TreeBatch | None:
    """Every request's ``eagle:K,D,N`` tree (:class:`bastion.policies.EaglePolicy`), or None
    without the compiled kernel."""
    eagle = getattr(_compiled, "eagle", None)
    if eagle is None or not _fits(marginals, top_k):
        return None
    probs, d, k = _flat(marginals)
    return _batch(marginals, eagle(probs, d, k, top_k, min(depth, d), total))
