"""Device-synchronised wall clock and the calibration hook ``verify_timer``.

``device_clock(device)`` returns a clock that waits for the device's queued work before reading
``time.perf_counter`` (a no-op on CPU), so stage times measure work, not kernel launches.

``verify_timer(model)(s, c)`` times one real tree-verification pass of ``s`` tokens over a
context of ``c`` tokens: the cost model's profiling sweep (``bastion.cost``, built separately)
consumes it as its measurement function. :class:`AffineCostModel` is a small stand-in
``CostModel`` (verify time affine in the tree size) fitted from that hook, so the adaptive policy
runs on the real backend before the calibrated cost model lands.

What this module does not do: fit the roofline cost model or cache calibration records.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bastion.errors import BudgetError
from bastion.interfaces import CostCurve, StepCost, StepLoad

__all__ = ["AffineCostModel", "Clock", "device_clock", "fit_affine_cost_model", "verify_timer"]

Clock = Callable[[], float]


def device_clock(device: torch.device | str) -> Clock:
    """A clock in seconds that synchronises ``device`` first (CUDA); plain perf_counter on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":

        def clock() -> float:
            torch.cuda.synchronize(dev)
            return time.perf_counter()

        return clock
    return time.perf_counter


def verify_timer(
    model: Any, *, repeats: int = 3, warmup: int = 1, seed: int = 0
) -> Callable[[int, int], float]:
    """A callable ``(s, c) -> seconds``: median time of a verification pass of a random
    ``s``-node tree (a chain of ``s`` tokens with the tree mask) over ``c`` cached tokens."""
    from transformers import DynamicCache

    from bastion.tree import DraftTree

    from .verifier import TorchVerifier

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
            verifier._forward(ctx, cache)
            mask, pos = verifier.tree_mask(tree, c)
            ids = torch.from_numpy(tree.tokens.copy()).to(device)[None]
            for i in range(warmup + repeats):
                t0 = verifier.clock()
                verifier._forward(ids, cache, pos, mask)
                t1 = verifier.clock()
                cache.crop(-s)
                if i >= warmup:
                    times.append(t1 - t0)
        return float(statistics.median(times))

    return timer


@dataclass(frozen=True)
class AffineCostModel:
    """T_verify(N) = a + b·N (convex), with constant draft and prep times; L_AR = T_verify(1).

    A stand-in satisfying :class:`bastion.interfaces.CostModel`; ``observe`` does nothing.
    """

    verify_a_s: float
    verify_b_s: float
    draft_s: float = 0.0
    prep_s: float = 0.0

    def __post_init__(self) -> None:
        if self.verify_a_s + self.verify_b_s <= 0 or self.verify_b_s < 0:
            raise BudgetError("an affine cost model needs b ≥ 0 and a + b > 0")

    def step_cost(self, tree_size: int, load: StepLoad) -> StepCost:
        return StepCost(self.draft_s, self.prep_s, self.verify_a_s + self.verify_b_s * tree_size)

    def cost_curve(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        n = np.arange(1, max_tree_size + 1, dtype=np.float64)
        verify = self.verify_a_s + self.verify_b_s * n
        return CostCurve(self.draft_s, self.prep_s, verify, float(verify[0]))

    def observe(self, tree_size: int, load: StepLoad, verify_s: float) -> None:
        return None


def fit_affine_cost_model(
    timer: Callable[[int, int], float],
    context_len: int,
    sizes: Sequence[int] = (1, 16, 64),
    draft_s: float = 0.0,
) -> AffineCostModel:
    """Least-squares fit of ``a + b·s`` to ``timer(s, context_len)`` over ``sizes``."""
    s = np.asarray(sizes, dtype=np.float64)
    t = np.array([timer(int(x), context_len) for x in sizes])
    b, a = np.polyfit(s, t, 1)
    b = max(float(b), 1e-9)
    a = max(float(a), 1e-9)
    return AffineCostModel(a, b, draft_s=draft_s)
