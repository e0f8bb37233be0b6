"""Synthetic drafter–target streams, drawn for a whole batch of requests at once.

The statistical model is that of :mod:`bastion.sim.workloads` (read its docstring): at each step a
request's drafter proposes a row of top-K marginals per future position — a head mass from the
request's confidence curve shifted by the step's and the position's noise, split in two at forks
and branches, the remaining mass spread over the runners-up — and the target's token at each
position is the drafter's rank-r candidate with probability c_r·a_k·q[r] (on a branch: the side
it follows), else a token outside the row. Every step draws fresh rows: confidence varies from
step to step, not only with depth.

Two things make it cheap enough to simulate thousands of request-steps per second:

- **Blocks.** Each request draws the randomness of ``block_steps`` steps at once from its own
  generator (seeded by the run's seed and the request's index, so a request's stream does not
  depend on which other requests share its batch), into a slot of a preallocated array; all of
  a block's draws (noise, forks, branches, spreads, target uniforms) are whole-array
  operations. With the compiled kernel a step turns every request's current draws into its
  marginals and target tokens in one call (the steps a request never drafts, after it finishes
  mid-block, are never computed); without it the whole block is computed in numpy when drawn
  and a step gathers every request's current step with one fancy index. Both give the same
  arrays (tested).
- **A bank of runner-up spreads.** The Dirichlet draw of the runner-up mass is taken from a bank
  of ``bank_size`` (default 4096) Dirichlet rows drawn once per source, each row picked uniformly
  at random per position and step. The law of one row is exactly the Dirichlet's; rows repeat
  only across a bank's worth of draws, which leaves τ unchanged within sampling error (the tests
  compare it against fresh draws).

Token ids are the candidates' ranks (0 … K−1); a target token outside the drafter's row is K, so
it never matches a tree node, and the token after the last drafted position is −1 (unknown). Only
acceptance matters in simulation, not token identity.

What this module does not do: time anything (bastion.sim.gpu), choose trees, or replay recorded runs
(bastion.sim.replay).
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals
from bastion.errors import ConfigError
from bastion.fastinit import trusted_init
from bastion.guard import public
from bastion.sim.seeding import seeded
from bastion.sim.workloads import Workload

try:  # the optional compiled kernel (setup.py): a block's arithmetic in one call
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _kernel = None
_draws = getattr(_kernel, "draws", None)
_draws_pin = getattr(_kernel, "draws_pin", None)
_neg_logit = getattr(_kernel, "neg_logit", None)
_advance = getattr(_kernel, "advance", None)

__all__ = ["SyntheticSource"]

_DRAWS_MAX_K = 1024  # the compiled kernel's widest row
_batch_marginals = trusted_init(BatchMarginals)  # every step's, from arrays made here

IntArray = npt.NDArray[np.int64]
# a dtype as an object: a numpy call given one skips converting the scalar type (timeit, this
# project's dev machine: ascontiguousarray 85 -> 61 ns, frombuffer 221 -> 174 ns, empty 184 ->
# 146 ns)
_I8 = np.dtype(np.int64)


@functools.lru_cache(maxsize=16)
def _spread_bank(
    k: int, concentration: float, tail_alpha: float, seed: int, size: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Dirichlet rows over the K − 1 runners-up plus the outside-top-K bucket (dropped), each
    sorted descending, as ``[2·size, K]``: rows 0 … size − 1 with a zero column 0 (the top-1
    slot), then the same rows shifted one rank down with zero columns 0 and 1 (the two slots of
    a fork; the last runner-up falls outside the top-K); and each row's sum (the compiled
    kernel's bound, see ``SyntheticSource.draft``). Read-only, shared by every source with these
    inputs; every entry ≥ 0 (Dirichlet draws)."""
    alpha = np.full(k, concentration)
    alpha[-1] = tail_alpha
    gammas = np.random.default_rng([seed, 0x62616E6B]).standard_gamma(alpha, size=(size, k))
    spread = (gammas / gammas.sum(axis=1, keepdims=True))[:, :-1]
    bank = np.zeros((2 * size, k))  # column 0 is the top-1 slot, filled per row
    bank[:size, 1:] = -np.sort(-spread, axis=1)
    bank[size:, 2:] = bank[:size, 1:-1]
    sums = bank.sum(axis=1)
    bank.flags.writeable = sums.flags.writeable = False
    return bank, sums


