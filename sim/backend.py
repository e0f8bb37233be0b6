"""The simulator's batched drafter and verifier: what the engine loop drives in simulation.

:class:`SimBatch` holds the requests in flight as arrays over *slots* (KV length, tokens
generated, tokens wanted) and a :class:`DraftSource` that knows, for each slot, the drafter's
marginals at its current root and the target's tokens at the drafted positions — synthetic
(:class:`bastion.sim.synthetic.SyntheticSource`) or replayed from recorded traces
(:class:`sim.replay.TraceSource`). ``draft_batch`` hands the marginals of every request of a step
to the engine; ``verify_batch`` walks every chosen tree against its target tokens at once and
commits the accepted path plus the bonus token: greedy match against a known continuation, which
is also the law of sample-and-match under the synthetic model.

The acceptance walk is vectorised over all nodes of all trees: a node is on its request's
accepted path iff it and all of its ancestors match the target at their depths, which pointer
jumping (each node's ancestor flag and ancestor pointer squared ⌈log₂ depth⌉ times) computes
without a loop over nodes or requests. Siblings carry distinct tokens, so the matched nodes of a
request are exactly its accepted path.

Neither charges time: the serving layer prices each batched pass on the simulated GPU and
advances the SimPy clock.

What this module does not do: choose trees (the engine calls the policy) or keep time.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, BatchVerifyResult, StepRequests, TreeBatch
from bastion.bestfirst import accepted_paths, verified_paths
from bastion.errors import ConfigError
from bastion.fastinit import trusted_init
from bastion.guard import array, integer, public
from bastion.tree import DraftTree

try:  # the optional compiled kernel (setup.py): a verified step's counts in one call
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _kernel = None
_commit = getattr(_kernel, "commit", None)
_verify = getattr(_kernel, "verify", None)
_pool_pin = getattr(_kernel, "pool_pin", None)
# a dtype as an object: np.frombuffer given one skips converting the scalar type
_I8 = np.dtype(np.int64)
_NONE = np.zeros(0, np.int64)  # the contexts a source that does not read them is handed
_NONE.flags.writeable = False

_verified = trusted_init(BatchVerifyResult)  # a step's result, built without __init__

__all__ = ["DraftSource", "SimBatch", "accepted_counts", "accepted_path"]

IntArray = npt.NDArray[np.int64]


class DraftSource(Protocol):
    """Drafter marginals and target tokens for the requests in flight, by slot. A source whose
    ``reads_context_lens`` is False (a class attribute; absent: True) is handed an empty
    array for ``context_lens`` (:class:`SimBatch` then skips gathering them)."""

    def draft(self, slots: IntArray, context_lens: IntArray) -> tuple[BatchMarginals, IntArray]:
        """Marginals at each slot's root and the target's tokens ``[B, depth + 1]`` (the last
        column: the token after the drafted positions, −1 when unknown)."""
        ...


@public
def accepted_counts(trees: TreeBatch, target: IntArray) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """(accepted draft tokens per request ``[B]``, on-path flag per node ``[ΣN]``, roots False).

    ``target[i, d − 1]`` is the target's token at depth d of request i (columns past a tree's
    drafted depth are never compared). The compiled kernel walks each tree once, parents first;
    without it, the numpy form below gives the same answer."""
    compiled = accepted_paths(trees.parents, trees.tokens, trees.depths, trees.offsets, target)
    return compiled[:2] if compiled is not None else accepted_counts_numpy(trees, target)


def accepted_counts_numpy(
    trees: TreeBatch, target: IntArray
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """:func:`accepted_counts` in numpy: pointer jumping over all nodes of all trees."""
    offsets = trees.offsets
    sizes = np.diff(offsets)
    request = np.repeat(np.arange(sizes.shape[0]), sizes)
    depths = trees.depths
    root = depths == 0
    cols = np.maximum(depths - 1, 0)
    ok = (trees.tokens == target[request, cols]) | root
    up = trees.parents + offsets[request]  # global parent index
    up[root] = np.flatnonzero(root)  # roots point at themselves
    reach = 1
    deepest = int(depths.max(initial=0))
    while reach < deepest:  # pointer jumping: after k rounds, 2^k ancestors are folded in
        ok = ok & ok[up]
        up = up[up]
        reach *= 2
    ok &= ~root
    counts = np.add.reduceat(ok.astype(np.int64), offsets[:-1])
    return counts, ok


@public(target=array(1, whole=True))
def accepted_path(tree: DraftTree, target: IntArray) -> list[int]:
    """Nodes of the longest root path of one tree whose tokens equal ``target`` at their depths
    (root first) — the single-request form of :func:`accepted_counts`."""
    batch = TreeBatch.from_trees([tree])
    padded = np.concatenate((np.asarray(target, np.int64), [-1]))[None, :]
    width = max(int(tree.depths.max()), padded.shape[1])
    if padded.shape[1] < width:
        padded = np.pad(padded, ((0, 0), (0, width - padded.shape[1])), constant_values=-1)
    _, ok = accepted_counts(batch, padded)
    return [0, *np.flatnonzero(ok).tolist()]


MAX_REQUESTS = 1 << 24  # requests of one simulation (its slot table is allocated up front)


@public(error=ConfigError, n_requests=integer(1, MAX_REQUESTS))
class SimBatch:
    """The requests in flight on the simulated GPU (a ``BatchDrafter`` and ``BatchVerifier``).

    Slots are reused: :meth:`admit` puts a request in a free slot, :meth:`release` frees it.
    Arrays are indexed by slot; ``slot_of`` maps request ids to slots.
    """

    def __init__(self, source: DraftSource, n_requests: int) -> None:
        if n_requests < 1:
            raise ConfigError(f"a simulation needs at least one request; got {n_requests}")
        self.source = source
        self.slot_of = np.full(n_requests, -1, np.int64)
        self.context_len = np.zeros(0, np.int64)  # KV tokens before the current root
        self.generated = np.zeros(0, np.int64)  # tokens committed (prefill's first included)
        self.output_len = np.zeros(0, np.int64)  # tokens the request generates in all
        self.request_id = np.zeros(0, np.int64)
        self._free: list[int] = []
        self._target: IntArray | None = None  # target tokens of the open step
        self._drafted_for: StepRequests | None = None  # the step they belong to
        self._drafted_slots: IntArray = np.zeros(0, np.int64)  # … and its slots
        self._pin_counts()

    def _pin_counts(self) -> None:
        """The three count arrays' buffers taken once and held (``pool_pin``), re-pinned
        whenever the arrays are replaced (the pool grows): verify() and gather() then use the
        held buffers each step instead of asking numpy for them (a pin of arrays since replaced
        is only not used)."""
        self.pin: object = (
            None
            if _pool_pin is None
            else _pool_pin(self.context_len, self.generated, self.output_len)
        )

    def __getstate__(self) -> dict[str, object]:  # (copies and pickles: without the pin)
        state = self.__dict__.copy()
        state["pin"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._pin_counts()

    def admit(self, request_id: int, prompt_len: int, output_len: int) -> int:
        """Start a request whose prompt is prefilled (its first token generated); its slot."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = self.context_len.shape[0]
            grow = max(1, slot)
            self.context_len = np.concatenate((self.context_len, np.zeros(grow, np.int64)))
            self.generated = np.concatenate((self.generated, np.zeros(grow, np.int64)))
            self.output_len = np.concatenate((self.output_len, np.zeros(grow, np.int64)))
            self.request_id = np.concatenate((self.request_id, np.full(grow, -1, np.int64)))
            self._free.extend(range(slot + grow - 1, slot, -1))
            self._pin_counts()
        self.slot_of[request_id] = slot
        self.request_id[slot] = request_id
        self.context_len[slot] = prompt_len
        self.generated[slot] = 1
        self.output_len[slot] = output_len
        return slot

    def release(self, request_id: int) -> None:
        slot = int(self.slot_of[request_id])
        self.slot_of[request_id] = -1
        self.request_id[slot] = -1
        self._free.append(slot)

    # -- the protocols ----------------------------------------------------------------------------

    def draft_batch(self, requests: StepRequests) -> BatchMarginals:
        slots = self.slot_of[requests.request_ids]
        source = self.source
        contexts = self.context_len[slots] if getattr(source, "reads_context_lens", True) else _NONE
        marginals, self._target = source.draft(slots, contexts)
        self._drafted_for, self._drafted_slots = requests, slots
        return marginals

    def verify_batch(self, requests: StepRequests, trees: TreeBatch) -> BatchVerifyResult:
        target = self._target
        drafted = target is not None and requests is self._drafted_for
        slots = self._drafted_slots if drafted else self.slot_of[requests.request_ids]
        if target is None or not drafted:
            if trees.total_nodes != trees.size:
                raise ConfigError("verify_batch needs the same step's draft_batch first")
            # undrafted root-only trees (target-only AR): one token each, identity unknown
            target = np.full((slots.shape[0], 1), -1, np.int64)
        self._target = self._drafted_for = None
        b = slots.shape[0]
        if drafted and _verify is not None:  # the walk and the counts below in one compiled
            # call (root-only trees too: lengths 1, each target's first token); None (nothing
            # changed) unless every array is C-contiguous int64 (the trees may be any
            # policy's): then the separate calls below convert them
            made = _verify(
                trees.parents,
                trees.tokens,
                trees.depths,
                trees.offsets,
                target,
                self.context_len,
                self.generated,
                self.output_len,
                slots,
                self.pin,
            )
            if made is not None:
                frombuffer = np.frombuffer
                return _verified(
                    frombuffer(made[0], _I8), frombuffer(made[1], _I8), frombuffer(made[2], _I8)
                )
        if trees.total_nodes == b:  # root-only trees: nothing to walk, one token each
            committed = np.ones(b, np.int64)
            tokens = target[:, 0].copy()
            nodes = np.zeros(0, np.int64)
        else:
            walked = verified_paths(
                trees.parents, trees.tokens, trees.depths, trees.offsets, target
            )
            if walked is not None:
                committed, tokens, nodes = walked
            else:
                counts, tokens, nodes = _committed_numpy(trees, target)
                committed = counts + 1
        # tokens past a request's output length are never delivered (the serving layer counts
        # only what is); the verifier's own result stays uncut for a learning cost model
        if b == 1:  # the batch-1 step: the same sums on the one slot, without index arrays
            slot, made = int(slots[0]), int(committed[0])
            self.context_len[slot] += made
            self.generated[slot] = min(int(self.generated[slot]) + made, int(self.output_len[slot]))
        elif _commit is None or not _commit(
            self.context_len, self.generated, self.output_len, slots, committed
        ):  # (compiled: the same integer updates in one call, tests/test_sim_core.py)
            self.context_len[slots] += committed
            wanted = self.output_len[slots]
            self.generated[slots] = np.minimum(self.generated[slots] + committed, wanted)
        return _verified(committed, tokens, nodes)


def _committed_numpy(trees: TreeBatch, target: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """(accepted per request, accepted tokens then the bonus per request, accepted nodes)."""
    counts, on_path = accepted_counts_numpy(trees, target)
    b = counts.shape[0]
    bonus = target[np.arange(b), np.minimum(counts, target.shape[1] - 1)]
    ends = np.cumsum(counts + 1)
    tokens = np.empty(int(ends[-1]), np.int64)
    is_bonus = np.zeros(tokens.shape[0], bool)
    is_bonus[ends - 1] = True
    tokens[is_bonus] = bonus
    tokens[~is_bonus] = trees.tokens[on_path]
    nodes = np.flatnonzero(on_path) - np.repeat(trees.offsets[:-1], counts)
    return counts, tokens, nodes
