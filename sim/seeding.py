"""Seeded numpy generators, cheaply: the state `default_rng(entropy)` starts in, set on a kept one.

The simulator seeds one generator per request from ``[seed, index, …]`` (its lengths, its
drafter–target stream); numpy builds each through a ``SeedSequence`` object and a new ``PCG64``,
≈ 10 µs a request twice over. :func:`seeded` gives the generator in the very same state — the
seed sequence's words and the PCG64 seeding from the compiled kernel (``seed_state``; where an
entry is 2**64 or more, or a numpy integer, the words from the kernel and the seeding on Python
integers) — and can re-state a generator the caller keeps instead of building one (the tests
compare states and draws with numpy's for seeds and indices across the 32-bit range and beyond).
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt
from numpy.random.bit_generator import ISeedSequence

try:
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the build without the extension
    _kernel = None

_seed_words = getattr(_kernel, "seed_words", None)
_seed_state = getattr(_kernel, "seed_state", None)

_MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's 128-bit LCG multiplier
_MASK = (1 << 128) - 1
_WORD = (1 << 32) - 1


class _Replaced(ISeedSequence):
    """The seed sequence of a generator :func:`seeded` makes: its whole state is set at once,
    so the words PCG64 seeds itself from first are never used — zeros, without the ≈ 4 µs of
    hashing a ``SeedSequence`` spends on them (a new generator per slot per serve)."""

    def generate_state(
        self, n_words: int, dtype: npt.DTypeLike = np.uint32
    ) -> npt.NDArray[np.uint32 | np.uint64]:
        return np.zeros(n_words, dtype)


_ANY_SEED = _Replaced()  # a new generator's seed, replaced at once


def seeded(
    entropy: tuple[int, ...] | list[int], generator: np.random.Generator | None = None
) -> np.random.Generator:
    """A generator in the state ``np.random.default_rng(list(entropy))`` starts in.

    ``generator``, a PCG64 generator the caller owns, is re-stated and returned (its previous
    state is lost); without it a new generator is made. Entropies that are not all non-negative
    integers, or without the compiled kernel, go through numpy itself (and its errors)."""
    # the state and increment in one compiled call (a few ints below 2**64: a request's);
    # else on Python ints below
    made = _seed_state(entropy) if _seed_state is not None else None
    if made is not None:
        state, inc = made
    else:
        words = _entropy_words(entropy)
        if words is None or _seed_words is None:
            return np.random.default_rng(list(entropy))
        out = _seed_words(struct.pack(f"<{len(words)}I", *words), 8)
        # numpy's PCG64 seeding: four 64-bit words (32-bit pairs, little-endian), the first
        # two the initial state, the last two the stream; state 0, one step, add, one step
        a, b, c, d = struct.unpack("<4Q", out)
        inc = ((((c << 64) | d) << 1) | 1) & _MASK
        state = ((inc + ((a << 64) | b)) * _MULTIPLIER + inc) & _MASK
    if generator is None or type(generator.bit_generator) is not np.random.PCG64:
        generator = np.random.Generator(np.random.PCG64(_ANY_SEED))  # type: ignore[arg-type]
    generator.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": state, "inc": inc},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return generator


def _entropy_words(entropy: tuple[int, ...] | list[int]) -> list[int] | None:
    """The 32-bit words ``SeedSequence`` assembles from ``entropy`` (each integer little-endian,
    0 as one word), or None where an entry is not a non-negative integer."""
    words: list[int] = []
    for v in entropy:
        if type(v) is not int:
            if not isinstance(v, np.integer):
                return None
            v = int(v)
        if v < 0:
            return None
        words.append(v & _WORD)
        v >>= 32
        while v:
            words.append(v & _WORD)
            v >>= 32
    return words