def _source_state(source: SyntheticSource) -> dict[str, object]:
    """A source's state to copy or pickle: without its pin and its slots' views (a pin cannot be
    copied, and a copied view would no longer be its block's), made anew on restoring."""
    state = source.__dict__.copy()
    del state["_draw_pin"]
    state.pop("_views", None)
    return state


def _restore_source(source: SyntheticSource, state: dict[str, object]) -> None:
    source.__dict__.update(state)
    source._pin_draws()


@public
class SyntheticSource:
    """Marginals and target tokens for the requests in flight, indexed by slot.

    ``admit(slot, index)`` starts request ``index`` in ``slot``; ``draft(slots, contexts)``
    returns every listed slot's next step and advances it.
    """

    reads_context_lens = False  # streams are indexed by step: draft() ignores the contexts
    # the stored blocks, [slots, block_steps, …]: the compiled path's draws (_fall, _u,
    # _pick, _log_u, _tu) or the numpy path's marginals and target tokens (_probs, _target)
    _fall: npt.NDArray[np.float64]
    _u: npt.NDArray[np.float64]
    _pick: IntArray
    _log_u: npt.NDArray[np.float64]
    _tu: npt.NDArray[np.float64]
    _probs: npt.NDArray[np.float64]
    _target: IntArray

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
        self.temperature = temperature
        self._law = w.rank_alignment(temperature)[None, :, :]  # [1, D, K]: c_r · a_k at T
        self._law_rows = np.ascontiguousarray(self._law[0], dtype=np.float64)  # [D, K]
        head = np.clip(w.head_curve(), 1e-12, 1.0 - 1e-12)
        self._base_logit = np.log(head / (1.0 - head))
        self._upper = np.triu(np.ones((w.k, w.k)))  # x @ upper: cumulative sums of x's rows
        self._ones = np.ones(w.k)
        self._branch_stay = min(1.0 - 1.0 / w.branch_len, 1.0 - 1e-12)  # geometric length
        self._log_stay = np.log(self._branch_stay)
        self._bank, self._bank_sum = _spread_bank(
            w.k, w.concentration, w.tail_alpha, seed, bank_size
        )
        # with the bank's row sums, bounds of a row's total weight for the compiled kernel's
        # shortcut (see _draws); the shortcut needs every weight ≥ 0 (a validated workload's
        # law, the bank's Dirichlet rows): else an infinite bound turns it off
        self._law_max = self._law_rows.max(axis=1)
        if not np.all(self._law_rows >= 0):
            self._law_max = np.full(w.depth, math.inf)
        self._bank_size = bank_size
        self._sds = (float(w.step_sd), float(w.position_sd))  # _neg_logit's, per refill
        self._z_shape = (block_steps, w.depth + 1)
        self._slots = 0
        # the compiled path keeps each block's draws and computes a step when it is drafted;
        # the numpy path computes the block's marginals and target tokens when it is drawn
        self._compiled = (
            _draws is not None
            and _draws_pin is not None
            and _neg_logit is not None
            and w.k <= _DRAWS_MAX_K
        )
        per_step = {  # what one stored step holds, per path: (name, shape of one step, dtype)
            True: [
                ("_fall", (w.depth,), np.float64),  # exp(−logit) of the head masses
                ("_u", (2 * w.depth + 5,), np.float64),
                ("_pick", (w.depth,), np.int64),
                ("_log_u", (), np.float64),  # log of the branch length's uniform
                ("_tu", (w.depth,), np.float64),
            ],
            False: [
                ("_probs", (w.depth, w.k), np.float64),
                ("_target", (w.depth + 1,), np.int64),
            ],
        }[self._compiled]
        self._stored = per_step
        for name, shape, dtype in per_step:
            setattr(self, name, np.empty((0, block_steps, *shape), dtype))
        self._cursor = np.empty(0, np.int64)
        self._row = np.zeros(1, np.int64)  # a batch-1 step's row index (see _advance)
        self._top1 = np.empty((0, w.depth))
        self._rngs: list[np.random.Generator | None] = []
        self._lengths_rng: np.random.Generator | None = None  # re-seeded per request (lengths)
        # per batch size: the read-only [B, D, K] rank ids (_rank_ids), and the shapes of a
        # step's marginals and target tokens
        self._per_batch: dict[int, tuple[IntArray, tuple[int, int, int], tuple[int, int]]] = {}
        self._pin_draws()

    def _pin_draws(self) -> None:
        """The compiled draws' arguments that stay the same from step to step, pinned in one
        object (the stored blocks' buffers, re-pinned when they grow, and the workload's
        constants: each step hands draws() the pin, not nine arrays whose buffers it takes and
        gives back), and each slot's views of the blocks (rebuilt with them)."""
        w = self.workload
        self._draw_pin: object = None  # (no slots yet: nothing to pin)
        if not self._compiled:
            return
        blocks = (
            self._bank,
            self._bank_sum,
            self._pick,
            self._fall,
            self._u,
            self._log_u,
            self._law_rows,
            self._law_max,
            self._tu,
            self._cursor,  # (draws() moves the drafted slots' cursors on)
        )
        consts = (
            w.depth,
            w.k,
            self._bank_size,
            self.block_steps,
            float(w.branch_rate),
            float(w.fork_rate),
            float(w.fork_ratio_min),
            float(self._log_stay),
        )
        if self._slots:
            assert _draws_pin is not None
            self._draw_pin = _draws_pin(*blocks, *consts)
        # every slot's own views of the stored blocks, which _refill writes a block of draws
        # into (made here, once per growth, not per refill): its head log-odds, fall, uniforms
        # and their third column (the branch length's), bank rows, target uniforms, log u
        self._views = [
            (
                self._top1[s],
                self._fall[s],
                self._u[s],
                self._u[s, :, 2],
                self._pick[s],
                self._tu[s],
                self._log_u[s],
            )
            for s in range(self._slots)
        ]

    __getstate__, __setstate__ = _source_state, _restore_source  # (copies: without the pin)

    # -- slots ----------------------------------------------------------------------------------

    def _grow(self, slots: int) -> None:
        """Room for ``slots`` requests in flight: the blocks of the slots in use are kept, the
        new ones left unwritten (a block is written whole before it is read)."""
        w, old = self.workload, self._slots
        for name, _, dtype in self._stored:
            kept = getattr(self, name)
            grown = np.empty((slots, *kept.shape[1:]), dtype)
            grown[:old] = kept  # (nothing to copy at first)
            setattr(self, name, grown)
        self._cursor = np.concatenate((self._cursor, np.zeros(slots - old, np.int64)))
        self._top1 = np.concatenate((self._top1, np.empty((slots - old, w.depth))))
        self._rngs.extend([None] * (slots - old))
        self._slots = slots
        self._pin_draws()

    def lengths(self, index: int, requested: tuple[int, int] | None = None) -> tuple[int, int]:
        """Request ``index``'s (prompt_len, output_len): ``requested`` (an arrival's) if given,
        else drawn from the workload's length distributions with the request's own seed."""
        if requested is not None:
            return requested
        w = self.workload
        sample = getattr(w, "sample_lengths", None)
        if sample is None:
            return w.prompt_len, w.output_len
        self._lengths_rng = rng = seeded((self.seed, index, 0x6C656E), self._lengths_rng)
        if type(w) is Workload:  # sample_lengths(rng, 1)'s, without its arrays
            return w._lengths_of_one(rng)
        prompt, out = sample(rng, 1)
        return int(prompt[0]), int(out[0])

    def reserve(self, slots: int) -> None:
        """Make room for ``slots`` requests in flight at once (growing later is slower)."""
        if slots > self._slots:
            self._grow(slots)

    def admit(self, slot: int, index: int) -> np.random.Generator:
        """Start request ``index`` in ``slot``; returns the request's own generator (the slot's,
        seeded for the request: the slot's next request re-seeds it)."""
        if slot >= self._slots:
            self._grow(max(slot + 1, 2 * self._slots, 8))
        sd = self.workload.difficulty_sd
        rng = seeded((self.seed, index), self._rngs[slot])  # default_rng([seed, index])'s
        # rng.normal(0.0, sd)'s value (numpy forms it as 0.0 + sd · z: the same double) without
        # its argument checks (sd is a validated workload's, ≥ 0)
        shift = sd * rng.standard_normal() if sd else 0.0
        # the request's head log-odds per position
        np.add(self._base_logit, shift, out=self._top1[slot])
        self._rngs[slot] = rng
        self._refill(slot)
        return rng

    def _refill(self, slot: int) -> None:
        """Draw the next ``block_steps`` steps of ``slot`` in one vectorised pass (with the
        compiled kernel, their draws: a step's marginals are computed when it is drafted).

        Per step: a confidence shift e_s, and a branch (whether, where, how long, its ratio,
        the side the target takes); per position: noise η, an isolated fork and its ratio, a
        runner-up spread (a bank row) and the target's uniform. Every draw is made whatever the
        parameters, so a request's randomness does not depend on them (common random numbers
        when fitting)."""
        rng = self._rngs[slot]
        assert rng is not None
        z = rng.standard_normal(self._z_shape)  # column 0: the step's shift
        self._cursor[slot] = 0
        if self._compiled:  # kept as drawn: draft() computes each step's rows (_draws)
            # numpy's exp and log of the draws (the kernel takes the rest of the arithmetic
            # below, the same operations, when a step is drafted)
            top1, fall, u, u_length, pick, target_u, log_u = self._views[slot]
            assert _neg_logit is not None
            _neg_logit(top1, z, *self._sds, fall)
            np.exp(fall, out=fall)
            rng.random(out=u)  # branch: 5 per step; forks: 2 per position
            bank_rows(rng, self._bank_size, pick.shape, pick)
            rng.random(out=target_u)  # the target's uniforms (used last)
            np.log(u_length, out=log_u)
            return
        w = self.workload
        steps, depth = self.block_steps, w.depth
        logit = self._top1[slot][None, :] + w.step_sd * z[:, :1] + w.position_sd * z[:, 1:]
        # h: the head mass, kept in (0, 1) however large the log-odds
        head = np.minimum(1.0 / (1.0 + np.exp(-logit)), 1.0 - 1e-12)  # [S, D], C-contiguous
        u = rng.random((steps, 2 * depth + 5))  # branch: 5 per step; forks: 2 per position
        pick = bank_rows(rng, self._bank_size, (steps, depth))
        target_u = rng.random((steps, depth))  # the target's uniforms (used last)
        length = 1.0 + np.floor(np.log(u[:, 2]) / self._log_stay)  # [S]
        _refill_numpy(self, slot, head[:, :, None], u, pick, target_u[:, :, None], length[:, None])

    # -- one step ---------------------------------------------------------------------------------

    def draft(self, slots: IntArray, context_lens: IntArray) -> tuple[BatchMarginals, IntArray]:
        """Every slot's marginals at its current root and the target's tokens there.

        The second array is ``[B, depth + 1]``: the target's token at positions 1 … depth and
        after them (−1: not drafted, never matched)."""
        del context_lens  # synthetic streams are indexed by step, not by position
        if self._compiled:  # the slots' rows formed and their cursors moved on by draws()
            slots = np.ascontiguousarray(slots, _I8)
        else:
            rows = self._advance(slots)
        b = slots.shape[0]
        per = self._per_batch.get(b)
        if per is None:
            w = self.workload
            per = self._per_batch[b] = (
                _rank_ids(b, w.depth, w.k),
                (b, w.depth, w.k),
                (b, w.depth + 1),
            )
        ids, probs_shape, target_shape = per
        if self._compiled:  # every slot's current step computed from its block's draws
            probs = np.empty(probs_shape)
            target = np.empty(target_shape, _I8)
            assert _draws is not None  # (the compiled path is chosen only with the kernel)
            # (the pin, see _pin_draws; the slots; the outputs; advance: as _advance does): the
            # spent slots, where a block is spent (nothing changed), drawn anew before the step
            spent = _draws(self._draw_pin, slots, probs, target, True)
            if spent is not None:
                for slot in spent:
                    self._refill(slot)
                _draws(self._draw_pin, slots, probs, target, True)
        else:  # gathered from the blocks computed when drawn
            w = self.workload
            probs = self._probs.reshape(-1, w.depth, w.k).take(rows, axis=0)
            target = self._target.reshape(-1, w.depth + 1).take(rows, axis=0)
        return _batch_marginals(ids, probs), target

    def _advance(self, slots: IntArray) -> IntArray:
        """Each slot's current step as one index into the stored blocks (slot · block_steps +
        step), every slot moved on a step; a slot whose block is spent draws the next first.
        (The numpy path's; the compiled path's draws() forms the rows itself, the same way.)"""
        block = self.block_steps
        if slots.shape[0] == 1:  # batch 1: without index arrays
            slot = int(slots[0])
            step = int(self._cursor[slot])
            if step >= block:
                self._refill(slot)
                step = 0
            self._cursor[slot] = step + 1
            row = self._row  # (only draft() reads it, before the next step)
            row[0] = slot * block + step
            return row
        if _advance is not None:  # the same in one compiled call (tests/test_sim_draws.py)
            slots = np.ascontiguousarray(slots, _I8)
            rows = _advance(self._cursor, slots, block)
            if type(rows) is tuple:  # some blocks are spent: draw them, then move on
                for slot in rows:
                    self._refill(slot)
                rows = _advance(self._cursor, slots, block)
            return np.frombuffer(rows, _I8)
        cursor = self._cursor[slots]
        spent = cursor >= block
        if np.count_nonzero(spent):
            for slot in slots[spent].tolist():
                self._refill(slot)
            cursor = self._cursor[slots]
        self._cursor[slots] = cursor + 1
        return slots * block + cursor


