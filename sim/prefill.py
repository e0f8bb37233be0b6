"""Prefill chunks in the simulated GPU: chunked prompt prefill, alone or riding with a decode step.

:meth:`~bastion.sim.gpu.SimulatedGPU.prefill_truth` prices one pass that processes chunks of new
prompt tokens for several requests (causal attention, no tree mask), and ``verify_*`` / ``ar_*``
accept optional prefill chunks riding in the same forward pass as the decode step (chunked prefill
mixed into decode, as Sarathi-Serve and vLLM do). In such a pass

- the token count T (every GEMM, norm, KV write, tile padding and tile step) counts the decode
  tokens and the chunk tokens together;
- a causal chunk of n new tokens over c cached ones computes Σ_{j=1..n} (c + j) =
  n·c + n(n+1)/2 (query, key) pairs (:func:`causal_chunk_pairs`; token j sees the c cached keys
  and the new keys up to itself — a causal kernel skips the masked upper triangle, unlike the
  tree pass's masked kernel that computes the whole s·(c+s) block), reads c + n keys/values per
  layer and no mask;
- the LM head runs on the rows whose logits are needed: every tree token (or the one AR token)
  of a decode request and one row per prefill chunk (its last token, as vLLM computes them);
- the tree-attention penalty scales the attention operators by 1 + penalty × (share of the
  pass's attention pairs that belong to trees): the causal chunk's part of the kernel is not
  slowed by the tree mask. A pass without chunks is priced exactly as before.

This module holds the chunks' default size, their causal pairs and their validation; the
pricing is :class:`~bastion.sim.pass_pricing.PassPricer`'s.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import array, public

__all__ = ["DEFAULT_PREFILL_CHUNK", "causal_chunk_pairs"]

Array = npt.NDArray[np.float64]

DEFAULT_PREFILL_CHUNK = 512
"""Prompt tokens one request may put into one forward pass when prefill is chunked.

The default of the serving configuration's ``prefill_chunk_tokens``: a prompt longer than this
is prefilled over several passes, each of which may also carry the decode step of the running
requests (Sarathi-Serve's chunked prefill; vLLM's ``max_num_batched_tokens`` plays a similar
role). The value is a conventional choice, not a tuned one: 512 tokens fill the GEMM tiles of a
pass, and with the default GroundTruth for Qwen3-8B on an H100 SXM a 512-token chunk riding with a
32-request verification step (trees of 16, contexts of 1000) takes it from ≈ 21 ms to ≈ 36 ms."""


@public(
    new_tokens=array(lo=0, hi=2.0**53),
    contexts=array(lo=0, hi=2.0**53),
    broadcast=("new_tokens", "contexts"),
)
def causal_chunk_pairs(new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> Array:
    """(query, key) pairs a causal attention kernel computes for prefill chunks.

    A chunk of n new tokens over c tokens already cached: token j (j = 1 … n) sees the c cached
    keys and the j new keys up to and including itself, so the chunk computes
    Σ_j (c + j) = n·c + n(n + 1)/2 pairs (elementwise over the arguments).
    """
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    return np.asarray(n * c + n * (n + 1.0) / 2.0, dtype=np.float64)


Chunks = tuple[list[float], list[float]]


def checked_chunks(new_tokens: npt.ArrayLike, contexts: npt.ArrayLike) -> Chunks:
    """Validated prefill chunks as two equal-length lists of floats (possibly empty).

    Lists or tuples of Python ints (what the serving loop passes) are checked in Python; anything
    else goes through numpy.
    """
    if isinstance(new_tokens, list | tuple) and isinstance(contexts, list | tuple):
        if not new_tokens and not contexts:
            return [], []  # the common case (no prefill)
        if all(type(x) is int for x in new_tokens) and all(type(x) is int for x in contexts):
            if len(new_tokens) != len(contexts):
                raise ConfigError(
                    f"prefill chunks need equal-length 1-D token counts and contexts; got "
                    f"{len(new_tokens)} and {len(contexts)}"
                )
            if min(new_tokens) < 1 or min(contexts) < 0:
                raise ConfigError(
                    "every prefill chunk needs a whole number ≥ 1 of new tokens and a whole "
                    f"context ≥ 0; got tokens {list(new_tokens)}, contexts {list(contexts)}"
                )
            return [float(x) for x in new_tokens], [float(x) for x in contexts]
    n = np.atleast_1d(np.asarray(new_tokens, dtype=np.float64))
    c = np.atleast_1d(np.asarray(contexts, dtype=np.float64))
    if n.ndim != 1 or n.shape != c.shape:
        raise ConfigError(
            f"prefill chunks need equal-length 1-D token counts and contexts; got shapes "
            f"{n.shape} and {c.shape}"
        )
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(c))):
        raise ConfigError("prefill token counts and contexts must be finite")
    if np.any(n < 1) or np.any(c < 0) or np.any(n != np.round(n)) or np.any(c != np.round(c)):
        raise ConfigError(
            "every prefill chunk needs a whole number ≥ 1 of new tokens and a whole context ≥ 0; "
            f"got tokens {n.tolist()}, contexts {c.tolist()}"
        )
    return n.tolist(), c.tolist()
