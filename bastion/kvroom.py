"""The KV-cache room of one batched step: which trees fit, and the trees cut to fit.

A paged KV cache (vLLM's) holds each request's keys and values in blocks of ``block_tokens``
tokens. Verifying a tree of N nodes writes N tokens' K/V behind the request's context (its
root, the last step's bonus token, included), so a step needs, for request i,

    added_i = ⌈max(0, N_i − room_i) / block_tokens⌉

new blocks, where ``room_i`` is the token slots request i already holds beyond its context
(the free tail of its last block, plus whatever the server reserved for this step). The
trees fit when Σ_i added_i ≤ ``free_blocks``. A server that knows its cache hands the step a
:class:`KVRoom` (:attr:`bastion.batch.StepRequests.kv`); it guarantees ``room_i ≥ 1`` (every
root fits), so a step of roots alone always fits.

:func:`fit_trees` cuts trees that do not fit. Nodes go in one order for the whole batch: by
score ρ, descending, where each node's key is the least ρ on the way to it in its own tree's
expansion order (ties: by request, then by position), and the longest prefix of that order
whose trees fit is kept — each tree keeps a prefix of its own nodes, so every cut tree is a
tree (parents come before children). For best-first trees (ρ never increases along a tree's
expansion order) this order is the joint budget's merged order (:mod:`bastion.joint`): the cut
is the joint budget's own allocation at the largest total that fits, which is the best total
that fits whenever the batch's Ŝ is unimodal along the merged chain.

What this module does not do: hold or count a cache (the server does: ``bastion.sim.memory``),
or price anything.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bastion.batch import KVRoom, TreeBatch
from bastion.errors import BudgetError
from bastion.guard import public

__all__ = ["fit_trees"]

IntArray = npt.NDArray[np.int64]


def _keep_order(trees: TreeBatch) -> IntArray:
    """The request of every non-root node, in the order :func:`fit_trees` keeps them."""
    b = trees.size
    offsets = trees.offsets
    key = trees.scores.astype(np.float64, copy=True)
    for i in range(b):  # ρ's running minimum along each tree: a prefix of the order is a tree
        a, e = int(offsets[i]), int(offsets[i + 1])
        if e - a > 1:
            np.minimum.accumulate(key[a + 1 : e], out=key[a + 1 : e])
    request = trees.request_of_node()
    position = np.arange(trees.total_nodes) - np.repeat(offsets[:-1], trees.sizes)
    nonroot = position > 0
    request, position, key = request[nonroot], position[nonroot], key[nonroot]
    order = np.lexsort((position, request, -key))
    return request[order]


@public
def fit_trees(trees: TreeBatch, kv: KVRoom) -> TreeBatch:
    """``trees`` cut to what ``kv`` holds (see the module doc); ``trees`` itself when they fit.

    A :class:`BudgetError` if the room is for another batch size; the roots always fit."""
    offsets = trees.offsets  # (trees.size and trees.total_nodes, without the properties' calls)
    b = offsets.shape[0] - 1
    if kv.room.shape[0] != b:
        raise BudgetError(f"the KV room is for {kv.room.shape[0]} requests; the step has {b}")
    if kv.surely_fits(int(offsets[-1]), b) or kv.fits(trees.sizes):
        return trees
    request = _keep_order(trees)
    lo, hi = 0, request.shape[0]  # the roots alone fit (room ≥ 1); the whole does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        sizes = 1 + np.bincount(request[:mid], minlength=b)
        if kv.fits(sizes):
            lo = mid
        else:
            hi = mid
    keep = 1 + np.bincount(request[:lo], minlength=b)
    position_all = np.arange(trees.total_nodes) - np.repeat(trees.offsets[:-1], trees.sizes)
    mask = position_all < np.repeat(keep, trees.sizes)
    offsets = np.concatenate(([0], np.cumsum(keep))).astype(np.int64)
    return TreeBatch(
        offsets,
        trees.parents[mask],
        trees.tokens[mask],
        trees.depths[mask],
        trees.scores[mask],
        trees.ranks[mask],
    )