@functools.lru_cache(maxsize=40)  # (≤ 40 shapes: at B = 256 one is ≈ 0.5 MB)
def _rank_ids(b: int, depth: int, k: int) -> IntArray:
    """The token ids of a step of ``b`` requests, [B, D, K]: every row's ranks 0 … K − 1.
    A C-contiguous read-only array kept per shape and shared by every source (a serve's batch
    sizes come and go; each source building its own cost ≈ 1 µs a step at C = 32), not a
    broadcast view: the controller's compiled calls need contiguous ids, and copying a view
    every step (≈ 60 KB at B = 32) cost more than keeping one array per batch size."""
    ids = np.ascontiguousarray(np.broadcast_to(np.arange(k, dtype=np.int64), (b, depth, k)))
    ids.flags.writeable = False
    return ids


def bank_rows(
    rng: np.random.Generator,
    size: int,
    shape: tuple[int, int],
    out: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.int64]:
    """``rng.integers(0, size, shape)``: the same values, the generator left in the same
    state. Where ``size`` is a power of two from 2 to 2³², numpy draws each value from one 32-bit
    half of a 64-bit word (low half first, a word per two values) by Lemire's method, which
    for such a size never rejects and keeps the half's top log2(size) bits: taken here from
    the raw words directly (several × cheaper than ``integers``' argument handling).
    ``out``: an int64 array of ``shape`` the values are written into (and returned), without
    an array of their own in between."""
    bits = size.bit_length() - 1
    if size < 2 or size != 1 << bits or bits > 32 or sys.byteorder != "little":
        drawn = np.asarray(rng.integers(0, size, size=shape), np.int64)
        if out is None:
            return drawn
        out[...] = drawn
        return out
    n = shape[0] * shape[1]
    halves = rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n].reshape(shape)
    if out is None:
        out = np.empty(shape, _I8)
    # each half's top bits, as an int64 (≥ 0): the uint32 shift's values, cast on writing
    np.right_shift(halves, 32 - bits, out=out)
    return out


