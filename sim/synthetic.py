"""Synthetic drafter–target streams, drawn for a whole batch of requests at once.

The statistical model is that of :mod:`sim.workloads` (read its docstring): at each step a
request's drafter proposes a row of top-K marginals per future position — the top-1 probability
from the request's confidence curve, the remaining mass spread over the runners-up — and the
target's token at each position is the drafter's rank-r candidate with probability λ·q[r], else a
token outside the row.

Two things make it cheap enough to simulate thousands of request-steps per second:

- **Blocks.** Each request draws ``block_steps`` steps of marginals and target tokens at once
  from its own generator (seeded by the run's seed and the request's index, so a request's stream
  does not depend on which other requests share its batch), into a slot of a preallocated array;
  a step then gathers every request's current step with one fancy index.
- **A bank of runner-up spreads.** The Dirichlet draw of the runner-up mass is taken from a bank
  of ``bank_size`` (default 4096) Dirichlet rows drawn once per source, each row picked uniformly
  at random per position and step. The law of one row is exactly the Dirichlet's; rows repeat
  only across a bank's worth of draws, which leaves τ unchanged within sampling error (the tests
  compare it against fresh draws).

Token ids are the candidates' ranks (0 … K−1); a target token outside the drafter's row is K, so
it never matches a tree node, and the token after the last drafted position is −1 (unknown). Only
acceptance matters in simulation, not token identity.

What this module does not do: time anything (sim.gpu), choose trees, or replay recorded runs
(sim.replay).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals
from bastion.errors import ConfigError
from sim.workloads import Workload

__all__ = ["SyntheticSource"]

IntArray = npt.NDArray[np.int64]


@functools.lru_cache(maxsize=16)
def _spread_bank(
    k: int, concentration: float, tail_alpha: float, seed: int, size: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Dirichlet rows over the K − 1 runners-up plus the outside-top-K bucket (dropped), each
    sorted descending, as ``[size, K]`` with a zero column 0 (the top-1 slot), and their
    row-wise cumulative sums ``[size, K + 1]`` ending in +∞; read-only, shared by every source
    with these inputs."""
    alpha = np.full(k, concentration)
    alpha[-1] = tail_alpha
    gammas = np.random.default_rng([seed, 0x62616E6B]).standard_gamma(alpha, size=(size, k))
    spread = (gammas / gammas.sum(axis=1, keepdims=True))[:, :-1]
    bank = np.zeros((size, k))  # column 0 is the top-1 slot, filled per row
    bank[:, 1:] = -np.sort(-spread, axis=1)
    cumulative = np.full((size, k + 1), np.inf)  # column K: past the row, never exceeded
    cumulative[:, :k] = np.cumsum(bank, axis=1)
    bank.flags.writeable = cumulative.flags.writeable = False
    return bank, cumulative


