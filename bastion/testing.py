"""Property-test your own policy or controller: Hypothesis strategies and exact oracles.

Strategies (need ``hypothesis``; ``pip install bastion[testing]``):

- :func:`marginals` — drafter marginals [depth, K], rows sorted descending, often with exact
  ties and zeros (tie-breaking is where best-first implementations usually go wrong);
- :func:`batches` — a step's worth of marginals (one per request);
- :func:`convex_costs`, :func:`monotone_costs` — Ĉ(N) arrays, convex or with steps;
- :func:`cost_curves` — :class:`~bastion.interfaces.CostCurve` objects built from them.

Oracles (exact, brute force; small inputs only — they refuse lattices over ``MAX_ORACLE_NODES``):

- :func:`optimal_acceptance` — max Â over every prefix-closed tree of each size N, by a
  tree-knapsack (max-plus) dynamic programme;
- :func:`optimal_acceptance_enumerated` — the same by enumerating every prefix-closed tree
  (tiny lattices; an independent check of the DP);
- :func:`best_joint_acceptance` — max Σ Âᵢ(Nᵢ) over every allocation of a total M across a
  batch (the joint budget's optimum);
- :func:`best_joint_speedup` — max Σ Âᵢ · L_AR / Ĉ(ΣNᵢ − B) over every allocation;
- :func:`check_tree` — a tree is prefix-closed, drawn from the marginals, and scored right.

Example — a policy is optimal if its tree's Â equals the oracle at every size::

    from hypothesis import given
    from bastion.testing import marginals, optimal_acceptance, check_tree

    @given(marginals(max_depth=4, max_k=3))
    def test_my_policy_is_optimal(m):
        tree = my_policy.choose(m, context).tree
        check_tree(tree, m)
        assert tree.scores.sum() >= optimal_acceptance(m)[tree.size] - 1e-12

What this module does not do: run anything on import beyond defining the strategies; time
anything.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from bastion.errors import BudgetError, MarginalsError
from bastion.guard import array, integer, number, public
from bastion.interfaces import CostCurve
from bastion.tree import DraftMarginals, DraftTree

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised only without hypothesis
    raise ImportError(
        "bastion.testing needs hypothesis: pip install 'bastion[testing]' (or hypothesis)"
    ) from exc

__all__ = [
    "MAX_ORACLE_NODES",
    "batches",
    "best_joint_acceptance",
    "best_joint_speedup",
    "check_tree",
    "convex_costs",
    "cost_curves",
    "lattice",
    "marginals",
    "monotone_costs",
    "optimal_acceptance",
    "optimal_acceptance_enumerated",
    "prob_rows",
]

Array = npt.NDArray[np.float64]
Node = tuple[int, ...]  # a lattice node: the candidate rank taken at each depth

MAX_ORACLE_NODES = 20_000  # the DP's lattice cap; enumeration is capped far lower (below)
_MAX_ENUMERATED_NODES = 40


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------


@st.composite
def prob_rows(draw: st.DrawFn, depth: int, k: int, tied: bool) -> Array:
    """[depth, k] sub-stochastic rows sorted descending (the top-k of a full distribution)."""
    raw = np.array(
        draw(
            st.lists(
                st.lists(st.floats(0.0, 1.0), min_size=k + 1, max_size=k + 1),
                min_size=depth,
                max_size=depth,
            )
        )
    )
    raw = raw + 1e-3  # keep every row's total mass positive
    rows = raw / raw.sum(axis=1, keepdims=True)  # the last column is the mass outside the top-k
    p = -np.sort(-rows[:, :k], axis=1)
    if tied:
        p = np.floor(p * 8.0) / 8.0  # a coarse grid: many exact ties, some zeros
        p = -np.sort(-p, axis=1)
    return p


@st.composite
def marginals(
    draw: st.DrawFn, max_depth: int = 6, max_k: int = 5, min_depth: int = 1, min_k: int = 1
) -> DraftMarginals:
    """Drafter marginals with depth in [min_depth, max_depth] and K in [min_k, max_k]."""
    depth = draw(st.integers(min_depth, max_depth))
    k = draw(st.integers(min_k, max_k))
    tied = draw(st.booleans())
    p = draw(prob_rows(depth, k, tied))
    seed = draw(st.integers(0, 2**32 - 1))
    vocab = np.random.default_rng(seed).permuted(np.tile(np.arange(4 * k), (depth, 1)), axis=1)
    return DraftMarginals(vocab[:, :k], p)


@public
def batches(
    max_requests: int = 3, max_depth: int = 3, max_k: int = 3
) -> st.SearchStrategy[list[DraftMarginals]]:
    """A step's marginals: 1 … ``max_requests`` requests (small enough for the joint oracles)."""
    return st.lists(marginals(max_depth=max_depth, max_k=max_k), min_size=1, max_size=max_requests)


