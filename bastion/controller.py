"""Bastion's learning controller: the ``bastion`` policy (design decision 9).

Each step it chooses among every way of decoding it can price from measured cycles:

- **AR** (no draft at all): decided *before* drafting, since skipping the drafter is the
  saving. The policy drafts while speculation's realised speedup over AR (an exponential
  average of committed tokens per second, over the learned AR rate) stays above 1, and, while
  AR is faster, drafts every ``probe_every``-th step to see whether that changed.
  At batch 1 a new request, while AR stands, starts the evidence afresh: a few of its drafted
  steps judge the new text (a drafter's acceptance moves with the text).
- **The chain** (the drafter's top-1 path, verified with a causal pass): priced by its own
  measured cycle, with its acceptance from the calibrated marginals.
- **Best-first trees** of the lattice sizes up to ``n_max``: at batch 1 each priced by its
  learned cycle (:meth:`bastion.learned.LearnedCostModel.candidate_cycles`, one standard error on
  the expensive side) and credited with the tokens the size calibration expects of this step's
  surrogate there, so the chosen size is a measured one; at batch > 1 the trees of the step share
  one joint budget (:mod:`bastion.joint`) along the learned batch cycle, stepped to the cheapest
  measured total at or above each total.

The acceptance the controller maximises is the drafter's surrogate corrected by the observed
per-depth factor (:class:`bastion.learned.AcceptanceCalibration`): best-first on the calibrated
marginals, which is optimal for that objective because the factor never grows with depth.

Its promise: never slower than the best built-in policy (AR, the chain or a fixed best-first
size), within noise and after the start-up calibration. ``bastion:paper`` keeps the paper's
controller (a static calibrated roofline, no learning, no AR or chain) for comparison.

What this module does not do: measure (the engine and the simulator report each step's cycle to
the cost model's ``observe_step``) or store what was learned (:mod:`bastion.learned`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals, TreeBatch, chain_batch, empty_marginals
from bastion.bestfirst import best_first
from bastion.errors import BudgetError
from bastion.fastinit import trusted_init
from bastion.guard import integer, public
from bastion.interfaces import BatchChoice, BatchPolicyContext, CostModel
from bastion.joint import (
    JointDiagnostics,
    choose_joint_batch,
    forest_and_order,
    joint_result,
)
from bastion.learned import LearnedCostModel
from bastion.per_request import joint_first_budget
from bastion.tree import DraftMarginals, DraftTree, tree_from_arrays

if TYPE_CHECKING:
    from bastion.batch import StepRequests

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

try:  # the compiled batch-1 size choice (bastion._bestfirst.choose); the loop below without it
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no C compiler was available
    _kernel = None
_chain_cut_kernel = getattr(_kernel, "chain_cut", None)
_CUT_F8 = np.dtype(np.float64)  # (a dtype object: ascontiguousarray 85 -> 61 ns, timeit)

__all__ = [
    "DECIDE_EVERY",
    "EXPLORE_COST",
    "ControllerChoice",
    "LearningPolicy",
    "SizeDiagnostics",
    "choose_size",
    "learner_of",
]

EXPLORE_COST = 1.5  # an exploring step verifies the largest size at most this many times as dear
DECIDE_EVERY = 8  # the default: an agreeing batched decision stands for up to 8 steps


def learner_of(cost_model: CostModel | None, policy: str = "bastion") -> LearnedCostModel:
    """``cost_model`` as a :class:`LearnedCostModel` (the engine wraps a plain one)."""
    if isinstance(cost_model, LearnedCostModel):
        return cost_model
    if cost_model is None:
        raise BudgetError(f"the {policy} policy needs a cost model in its context")
    raise BudgetError(
        f"the {policy} policy learns from measured cycles and needs a LearnedCostModel; got "
        f"{type(cost_model).__name__} (SpecEngine wraps a plain cost model for it)"
    )


@dataclass(frozen=True)
class ControllerChoice:
    """Why the controller chose what it did this step."""

    kind: str  # "tree", "chain" or "ar"
    predicted_speedup: float  # Ŝ of the choice over the learned AR cycle
    tree_speedup: float  # Ŝ of the best measured tree size
    chain_speedup: float  # Ŝ of the chain
    predicted_cycle_s: float  # the learned cycle of the choice
    tree_diagnostics: object | None = None  # the budget's or joint budget's diagnostics
    repeated: bool = False  # the last full decision repeated (see LearningPolicy.decide_every)


_NAN = float("nan")  # a repeated step's unpriced speedups
_why = trusted_init(ControllerChoice)  # the per-step records, built without __init__
_choice = trusted_init(BatchChoice)
_trees = trusted_init(TreeBatch)


@dataclass(frozen=True, eq=False)
class SizeDiagnostics:
    """Batch 1: the lattice sizes the controller compared and what it expected of each."""

    tree_size: int  # the chosen N
    sizes: npt.NDArray[np.int64]  # the candidate sizes evaluated
    a_hat: npt.NDArray[np.float64]  # expected committed tokens (calibrated) at each
    c_hat: npt.NDArray[np.float64]  # learned cycle (pessimistic by one standard error)
    s_hat: npt.NDArray[np.float64]  # Ŝ = Â · L_AR / Ĉ
    ar_step_s: float  # the learned AR cycle
    best: int  # index of the best candidate (an exploring step verifies a larger tree)

    @property
    def predicted_speedup(self) -> float:
        return float(self.s_hat[self.best])

    @property
    def cycle_s(self) -> float:
        return float(self.c_hat[self.best])


@public(
    error=BudgetError, context_len=integer(lo=0), n_max=integer(1, 1 << 20), start=integer(lo=1)
)
def choose_size(
    marginals: DraftMarginals,
    learner: LearnedCostModel,
    context_len: int,
    n_max: int,
    start: int = 128,
    explore: bool = False,
) -> tuple[DraftTree, SizeDiagnostics]:
    """Batch 1: the best-first tree of the lattice size with the largest expected speedup.

    Candidates are the lattice sizes up to what the marginals can build and ``n_max``, each
    priced by its learned cycle and credited with the committed tokens the size calibration
    expects of this step's Â there (each lattice increment of Â discounted by what such
    increments realised). The tree is grown in doubling chunks (from twice the last chosen
    size) while the best candidate lies in the upper half of what was built — a heuristic, not
    a bound: a much larger size that would win is found by the periodic exploration instead.
    ``explore``: verify the largest lattice size whose learned cycle is at most
    :data:`EXPLORE_COST` times the best one's; its prefixes teach the size calibration what
    every size up to it gives.
    """
    if _kernel is not None and not explore:  # the hot path: the same loop, compiled
        built, diag, _, _ = _choose_compiled(
            marginals.probs, marginals.token_ids, learner, context_len, n_max, start
        )
        return DraftTree.trusted(*built), diag
    probs = marginals.probs
    all_sizes, cells, cycles, ar_s = learner.candidate_cycles(n_max, context_len)
    cap = int(all_sizes[-1])  # lowered to what the lattice of ``probs`` holds once a build
    budget = min(max(start, 1), cap)  # comes back short of its budget
    while True:
        arrays = best_first(probs, budget)
        scores = arrays[3]
        n = scores.shape[0]
        a_hat = np.cumsum(scores)
        k = int(np.searchsorted(all_sizes, n, side="right"))  # candidates built
        if n < budget:  # every node with ρ > 0 is built: no larger size exists
            all_sizes, cells, cycles = all_sizes[:k], cells[:k], cycles[:k]
            cap = int(all_sizes[-1])
        sizes = all_sizes[:k]
        expected = learner.sizes.expected(1, cells[:k], a_hat[sizes - 1])
        s_hat = expected * ar_s / cycles[:k]
        best = int(np.argmax(s_hat))
        if n < budget or budget >= cap or 2 * int(sizes[best]) <= n:
            break  # the best size sits in the lower half of what was built: stop growing
        budget = min(2 * budget, cap)
    chosen = int(sizes[best])
    if explore and chosen < cap:  # bounded exploration: the largest size at most twice as dear
        affordable = all_sizes[cycles <= EXPLORE_COST * float(cycles[best])]
        target = max(int(affordable.max(initial=0)), int(all_sizes[min(best + 1, k - 1)]))
        if target > n:
            arrays = best_first(probs, target)
        chosen = min(target, int(arrays[3].shape[0]))
    tree = tree_from_arrays(tuple(a[:chosen] for a in arrays), marginals)  # type: ignore[arg-type]
    return tree, SizeDiagnostics(chosen, sizes, expected, cycles[:k], s_hat, ar_s, best)


_size_diagnostics = trusted_init(SizeDiagnostics)  # the compiled batch-1 choice's, every step


def _choose_compiled(
    probs: FloatArray,
    token_ids: IntArray,
    learner: LearnedCostModel,
    context_len: int,
    n_max: int,
    start: int,
) -> tuple[
    tuple[IntArray, IntArray, IntArray, FloatArray, IntArray], SizeDiagnostics, FloatArray, IntArray
]:
    """:func:`choose_size`'s loop (no exploration) in one compiled call: bit-identical
    (``tests/test_controller_compiled.py``), without the interpreter between its steps. The
    chosen tree's (parents, tokens, depths, scores, ranks), the diagnostics, the chain's Â less
    its root cut at every depth ([1, depth]: cumsum(cumprod(probs[:, 0])), the same
    floating-point operations) and the tree's batch offsets [0, N]."""
    sizes, _, cycles, ar_s = learner.candidate_cycles(n_max, context_len)
    depth, k = probs.shape
    gain = learner.sizes.gain_ratios(1)[: sizes.shape[0]]
    ib, fb, best, built, _ = _kernel.choose(
        np.ascontiguousarray(probs, np.float64),
        np.ascontiguousarray(token_ids, np.int64),
        depth,
        k,
        start,
        sizes,
        gain,  # both the learner's own float64 arrays
        cycles,
        float(ar_s),
    )
    ints = np.frombuffer(ib, np.int64)  # parents, depths, ranks, tokens (n each), offsets
    floats = np.frombuffer(fb, np.float64)  # scores (n), expected, Ŝ (built each), chain
    n = (ints.shape[0] - 2) // 4
    chosen = int(sizes[best])
    arrays = (
        ints[:chosen],
        ints[3 * n : 3 * n + chosen],
        ints[n : n + chosen],
        floats[:chosen],
        ints[2 * n : 2 * n + chosen],
    )
    diag = _size_diagnostics(
        chosen,
        sizes[:built],
        floats[n : n + built],
        cycles[:built],
        floats[n + built : n + 2 * built],
        ar_s,
        int(best),
    )
    return arrays, diag, floats[n + 2 * built :].reshape(1, depth), ints[4 * n :]


