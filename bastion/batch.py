"""The values of one batched decode step: every request's marginals, trees and outcomes at once.

A serving step drafts, chooses trees for, verifies and commits all of its requests together;
batch 1 is the same code with one request. The values that cross the batched protocols are
stored as arrays over the batch, so a simulator can run a step without a Python loop over its
requests:

- :class:`StepRequests`: who is in the step (ids, KV lengths, roots, last step's tree sizes),
  and, from a server that counts its KV cache, the room its trees have there (:class:`KVRoom`).
- :class:`BatchMarginals`: every request's top-K marginals, stacked to ``[B, depth, K]``
  (rows of a request with a smaller lattice are padded with probability 0, never drafted).
- :class:`TreeBatch`: every request's tree, concatenated in request order (CSR layout:
  ``offsets[i]:offsets[i + 1]`` are request i's nodes; parents are indices within the request).
- :class:`BatchVerifyResult`: committed lengths per request and the committed tokens and
  accepted nodes concatenated in request order.

Each has a per-request view (``row(i)``, ``tree(i)``, ``result(i)``) returning the single-request
types (``DraftMarginals`` and ``DraftTree`` of :mod:`bastion.tree`, and :class:`VerifyResult`,
defined here and re-exported by :mod:`bastion.interfaces`), and a constructor from those
(``from_rows``, ``from_trees``, ``from_results``), which is how single-request drafters,
policies and verifiers are adapted.

What this module does not do: choose or verify anything (see :mod:`bastion.engine`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.errors import BudgetError, MarginalsError
from bastion.fastinit import trusted_init
from bastion.guard import array, integer, public
from bastion.tree import DraftMarginals, DraftTree

__all__ = [
    "MAX_BATCH",
    "BatchMarginals",
    "BatchVerifyResult",
    "KVRoom",
    "StepRequests",
    "TreeBatch",
    "VerifyResult",
    "chain_batch",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
# dtypes as objects: a numpy call given one skips converting the scalar type (timeit, this
# project's dev machine: ascontiguousarray 85 -> 61 ns, frombuffer 221 -> 174 ns)
_I8, _F8 = np.dtype(np.int64), np.dtype(np.float64)

MAX_KV_BLOCK_TOKENS = 1 << 20
"""The largest KV-cache block (tokens) a :class:`KVRoom` accepts."""

MAX_BATCH = 1 << 20
"""The most requests one step's batch built from a bare size holds (``BatchMarginals.empty``,
``TreeBatch.roots``): a larger size is refused before anything is allocated for it."""


def _ints(values: npt.ArrayLike) -> IntArray:
    return np.asarray(values, dtype=np.int64)


@public(
    error=BudgetError,
    room=array(1, lo=1, whole=True),
    free_blocks=integer(lo=0),
    block_tokens=integer(1, MAX_KV_BLOCK_TOKENS),
)
@dataclass(frozen=True, eq=False)
class KVRoom:
    """What a step's trees may write into a paged KV cache (:mod:`bastion.kvroom`): request i
    holds ``room[i]`` token slots beyond its context (≥ 1: its root fits), and verifying a
    tree of N_i nodes takes ⌈max(0, N_i − room_i) / block_tokens⌉ of the ``free_blocks``."""

    room: IntArray  # [B] token slots each request holds beyond its context (≥ 1)
    free_blocks: int  # blocks no request holds
    block_tokens: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "room", np.asarray(self.room, np.int64))

    def added_blocks(self, sizes: npt.ArrayLike) -> int:
        """Σ_i ⌈max(0, N_i − room_i) / block_tokens⌉: the new blocks trees of ``sizes`` take."""
        over = np.maximum(np.asarray(sizes, np.int64) - self.room, 0)
        bt = self.block_tokens
        return int(np.add.reduce((over + (bt - 1)) // bt))

    def fits(self, sizes: npt.ArrayLike) -> bool:
        """Whether trees of ``sizes`` (roots included) fit the free blocks."""
        return self.added_blocks(sizes) <= self.free_blocks

    def surely_fits(self, total_nodes: int, batch: int) -> bool:
        """A sufficient test in O(1): B trees of ΣN nodes take at most ⌊(ΣN + B(bt − 1)) / bt⌋
        new blocks (Σ_i ⌈N_i / bt⌉, whatever each request's room)."""
        bt = self.block_tokens
        return (total_nodes + batch * (bt - 1)) // bt <= self.free_blocks


@dataclass(frozen=True, eq=False)
class StepRequests:
    """The requests of one step. Arrays are over the batch, in the step's request order."""

    request_ids: IntArray  # [B]
    context_lens: IntArray  # [B] tokens in each KV cache before its root
    bonus_tokens: IntArray  # [B] each tree's root: the request's last committed token
    previous_tree_sizes: IntArray  # [B] last step's tree size, 0 on a request's first step
    previous_expected: FloatArray  # [B] last step's Â (expected tokens), 0 on the first step
    feedback: Sequence[object | None] | None = None  # per request, from last step's verify
    committed: Sequence[Sequence[int]] | None = None  # per request, every token so far
    # prompt tokens of requests still being prefilled that ride in this step's forward pass
    # (chunked prefill mixed into decode); 0: the pass verifies the trees alone
    riding_tokens: int = 0
    # the KV cache's room for this step's trees (a server that counts its cache sets it; the
    # engine cuts trees that do not fit, bastion.kvroom.fit_trees); None: no limit
    kv: KVRoom | None = None

    @classmethod
    @public(
        request_ids=array(1, whole=True),
        context_lens=array(1, lo=0, whole=True),
        bonus_tokens=array(1, whole=True),
        previous_tree_sizes=array(1, lo=0, hi=MAX_TREE_SIZE, whole=True),
        previous_expected=array(1, lo=0),
        own=("riding_tokens",),
        lengths=(
            "request_ids",
            "context_lens",
            "bonus_tokens",
            "previous_tree_sizes",
            "previous_expected",
            "feedback",
            "committed",
        ),
    )
    def of(
        cls,
        request_ids: npt.ArrayLike,
        context_lens: npt.ArrayLike,
        bonus_tokens: npt.ArrayLike,
        previous_tree_sizes: npt.ArrayLike | None = None,
        previous_expected: npt.ArrayLike | None = None,
        feedback: Sequence[object | None] | None = None,
        committed: Sequence[Sequence[int]] | None = None,
        riding_tokens: int = 0,
        kv: KVRoom | None = None,
    ) -> StepRequests:
        """The checked constructor (the dataclass's own takes its arguments as they are)."""
        if (
            isinstance(riding_tokens, bool)
            or not isinstance(riding_tokens, (int, np.integer))
            or riding_tokens < 0
        ):
            raise BudgetError(f"riding_tokens must be an integer ≥ 0; got {riding_tokens!r}")
        ids = _ints(request_ids)
        b = ids.shape[0]
        if kv is not None and kv.room.shape != (b,):
            raise BudgetError(f"kv: the KV room is for {kv.room.shape} requests; the step has {b}")
        return cls(
            ids,
            _ints(context_lens),
            _ints(bonus_tokens),
            np.zeros(b, np.int64) if previous_tree_sizes is None else _ints(previous_tree_sizes),
            np.zeros(b) if previous_expected is None else np.asarray(previous_expected, float),
            feedback,
            committed,
            int(riding_tokens),
            kv,
        )

    @property
    def size(self) -> int:
        """B, the number of requests in the step."""
        return int(self.request_ids.shape[0])

    def __len__(self) -> int:
        return self.size


@dataclass(frozen=True, eq=False)
class BatchMarginals:
    """Every request's top-K marginals, ``[B, depth, K]`` (see :class:`DraftMarginals`)."""

    token_ids: IntArray  # [B, depth, K]
    probs: FloatArray  # [B, depth, K], each row sorted descending

    @property
    def size(self) -> int:
        return int(self.probs.shape[0])

    def row(self, i: int) -> DraftMarginals:
        """Request i's marginals (a view; padding rows have probability 0)."""
        return DraftMarginals.trusted(self.token_ids[i], self.probs[i])

    @classmethod
    @public(error=MarginalsError)
    def from_rows(cls, rows: Sequence[DraftMarginals]) -> BatchMarginals:
        """Stack per-request marginals; smaller lattices are padded with zero probability."""
        if not rows:
            raise MarginalsError("a batch of marginals needs at least one request")
        shapes = {m.probs.shape for m in rows}
        if len(shapes) == 1:
            return cls(np.stack([m.token_ids for m in rows]), np.stack([m.probs for m in rows]))
        depth = max(s[0] for s in shapes)
        k = max(s[1] for s in shapes)
        ids = np.zeros((len(rows), depth, k), np.int64)
        probs = np.zeros((len(rows), depth, k))
        for i, m in enumerate(rows):
            d, kk = m.probs.shape
            # padding: distinct unused ids (never drafted: their probability is 0)
            ids[i] = int(m.token_ids.max()) + 1 + np.arange(k)
            ids[i, :d, :kk] = m.token_ids
            probs[i, :d, :kk] = m.probs
        return cls(ids, probs)

    @classmethod
    @public(batch_size=integer(1, MAX_BATCH))
    def empty(cls, batch_size: int) -> BatchMarginals:
        """What a policy that never drafts (target-only AR) receives: one zero candidate."""
        return empty_marginals(batch_size)


@functools.lru_cache(maxsize=64)
def empty_marginals(batch_size: int) -> BatchMarginals:
    """:meth:`BatchMarginals.empty` without its argument check, for the library's per-step
    callers (the same object per batch size: the engine hands it to an AR step, the controller
    recognises it by identity)."""
    ids = np.zeros((batch_size, 1, 1), np.int64)
    probs = np.zeros((batch_size, 1, 1))
    ids.flags.writeable = probs.flags.writeable = False
    return BatchMarginals(ids, probs)


@dataclass(frozen=True, eq=False)
class TreeBatch:
    """Every request's draft tree, concatenated in request order (see :class:`DraftTree`).

    ``parents`` are indices within the request's own tree (−1 for each root), so ``tree(i)`` is a
    plain slice.
    """

    offsets: IntArray  # [B + 1], request i's nodes are offsets[i]:offsets[i + 1]
    parents: IntArray  # [ΣN]
    tokens: IntArray  # [ΣN]
    depths: IntArray  # [ΣN]
    scores: FloatArray  # [ΣN] ρ
    ranks: IntArray  # [ΣN]

    @property
    def size(self) -> int:
        """B, the number of trees."""
        return int(self.offsets.shape[0]) - 1

    @property
    def sizes(self) -> IntArray:
        """[B] tree sizes N_i (roots included)."""
        offsets = self.offsets  # np.diff's values, without its Python-level checks (hot)
        return offsets[1:] - offsets[:-1]

    @property
    def total_nodes(self) -> int:
        return int(self.offsets[-1])

    def expected_tokens(self) -> FloatArray:
        """[B] each tree's Â = Σ ρ over its nodes."""
        return np.add.reduceat(self.scores, self.offsets[:-1])

    def request_of_node(self) -> IntArray:
        """[ΣN] the request index of every node."""
        return np.repeat(np.arange(self.size), self.sizes)

    def tree(self, i: int) -> DraftTree:
        a, e = int(self.offsets[i]), int(self.offsets[i + 1])
        return DraftTree.trusted(
            self.parents[a:e], self.tokens[a:e], self.depths[a:e], self.scores[a:e], self.ranks[a:e]
        )

    def trees(self) -> list[DraftTree]:
        return [self.tree(i) for i in range(self.size)]

    def with_root_tokens(self, roots: npt.ArrayLike) -> TreeBatch:
        """The same trees with each root's token set (the engine sets the bonus tokens)."""
        tokens = self.tokens.copy()
        if self.offsets.shape[0] == 2 and type(roots) is np.ndarray and roots.shape == (1,):
            tokens[0] = roots[0]  # batch 1 (the engine's bonus tokens): one root, at 0
        else:
            tokens[self.offsets[:-1]] = roots
        return _tree_batch(self.offsets, self.parents, tokens, self.depths, self.scores, self.ranks)

    @classmethod
    @public(error=MarginalsError)
    def from_trees(cls, trees: Sequence[DraftTree]) -> TreeBatch:
        if not trees:
            raise MarginalsError("a tree batch needs at least one tree")
        if len(trees) == 1:  # the batch-1 serving step: no copies
            t = trees[0]
            return cls(
                np.array([0, t.size], np.int64), t.parents, t.tokens, t.depths, t.scores, t.ranks
            )
        offsets = np.zeros(len(trees) + 1, np.int64)
        np.cumsum([t.size for t in trees], out=offsets[1:])
        return cls(
            offsets,
            np.concatenate([t.parents for t in trees]),
            np.concatenate([t.tokens for t in trees]),
            np.concatenate([t.depths for t in trees]),
            np.concatenate([t.scores for t in trees]),
            np.concatenate([t.ranks for t in trees]),
        )

    @classmethod
    @public(batch_size=integer(1, MAX_BATCH))
    def roots(cls, batch_size: int) -> TreeBatch:
        """B root-only trees (target-only AR)."""
        return _root_batch(batch_size)


_tree_batch = trusted_init(TreeBatch)  # the engine's per-step copy (with_root_tokens)


def tree_batch_from_buffers(
    offsets: bytes, parents: bytes, tokens: bytes, depths: bytes, scores: bytes, ranks: bytes
) -> TreeBatch:
    """A :class:`TreeBatch` over a compiled kernel's flat buffers (int64, and float64 scores),
    without copying them. Internal: the kernels' callers (the joint budget, the controllers)
    share it; not part of the public API."""
    frombuffer, i8 = np.frombuffer, _I8
    return _tree_batch(
        frombuffer(offsets, i8),
        frombuffer(parents, i8),
        frombuffer(tokens, i8),
        frombuffer(depths, i8),
        frombuffer(scores, _F8),
        frombuffer(ranks, i8),
    )


@functools.lru_cache(maxsize=64)  # read-only arrays: one batch of roots per batch size
def _root_batch(batch_size: int) -> TreeBatch:
    minus = np.full(batch_size, -1, np.int64)
    arrays = (np.arange(batch_size + 1), minus, minus, np.zeros(batch_size, np.int64))
    for a in arrays:
        a.flags.writeable = False
    scores = np.ones(batch_size)
    scores.flags.writeable = False
    return TreeBatch(arrays[0], arrays[1], arrays[2], arrays[3], scores, arrays[1])


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verifying one tree.

    Accepted tokens are draft tokens the target agreed with; the bonus token is the target's own
    token at the deepest accepted node (always emitted). Committed length = len(accepted_tokens)
    + 1, so τ counts the bonus token.
    """

    accepted_nodes: tuple[int, ...]  # tree node indices on the accepted path, root (0) first
    accepted_tokens: tuple[int, ...]  # tokens of accepted_nodes[1:]
    bonus_token: int
    feedback: object | None = None  # what the drafter needs next step (opaque to the engine)

    @property
    def committed_len(self) -> int:
        return len(self.accepted_tokens) + 1


@dataclass(frozen=True, eq=False)
class BatchVerifyResult:
    """The outcome of verifying a :class:`TreeBatch`, request by request.

    Request i commits ``committed_lens[i]`` tokens: its accepted draft tokens, then the bonus
    token (so committed = accepted + 1, and τ counts the bonus). ``tokens`` holds them all in
    request order; ``accepted_nodes`` holds each request's accepted path (node indices within
    its tree, root excluded) in the same order.
    """

    committed_lens: IntArray  # [B]
    tokens: IntArray  # [Σ committed] accepted tokens then the bonus token, request by request
    accepted_nodes: IntArray  # [Σ (committed − 1)] path nodes, root excluded
    feedback: Sequence[object | None] | None = None  # per request, for the drafter's next step

    @property
    def size(self) -> int:
        return int(self.committed_lens.shape[0])

    def result(self, i: int) -> VerifyResult:
        """Request i's outcome as a single-request :class:`VerifyResult`."""
        ends = np.cumsum(self.committed_lens)
        a, e = int(ends[i] - self.committed_lens[i]), int(ends[i])
        pa = a - i  # accepted nodes are committed − 1 per request
        toks = self.tokens[a:e].tolist()
        path = (0, *self.accepted_nodes[pa : pa + e - a - 1].tolist())
        fb = self.feedback[i] if self.feedback is not None else None
        return VerifyResult(path, tuple(toks[:-1]), int(toks[-1]), fb)

    @classmethod
    @public
    def from_results(cls, results: Sequence[VerifyResult]) -> BatchVerifyResult:
        lens = np.array([r.committed_len for r in results], np.int64)
        tokens = [t for r in results for t in (*r.accepted_tokens, r.bonus_token)]
        nodes = [n for r in results for n in r.accepted_nodes[1:]]
        return cls(lens, _ints(tokens), _ints(nodes), tuple(r.feedback for r in results) or None)


