"""Start-up calibration of the learning controller on the simulated GPU.

A real deployment times whole cycles on its device before serving (the paper reports about 70 s
of calibration on a GPU); the simulator does the same on a *probe* copy of the simulated GPU
(its own noise seed), charging each cycle exactly as serving charges a step of that kind —
drafter pass, preparation with the controller's host time, verification pass; a chain cycle as
a chain decision that stands runs, with the chain's argmax preparation — so the
controller learns the truth only by measuring it (design decision 1). The simulated seconds
those passes take are the start-up cost a real GPU would pay (``LearnedCostModel.startup_s``).

What this module does not do: serve (``bastion.sim.serving``) or decide (``bastion.controller``).
"""

from __future__ import annotations

import numpy as np

from bastion.guard import integer, public
from bastion.interfaces import CostModel
from bastion.learned import CycleKind, LearnedCostModel, calibrate_cycles
from bastion.sim.gpu import SimulatedGPU

__all__ = ["STARTUP_CONTEXT", "learned_cost_model", "startup_batch_sizes"]

STARTUP_CONTEXT = 512  # the KV length the start-up passes run at (the prior handles others)


@public(concurrency=integer(lo=1))
def startup_batch_sizes(concurrency: int) -> tuple[int, ...]:
    """The batch sizes timed at start-up: the powers of two up to the server's concurrency."""
    sizes = [1]
    while sizes[-1] < concurrency:
        sizes.append(min(2 * sizes[-1], 1 << 10))
        if sizes[-1] == 1 << 10:
            break
    return tuple(sizes)


@public(
    n_max=integer(1, 1 << 20),
    concurrency=integer(lo=1),
    seed=integer(lo=0),
    repeats=integer(1, 1000),
)
def learned_cost_model(
    gpu: SimulatedGPU,
    prior: CostModel,
    *,
    n_max: int = 1024,
    concurrency: int = 1,
    seed: int = 0,
    repeats: int = 2,
) -> LearnedCostModel:
    """A :class:`LearnedCostModel` around ``prior``, its table filled by timing cycles of
    every kind at every lattice size on a probe copy of ``gpu``."""
    probe = SimulatedGPU(
        gpu.hardware, gpu.model, gpu.drafter, gpu.truth, seed=seed + 104729, tp=gpu.tp
    )
    depth = int(gpu.drafter.block_size) - 1 if gpu.drafter is not None else 15

    def measure(kind: CycleKind, contexts: np.ndarray, sizes: np.ndarray) -> float:
        if kind == "chain":  # as a chain decision that stands runs: argmax preparation
            return sum(probe.step_s(kind, sizes, contexts, topk=False, controller="repeat"))
        return sum(probe.step_s(kind, sizes, contexts, topk=True, controller=True))

    model = LearnedCostModel(prior)
    calibrate_cycles(
        model,
        measure,
        batch_sizes=startup_batch_sizes(concurrency),
        n_max=n_max,
        context_len=STARTUP_CONTEXT,
        depth=depth,
        repeats=repeats,
    )
    return model