def _choose_joint_compiled(
    cal: BatchMarginals,
    learner: LearnedCostModel,
    contexts: IntArray,
    n_max: int,
    initial: int,
    riding: int = 0,
) -> tuple[TreeBatch, JointDiagnostics] | None:
    """``choose_joint_batch(cal, learner.joint_decision_curve …, n_max, "auto", initial)`` in
    one compiled call (``tests/test_controller_compiled.py``), or None where the compiled loop
    cannot answer (a chain beyond the priced totals, a cost that is not finite and > 0): the
    caller then runs the Python loop, which prices further or raises."""
    probs = cal.probs
    b, depth, k = probs.shape
    cells, best_above, ar = learner.joint_decision_arrays(contexts, n_max, riding)
    most = b * (n_max - 1)
    out = _kernel.joint(
        np.ascontiguousarray(probs, np.float64),
        np.ascontiguousarray(cal.token_ids, np.int64),
        depth,
        k,
        n_max,
        min(b * (min(initial, n_max) - 1), most),
        most,
        b"",  # the lattice masses: computed by the kernel
        cells,
        np.ascontiguousarray(best_above, np.float64),
        float(ar),
    )
    if out[0] != 0:
        return None
    learner.merge_hint = out[7]  # the chosen nodes' merged order: the learning step's hint
    return joint_result(b, n_max, out, ar)


