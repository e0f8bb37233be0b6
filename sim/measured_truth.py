"""The simulated GPU under a measured truth: each pass and host cost read off its MeasuredCosts.

A truth with a ``[measured]`` section (:class:`~bastion.sim.measured.MeasuredCosts`, fitted from
real steps on one machine) prices every part of a step from those fits instead of the roofline:
the verifier's call per step kind, the drafter's pass per preparation, the host's build and
decode loop per kind and control, and each prefill chunk prefilled alone. These functions turn
:class:`~bastion.sim.gpu.SimulatedGPU`'s arguments into the measured terms' (whole numbers, a
control name); the GPU adds the noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.sim.measured import MeasuredCosts
from bastion.sim.prefill import Chunks, checked_chunks


def ints(values: npt.ArrayLike, what: str, like: list[int] | None = None) -> list[int]:
    """A 1-D list of whole numbers ≥ 0 (one per request of ``like``, when given)."""
    a = np.atleast_1d(np.asarray(values))
    if a.ndim != 1:
        raise ConfigError(f"{what} must be 1-D, got shape {a.shape}")
    if a.size and (not np.all(np.isfinite(a)) or np.min(a) < 0):
        raise ConfigError(f"{what} must be finite and ≥ 0")
    out = [math.ceil(v) for v in a.tolist()]
    if like is not None and len(out) != len(like):
        raise ConfigError(f"{len(like)} tree sizes but {len(out)} contexts; give one each")
    return out


def control(controller: bool | str) -> str:
    """The measured truth's control of a step: static, decide, or repeat."""
    return "repeat" if controller == "repeat" else "decide" if controller else "static"


def measured_prep(
    m: MeasuredCosts, tree_sizes: npt.ArrayLike, topk: bool, controller: bool | str, path: bool
) -> float:
    """The measured host time of a step's preparation (build and decode loop together)."""
    kind = "chain" if not topk or path else "tree"
    return sum(m.host_s(kind, control(controller), ints(tree_sizes, "sz")))


def measured_pass(
    m: MeasuredCosts,
    kind: str,
    tree_sizes: npt.ArrayLike,
    contexts: npt.ArrayLike,
    prefill_tokens: npt.ArrayLike,
    prefill_contexts: npt.ArrayLike,
) -> float:
    """The measured verifier's call, plus each prefill chunk prefilled alone."""
    sizes = ints(tree_sizes, "tree sizes")
    ctx = ints(contexts, "contexts", sizes) if sizes else []
    return measured_verify(m, kind, sizes, ctx, checked_chunks(prefill_tokens, prefill_contexts))


def measured_verify(
    m: MeasuredCosts, kind: str, sizes: list[int], contexts: list[int], chunks: Chunks
) -> float:
    """:func:`measured_pass` on checked sizes, contexts and chunks."""
    seconds = m.prefill_s(*chunks) if chunks[0] else 0.0
    if sizes:
        seconds += m.verify_s(kind, sizes, contexts)
    elif not chunks[0]:
        raise ConfigError("a pass needs at least one request")
    return seconds


def measured_step(
    m: MeasuredCosts,
    noisy: Callable[[float], float],
    unbias: float,
    kind: str,
    tree_sizes: npt.ArrayLike,
    contexts: npt.ArrayLike,
    topk: bool,
    controller: bool | str,
    prefill_tokens: npt.ArrayLike,
    prefill_contexts: npt.ArrayLike,
    builder: str = "",
    appended: int | None = None,
) -> tuple[float, float, float, float]:
    """:meth:`~bastion.sim.gpu.SimulatedGPU.step_s` under a measured truth: (draft, host, verify,
    unobserved), each measured for the step's kind, preparation and control; noisy (``noisy``,
    then × ``unbias``), drawn in that order. ``unobserved``: the host's decode-loop share, which
    a real engine's clock does not show its cost model. ``appended``: the target features the
    drafter takes before its pass, summed over the requests (None: the truth's mean)."""
    sizes = ints(tree_sizes, "tree sizes")
    ctx = ints(contexts, "contexts", sizes)
    if kind not in ("ar", "chain", "tree"):
        raise ConfigError(f"unknown step kind {kind!r}; accepted: ar, chain, tree")
    draft = 0.0
    if kind != "ar":
        draft = noisy(m.draft_s("topk" if topk else "argmax", ctx, appended)) * unbias
    build, loop = m.host_s(kind, control(controller), sizes, builder)
    host = noisy(build + loop) * unbias
    chunks = checked_chunks(prefill_tokens, prefill_contexts)
    verify = noisy(measured_verify(m, kind, sizes, ctx, chunks)) * unbias
    unobserved = host * loop / (build + loop) if build + loop > 0 else 0.0
    return draft, host, verify, unobserved
