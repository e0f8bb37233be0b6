"""Tree policies: how a step's drafter marginals become the tree the target verifies.

Every policy satisfies :class:`bastion.interfaces.TreePolicy` and returns prefix-closed trees in
an order where parents precede children.

- ``ar``               the root alone (N = 1): target-only autoregressive decoding, the baseline.
- ``chain``            the single top-1 path (DFlash's greedy block).
- ``beam(w, d)``       beam search: the w best extensions per depth, a w×d rectangle (§4.3).
- ``fixed(N)``         best-first at a fixed size N (Bastion-Fixed, DDTree).
- ``eagle(k, d, N)``   EAGLE-2/3 style: d rounds expanding the k best frontier nodes by their
                       top-k children, then a global rerank of all candidates by ρ, keeping N.
- ``bastion``          the learning controller (:mod:`bastion.controller`): AR, the chain or a
                       best-first tree, whichever the measured cycles and the observed
                       acceptance favour; at batch > 1 one joint budget for the whole step.
- ``bastion:paper``    the paper's controller: best-first with N chosen per step from a static
                       calibrated roofline (:mod:`bastion.budget`); at batch > 1 one joint
                       budget for the whole step (:mod:`bastion.joint`).
- ``bastion:per-request``  the paper's controller run for each request alone (the paper's rule).

Every policy has the single-request ``choose``; ``ar``, ``chain``, ``fixed``, ``beam``, ``eagle``
and ``bastion`` also choose a whole step's trees at once (``choose_batch``, vectorised or
compiled over the batch); the engine adapts the others. Policies declare what they need by
attributes, never by class: ``uses_drafter`` (False: never drafted for), ``uses_cost_model``
(True: needs a cost model and the batched load), ``uses_topk`` (False: only the drafter's top-1
is needed, so the host skips the top-K normalisation and the tree mask).

:func:`make_policy` parses the short spec strings the CLI uses (``fixed:64``, ``beam:4x15``,
``eagle:10,7,60``, ``bastion``, ``chain``) and loads a researcher's own policy by import path
(``package.module:Name[:ARGS]``, ``file.py:Name``) or by a name registered under the entry-point
group ``bastion.policies`` (:mod:`bastion.plugins`).

What this module does not do: price trees or draft; policies are pure functions of their input.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, TreeBatch, chain_batch
from bastion.bestfirst import MAX_TREE_SIZE, best_first_flat
from bastion.budget import ControllerMode, choose_tree
from bastion.engine import PerRequestPolicy
from bastion.errors import BudgetError, ConfigError, UnknownNameError
from bastion.fastinit import trusted_init
from bastion.guard import public
from bastion.interfaces import (
    BatchChoice,
    BatchPolicyContext,
    BatchTreePolicy,
    PolicyContext,
    TreeChoice,
    TreePolicy,
)
from bastion.per_request import choose_per_request, first_budget, joint_first_budget
from bastion.shaped import beam_batch, eagle_batch
from bastion.tree import DraftMarginals, DraftTree, best_first_tree

__all__ = [
    "AdaptivePolicy",
    "AutoregressivePolicy",
    "BeamPolicy",
    "ChainPolicy",
    "EaglePolicy",
    "FixedPolicy",
    "make_policy",
    "policy_labels",
]


@functools.cache
def _root_only() -> DraftTree:
    return DraftTree([-1], [-1], [0], [1.0], [-1])


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BudgetError(f"{name} must be an integer ≥ 1; got {value!r}")
    return int(value)


def _tree_from_nodes(
    marginals: DraftMarginals,
    parents: list[int],
    depths: list[int],
    ranks: list[int],
    scores: list[float],
    root_token: int = -1,
) -> DraftTree:
    """Build a DraftTree from lists whose entry 0 is the root."""
    d = np.asarray(depths, dtype=np.int64)
    r = np.asarray(ranks, dtype=np.int64)
    tokens = np.empty_like(r)
    tokens[0] = root_token
    tokens[1:] = marginals.token_ids[d[1:] - 1, r[1:]]
    return DraftTree(parents, tokens, d, scores, r)


def _sorted_by_key(
    parents: npt.NDArray[np.int64],
    depths: npt.NDArray[np.int64],
    ranks: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    keep: int,
) -> tuple[list[int], list[int], list[int], list[float]]:
    """Re-order a parent-closed node set (root at 0) by the best-first key, keeping ``keep``.

    Key: (−ρ, depth, parent's new position, rank) — the order of :mod:`bastion.bestfirst`, so
    every prefix is prefix-closed. Processing depth by depth makes the parent position known.
    """
    n = parents.size
    new_pos = np.full(n, -1, dtype=np.int64)
    new_pos[0] = 0
    order_levels = []
    for d in range(1, int(depths.max(initial=0)) + 1):
        idx = np.flatnonzero(depths == d)
        keys = np.lexsort((ranks[idx], new_pos[parents[idx]], -scores[idx]))
        idx = idx[keys]
        new_pos[idx] = np.arange(idx.size)  # provisional within-level rank, used as parent key
        order_levels.append(idx)
    if not order_levels:
        return [-1], [0], [-1], [1.0]
    level_of = np.concatenate(order_levels)
    within = np.concatenate([np.arange(x.size) for x in order_levels])
    final = level_of[np.lexsort((within, depths[level_of], -scores[level_of]))][: keep - 1]
    pos = np.full(n, -1, dtype=np.int64)
    pos[0] = 0
    pos[final] = np.arange(1, final.size + 1)
    if np.any(pos[parents[final]] < 0):  # pragma: no cover - guarded by the key order
        raise BudgetError("internal error: rerank dropped a parent")
    return (
        [-1, *pos[parents[final]].tolist()],
        [0, *depths[final].tolist()],
        [-1, *ranks[final].tolist()],
        [1.0, *scores[final].tolist()],
    )


@dataclass(frozen=True)
class AutoregressivePolicy:
    """The root alone (N = 1): the target verifies only the bonus token and emits one token per
    step. Target-only autoregressive decoding through the same engine loop (the baseline);
    the engine skips the drafter for it."""

    uses_drafter = False

    @property
    def name(self) -> str:
        return "ar"

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        return TreeChoice(_root_only())

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        return BatchChoice(TreeBatch.roots(context.requests.size))


@dataclass(frozen=True)
class ChainPolicy:
    """The top-1 token at each position: DFlash's single path (``depth`` positions at most)."""

    depth: int | None = None
    uses_topk = False

    def __post_init__(self) -> None:
        if self.depth is not None:
            _positive_int("depth", self.depth)

    @property
    def name(self) -> str:
        return "chain" if self.depth is None else f"chain:{self.depth}"

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        d = marginals.depth if self.depth is None else min(self.depth, marginals.depth)
        p = marginals.probs[:d, 0]
        nonzero = int(np.argmin(p > 0.0)) if np.any(p <= 0.0) else d  # stop at a zero marginal
        scores = np.concatenate(([1.0], np.cumprod(p[:nonzero])))
        n = scores.size
        tree = _tree_from_nodes(
            marginals,
            list(range(-1, n - 1)),
            list(range(n)),
            [-1] + [0] * (n - 1),
            scores.tolist(),
        )
        return TreeChoice(tree)

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        """Every request's top-1 path at once (each stops at its first zero marginal)."""
        return BatchChoice(chain_batch(marginals, self.depth))


@dataclass(frozen=True)
class FixedPolicy:
    """Best-first at a fixed tree size N (Bastion-Fixed; DDTree's construction)."""

    tree_size: int

    def __post_init__(self) -> None:
        _positive_int("tree_size", self.tree_size)
        if self.tree_size > MAX_TREE_SIZE:  # a 20-digit fixed:N is refused here, not mid-run
            raise BudgetError(
                f"tree_size must be in 1 … MAX_TREE_SIZE = {MAX_TREE_SIZE}; got {self.tree_size}"
            )

    @property
    def name(self) -> str:
        return f"fixed:{self.tree_size}"

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        return TreeChoice(best_first_tree(marginals, self.tree_size))

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        """Every request's best-first tree in one compiled call."""
        return BatchChoice(best_first_batch(marginals, self.tree_size))


@dataclass(frozen=True)
class BeamPolicy:
    """Beam search: keep the ``width`` best extensions by ρ at each of ``depth`` positions.

    The tree is the w×d rectangle of §4.3 (size 1 + w·d when the lattice allows it).
    """

    width: int
    depth: int
    # its own tree builder (not best-first): a measured truth prices its host work apart
    tree_builder: ClassVar[str] = "beam"

    def __post_init__(self) -> None:
        _positive_int("width", self.width)
        _positive_int("depth", self.depth)

    @property
    def name(self) -> str:
        return f"beam:{self.width}x{self.depth}"

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        parents, depths, ranks, scores = [-1], [0], [-1], [1.0]
        beam = np.array([0])  # node indices of the current beam
        beam_scores = np.array([1.0])
        for d in range(min(self.depth, marginals.depth)):
            p = marginals.probs[d]
            cand = (beam_scores[:, None] * p[None, :]).ravel()  # (beam index, rank) order
            order = np.argsort(-cand, kind="stable")[: self.width]
            order = order[cand[order] > 0.0]
            if order.size == 0:
                break
            start = len(parents)
            parents.extend(beam[order // p.size].tolist())
            ranks.extend((order % p.size).tolist())
            depths.extend([d + 1] * order.size)
            scores.extend(cand[order].tolist())
            beam = np.arange(start, start + order.size)
            beam_scores = cand[order]
        return TreeChoice(_tree_from_nodes(marginals, parents, depths, ranks, scores))

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        """Every request's tree in one compiled call (:mod:`bastion.shaped`; the same trees
        as :meth:`choose`, which builds them one by one without the kernel)."""
        trees = beam_batch(marginals, self.width, self.depth)
        if trees is None:
            return PerRequestPolicy(self).choose_batch(marginals, context)
        return BatchChoice(trees)


@dataclass(frozen=True)
class EaglePolicy:
    """EAGLE-2/3 style dynamic tree: frontier expansion, then a global rerank by ρ.

    Round 1 takes the root's ``top_k`` children; each later round expands the ``top_k`` best
    nodes of the previous round by their ``top_k`` children (``depth`` rounds in all). All
    generated nodes are then reranked by ρ and the best ``total − 1`` kept with the root, so
    the tree has at most ``total`` nodes. With block-diffusion marginals a node's children are
    the top-k tokens of the next position, whatever the path.
    """

    top_k: int = 10
    depth: int = 7
    total: int = 60
    tree_builder: ClassVar[str] = "eagle"  # its own builder, as BeamPolicy's

    def __post_init__(self) -> None:
        for field_name in ("top_k", "depth", "total"):
            _positive_int(field_name, getattr(self, field_name))

    @property
    def name(self) -> str:
        return f"eagle:{self.top_k},{self.depth},{self.total}"

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        k = min(self.top_k, marginals.k)
        parents, depths, ranks, scores = [-1], [0], [-1], [1.0]
        frontier = np.array([0])
        frontier_scores = np.array([1.0])
        for d in range(min(self.depth, marginals.depth)):
            p = marginals.probs[d, :k]
            cand = (frontier_scores[:, None] * p[None, :]).ravel()
            valid = np.flatnonzero(cand > 0.0)
            if valid.size == 0:
                break
            start = len(parents)
            parents.extend(frontier[valid // k].tolist())
            ranks.extend((valid % k).tolist())
            depths.extend([d + 1] * valid.size)
            scores.extend(cand[valid].tolist())
            best = np.argsort(-cand[valid], kind="stable")[:k]
            frontier = start + best
            frontier_scores = cand[valid][best]
        arrays = _sorted_by_key(
            np.asarray(parents),
            np.asarray(depths),
            np.asarray(ranks),
            np.asarray(scores),
            self.total,
        )
        return TreeChoice(_tree_from_nodes(marginals, *arrays))

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        """Every request's tree in one compiled call, as :meth:`BeamPolicy.choose_batch`."""
        trees = eagle_batch(marginals, self.top_k, self.depth, self.total)
        if trees is None:
            return PerRequestPolicy(self).choose_batch(marginals, context)
        return BatchChoice(trees)


@dataclass(frozen=True)
class AdaptivePolicy:
    """The paper's controller (``bastion:paper``): best-first with the tree size chosen each
    step by the budget controller from the cost model as it is (no learning, no AR or chain).

    At batch 1 the controller of :mod:`bastion.budget` picks N. At batch > 1, with ``joint``
    (the default) and a cost model that prices a batch as it grows (``joint_cost_curve``), one
    budget is chosen for the whole step (:mod:`bastion.joint`): the requests' best-first orders
    merged by ρ, stopped where the batch's Ŝ peaks. With ``joint=False`` (``bastion:per-request``)
    each request runs its own controller against the batched pass, as in the paper.
    """

    n_max: int = 1024
    mode: ControllerMode = "auto"
    initial_budget: int = 128
    joint: bool = True
    uses_cost_model = True

    def __post_init__(self) -> None:
        _positive_int("n_max", self.n_max)
        _positive_int("initial_budget", self.initial_budget)

    @property
    def name(self) -> str:
        return "bastion:paper" if self.joint else "bastion:per-request"

    def choose(self, marginals: DraftMarginals, context: PolicyContext) -> TreeChoice:
        if context.cost_model is None:
            raise BudgetError(f"the {self.name} policy needs a cost model in its PolicyContext")
        cost_model, load = context.cost_model, context.load
        start = self.initial_budget
        if context.previous_tree_size:  # begin near the last choice: fewer growth rounds
            start = int(first_budget(context.previous_tree_size))
        tree, diag = choose_tree(
            marginals,
            lambda n: cost_model.cost_curve(n, load),
            self.n_max,
            self.mode,
            start,
            base_tokens=context.load.co_batched_tokens,
        )
        return TreeChoice(tree, diag)

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        cost_model, req = context.cost_model, context.requests
        if cost_model is None:
            raise BudgetError(f"the {self.name} policy needs a cost model in its context")
        joint_curve = getattr(cost_model, "joint_cost_curve", None)
        if req.size == 1 or not self.joint or joint_curve is None:
            fast = choose_per_request(self, marginals, context) if req.size > 1 else None
            return fast or PerRequestPolicy(self).choose_batch(marginals, context)
        # begin near the last choices (per request): fewer growth rounds
        start = joint_first_budget(req.previous_tree_sizes, self.initial_budget)
        trees, diag = _joint_priced()(
            marginals,
            cost_model,  # it has joint_cost_curve (checked above)
            req.context_lens,
            self.n_max,
            self.mode,
            start,
        )
        return _batch_choice(trees, diag)


_batch_choice = trusted_init(BatchChoice)  # the joint controller's, every step


@functools.cache
def _joint_priced() -> Callable[..., tuple[TreeBatch, object]]:
    """bastion.joint.choose_joint_priced, imported when first asked (bastion.joint imports
    this module's neighbours; a per-step import statement costs more than a cached call)."""
    from bastion.joint import choose_joint_priced

    return choose_joint_priced


def best_first_batch(marginals: BatchMarginals, budget: int) -> TreeBatch:
    """Best-first trees of size ``budget`` for every request of a batch, in one compiled call
    (a budget beyond ``MAX_TREE_SIZE`` is cut, as by :func:`best_first_tree`)."""
    budget = min(budget, MAX_TREE_SIZE + 1)
    (parents, depths, ranks, scores), offsets = best_first_flat(marginals.probs, budget)
    request = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    tokens = marginals.token_ids[request, np.maximum(depths - 1, 0), np.maximum(ranks, 0)]
    tokens[offsets[:-1]] = -1
    return TreeBatch(offsets, parents, tokens, depths, scores, ranks)


_SPECS = (
    "ar, chain[:D], fixed:N, beam:WxD, eagle:K,D,N, bastion[:N_MAX][,every=K], "
    "bastion:paper[,N_MAX], "
    "bastion:per-request[,N_MAX]"
)


POLICY_GROUP = "bastion.policies"  # the entry-point group of short plug-in names
_BUILTINS = frozenset({"ar", "chain", "fixed", "beam", "eagle", "bastion", "adaptive"})


def is_policy(obj: object) -> bool:
    """Whether ``obj`` is a tree policy: a ``name`` and ``choose`` and/or ``choose_batch``."""
    if isinstance(obj, type):
        return False
    has_choose = callable(getattr(obj, "choose", None)) or callable(
        getattr(obj, "choose_batch", None)
    )
    return has_choose and isinstance(getattr(obj, "name", None), str)


def split_policy_specs(text: str) -> list[str]:
    """Split a comma-separated list of policy specs, keeping each spec's own comma-separated
    arguments with it: ``"chain,bastion:per-request,64,mod:P:8,k=2"`` →
    ``["chain", "bastion:per-request,64", "mod:P:8,k=2"]``. A piece starts a new spec when it is
    a built-in name or has a ``:`` after a name; numbers and ``key=value`` pieces continue the one
    before. (Repeat ``--policy`` to avoid any doubt.)"""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head, colon, _ = piece.partition(":")
        if "=" in head or piece in ("per-request", "paper"):
            starts = False  # key=value, or the per-request flag of bastion:…
        elif head in _BUILTINS or colon:
            starts = True
        else:  # a bare number continues; a bare name is a registered plug-in
            starts = not piece.replace(".", "", 1).lstrip("+-").isdigit()
        if starts or not specs:
            specs.append(piece)
        else:
            specs[-1] += "," + piece
    return specs


def policy_label(policy: object) -> str:
    """How a policy is recorded in results: a spec string as given; an object as
    ``"NAME [module:Class]"`` (its ``name`` and where its class lives)."""
    if isinstance(policy, str):
        return policy
    cls = type(policy)
    return f"{getattr(policy, 'name', '?')} [{cls.__module__}:{cls.__qualname__}]"


@public
def policy_labels(policies: Sequence[str | object]) -> list[str]:
    """The labels results record for policies compared together (one run's list, AR included).

    Each policy is labelled by its display ``name``, unless two of them would share one (two
    plug-in specs of one class, ``bastion`` beside ``bastion:512``, a plug-in named ``fixed:16``
    beside the built-in, or one named ``ar`` beside the AR baseline): then each of those is
    labelled by its spec string (:func:`policy_label` for an object), so no two rows of a
    comparison carry the same label. The same spec given twice is refused
    (:class:`~bastion.errors.ConfigError` naming it); a spec that is not a policy raises as
    :func:`make_policy` does.
    """
    specs = [policy_label(p) for p in policies]
    seen: set[str] = set()
    for spec in specs:
        if spec in seen:
            raise ConfigError(f"policy {spec!r} is given twice; give each policy once")
        seen.add(spec)
    names = [str(make_policy(p).name) for p in policies]  # type: ignore[arg-type]
    shared = {n for n in names if names.count(n) > 1}
    labels = [spec if name in shared else name for spec, name in zip(specs, names, strict=True)]
    clash = sorted({label for label in labels if labels.count(label) > 1})
    if clash:
        named = [s for s, label in zip(specs, labels, strict=True) if label in clash]
        raise ConfigError(
            f"policies {', '.join(map(repr, named))} would all be recorded as {clash[0]!r}; "
            "give the plug-in classes distinct names"
        )
    return labels


@public
def make_policy(spec: str | TreePolicy | BatchTreePolicy, *, n_max: int | None = None) -> Any:
    """A policy from a spec, or ``spec`` itself if it already is one.

    Built-ins: ``ar``, ``chain[:D]``, ``fixed:N``, ``beam:WxD``, ``eagle:K,D,N``,
    ``bastion[:N_MAX]``, ``bastion:per-request[,N_MAX]``. Anything else is a plug-in
    (:mod:`bastion.plugins`): ``package.module:Name[:ARGS]``, ``file.py:Name[:ARGS]``, or a short
    name registered under the entry-point group ``bastion.policies``. ``n_max`` is the adaptive
    controller's cap when the spec does not give one (built-ins only; a plug-in takes its own
    arguments).
    """
    if not isinstance(spec, str):
        if is_policy(spec):
            return spec
        raise BudgetError(
            f"a policy must be a spec string ({_SPECS}, or 'package.module:Name[:ARGS]') or an "
            f"object with a str `name` and a `choose` or `choose_batch` method; got {spec!r}"
        )
    name, _, arg = spec.strip().partition(":")
    if name not in _BUILTINS:
        return _plugin_policy(spec)
    try:
        if name == "ar" and not arg:
            return AutoregressivePolicy()
        if name == "chain":
            return ChainPolicy(int(arg) if arg else None)
        if name == "fixed":
            return FixedPolicy(int(arg))
        if name == "beam":
            width, depth = arg.lower().split("x")
            return BeamPolicy(int(width), int(depth))
        if name == "eagle":
            if not arg:
                return EaglePolicy()
            k, d, n = (int(x) for x in arg.split(","))
            return EaglePolicy(k, d, n)
        if name in ("bastion", "adaptive"):
            parts = [a.strip() for a in arg.split(",")] if arg else []
            flags = [a for a in parts if a in ("per-request", "paper")]
            every = [_every(a) for a in parts if a.startswith("every=")]
            sizes = [_size(a) for a in parts if a not in flags and not a.startswith("every=")]
            if len(sizes) > 1 or len(flags) > 1 or len(every) > 1:
                raise ValueError("at most one of paper / per-request, one N_MAX and one every=K")
            if every and flags:
                raise ValueError("every=K is an option of the learning controller (bastion) only")
            cap = sizes[0] if sizes else n_max
            if not flags:
                from bastion.controller import DECIDE_EVERY, LearningPolicy

                return LearningPolicy(
                    1024 if cap is None else cap, every[0] if every else DECIDE_EVERY
                )
            joint = flags[0] == "paper"
            return AdaptivePolicy(joint=joint) if cap is None else AdaptivePolicy(cap, joint=joint)
    except ValueError as exc:
        raise BudgetError(f"bad policy spec {spec!r} ({exc}); accepted: {_SPECS}") from exc
    raise BudgetError(f"bad policy spec {spec!r}; accepted: {_SPECS}")


def _every(text: str) -> int:
    """An ``every=K`` argument: the learning controller decides every K drafted steps."""
    value = int(text.partition("=")[2])
    if not 1 <= value <= 1024:
        raise ValueError("every=K needs K in 1 … 1024")
    return value


def _size(text: str) -> int:
    """An N_MAX argument: a whole number within the library's tree-size limit."""
    from bastion.bestfirst import MAX_TREE_SIZE

    value = int(text)
    if not 1 <= value <= MAX_TREE_SIZE:
        raise ValueError(f"N_MAX must be in 1 … {MAX_TREE_SIZE}")
    return value


def _plugin_policy(spec: str) -> Any:
    from bastion import plugins

    try:
        obj = plugins.load(spec, POLICY_GROUP, "policy", ready=is_policy)
    except UnknownNameError as exc:
        raise UnknownNameError(f"{exc}; built-in policies: {_SPECS}") from None
    if not is_policy(obj):
        raise BudgetError(
            f"policy spec {spec!r} gave {obj!r}, which is not a tree policy: it needs a str "
            "`name` and a `choose(marginals, context)` or `choose_batch(marginals, context)` "
            "method"
        )
    return obj