@st.composite
def convex_costs(draw: st.DrawFn, n_max: int) -> Array:
    """A positive, non-decreasing, convex Ĉ(N) for N = 1 … n_max (a sum of convex pieces)."""
    n = np.arange(1, n_max + 1, dtype=np.float64)
    c0 = draw(st.floats(1e-3, 1.0))
    lin = draw(st.floats(0.0, 1e-2))
    quad = draw(st.floats(0.0, 1e-4))
    knee = draw(st.integers(1, n_max))
    slope = draw(st.floats(0.0, 5e-2))
    return c0 + lin * n + quad * n**2 + slope * np.maximum(0.0, n - knee)


@st.composite
def monotone_costs(draw: st.DrawFn, n: int) -> Array:
    """Positive non-decreasing costs, convex or not: random increments with a few large steps
    (tile and wave cliffs)."""
    steps = np.array(draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n)))
    jumps = draw(st.lists(st.integers(0, n - 1), max_size=4))
    steps[np.array(jumps, dtype=int)] += draw(st.floats(0.0, 2.0))
    return draw(st.floats(0.1, 2.0)) + np.cumsum(steps)


@st.composite
def cost_curves(draw: st.DrawFn, n_max: int, convex: bool | None = None) -> CostCurve:
    """A :class:`CostCurve` for N = 1 … n_max: draft and host times, Ĉ_verify and L_AR.
    ``convex``: True → convex verify costs, False → with steps, None → either."""
    if convex is None:
        convex = draw(st.booleans())
    verify = draw(convex_costs(n_max) if convex else monotone_costs(n_max))
    draft = draw(st.floats(0.0, 0.5))
    aux = draw(st.floats(0.0, 0.1))
    ar = draw(st.floats(0.05, 2.0))
    return CostCurve(draft, aux, verify, ar)


# --------------------------------------------------------------------------------------------
# Oracles
# --------------------------------------------------------------------------------------------


def _lattice_size(m: DraftMarginals) -> int:
    return int(sum(m.k**d for d in range(m.depth + 1)))


@public
def lattice(
    m: DraftMarginals, limit: int = MAX_ORACLE_NODES
) -> tuple[list[Node], dict[Node, float]]:
    """Every node of the top-K lattice (root first, by depth) with its score ρ (the product of
    the marginals along its path)."""
    size = _lattice_size(m)
    if size > limit:
        raise BudgetError(
            f"the oracle's lattice has {size} nodes (depth {m.depth}, K {m.k}); at most {limit} "
            "are enumerated — use smaller marginals"
        )
    nodes: list[Node] = [()]
    score: dict[Node, float] = {(): 1.0}
    frontier: list[Node] = [()]
    for d in range(m.depth):
        nxt = []
        for node in frontier:
            for r in range(m.k):
                child = (*node, r)
                score[child] = score[node] * float(m.probs[d, r])
                nxt.append(child)
        nodes.extend(nxt)
        frontier = nxt
    return nodes, score


@public
def optimal_acceptance(m: DraftMarginals) -> Array:
    """``best[N]`` = max Â over every prefix-closed tree of N nodes (root included), for
    N = 0 … the lattice size (``best[0] = -inf``), by an exact tree-knapsack DP."""
    nodes, score = lattice(m)
    best: dict[Node, Array] = {}
    for v in sorted(nodes, key=len, reverse=True):
        acc = np.array([-np.inf, score[v]])  # acc[n] = best Â of a size-n subtree rooted at v
        if len(v) < m.depth:
            for r in range(m.k):
                child = np.concatenate(([0.0], best.pop((*v, r))[1:]))  # a child may be absent
                out = np.full(acc.size + child.size - 1, -np.inf)
                sums = acc[:, None] + child[None, :]
                for i in range(acc.size):
                    out[i : i + child.size] = np.maximum(out[i : i + child.size], sums[i])
                acc = out
        best[v] = acc
    return best[()]


@public
def optimal_acceptance_enumerated(m: DraftMarginals) -> dict[int, float]:
    """max Â per size over *every* prefix-closed tree, by enumeration (lattices of at most 40
    nodes): an oracle independent of the DP's recursion."""
    nodes, score = lattice(m, _MAX_ENUMERATED_NODES)
    children: dict[Node, list[Node]] = {n: [] for n in nodes}
    for n in nodes:
        if n:
            children[n[:-1]].append(n)

    def subtrees(v: Node) -> list[frozenset[Node]]:
        options = [[frozenset(), *subtrees(c)] for c in children[v]]
        return [frozenset({v}).union(*combo) for combo in itertools.product(*options)]

    best: dict[int, float] = {}
    for tree in subtrees(()):
        a = sum(score[n] for n in tree)
        best[len(tree)] = max(best.get(len(tree), -1.0), a)
    return best


