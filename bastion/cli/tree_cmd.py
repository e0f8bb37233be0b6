"""``bastion tree``: show a best-first tree and the controller's choice for sample marginals.

The marginals are synthetic (seeded): top-1 confidence decaying with depth, the rest of the
mass spread over the other candidates, as a block-diffusion drafter's marginals look. The cost
curve is a linear stand-in Ĉ(N) = T_fixed + N·t_node whose two numbers are flags, so the demo
runs without any hardware profile; the simulator and the real backend use calibrated models.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from bastion.budget import choose_tree
from bastion.cli import _checks as checks
from bastion.errors import BudgetError
from bastion.interfaces import CostCurve
from bastion.tree import DraftMarginals, DraftTree, best_first_tree, surrogate_acceptance


def sample_marginals(
    rng: np.random.Generator, depth: int, k: int, top1: float = 0.9, decay: float = 0.96
) -> DraftMarginals:
    """Synthetic drafter marginals: top-1 mass ``top1·decay^d`` at position d, the rest
    spread over K−1 runners-up with a Dirichlet draw, rows sorted descending."""
    if depth < 1 or k < 1:
        raise BudgetError(f"depth and k must be ≥ 1; got {depth}, {k}")
    rows = []
    for d in range(depth):
        head = top1 * decay**d
        tail = (1.0 - head) * rng.dirichlet(np.full(k, 0.5))[: k - 1] if k > 1 else np.empty(0)
        rows.append(np.concatenate(([head], -np.sort(-tail))))
    probs = np.array(rows)
    order = np.argsort(-probs, axis=1, kind="stable")
    ids = np.stack([rng.permutation(50_000)[:k] for _ in range(depth)])
    return DraftMarginals(ids, np.take_along_axis(probs, order, axis=1))


def render(tree: DraftTree, limit: int) -> list[str]:
    """An indented text drawing of the first ``limit`` nodes, in depth-first order."""
    n = min(limit, tree.size)
    kids: dict[int, list[int]] = {i: [] for i in range(n)}
    for i in range(1, n):
        kids[int(tree.parents[i])].append(i)
    lines: list[str] = []
    stack = [(0, "")] if n else []  # depth first, iteratively (a deep chain has no recursion limit)
    while stack:
        node, indent = stack.pop()
        tok = "root" if node == 0 else f"tok {tree.tokens[node]:>5}"
        lines.append(f"{indent}[{node:>3}] {tok}  ρ={tree.scores[node]:.4f}")
        stack.extend((child, indent + "  ") for child in reversed(kids[node]))
    if tree.size > n:
        lines.append(f"… {tree.size - n} more nodes")
    return lines


#: Largest --depth and --k of the sample marginals (a drafter block is 16 positions; the
#: ids are drawn from a 50 000-token vocabulary).
MAX_DEPTH, MAX_K = 1024, 4096


def _check(args: argparse.Namespace) -> None:
    """Every flag in range before anything is drawn or allocated."""
    from bastion.bestfirst import MAX_TREE_SIZE

    checks.seed(args.seed)
    checks.int_in("--depth", args.depth, 1, MAX_DEPTH)
    checks.int_in("--k", args.k, 1, MAX_K)
    checks.int_in("--budget", args.budget, 1, MAX_TREE_SIZE)
    checks.int_in("--show", args.show, 0)
    checks.int_in("--n-max", args.n_max, 1, MAX_TREE_SIZE)
    checks.float_in("--top1", args.top1, 0.0, 1.0, open_low=True)
    checks.float_in("--decay", args.decay, 0.0, 1.0, open_low=True)
    checks.float_in("--fixed-ms", args.fixed_ms, 0.0, 1e6, open_low=True)
    checks.float_in("--node-us", args.node_us, 0.0, 1e9)


def run(args: argparse.Namespace) -> int:
    _check(args)
    rng = np.random.default_rng(args.seed)
    m = sample_marginals(rng, args.depth, args.k, args.top1, args.decay)
    tree = best_first_tree(m, args.budget)
    n = np.arange(1, args.n_max + 1)
    fixed_s, node_s = args.fixed_ms * 1e-3, args.node_us * 1e-6
    if fixed_s <= 0 or node_s < 0:
        raise BudgetError("--fixed-ms must be > 0 and --node-us ≥ 0")
    curve = CostCurve(draft_s=0.0, prep_s=0.0, verify_s=fixed_s + node_s * n, ar_step_s=fixed_s)
    chosen, diag = choose_tree(m, curve, args.n_max)
    if args.json:
        print(
            json.dumps(
                {
                    "budget": args.budget,
                    "tree": {
                        "parents": tree.parents.tolist(),
                        "tokens": tree.tokens.tolist(),
                        "depths": tree.depths.tolist(),
                        "scores": tree.scores.tolist(),
                    },
                    "a_hat": surrogate_acceptance(tree),
                    "controller": {
                        "tree_size": chosen.size,
                        "mode": diag.mode,
                        "a_hat": float(diag.a_hat[chosen.size - 1]),
                        "predicted_speedup": diag.predicted_speedup,
                    },
                },
                indent=2,
            )
        )
        return 0
    print(f"Best-first tree, budget N = {args.budget} (depth {args.depth}, K = {args.k}):")
    print("\n".join(render(tree, args.show)))
    print(f"Â(T_{tree.size}) = {surrogate_acceptance(tree):.3f} expected tokens per step\n")
    print(
        f"Controller with Ĉ(N) = {args.fixed_ms:g} ms + N·{args.node_us:g} µs "
        f"(N_max = {args.n_max}, {diag.mode}):"
    )
    print(f"{'N':>6} {'Â(N)':>8} {'Ĉ(N) ms':>9} {'Ŝ(N)':>7}")
    marks = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, chosen.size})
    for size in (x for x in marks if x <= diag.s_hat.size):
        star = "  ← chosen" if size == chosen.size else ""
        a, c, s = diag.a_hat[size - 1], diag.c_hat[size - 1] * 1e3, diag.s_hat[size - 1]
        print(f"{size:>6} {a:>8.3f} {c:>9.3f} {s:>7.3f}{star}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tree",
        help="print a best-first tree and the controller's choice for sample marginals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sample marginals")
    p.add_argument("--depth", type=int, default=15, help="draft positions (γ)")
    p.add_argument("--k", type=int, default=8, help="candidates per position")
    p.add_argument("--top1", type=float, default=0.9, help="top-1 probability at position 1")
    p.add_argument("--decay", type=float, default=0.96, help="top-1 decay per position")
    p.add_argument("--budget", type=int, default=24, help="size of the printed fixed tree")
    p.add_argument("--show", type=int, default=40, help="nodes to draw")
    p.add_argument("--n-max", type=int, default=1024, help="controller cap N_max")
    p.add_argument("--fixed-ms", type=float, default=10.0, help="stand-in cost: fixed part")
    p.add_argument("--node-us", type=float, default=20.0, help="stand-in cost: per tree node")
    p.add_argument("--json", action="store_true", help="print one JSON record")
    p.set_defaults(func=run)