def _chain_cut(probs: FloatArray) -> FloatArray:
    """[B, depth] the chain's Â less its root, cut at every depth, of each request's top-1
    marginals ``probs[:, :, 0]``: the cumulative sum of their cumulative product (compiled
    where built: the same doubles, tests/test_chain_shadow.py)."""
    b, depth, k = probs.shape
    if _chain_cut_kernel is not None and b > 0 and depth > 0 and k > 0:
        out = _chain_cut_kernel(np.ascontiguousarray(probs, _CUT_F8), b, depth, k)
        return np.ndarray((b, depth), _CUT_F8, out)  # (372 -> 232 ns: frombuffer and reshape)
    cut: FloatArray = probs[:, :, 0].cumprod(axis=1)
    cut.cumsum(axis=1, out=cut)
    return cut


def _ar_choice(learner: LearnedCostModel, req: StepRequests) -> BatchChoice:
    """An AR step's choice: the hot path while AR stands (every step then), so the last one
    is reused while its batch size and predicted cycle are the same (it is immutable)."""
    cycle = learner.mode_cycle("ar", req.context_lens, 0)
    b = req.size
    last = learner.last_ar_choice
    if last is not None and last[0] == b and last[1] == cycle:
        return last[2]
    why = _why("ar", 1.0, float("nan"), float("nan"), cycle)
    choice = _choice(TreeBatch.roots(b), why, kind="ar")
    learner.last_ar_choice = (b, cycle, choice)
    return choice


