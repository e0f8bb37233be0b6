"""Draft marginals, draft trees, and best-first construction (paper §3.1–3.3).

``DraftMarginals`` holds a drafter's top-K candidates per future position; ``DraftTree`` is a
prefix tree over them stored as arrays in expansion order (parents before children, node 0 the
root). ``best_first_tree`` builds the tree of size N that maximises the surrogate
Â(T) = Σ_i ρ(i) (Prop. 3.3); because its node order is the best-first order, ``tree.prefix(n)``
is the optimal tree of size n for every n ≤ N.

Conventions (docs/core.md): a tree of size N counts its root; the root has depth 0 and ρ = 1;
its token is the previous step's bonus token (``-1`` when unknown to the builder).

What this module does not do: choose N (see :mod:`bastion.budget`) or other tree shapes (see
:mod:`bastion.policies`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bastion.bestfirst import MAX_TREE_SIZE, TreeArrays, best_first, best_first_many
from bastion.errors import ArgumentError, BudgetError, MarginalsError
from bastion.guard import as_int, finite_array, public

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "MAX_MASK_ELEMENTS",
    "DraftMarginals",
    "DraftTree",
    "ancestor_matrix",
    "attention_mask",
    "best_first_tree",
    "best_first_trees",
    "path_to",
    "position_ids",
    "surrogate_acceptance",
    "to_networkx",
    "tree_from_arrays",
]

_SUM_TOLERANCE = 1e-6
_MAX_TOKEN = np.iinfo(np.int64).max


def _frozen(a: npt.ArrayLike, dtype: type) -> npt.NDArray[Any]:
    arr: npt.NDArray[Any] = np.array(a, dtype=dtype, copy=True)
    arr.flags.writeable = False
    return arr


def _checked_ints(name: str, value: object) -> npt.NDArray[Any]:
    """An int64 field of a tree from user input: integers only (no strings, floats with a
    fraction, None, or values beyond int64)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise MarginalsError(f"tree field {name} must be an integer array: {exc}") from exc
    if (
        arr.dtype.kind == "f"
        and np.all(np.isfinite(arr))
        and np.all(arr == np.round(arr))
        and np.all(np.abs(arr) < 2.0**63)
    ):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu" and arr.size:
        raise MarginalsError(f"tree field {name} must hold integers; got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _MAX_TOKEN:
        raise MarginalsError(f"tree field {name} holds {int(arr.max())} ≥ 2**63")
    return _frozen(arr, np.int64)


@public
@dataclass(frozen=True, eq=False)
class DraftMarginals:
    """A drafter's top-K candidates for each of ``depth`` future positions.

    ``token_ids[k, j]`` is the j-th most likely token at position k + 1 after the root and
    ``probs[k, j]`` its marginal probability q_k; each row is sorted descending, holds distinct
    token ids, and sums to at most 1 (the top-K mass of a full-vocabulary softmax).
    """

    token_ids: npt.NDArray[np.int64]  # [depth, K]
    probs: npt.NDArray[np.float64]  # [depth, K], rows sorted descending

    def __init__(self, token_ids: npt.ArrayLike, probs: npt.ArrayLike) -> None:
        try:
            ids = np.asarray(token_ids)
            p = np.asarray(probs, dtype=np.float64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise MarginalsError(f"marginals must be numeric arrays: {exc}") from exc
        if p.ndim != 2 or ids.ndim != 2:
            raise MarginalsError(
                f"token_ids and probs must be 2-D [depth, K]; got shapes {ids.shape} and {p.shape}"
            )
        if ids.shape != p.shape:
            raise MarginalsError(
                f"token_ids shape {ids.shape} does not match probs shape {p.shape}"
            )
        depth, k = p.shape
        if depth == 0 or k == 0:
            raise MarginalsError(f"marginals are empty (depth={depth}, K={k}); need depth, K ≥ 1")
        if ids.dtype.kind not in "iu":
            if (
                ids.dtype.kind == "f"
                and np.all(np.isfinite(ids))
                and np.all(ids == np.round(ids))
                and np.all(np.abs(ids) < 2.0**63)
            ):
                ids = ids.astype(np.int64)
            else:
                raise MarginalsError(f"token_ids must be integers; got dtype {ids.dtype}")
        if np.any(ids < 0):
            raise MarginalsError("token_ids must be non-negative")
        if ids.dtype.kind == "u" and ids.size and int(ids.max()) > _MAX_TOKEN:
            raise MarginalsError(f"token ids must be < 2**63; got {int(ids.max())}")
        if not np.all(np.isfinite(p)):
            raise MarginalsError("probs contain NaN or infinite values")
        if np.any(p < 0.0) or np.any(p > 1.0):
            raise MarginalsError(
                f"probs must lie in [0, 1]; got min {p.min():.6g}, max {p.max():.6g}"
            )
        sums = p.sum(axis=1)
        if np.any(sums > 1.0 + _SUM_TOLERANCE):
            row = int(np.argmax(sums))
            raise MarginalsError(
                f"row {row} of probs sums to {sums[row]:.9g} > 1 (tolerance {_SUM_TOLERANCE})"
            )
        if np.any(np.diff(p, axis=1) > 0.0):
            row = int(np.flatnonzero(np.any(np.diff(p, axis=1) > 0.0, axis=1))[0])
            raise MarginalsError(f"row {row} of probs is not sorted in descending order")
        if k > 1:
            srt = np.sort(ids, axis=1)
            dup = np.any(srt[:, 1:] == srt[:, :-1], axis=1)
            if np.any(dup):
                raise MarginalsError(f"row {int(np.flatnonzero(dup)[0])} repeats a token id")
        object.__setattr__(self, "token_ids", _frozen(ids, np.int64))
        object.__setattr__(self, "probs", _frozen(p, np.float64))

    @classmethod
    def trusted(
        cls, token_ids: npt.NDArray[np.int64], probs: npt.NDArray[np.float64]
    ) -> DraftMarginals:
        """Wrap arrays that are valid by construction, skipping validation (hot loops such as
        the simulator's generators, whose output the tests validate separately)."""
        self = object.__new__(cls)
        object.__setattr__(self, "token_ids", token_ids)
        object.__setattr__(self, "probs", probs)
        return self

    @property
    def depth(self) -> int:
        return int(self.probs.shape[0])

    @property
    def k(self) -> int:
        return int(self.probs.shape[1])

    @classmethod
    def from_distributions(cls, dists: npt.ArrayLike, k: int) -> DraftMarginals:
        """Top-k of full distributions ``dists`` [depth, vocab] (ties: lower token id first)."""
        d = finite_array(dists, "DraftMarginals.from_distributions: dists", error=MarginalsError)
        if d.ndim != 2 or d.shape[0] == 0 or d.shape[1] == 0:
            raise MarginalsError(
                "DraftMarginals.from_distributions: dists must be a non-empty [depth, vocab] "
                f"array; got shape {d.shape}"
            )
        k = as_int(k, "DraftMarginals.from_distributions: k", 1, d.shape[1], error=BudgetError)
        ids = np.argsort(-d, axis=1, kind="stable")[:, :k]
        return cls(ids, np.take_along_axis(d, ids, axis=1))

    @public(error=BudgetError)
    def truncate(self, depth: int | None = None, k: int | None = None) -> DraftMarginals:
        """The first ``depth`` positions and top ``k`` candidates."""
        d = self.depth if depth is None else depth
        kk = self.k if k is None else k
        if not (1 <= d <= self.depth and 1 <= kk <= self.k):
            raise BudgetError(
                f"truncate needs 1 ≤ depth ≤ {self.depth} and 1 ≤ k ≤ {self.k}; got {d}, {kk}"
            )
        return DraftMarginals(self.token_ids[:d, :kk], self.probs[:d, :kk])


@public
@dataclass(frozen=True, eq=False)
class DraftTree:
    """A prefix tree stored as arrays in expansion order; node 0 is the root.

    ``ranks[i]`` is the index of node i's token in its position's candidate row (−1 for the
    root); ``scores[i]`` is ρ(i), the product of marginals along the root-to-i path.
    """

    parents: npt.NDArray[np.int64]  # [N], parents[0] = -1, parents[i] < i
    tokens: npt.NDArray[np.int64]  # [N], tokens[0] = root token
    depths: npt.NDArray[np.int64]  # [N], depths[0] = 0, depths[i] = depths[parents[i]] + 1
    scores: npt.NDArray[np.float64]  # [N], ρ; scores[0] = 1
    ranks: npt.NDArray[np.int64]  # [N], ranks[0] = -1

    def __init__(
        self,
        parents: npt.ArrayLike,
        tokens: npt.ArrayLike,
        depths: npt.ArrayLike,
        scores: npt.ArrayLike,
        ranks: npt.ArrayLike | None = None,
        *,
        validate: bool = True,
    ) -> None:
        given: dict[str, Any] = {
            "parents": parents,
            "tokens": tokens,
            "depths": depths,
            "ranks": ranks,
        }
        fields: dict[str, npt.NDArray[Any]] = {}
        for name, value in given.items():
            if name == "ranks" and value is None:
                n = fields["parents"].shape[0] if fields["parents"].ndim == 1 else 0
                value = np.full(n, -1)
            try:
                fields[name] = _checked_ints(name, value) if validate else _frozen(value, np.int64)
            except (TypeError, ValueError, OverflowError) as exc:  # validate=False, unusable
                raise MarginalsError(f"tree field {name} must be an integer array: {exc}") from exc
        try:
            fields["scores"] = _frozen(scores, np.float64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise MarginalsError(f"tree scores must be numbers: {exc}") from exc
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        if validate:
            self._validate()

    def _validate(self) -> None:
        n = self.parents.shape[0] if self.parents.ndim == 1 else 0
        if n == 0:
            raise BudgetError("a tree has at least its root (size N ≥ 1)")
        for name in ("tokens", "depths", "scores", "ranks"):
            arr = getattr(self, name)
            if arr.shape != (n,):
                raise MarginalsError(f"tree field {name} has shape {arr.shape}; expected ({n},)")
        if self.parents[0] != -1 or self.depths[0] != 0:
            raise MarginalsError("node 0 must be the root (parent -1, depth 0)")
        idx = np.arange(1, n)
        par = self.parents[1:]
        if np.any(par < 0) or np.any(par >= idx):
            raise MarginalsError("every non-root node's parent must come before it (prefix-closed)")
        if np.any(self.depths[1:] != self.depths[par] + 1):
            raise MarginalsError("depths must equal the parent's depth + 1")
        if not np.all(np.isfinite(self.scores)) or np.any(self.scores < 0):
            raise MarginalsError("tree scores ρ must be finite and ≥ 0")
        if np.any(self.scores[1:] > self.scores[par] * (1 + 1e-12)):
            raise MarginalsError("a node's score ρ cannot exceed its parent's")

    @property
    def size(self) -> int:
        """N, the number of nodes including the root (tokens verified in one pass)."""
        return int(self.parents.shape[0])

    def __len__(self) -> int:
        return self.size

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    @classmethod
    def trusted(
        cls,
        parents: npt.NDArray[np.int64],
        tokens: npt.NDArray[np.int64],
        depths: npt.NDArray[np.int64],
        scores: npt.NDArray[np.float64],
        ranks: npt.NDArray[np.int64],
    ) -> DraftTree:
        """Wrap arrays that form a valid tree by construction, without copies or checks (the
        builders' output; property tests check it). The arrays are marked read-only."""
        self = object.__new__(cls)
        for name, value in (
            ("parents", parents),
            ("tokens", tokens),
            ("depths", depths),
            ("scores", scores),
            ("ranks", ranks),
        ):
            if value.flags.writeable and value.flags.owndata:
                value.flags.writeable = False
            object.__setattr__(self, name, value)
        return self

    @public(error=BudgetError)
    def prefix(self, n: int) -> DraftTree:
        """The first n nodes: for a best-first tree, the optimal tree T_n."""
        if not 1 <= n <= self.size:
            raise BudgetError(f"prefix size must be in [1, {self.size}]; got {n}")
        return DraftTree.trusted(
            self.parents[:n], self.tokens[:n], self.depths[:n], self.scores[:n], self.ranks[:n]
        )

    @public
    def with_root_token(self, token: int) -> DraftTree:
        if self.tokens[0] == token:
            return self
        tokens = self.tokens.copy()
        tokens[0] = token
        return DraftTree.trusted(self.parents, tokens, self.depths, self.scores, self.ranks)

    @public
    def children(self, node: int) -> npt.NDArray[np.int64]:
        return np.flatnonzero(self.parents == node)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DraftTree):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("parents", "tokens", "depths", "scores", "ranks")
        )

    __hash__ = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------------------------


def _check_budget(budget: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise BudgetError(f"budget must be an integer ≥ 1; got {budget!r}")
    if budget < 1:
        raise BudgetError(f"budget must be ≥ 1 (the root counts); got {budget}")
    # a budget beyond MAX_TREE_SIZE is cut here (Python ints may be any size); the builder cuts
    # it to what the lattice can give and refuses it only if that is still too many
    return min(int(budget), MAX_TREE_SIZE + 1)


def tree_from_arrays(
    arrays: TreeArrays, marginals: DraftMarginals, root_token: int = -1
) -> DraftTree:
    """Wrap a builder's (parents, depths, ranks, scores) arrays as a DraftTree with tokens.

    Guarded in the body, not by ``@public`` (it runs once per request per decode step): anything
    but a builder's arrays for these marginals is a :class:`MarginalsError`."""
    if not isinstance(marginals, DraftMarginals):
        raise MarginalsError(f"marginals must be a DraftMarginals; got {marginals!r:.80}")
    try:
        parents, depths, ranks, scores = arrays
        tokens = np.empty_like(ranks)
        tokens[0] = root_token
        tokens[1:] = marginals.token_ids[depths[1:] - 1, ranks[1:]]
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise MarginalsError(
            f"arrays must be a builder's (parents, depths, ranks, scores) for these marginals "
            f"and root_token an int: {exc}"
        ) from None
    return DraftTree.trusted(parents, tokens, depths, scores, ranks)


@public(own=("budget",))
def best_first_tree(marginals: DraftMarginals, budget: int, root_token: int = -1) -> DraftTree:
    """The optimal prefix-closed tree of size ``budget`` under Â, in best-first order.

    Its size is ``budget`` unless the lattice has fewer nodes with ρ > 0. Ties are broken by
    (depth, parent's position, rank), which keeps every prefix prefix-closed.
    """
    n = _check_budget(budget)
    return tree_from_arrays(best_first(marginals.probs, n), marginals, root_token)


@public(own=("budgets",), lengths=("batch", "root_tokens"))
def best_first_trees(
    batch: Sequence[DraftMarginals],
    budgets: int | Sequence[int],
    root_tokens: Sequence[int] | None = None,
) -> list[DraftTree]:
    """Best-first trees for the requests of one serving step, built in one compiled call.

    All marginals must share one shape [depth, K]; the result equals calling
    :func:`best_first_tree` on each.
    """
    if isinstance(batch, DraftMarginals) or not isinstance(batch, Sequence):
        raise MarginalsError(
            "batch must be a sequence of DraftMarginals (one per request); got "
            f"{type(batch).__name__}"
        )
    if not all(isinstance(m, DraftMarginals) for m in batch):
        raise MarginalsError("every item of batch must be a DraftMarginals")
    if len(batch) == 0:
        return []
    shapes = {m.probs.shape for m in batch}
    if len(shapes) != 1:
        raise MarginalsError(f"a batch needs one marginals shape; got {sorted(shapes)}")
    if isinstance(budgets, (int, np.integer)):
        nb = [_check_budget(budgets)] * len(batch)
    elif isinstance(budgets, (Sequence, np.ndarray)) and not isinstance(budgets, (str, bytes)):
        nb = [_check_budget(x) for x in budgets]
    else:
        raise BudgetError(f"budgets must be an integer or one per request; got {budgets!r}")
    if len(nb) != len(batch):
        raise BudgetError(f"{len(nb)} budgets for {len(batch)} requests")
    roots = [-1] * len(batch) if root_tokens is None else list(root_tokens)
    probs = np.stack([m.probs for m in batch])
    arrays = best_first_many(probs, np.array(nb))
    return [tree_from_arrays(a, m, r) for a, m, r in zip(arrays, batch, roots, strict=True)]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@public
def surrogate_acceptance(tree: DraftTree) -> float:
    """Â(T) = Σ ρ(i) over all nodes, root included: the surrogate of τ (Prop. 3.2)."""
    return float(tree.scores.sum())


MAX_MASK_ELEMENTS = 1 << 28
"""The largest dense mask :func:`attention_mask` builds (N × (past_len + N) elements, 1 GiB as
float32): a larger one would exhaust the host's memory before it could be used."""


@public
def ancestor_matrix(tree: DraftTree) -> npt.NDArray[np.bool_]:
    """visible[i, j] is True iff node j is node i or one of its ancestors ([N, N])."""
    n = tree.size
    if n > 1 and np.array_equal(tree.parents[1:], np.arange(n - 1)):
        return np.tri(n, dtype=bool)  # a chain (the chain policy's, or a decision's): causal
    vis = np.eye(n, dtype=bool)
    order = np.argsort(tree.depths, kind="stable")
    bounds = np.searchsorted(tree.depths[order], np.arange(1, tree.max_depth + 2))
    for a, b in itertools.pairwise(bounds):
        nodes = order[a:b]
        vis[nodes] |= vis[tree.parents[nodes]]
    return vis


@public
def attention_mask(tree: DraftTree, past_len: int, dtype: Any = np.float32) -> npt.NDArray[Any]:
    """The additive tree mask [N, past_len + N]: 0 where visible, the dtype's minimum elsewhere.

    Every node sees the whole prefix and itself and its ancestors within the tree.
    """
    if past_len < 0:
        raise BudgetError(f"past_len must be ≥ 0; got {past_len}")
    try:
        resolved = np.dtype(dtype)  # None reads as float64, as numpy's own functions do
    except (TypeError, ValueError):
        resolved = None
    if resolved is None or resolved.kind != "f":
        raise ArgumentError(
            f"attention_mask: dtype must be a floating-point dtype (np.float32…); got {dtype!r:.80}"
        )
    if tree.size * (past_len + tree.size) > MAX_MASK_ELEMENTS:
        raise BudgetError(
            f"a mask of {tree.size} × {past_len + tree.size} elements is more than "
            f"MAX_MASK_ELEMENTS = {MAX_MASK_ELEMENTS}; give a shorter past_len"
        )
    vis = np.concatenate((np.ones((tree.size, past_len), bool), ancestor_matrix(tree)), axis=1)
    return np.where(vis, 0.0, np.finfo(resolved).min).astype(resolved)


@public
def position_ids(tree: DraftTree, context_len: int) -> npt.NDArray[np.int64]:
    """Rotary position of each node: the root sits at ``context_len`` and children one deeper."""
    return context_len + tree.depths


@public
def path_to(tree: DraftTree, node: int) -> list[int]:
    """Node indices from the root to ``node`` inclusive."""
    if not 0 <= node < tree.size:
        raise BudgetError(f"node must be in [0, {tree.size}); got {node}")
    path = [node]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


@public
def to_networkx(tree: DraftTree) -> nx.DiGraph:
    """A DiGraph with an edge parent → child and node attributes token, depth, score, rank."""
    import networkx as nx

    g = nx.DiGraph()
    for i in range(tree.size):
        g.add_node(
            i,
            token=int(tree.tokens[i]),
            depth=int(tree.depths[i]),
            score=float(tree.scores[i]),
            rank=int(tree.ranks[i]),
        )
        if i:
            g.add_edge(int(tree.parents[i]), i)
    return g
