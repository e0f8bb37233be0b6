"""Pure acceptance rules: which path of a draft tree the target commits, and its bonus token.

Both lossless rules walk the tree from the root. At each visited node the target supplies its
own next token — the argmax of its logits at T = 0 (*greedy match*), a sample from its processed
distribution at T > 0 (*sample and match*). If a child of the node carries that token the walk
descends into it (the child's token is *accepted*); otherwise the walk stops and the target's
token is the *bonus* token, always committed. Committed per step = accepted + 1.

Because the tree is a deterministic function of the drafter's output, the committed tokens are
distributed exactly as the target's own autoregressive samples: each emitted token is the
target's choice at its position, and matching a child only decides whether the next choice
comes from this forward pass or a later one, as in the reference implementations.

The target's choice is a callable ``next_token(node) -> token``, called only at visited nodes
in root-to-leaf order, so a sampler consumes randomness for the nodes on the accepted path and
nothing else: a seeded run repeats exactly whatever the tree's shape off that path.

What this module does not do: run a model, sample, or touch a KV cache (see
:mod:`bastion.backends.torch.verifier`). It needs numpy only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bastion.errors import ArgumentError
from bastion.guard import array, public
from bastion.tree import DraftTree

__all__ = ["WalkResult", "child_index", "greedy_walk", "walk"]


@dataclass(frozen=True)
class WalkResult:
    """The accepted path of one walk."""

    path: tuple[int, ...]  # node indices, root (0) first
    accepted_tokens: tuple[int, ...]  # tokens of path[1:]
    bonus_token: int  # the target's token after the last accepted node


@public
def child_index(tree: DraftTree) -> dict[tuple[int, int], int]:
    """Map (parent node, token) → child node. Best-first trees have distinct sibling tokens;
    if a tree repeats one, the earlier child wins (either choice is lossless)."""
    index: dict[tuple[int, int], int] = {}
    for node in range(tree.size - 1, 0, -1):
        index[(int(tree.parents[node]), int(tree.tokens[node]))] = node
    return index


@public
def walk(tree: DraftTree, next_token: Callable[[int], int]) -> WalkResult:
    """Walk from the root following the target's token at each node (sample and match)."""
    children = child_index(tree)
    path = [0]
    while True:
        try:
            token = int(next_token(path[-1]))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ArgumentError(
                f"walk: next_token must return a token id (an int): {exc}"
            ) from None
        child = children.get((path[-1], token))
        if child is None:
            accepted = tuple(int(tree.tokens[n]) for n in path[1:])
            return WalkResult(tuple(path), accepted, token)
        path.append(child)


@public(argmax_tokens=array(1, whole=True))
def greedy_walk(tree: DraftTree, argmax_tokens: npt.ArrayLike) -> WalkResult:
    """Greedy match: ``argmax_tokens[i]`` is the target's argmax token at node i ([N])."""
    best = np.asarray(argmax_tokens, dtype=np.int64)
    if best.shape[0] < tree.size:
        raise ArgumentError(f"argmax_tokens has {best.shape[0]} entries; the tree has {tree.size}")
    return walk(tree, lambda node: int(best[node]))
