"""The synthetic drafter's compiled block of steps (``_bestfirst_draws.c``) is its numpy
reference array for array, for the shipped workloads and for parameters that exercise every
branch (K = 1, 2, 3, forks and branches everywhere, rows out of order)."""

from __future__ import annotations

import numpy as np
import pytest

import bastion.sim.synthetic as synthetic
from bastion.sim.workloads import get_workload

needs_kernel = pytest.mark.skipif(synthetic._draws is None, reason="compiled kernel not built")

VARIANTS = [
    {},
    {"k": 1},
    {"k": 2},
    {"k": 3},
    {"fork_rate": 0.5, "branch_rate": 0.9},
    {"k": 2, "fork_rate": 0.9, "branch_rate": 0.9},
    {"k": 1, "fork_rate": 0.9, "branch_rate": 0.9},
    {"depth": 3, "k": 5, "branch_rate": 1.0},
    {"difficulty_sd": 3.0, "step_sd": 2.0},  # low confidence: runners-up above the head
]


@needs_kernel
@pytest.mark.parametrize("workload", ["math", "chat", "qwen3-coder-30b-a3b-code"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_block_is_the_numpy_block(
    workload: str, variant: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    w = get_workload(workload).with_(**variant)
    for temperature in (0.0, 1.0):
        compiled = synthetic.SyntheticSource(w, 3, temperature, block_steps=16)
        reference = synthetic.SyntheticSource(w, 3, temperature, block_steps=16)
        kernel = synthetic._draws
        for index in range(6):
            slot = index % 3
            compiled.admit(slot, index)
            compiled._refill(slot)
            monkeypatch.setattr(synthetic, "_draws", None)
            reference.admit(slot, index)
            reference._refill(slot)
            monkeypatch.setattr(synthetic, "_draws", kernel)
            assert np.array_equal(compiled._probs[slot], reference._probs[slot])
            assert np.array_equal(compiled._target[slot], reference._target[slot])