def _allocation_table(
    batch: Sequence[DraftMarginals], n_max: int | None
) -> tuple[Array, npt.NDArray[np.int64]]:
    if not batch:
        raise MarginalsError("a batch needs at least one request's marginals")
    a_hat = []
    for m in batch:
        best = optimal_acceptance(m)[1:]
        a_hat.append(best[: n_max or best.size])
    total = int(np.prod([a.size for a in a_hat]))
    if total > 2_000_000:
        raise BudgetError(f"{total} allocations to enumerate; use fewer or smaller requests")
    grids = np.meshgrid(*a_hat, indexing="ij")
    sizes = np.meshgrid(*[np.arange(1, a.size + 1) for a in a_hat], indexing="ij")
    return np.sum([g.ravel() for g in grids], axis=0), np.sum([s.ravel() for s in sizes], axis=0)


@public(n_max=integer(lo=1))
def best_joint_acceptance(batch: Sequence[DraftMarginals], n_max: int | None = None) -> Array:
    """max Σᵢ Âᵢ(Nᵢ) over every allocation with Σ Nᵢ = M (each Nᵢ ≤ ``n_max``), for
    M = B, B + 1, … (entry M − B): what a joint budget of M nodes can at best achieve."""
    if not batch:
        raise MarginalsError("a batch needs at least one request's marginals")
    totals, ms = _allocation_table(batch, n_max)
    best = np.full(int(ms.max()) + 1, -np.inf)
    np.maximum.at(best, ms, totals)
    return best[len(batch) :]


@public(
    verify_s=array(1, nonempty=True, positive=True),
    n_max=integer(lo=1),
    ar_step_s=number(positive=True),
)
def best_joint_speedup(
    batch: Sequence[DraftMarginals], verify_s: npt.ArrayLike, n_max: int, ar_step_s: float = 1.0
) -> float:
    """max over every allocation (Nᵢ ≤ n_max) of Σ Âᵢ · L_AR / Ĉ(M), where ``verify_s[M − B]``
    is the step's cost when the trees have M nodes in all (a cost of the total alone)."""
    costs = np.asarray(verify_s, dtype=np.float64)
    totals, ms = _allocation_table(batch, n_max)
    if costs.size < int(ms.max()) - len(batch) + 1:
        raise BudgetError(
            f"verify_s has {costs.size} entries; the allocations reach M − B = "
            f"{int(ms.max()) - len(batch)}"
        )
    return float(np.max(totals * ar_step_s / costs[ms - len(batch)]))


@public(rtol=number(lo=0.0))
def check_tree(tree: DraftTree, m: DraftMarginals, rtol: float = 1e-12) -> None:
    """Raise ``AssertionError`` unless ``tree`` is a valid draft tree for ``m``: parents precede
    children, depths and ranks are in range, no two siblings share a rank, every token is the
    marginals' candidate at its depth and rank, and every score is ρ (the product of the
    marginals along the path)."""
    n = tree.size
    assert n >= 1 and tree.parents[0] == -1 and tree.depths[0] == 0, "the root comes first"
    assert tree.scores[0] == 1.0, f"the root's score is ρ = 1, not {tree.scores[0]}"
    idx = np.arange(1, n)
    par = tree.parents[1:]
    assert np.all((par >= 0) & (par < idx)), "every parent precedes its child"
    assert np.all(tree.depths[1:] == tree.depths[par] + 1), "depth = parent's depth + 1"
    assert np.all(tree.depths <= m.depth), f"depths reach {tree.depths.max()} > {m.depth}"
    ranks = tree.ranks[1:]
    assert np.all((ranks >= 0) & (ranks < m.k)), "ranks lie in 0 … K − 1"
    pairs = set(zip(par.tolist(), ranks.tolist(), strict=True))
    assert len(pairs) == n - 1, "two siblings take the same candidate"
    d = tree.depths[1:] - 1
    assert np.array_equal(tree.tokens[1:], m.token_ids[d, ranks]), "tokens are the candidates"
    rho = tree.scores[par] * m.probs[d, ranks]
    np.testing.assert_allclose(tree.scores[1:], rho, rtol=float(rtol), err_msg="scores are ρ")
