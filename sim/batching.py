"""BatchSums: a batch's tree sizes and contexts reduced to the few sums one pass's features need.

A batched pass's features (:class:`~bastion.sim.pass_pricing.PassPricer`) depend on the batch
only through sums over its requests: Σ s, Σ s², Σ s·c, Σ c, with every context quantised up to a
multiple of the truth's ``context_quantum`` (cache granularity). The sums come from one Gram
matrix of the rows (1, s_i, ⌈c_i / quantum⌉) kept in a reused buffer (whole numbers, so exact).
The bucket only coarsens the truth's dependence on context (attention grows by well under 0.1 %
per 16 tokens), not its dependence on the tree.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_min = np.minimum.reduce

try:  # the optional compiled kernel (setup.py): a step's sums in one call
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _kernel = None
_sums = getattr(_kernel, "sums", None)


def compiled_sums(
    sizes: IntArray | None, contexts: npt.ArrayLike, quantum: int
) -> tuple[int, ...] | None:
    """``bastion._bestfirst.sums`` of a step's 1-D int64 arrays: (B, Σ⌈c / quantum⌉) without
    ``sizes``, else (B, Σ s, Σ s², Σ⌈c / quantum⌉, Σ s·⌈c / quantum⌉), whole numbers that
    doubles hold exactly (so numpy's float sums of them, in any order); None where it does not
    answer (no kernel, other arrays, values out of its range): numpy's path then does."""
    if _sums is None or getattr(contexts, "ndim", 0) != 1:
        return None
    return _sums(sizes, contexts, quantum)  # type: ignore[no-any-return]


def decode_terms(got: tuple[int, ...], quantum: int) -> tuple[int, float, float, float, float]:
    """:meth:`BatchSums.decode_sums`' answer from :func:`compiled_sums`' five whole numbers:
    (B, Σ s, the tree blocks' pairs Σ s·c + Σ s², the KV tokens Σ c + Σ s, the causal pairs
    Σ s·c + Σ s(s + 1)/2), contexts quantised."""
    b, tokens, s_sq, k_sum, s_k = (got[0], *map(float, got[1:]))
    q = quantum
    return b, tokens, q * s_k + s_sq, q * k_sum + tokens, q * s_k + (s_sq + tokens) / 2.0


def quantise(contexts: npt.ArrayLike, quantum: int) -> Array:
    """Contexts rounded up to a multiple of ``quantum`` (not validated)."""
    return np.ceil(np.asarray(contexts, dtype=np.float64) / quantum) * quantum


class BatchSums:
    """Quantised contexts and the sums of decode passes, with a reused scratch buffer."""

    def __init__(self, context_quantum: int) -> None:
        self.context_quantum = context_quantum
        self._quantum = float(context_quantum)
        self._rows = np.ones((3, 64))  # scratch rows (1, s, ⌈c / quantum⌉) of a tree pass

    def quantise(self, contexts: npt.ArrayLike) -> Array:
        """Contexts rounded up to a multiple of the quantum (not validated)."""
        return quantise(contexts, self.context_quantum)

    def quantise_one(self, context: float) -> float:
        """One context rounded up to a multiple of the quantum."""
        q = self.context_quantum
        return float(math.ceil(context / q) * q)

    def buckets(self, contexts: npt.ArrayLike) -> Array:
        """⌈c / context_quantum⌉ per request as a 1-D float array (validated: ≥ 0)."""
        c = np.asarray(contexts)
        if c.ndim != 1:
            c = np.atleast_1d(c)
            if c.ndim != 1:
                raise ConfigError(f"contexts must be 1-D, got shape {c.shape}")
        k = c / self._quantum
        if k.dtype != np.float64:
            k = k.astype(np.float64)
        np.ceil(k, out=k)
        if k.shape[0] and _min(k) < 0:
            raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
        return k

    def decode_sums(
        self, sizes: IntArray, contexts: npt.ArrayLike
    ) -> tuple[int, float, float, float, float]:
        """(requests, Σ s, Σ s·(c + s), Σ (c + s), Σ s·c + s(s + 1)/2) of decode passes,
        contexts quantised: the tree blocks' pairs and the causal pairs.

        The rows (1, s, ⌈c / quantum⌉) go into a reused buffer; their Gram matrix holds every
        sum at once (whole numbers, so exact) and one reduction their minima."""
        got = compiled_sums(sizes, contexts, self.context_quantum)
        if got is not None:  # the hot path: the same whole numbers, summed in C
            if got[0] == 0:
                return 0, 0.0, 0.0, 0.0, 0.0
            return decode_terms(got, self.context_quantum)
        c = np.asarray(contexts)
        b = sizes.shape[0]
        if c.shape != (b,):
            c = np.atleast_1d(c)
            if c.ndim != 1:
                raise ConfigError(f"contexts must be 1-D, got shape {c.shape}")
            if c.shape[0] != b:
                raise ConfigError(f"{b} tree sizes but {c.shape[0]} contexts; give one each")
        if b == 0:
            return 0, 0.0, 0.0, 0.0, 0.0
        if b > self._rows.shape[1]:
            self._rows = np.ones((3, max(b, 2 * self._rows.shape[1])))
        rows = self._rows[:, :b]
        rows[1] = sizes
        k = rows[2]
        np.divide(c, self._quantum, out=k)
        np.ceil(k, out=k)
        _, s_min, k_min = _min(rows, axis=1).tolist()
        if s_min < 1 or k_min < 0:
            raise ConfigError("every request needs s ≥ 1 tokens and a context c ≥ 0")
        (_, tokens, k_sum), (_, s_sq, s_k), _ = np.dot(rows, rows.T).tolist()
        q = self.context_quantum
        return b, tokens, q * s_k + s_sq, q * k_sum + tokens, q * s_k + (s_sq + tokens) / 2.0

    def ar_sums(self, contexts: npt.ArrayLike) -> tuple[int, float, float, float]:
        """The same for one token per request (an autoregressive step)."""
        b, k_sum = self.bucket_sum(contexts)
        kv = self.context_quantum * k_sum + b if b else 0.0
        return b, float(b), kv, kv

    def bucket_sum(self, contexts: npt.ArrayLike) -> tuple[int, float]:
        """(B, Σ ⌈c / context_quantum⌉): :meth:`buckets`' count and sum (validated)."""
        got = compiled_sums(None, contexts, self.context_quantum)
        if got is not None:
            return got[0], float(got[1])
        k = self.buckets(contexts)
        return k.shape[0], float(np.add.reduce(k))
