"""The simulator's ``Drafter`` and ``Verifier``: what the engine loop drives in simulation.

Each simulated request is a :class:`SimRequest`: a source of drafter marginals at its current
root together with the target's tokens at the drafted positions (synthetic, from
:mod:`sim.workloads`, or replayed from a recorded trace, :mod:`sim.replay`). The drafter hands
the marginals to the engine; the verifier walks the chosen tree against the target's tokens —
greedy match against a known continuation, which is also the law of sample-and-match under the
synthetic model — and commits the accepted path plus the bonus token.

Neither charges time: the serving layer prices each batched pass on the simulated GPU and
advances the SimPy clock (one timeout per pass).

What this module does not do: choose trees (the engine calls the policy) or keep time.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from bastion.interfaces import DraftContext, VerifyResult
from bastion.tree import DraftMarginals, DraftTree

__all__ = ["SimDrafter", "SimRequest", "SimVerifier", "accepted_path"]


class SimRequest(Protocol):
    """One simulated request (synthetic or replayed)."""

    request_id: int
    context_len: int  # tokens in the KV cache before the current root
    generated: int  # tokens committed so far (the first, from prefill, included)
    output_len: int  # tokens to generate in all

    def draft(self) -> DraftMarginals:
        """Marginals at the current root; remembers the target's tokens for the step."""
        ...

    def target_tokens(self) -> npt.NDArray[np.int64]:
        """The target's tokens at the drafted positions 1 … depth of the open step."""
        ...

    def bonus(self, accepted: int) -> int:
        """The target's token after ``accepted`` matched positions."""
        ...

    def commit(self, n: int) -> None:
        """Advance the root by ``n`` committed tokens."""
        ...


def accepted_path(tree: DraftTree, target: npt.NDArray[np.int64]) -> list[int]:
    """Nodes of the longest root path whose tokens equal ``target`` at their depths.

    ``target[d − 1]`` is the target's token at depth d. Only nodes that match their own
    position can be on the path, so the walk visits those few (in expansion order, parents
    first) instead of every node.
    """
    depth = tree.depths[1:]
    usable = depth <= target.size
    match = np.zeros(tree.size, dtype=bool)
    match[1:][usable] = tree.tokens[1:][usable] == target[depth[usable] - 1]
    on_path = {0}
    deepest = 0
    for node in np.flatnonzero(match).tolist():
        if int(tree.parents[node]) in on_path:
            on_path.add(node)
            if tree.depths[node] > tree.depths[deepest]:
                deepest = node
    path = [deepest]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


class SimDrafter:
    """``Drafter`` over a table of simulated requests."""

    def __init__(self, requests: dict[int, SimRequest]) -> None:
        self.requests = requests

    def draft(self, context: DraftContext) -> DraftMarginals:
        return self.requests[context.request_id].draft()


class SimVerifier:
    """``Verifier`` that accepts against the simulated target's tokens and commits."""

    def __init__(self, requests: dict[int, SimRequest]) -> None:
        self.requests = requests

    def verify(self, request_id: int, tree: DraftTree) -> VerifyResult:
        req = self.requests[request_id]
        path = accepted_path(tree, req.target_tokens())
        accepted = tuple(int(tree.tokens[n]) for n in path[1:])
        bonus = req.bonus(len(accepted))
        req.commit(len(accepted) + 1)
        return VerifyResult(tuple(path), accepted, bonus)