class SyntheticSource:
    """Marginals and target tokens for the requests in flight, indexed by slot.

    ``admit(slot, index)`` starts request ``index`` in ``slot``; ``draft(slots, contexts)``
    returns every listed slot's next step and advances it.
    """

    def __init__(
        self,
        workload: Workload,
        seed: int = 0,
        temperature: float = 0.0,
        block_steps: int = 64,
        bank_size: int = 4096,
    ) -> None:
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ConfigError(f"temperature must be a finite number ≥ 0; got {temperature}")
        if block_steps < 1 or bank_size < 1:
            raise ConfigError("block_steps and bank_size must be ≥ 1")
        self.workload = w = workload
        self.seed = seed
        self.block_steps = block_steps
        self.alignment = w.alignment * math.exp(-w.temperature_penalty * temperature)
        self._bank, self._bank_cdf = _spread_bank(
            w.k, w.concentration, w.tail_alpha, seed, bank_size
        )
        self._ids = np.broadcast_to(np.arange(w.k, dtype=np.int64), (1, w.depth, w.k))
        self._slots = 0
        self._probs = np.empty((0, block_steps, w.depth, w.k))
        self._target = np.empty((0, block_steps, w.depth + 1), np.int64)
        self._cursor = np.empty(0, np.int64)
        self._top1 = np.empty((0, w.depth))
        self._rngs: list[np.random.Generator | None] = []
        self._id_views: dict[int, IntArray] = {}  # read-only [B, D, K] views of the rank ids

    # -- slots ----------------------------------------------------------------------------------

    def _grow(self, slots: int) -> None:
        w, extra = self.workload, slots - self._slots
        self._probs = np.concatenate((self._probs, np.empty((extra, *self._probs.shape[1:]))))
        self._target = np.concatenate(
            (self._target, np.empty((extra, *self._target.shape[1:]), np.int64))
        )
        self._cursor = np.concatenate((self._cursor, np.zeros(extra, np.int64)))
        self._top1 = np.concatenate((self._top1, np.empty((extra, w.depth))))
        self._rngs.extend([None] * extra)
        self._slots = slots

    def lengths(self, index: int, requested: tuple[int, int] | None = None) -> tuple[int, int]:
        """Request ``index``'s (prompt_len, output_len): ``requested`` (an arrival's) if given,
        else drawn from the workload's length distributions with the request's own seed."""
        if requested is not None:
            return requested
        w = self.workload
        sample = getattr(w, "sample_lengths", None)
        if sample is None:
            return w.prompt_len, w.output_len
        prompt, out = sample(np.random.default_rng([self.seed, index, 0x6C656E]), 1)
        return int(prompt[0]), int(out[0])

    def reserve(self, slots: int) -> None:
        """Make room for ``slots`` requests in flight at once (growing later is slower)."""
        if slots > self._slots:
            self._grow(slots)

    def admit(self, slot: int, index: int) -> np.random.Generator:
        """Start request ``index`` in ``slot``; returns the request's own generator."""
        if slot >= self._slots:
            self._grow(max(slot + 1, 2 * self._slots, 8))
        w = self.workload
        rng = np.random.default_rng([self.seed, index])
        shift = rng.normal(0.0, w.difficulty_sd) if w.difficulty_sd else 0.0
        base = w.top1 * w.decay ** np.arange(w.depth)
        logits = np.log(base / (1.0 - base)) + shift
        # the logistic of a finite logit is < 1, but may round to 1.0: keep 1 − top-1 > 0
        self._top1[slot] = np.minimum(1.0 / (1.0 + np.exp(-logits)), 1.0 - 1e-12)
        self._rngs[slot] = rng
        self._refill(slot)
        return rng

    def _refill(self, slot: int) -> None:
        """Draw the next ``block_steps`` steps of ``slot`` in one vectorised pass."""
        w, rng = self.workload, self._rngs[slot]
        assert rng is not None
        steps, k = self.block_steps, w.k
        top1 = self._top1[slot][None, :, None]  # [1, D, 1]
        pick = rng.integers(0, self._bank.shape[0], size=(steps, w.depth))
        # rows: the top-1 value, then the bank's runners-up (descending) scaled to 1 − top-1
        probs = np.take(self._bank, pick, axis=0)
        probs *= 1.0 - top1
        probs[:, :, :1] = top1
        # the target's token: rank r with probability λ·q[r], else outside (rank K) — the first
        # rank whose cumulative mass (the bank's cumulative rows, scaled; +∞ after K) exceeds u
        cdf = np.take(self._bank_cdf, pick, axis=0)
        cdf *= 1.0 - top1
        cdf += top1
        above = probs[:, :, 1] > probs[:, :, 0]  # a runner-up beats the top-1 value (rare)
        if above.any():  # move the top-1 value to where it belongs, so each row stays sorted
            rows = probs[above]
            first = rows[:, 0].copy()
            runners = rows[:, 1:]
            pos = (runners > first[:, None]).sum(axis=1)[:, None]
            col = np.arange(k)[None, :]
            padded = np.concatenate((runners, np.zeros((rows.shape[0], 1))), axis=1)
            probs[above] = np.where(col < pos, padded, np.where(col == pos, first[:, None], rows))
            cdf[above, :k] = np.cumsum(probs[above], axis=1)
        self._probs[slot] = probs
        u = rng.random((steps, w.depth, 1)) / self.alignment
        self._target[slot, :, : w.depth] = np.argmin(u > cdf, axis=2)
        self._target[slot, :, w.depth] = -1
        self._cursor[slot] = 0

    # -- one step ---------------------------------------------------------------------------------

    def draft(self, slots: IntArray, context_lens: IntArray) -> tuple[BatchMarginals, IntArray]:
        """Every slot's marginals at its current root and the target's tokens there.

        The second array is ``[B, depth + 1]``: the target's token at positions 1 … depth and
        after them (−1: not drafted, never matched)."""
        del context_lens  # synthetic streams are indexed by step, not by position
        cursor = self._cursor[slots]
        spent = cursor >= self.block_steps
        if spent.any():
            for slot in slots[spent].tolist():
                self._refill(slot)
            cursor = self._cursor[slots]
        self._cursor[slots] = cursor + 1
        row = slots * self.block_steps + cursor  # (slot, step) as one index into the blocks
        w = self.workload
        probs = np.take(self._probs.reshape(-1, w.depth, w.k), row, axis=0)
        target = np.take(self._target.reshape(-1, w.depth + 1), row, axis=0)
        if probs.shape[0] not in self._id_views:
            self._id_views[probs.shape[0]] = np.broadcast_to(self._ids, probs.shape)
        return BatchMarginals(self._id_views[probs.shape[0]], probs), target