@public
def chain_batch(marginals: BatchMarginals, depth: int | None = None) -> TreeBatch:
    """Every request's top-1 path (the chain) of at most ``depth`` positions (all if None), each
    stopping at its first zero marginal; root tokens −1."""
    full = marginals.probs.shape[1]
    d = full if depth is None else min(depth, full)
    p = marginals.probs[:, :d, 0]
    b = p.shape[0]
    scores = np.empty((b, d + 1))
    scores[:, 0] = 1.0
    np.cumprod(p, axis=1, out=scores[:, 1:])
    tokens = np.empty((b, d + 1), np.int64)
    tokens[:, 0] = -1
    tokens[:, 1:] = marginals.token_ids[:, :d, 0]
    if p.all():  # no zero marginal: every chain is full length, one shape
        offsets, parents, depths, ranks = _chain_shape(b, d)
        return TreeBatch(offsets, parents, tokens.ravel(), depths, scores.ravel(), ranks)
    keep = np.ones((b, d + 1), bool)  # a chain stops at its first zero marginal
    np.cumprod(p > 0.0, axis=1, out=keep[:, 1:])
    depths = np.broadcast_to(np.arange(d + 1), keep.shape)[keep]
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    ranks = np.where(depths == 0, -1, 0)
    return TreeBatch(offsets, depths - 1, tokens[keep], depths, scores[keep], ranks)


@functools.lru_cache(maxsize=64)
def _chain_shape(batch: int, depth: int) -> tuple[npt.NDArray[np.int64], ...]:
    """(offsets, parents, depths, ranks) of ``batch`` full chains of ``depth`` nodes + root."""
    offsets = np.arange(0, batch * (depth + 1) + 1, depth + 1, dtype=np.int64)
    depths = np.tile(np.arange(depth + 1, dtype=np.int64), batch)
    arrays = (offsets, depths - 1, depths, np.where(depths == 0, -1, 0))
    for a in arrays:
        a.flags.writeable = False
    return arrays