def _decides_for_chunk(learner: LearnedCostModel, req: StepRequests) -> bool:
    """Whether a batched step with a prefill chunk in its pass decides for that pass: yes
    unless a chain decision stands. A standing chain keeps its cheap step (argmax preparation,
    no decision) through the chunk; a tree's best total is what the chunk moves most."""
    return req.size > 1 and req.riding_tokens > 0 and learner.last_decision_kind() != "chain"


def _plan(learner: LearnedCostModel, b: int) -> tuple[bool, tuple[str, int, float] | None]:
    """(explore, the decision to repeat or None) of a drafted step of batch size ``b``. At
    batch 1 a tree decision is made every step (it is cheap and the step's own Â matters
    most); a chain decision may stand there too, since standing saves the top-K preparation."""
    explore = learner.explore_now()
    if explore or (b == 1 and learner.last_decision_kind() != "chain"):
        return explore, None
    return explore, learner.repeat_decision(b)


@dataclass(frozen=True)
class LearningPolicy:
    """``bastion``: AR, the chain or a best-first tree, whichever the measured cycles favour."""

    n_max: int = 1024
    decide_every: int = DECIDE_EVERY  # a batched decision stands for at most so many steps
    uses_cost_model = True
    learns = True  # the engine gives it a LearnedCostModel and reports every step to it
    # it reads the last tree sizes (its start), never the last steps' Â: a server need not
    # track them (StepRequests.previous_expected then reads 0)
    uses_previous_expected = False

    def __post_init__(self) -> None:
        for field, value in (("n_max", self.n_max), ("decide_every", self.decide_every)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise BudgetError(f"{field} must be an integer ≥ 1; got {value!r}")

    @property
    def name(self) -> str:
        return "bastion"

    def wants_draft(self, requests: StepRequests, cost_model: CostModel | None) -> bool:
        """Whether this step drafts (False: a target-only AR step)."""
        if not isinstance(cost_model, LearnedCostModel):
            return True
        return cost_model.wants_draft_for(requests.request_ids)

    def plan_step(self, requests: StepRequests, cost_model: CostModel | None) -> str:
        """Before drafting, what the step will be: "ar" (no draft pass), "chain" (a chain
        decision stands for this step, so the drafter's top-1 is all it needs: the argmax
        preparation of the chain policy, and no decision) or "tree" (top-K marginals: decide,
        explore, or repeat a tree decision). :meth:`choose_batch` then carries out the plan."""
        if not isinstance(cost_model, LearnedCostModel):
            return "tree"
        ids = requests.request_ids
        b = ids.shape[0]  # (requests.size, without the property's call: a step's hot path)
        if not cost_model.wants_draft_for(ids):
            cost_model.pending_plan = None
            return "ar"
        # _decides_for_chunk's rule, inline
        if b > 1 and requests.riding_tokens > 0 and cost_model.last_decision_kind() != "chain":
            cost_model.pending_plan = (b, False, None)
            return "tree"
        explore, again = _plan(cost_model, b)
        cost_model.pending_plan = (b, explore, again)
        return "chain" if again is not None and again[0] == "chain" else "tree"

    def choose_batch(self, marginals: BatchMarginals, context: BatchPolicyContext) -> BatchChoice:
        learner = context.cost_model
        if not isinstance(learner, LearnedCostModel):  # (the hot path: it is one)
            learner = learner_of(learner, self.name)
        req = context.requests
        b = req.size
        probs = marginals.probs  # rows sorted descending: a row is empty iff its top-1 is 0
        if (
            marginals is empty_marginals(b)  # what the engine hands an AR step
            or 0 in probs.shape
            # (the first row's top-1 answers it almost always; np.any's wrapper is slower)
            or (probs[0, 0, 0] == 0 and not np.count_nonzero(probs[:, :, 0]))
        ):
            return _ar_choice(learner, req)
        cal = learner.acceptance.calibrate(marginals)
        contexts = req.context_lens
        # a prefill chunk riding in the pass (batched serving) while no chain stands: this
        # step decides for itself, charging each total what it adds to the chunk's pass, and
        # its decision does not stand for the steps without one (nor does it teach the chain's
        # shadow: the simulator does not learn such steps)
        riding = req.riding_tokens  # (_decides_for_chunk, inline: every step)
        if not (b > 1 and riding > 0 and learner.last_decision_kind() != "chain"):
            riding = 0
        pending, learner.pending_plan = learner.pending_plan, None
        if riding:
            explore, again = False, None
        elif pending is not None and pending[0] == b:  # planned before drafting (plan_step)
            explore, again = pending[1], pending[2]
        else:
            explore, again = _plan(learner, b)
        if again is not None:
            return self._repeat(again, cal, learner)
        # a deciding step's trees teach the chain's shadow: its top-1 marginals and the chain's
        # Â less its root, cut at every depth (the batch-1 kernel computes the latter)
        top1 = cal.probs[:, :, 0]
        chain_cut: FloatArray
        if b == 1:
            ctx = int(contexts[0])
            start = 64
            if req.previous_tree_sizes[0] > 0:
                start = max(32, 2 * int(req.previous_tree_sizes[0]))
            if _kernel is not None and not explore:  # the hot path: choose_size, compiled
                arrays, sdiag, chain_cut, offsets = _choose_compiled(
                    cal.probs[0], cal.token_ids[0], learner, ctx, self.n_max, start
                )
                trees = _trees(offsets, arrays[0], arrays[1], arrays[2], arrays[3], arrays[4])
            else:
                chain_cut = _chain_cut(cal.probs)
                tree, sdiag = choose_size(cal.row(0), learner, ctx, self.n_max, start, explore)
                trees = TreeBatch.from_trees([tree])
            diag: object = sdiag
            s_tree, ar_s, c_tree = sdiag.predicted_speedup, sdiag.ar_step_s, sdiag.cycle_s
            a_chain = 1.0 + float(chain_cut[0, -1])
        else:
            chain_cut = _chain_cut(cal.probs)
            start = joint_first_budget(req.previous_tree_sizes, 64)
            fast = None
            if _kernel is not None:  # the hot path: the same loop, compiled
                fast = _choose_joint_compiled(cal, learner, contexts, self.n_max, start, riding)
            trees, jdiag = fast or choose_joint_batch(
                cal,
                lambda grow: learner.joint_decision_curve(contexts, grow, self.n_max, riding),
                self.n_max,
                "auto",
                min(start, self.n_max),
            )
            if explore:  # the largest batch total at most EXPLORE_COST times as dear
                total = int(trees.sizes.sum())
                target = learner.affordable_total(contexts, total, self.n_max, EXPLORE_COST)
                if target > total:  # the joint budget's allocation of that total
                    trees, learner.merge_hint = forest_and_order(cal, self.n_max, target)
            diag = jdiag
            s_tree, ar_s = jdiag.predicted_speedup, jdiag.ar_step_s
            if riding:  # the tree's cycle and the four the chain is charged (below) at once
                chain_total = b * (int(cal.probs.shape[1]) + 1)
                c_tree, *riding_cycles = learner.joint_cycles(
                    contexts,
                    (jdiag.total_size + riding, chain_total + riding, b + riding, chain_total, b),
                )
            else:
                c_tree = learner.joint_cycle(contexts, jdiag.total_size)
            a_chain = b + float(np.add.reduce(chain_cut[:, -1]))
        if not riding:
            learner.last_top1, learner.last_chain = top1, chain_cut
        depth = int(cal.probs.shape[1])
        a_chain *= learner.chain_ratio()
        c_chain = learner.mode_cycle("chain", contexts, depth)
        s_chain = a_chain * ar_s / c_chain
        if riding:  # the chain charged as the trees are: what its nodes add to the chunk's
            # pass (see LearnedCostModel.joint_decision_curve), against the tree's charge:
            # Ĉ(chain + riding) − Ĉ(B + riding) − (Ĉ(chain) − Ĉ(B))
            added = riding_cycles[0] - riding_cycles[1]
            bare = riding_cycles[2] - riding_cycles[3]
            s_chain = a_chain * ar_s / (c_chain + added - bare)
        if s_chain > s_tree and not explore:  # an exploring step keeps its tree
            chain = chain_batch(cal)
            if not riding:
                learner.decided("chain", b, int(chain.offsets[-1]), c_chain, self.decide_every)
            why = _why("chain", s_chain, s_tree, s_chain, c_chain, diag)
            return _choice(chain, why, kind="chain")
        if not (explore or riding):  # an exploring step's tree is not the decision
            learner.decided("tree", b, int(trees.offsets[-1]), c_tree, self.decide_every)
        why = _why("tree", s_tree, s_tree, s_chain, c_tree, diag)
        return _choice(trees, why, kind="tree")

    def _repeat(
        self,
        again: tuple[str, int, float],
        cal: BatchMarginals,
        learner: LearnedCostModel,
    ) -> BatchChoice:
        """A step between decisions: the last decision's kind and total, on this step's
        calibrated marginals (a forest's merged order left for the learning step)."""
        kind, total, cycle = again
        nan = _NAN
        if kind == "chain":
            trees = chain_batch(cal)
        elif cal.probs.shape[0] == 1:
            row = cal.row(0)
            trees = TreeBatch.from_trees([tree_from_arrays(best_first(row.probs, total), row)])
        else:
            trees, learner.merge_hint = forest_and_order(cal, self.n_max, total)
        why = _why(kind, nan, nan, nan, cycle, None, True)  # (repeated)
        return _choice(trees, why, kind)