def _refill_numpy(
    src: SyntheticSource,
    slot: int,
    head: npt.NDArray[np.float64],
    u: npt.NDArray[np.float64],
    pick: IntArray,
    target_u: npt.NDArray[np.float64],
    length: npt.NDArray[np.float64],
) -> None:
    """:meth:`SyntheticSource._refill` from its draws in numpy, the whole block of ``slot``
    at once (the reference of the compiled kernel, which computes each step when it is
    drafted)."""
    w = src.workload
    steps, depth = src.block_steps, w.depth
    cols = np.arange(depth)[None, :]
    # a branch: from depth j0 for L positions, two continuations the drafter cannot tell
    # apart; the target follows one of them (the second with probability v/(1+v))
    start = np.floor(u[:, 1:2] * depth)
    branch = (u[:, :1] < w.branch_rate) & (cols >= start) & (cols < start + length)
    ratio = w.fork_ratio_min + (1.0 - w.fork_ratio_min) * np.concatenate(
        (np.broadcast_to(u[:, 3:4], (steps, depth)), u[:, 5 + depth :]), axis=1
    )  # [S, 2D]: the branch's ratio per step, then each isolated fork's
    second = u[:, 4:5] < ratio[:, :1] / (1.0 + ratio[:, :1])  # the target's side
    fork = branch | (u[:, 5 : 5 + depth] < w.fork_rate)
    forks = bool(fork.any())
    if forks:  # a fork's runners-up come from the bank's shifted half
        pick += src._bank_size * fork
    probs = np.take(src._bank, pick, axis=0)  # runners-up (descending) in columns 1 (2) …
    probs *= 1.0 - head
    if forks:
        v = np.where(branch, ratio[:, :depth], ratio[:, depth:])
        h = head[:, :, 0]
        if w.k >= 2:  # (with K = 1 the second candidate is not kept, but q₁ is split)
            probs[:, :, 1] = np.where(fork, h * v / (1.0 + v), probs[:, :, 1])
        probs[:, :, 0] = np.where(fork, h / (1.0 + v), h)
    else:
        probs[:, :, :1] = head
    law = src._law
    # the target's law per rank: c_r·a_k·q[r], where a fork's second candidate counts as
    # a head candidate (λ, not λ₂); on a branch the whole head mass goes to the side the
    # target follows
    weights = probs * law
    if forks and w.k >= 2:
        weights[:, :, 1] = np.where(fork, probs[:, :, 1] * law[:, :, 0], weights[:, :, 1])
    if forks and w.k >= 2 and branch.any():
        total = weights[:, :, 0] + weights[:, :, 1]
        side = branch & second
        weights[:, :, 0] = np.where(branch, np.where(side, 0.0, total), weights[:, :, 0])
        weights[:, :, 1] = np.where(branch, np.where(side, total, 0.0), weights[:, :, 1])
    # the bank's runners-up are sorted, so a row can be out of order only where they meet
    # the head candidates (columns 0–2)
    if w.k >= 3:
        unsorted = (probs[:, :, 1] > probs[:, :, 0]) | (probs[:, :, 2] > probs[:, :, 1])
    else:
        unsorted = np.asarray((probs[:, :, 1:] > probs[:, :, :-1]).any(axis=2))
    if unsorted.any():  # a runner-up above the head (low confidence): keep rows sorted
        order = np.argsort(-probs[unsorted], axis=1, kind="stable")
        probs[unsorted] = np.take_along_axis(probs[unsorted], order, axis=1)
        weights[unsorted] = np.take_along_axis(weights[unsorted], order, axis=1)
    src._probs[slot] = probs
    # the target's token: rank r with probability weights[r] (rows scaled down to a total
    # of 1 where they would exceed it), else outside (rank K): the number of cumulative
    # weights below a uniform
    # (cumulative sums and the count as small matrix products: much faster than
    # cumsum/sum along a 16-wide axis)
    k = w.k
    cdf = (weights.reshape(-1, k) @ src._upper).reshape(steps, depth, k)
    cdf /= np.maximum(cdf[:, :, -1:], 1.0)
    below = (target_u > cdf).reshape(-1, k).astype(np.float64) @ src._ones
    src._target[slot, :, :depth] = below.reshape(steps, depth)
    src._target[slot, :, depth] = -1
