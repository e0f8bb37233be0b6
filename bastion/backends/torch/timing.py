"""The calibration hooks (timers of real passes) and the small real-backend cost models.

``Clock`` and ``device_clock`` (the device-synchronised wall clock) live in :mod:`.clock` and
are re-exported here.

``verify_timer(model)(s, c)`` times one real tree-verification pass of ``s`` tokens over a
context of ``c`` tokens: the cost model's profiling sweep (``bastion.cost``) consumes it as its
measurement function. ``drafter_timer(drafter)(b, c)`` times one batched drafter pass over ``b``
requests of ``c`` context tokens each; :func:`fit_draft_timing` fits
T_draft(B, ΣC) = d0 + d_B·B + d_C·ΣC to such points (:class:`DraftTiming`).

Cost models: :class:`AffineCostModel` is a stand-in ``CostModel`` (the batched pass's verify
time affine in its total tokens) fitted on the spot when no calibration record exists;
:class:`DraftTimedCostModel` wraps any cost model and replaces its T_draft with a fitted
:class:`DraftTiming`, so Ĉ(N) = T_draft + T_aux + T_verify(N) on real runs includes the
drafter's measured pass (the calibrated roofline of ``bastion calibrate --target`` prices the
target only). Both price a batch (``co_batched``) and a joint allocation
(``joint_cost_curve``), so the adaptive policy uses the joint batch budget at B > 1.

What this module does not do: fit the roofline cost model or cache records (see
:mod:`.calibrate`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.cost.costmodel import check_tree_size
from bastion.errors import ArgumentError, BudgetError, ConfigError
from bastion.guard import as_float, each, has, integer, is_finite, number, public
from bastion.interfaces import CostCurve, CostModel, StepCost, StepLoad

from .clock import Clock, device_clock
from .verifier import TargetFeedback, TorchVerifier

__all__ = [
    "AffineCostModel",
    "Clock",
    "DraftTimedCostModel",
    "DraftTimedJointCostModel",
    "DraftTiming",
    "device_clock",
    "drafter_timer",
    "fit_affine_cost_model",
    "fit_draft_timing",
    "verify_timer",
    "with_draft_timing",
]


@public(model=has("config", "parameters"))
def verify_timer(
    model: Any, *, repeats: int = 3, warmup: int = 1, seed: int = 0
) -> Callable[[int, int], float]:
    """A callable ``(s, c) -> seconds``: median time of a verification pass of a random
    ``s``-node tree (a chain of ``s`` tokens with the tree mask) over ``c`` cached tokens."""
    from transformers import DynamicCache

    from bastion.tree import DraftTree

    verifier = TorchVerifier(model)
    vocab = int(model.config.vocab_size)
    gen = np.random.default_rng(seed)
    device = verifier.device

    def timer(s: int, c: int) -> float:
        if s < 1 or c < 1:
            raise BudgetError(f"verify_timer needs s ≥ 1 and c ≥ 1; got s={s}, c={c}")
        parents = np.arange(-1, s - 1)
        tree = DraftTree(parents, gen.integers(0, vocab, s), np.arange(s), np.ones(s))
        ctx = torch.from_numpy(gen.integers(0, vocab, (1, c))).to(device)
        times = []
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            verifier.forward(ctx, cache)
            mask, pos = verifier.tree_mask(tree, c)
            ids = torch.from_numpy(tree.tokens.copy()).to(device)[None]
            for i in range(warmup + repeats):
                t0 = verifier.clock()
                verifier.forward(ids, cache, pos, mask)
                t1 = verifier.clock()
                cache.crop(-s)
                if i >= warmup:
                    times.append(t1 - t0)
        return float(statistics.median(times))

    return timer


@public
@dataclass(frozen=True)
class AffineCostModel:
    """T_verify = a + b·(tokens in the batched pass), constant draft and prep times;
    L_AR = a + b·B (one token per request of the batch).

    A stand-in satisfying :class:`bastion.interfaces.CostModel` and the joint budget's
    ``joint_cost_curve``; ``observe`` does nothing. At batch 1, T_verify(N) = a + b·N.
    """

    verify_a_s: float
    verify_b_s: float
    draft_s: float = 0.0
    prep_s: float = 0.0

    def __post_init__(self) -> None:
        if self.verify_a_s + self.verify_b_s <= 0 or self.verify_b_s < 0:
            raise BudgetError("an affine cost model needs b ≥ 0 and a + b > 0")

    @staticmethod
    def _others(load: StepLoad) -> int:
        return sum(int(r.tree_size) for r in load.co_batched)

    @public(error=BudgetError, own=("tree_size",))
    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        tree_size = check_tree_size(tree_size, "tree_size")
        tokens = tree_size + self._others(load)
        return StepCost(self.draft_s, self.prep_s, self.verify_a_s + self.verify_b_s * tokens)

    @public(error=BudgetError, own=("max_tree_size",))
    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        max_tree_size = check_tree_size(max_tree_size, "max_tree_size")
        n = np.arange(1, max_tree_size + 1, dtype=np.float64) + self._others(load)
        verify = self.verify_a_s + self.verify_b_s * n
        ar = self.verify_a_s + self.verify_b_s * load.batch_size
        return CostCurve(self.draft_s, self.prep_s, verify, float(ar))

    def joint_cost_curve(
        self, context_lens: npt.NDArray[np.int64], grow: npt.NDArray[np.int64]
    ) -> CostCurve:
        b = int(np.asarray(context_lens).size)
        tokens = b + np.arange(int(np.asarray(grow).size) + 1, dtype=np.float64)
        verify = self.verify_a_s + self.verify_b_s * tokens
        return CostCurve(self.draft_s, self.prep_s, verify, float(verify[0]))

    @public(error=BudgetError, tree_size=integer(1, MAX_TREE_SIZE))
    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        return None


@public(
    context_len=integer(lo=0),
    sizes=each(integer(1, MAX_TREE_SIZE)),
    draft_s=number(lo=0.0),
)
def fit_affine_cost_model(
    timer: Callable[[int, int], float],
    context_len: int,
    sizes: Sequence[int] = (1, 16, 64),
    draft_s: float = 0.0,
) -> AffineCostModel:
    """Least-squares fit of ``a + b·s`` to ``timer(s, context_len)`` over ``sizes`` (at least
    two different ones); ``timer`` returns seconds, a finite number > 0."""
    if len(set(sizes)) < 2:
        raise ArgumentError(
            f"fit_affine_cost_model: sizes must hold two different sizes at least; got {sizes!r}"
        )
    s = np.asarray(sizes, dtype=np.float64)
    t = np.array(
        [
            as_float(
                timer(int(x), context_len),
                f"fit_affine_cost_model: what timer({int(x)}, {context_len}) returned",
                positive=True,
            )
            for x in sizes
        ]
    )
    b, a = np.polyfit(s, t, 1)
    b = max(float(b), 1e-9)
    a = max(float(a), 1e-9)
    return AffineCostModel(a, b, draft_s=draft_s)


# --------------------------------------------------------------------------------------------
# The drafter's pass
# --------------------------------------------------------------------------------------------


@public
@dataclass(frozen=True)
class DraftTiming:
    """T_draft(B, ΣC) = d0 + d_batch·B + d_context·ΣC seconds: one batched drafter pass over B
    requests holding ΣC context tokens in all. ``points`` are the (B, ΣC, seconds) it was fitted
    to; ``rmse_s`` its in-sample error."""

    d0_s: float
    d_batch_s: float
    d_context_s: float
    points: tuple[tuple[int, int, float], ...] = ()
    rmse_s: float = float("nan")

    def __post_init__(self) -> None:
        coef = (self.d0_s, self.d_batch_s, self.d_context_s)
        if not all(is_finite(c) and c >= 0 for c in coef) or sum(coef) <= 0:
            raise ConfigError(f"draft timing coefficients must be finite and ≥ 0; got {coef}")

    def seconds(self, batch_size: int, total_context: float) -> float:
        return self.d0_s + self.d_batch_s * batch_size + self.d_context_s * float(total_context)

    def to_dict(self) -> dict[str, Any]:
        return {
            "d0_s": self.d0_s,
            "d_batch_s": self.d_batch_s,
            "d_context_s": self.d_context_s,
            "rmse_s": self.rmse_s,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    @public(error=ConfigError)
    def from_dict(cls, data: dict[str, Any], origin: str = "<record>") -> DraftTiming:
        try:
            return cls(
                float(data["d0_s"]),
                float(data["d_batch_s"]),
                float(data["d_context_s"]),
                tuple((int(b), int(c), float(t)) for b, c, t in data.get("points", ())),
                float(data.get("rmse_s", float("nan"))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{origin}: not a drafter timing record ({exc!r})") from None


@public
def fit_draft_timing(points: Sequence[tuple[int, int, float]]) -> DraftTiming:
    """Non-negative least squares of d0 + d_B·B + d_C·ΣC to (B, ΣC, seconds) points."""
    from scipy.optimize import nnls

    if len(points) < 3:
        raise ConfigError(f"fitting the drafter's time needs ≥ 3 points; got {len(points)}")
    for i, (b, c, _) in enumerate(points):
        if b < 1 or c < 0:
            raise ConfigError(f"point {i} needs a batch B ≥ 1 and a context ΣC ≥ 0; got {b}, {c}")
    x = np.array([[1.0, b, c] for b, c, _ in points])
    y = np.array([t for _, _, t in points])
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ConfigError("measured drafter times must be positive and finite")
    with np.errstate(over="ignore"):
        weighted = x / y[:, None]  # relative error: small passes count too
    if not np.all(np.isfinite(weighted)):
        raise ConfigError("measured drafter times are too small to weigh (a time below 1e-300 s)")
    coef, _ = nnls(weighted, np.ones_like(y))
    err = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
    d0, db, dc = (float(c) for c in coef)
    return DraftTiming(d0, db, dc, tuple(points), err)


@public(drafter=has("cfg", "top_k"))
def drafter_timer(
    drafter: Any, *, repeats: int = 3, warmup: int = 1, seed: int = 0
) -> Callable[[int, int], float]:
    """A callable ``(b, c) -> seconds``: median time of one ``draft_batch`` over ``b`` requests
    with ``c`` context tokens each (random features; each timed pass also appends two tokens of
    feedback per request, as a decoding step does). Uses request ids < 0 and releases them."""
    from bastion.batch import StepRequests

    gen = torch.Generator().manual_seed(seed)
    width = len(drafter.cfg.target_layer_ids) * drafter.cfg.hidden_size
    dtype = drafter.embed.weight.dtype
    vocab = int(drafter.cfg.vocab_size)
    clock = device_clock(drafter.device)

    def feats(m: int) -> torch.Tensor:
        return torch.randn(m, width, generator=gen).to(drafter.device, dtype)

    def timer(b: int, c: int) -> float:
        if b < 1 or c < 1:
            raise BudgetError(f"drafter_timer needs b ≥ 1 and c ≥ 1; got b={b}, c={c}")
        ids = [-1 - i for i in range(b)]
        times = []
        try:
            with torch.no_grad():
                drafter.append_context([(rid, TargetFeedback(feats(c), 0)) for rid in ids])
                length = c
                for i in range(warmup + repeats):
                    fb = [TargetFeedback(feats(2), length) for _ in ids]
                    req = StepRequests.of(
                        ids,
                        [length + 2] * b,
                        torch.randint(0, vocab, (b,), generator=gen).tolist(),
                        feedback=fb,
                    )
                    t0 = clock()
                    drafter.draft_batch(req)
                    t1 = clock()
                    length += 2
                    if i >= warmup:
                        times.append(t1 - t0)
        finally:
            for rid in ids:
                drafter.release(rid)
        return float(statistics.median(times))

    return timer


def _draft_load(load: StepLoad) -> tuple[int, int]:
    return load.batch_size, load.context_len + sum(r.context_len for r in load.co_batched)


class DraftTimedCostModel:
    """``inner`` with its T_draft replaced by a fitted :class:`DraftTiming` (a ``CostModel``).

    Everything else (T_aux, T_verify, L_AR, ``observe``) is the inner model's."""

    def __init__(self, inner: CostModel, timing: DraftTiming) -> None:
        self.inner = inner
        self.timing = timing

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r}, {self.timing!r})"

    @public(error=BudgetError, tree_size=integer(1, MAX_TREE_SIZE))
    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        c = self.inner.step_cost(tree_size, load)
        return StepCost(self.timing.seconds(*_draft_load(load)), c.prep_s, c.verify_s, c.breakdown)

    @public(error=BudgetError, max_tree_size=integer(1, MAX_TREE_SIZE))
    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        c = self.inner.cost_curve(max_tree_size, load)
        draft = self.timing.seconds(*_draft_load(load))
        return CostCurve(draft, c.prep_s, c.verify_s, c.ar_step_s)

    @public(error=BudgetError, tree_size=integer(1, MAX_TREE_SIZE))
    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        self.inner.observe(tree_size, load, verify_s)


class DraftTimedJointCostModel(DraftTimedCostModel):
    """:class:`DraftTimedCostModel` of an inner model that prices joint allocations."""

    def joint_cost_curve(
        self, context_lens: npt.NDArray[np.int64], grow: npt.NDArray[np.int64]
    ) -> CostCurve:
        c = self.inner.joint_cost_curve(context_lens, grow)  # type: ignore[attr-defined]
        ctx = np.asarray(context_lens)
        draft = self.timing.seconds(int(ctx.size), float(ctx.sum()))
        return CostCurve(draft, c.prep_s, c.verify_s, c.ar_step_s)


@public
def with_draft_timing(inner: CostModel, timing: DraftTiming) -> DraftTimedCostModel:
    """``inner`` with T_draft from ``timing``; keeps ``joint_cost_curve`` if ``inner`` has it."""
    if callable(getattr(inner, "joint_cost_curve", None)):
        return DraftTimedJointCostModel(inner, timing)
    return DraftTimedCostModel(inner, timing)
