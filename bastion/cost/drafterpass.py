"""The DFlash drafter's roofline: one draft pass over a batch, and its fast form per batch size.

:func:`drafter_pass` counts a draft for every request of a batch with the raw terms of
:mod:`bastion.cost.opcounts` (the drafter's context projection and cache append, its layers
over a block of ``block_size`` tokens, the target's LM head over the masked slots);
:class:`DrafterPricer` gives the same numbers for a whole batch from two evaluations per batch
size (what the cost model and the simulator call every step).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from bastion.cost.breakdown import OperatorCost, PassShape, RooflineBreakdown
from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec
from bastion.cost.opcounts import (
    Raw,
    RooflineOptions,
    check_layers,
    gemm_op,
    layer_ops,
    per_gpu,
    price_raws,
)
from bastion.cost.parallel import comm_op
from bastion.errors import ConfigError
from bastion.guard import each, integer, number, public

try:  # the optional compiled kernel: a pass's operator sum in one call
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the extension is optional
    _compiled = None
_drafter_s = getattr(_compiled, "drafter_s", None)

__all__ = ["DrafterPricer", "drafter_pass"]

Array = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike


@public(contexts=each(number(lo=0.0)), new_context_tokens=integer(lo=0))
def drafter_pass(
    drafter: DrafterSpec,
    hw: HardwareProfile,
    contexts: Iterable[ArrayLike],
    options: RooflineOptions | None = None,
    new_context_tokens: int | None = None,
) -> RooflineBreakdown:
    """One DFlash draft for each request of a batch (``contexts`` = their cached lengths).

    Per request: ``fc`` projects the newly committed tokens' tapped features (``taps·h → h``,
    default: a full block of new tokens, an upper bound) and each layer appends their K/V to the
    drafter cache; then the block of ``block_size`` tokens runs through the drafter's layers,
    attending (non-causally, no mask) to the cached context and to the block; the target's LM head
    produces logits for the ``block_size − 1`` masked slots. Embedding: gathered rows only.

    With ``options.tensor_parallel`` > 1 the drafter runs on the target's GPUs split the same
    way (one GPU's share of every count), and each of its layers ends its attention and its
    FFN with an all-reduce of the block's activations (an ``all_reduce`` entry, as the
    target's pass; :mod:`bastion.cost.parallel`).
    """
    opt = options or RooflineOptions()
    b = drafter.block_size
    new = b if new_context_tokens is None else new_context_tokens
    ctx = list(contexts)
    shape = PassShape.of_batch(np.full(len(ctx), float(b)), np.asarray(ctx, float), masked=False)
    priced = _priced(drafter, hw, opt, float(len(ctx)), shape, new)
    return RooflineBreakdown(priced, meta={"layers": float(per_gpu(drafter.model, opt).layers)})


def _priced(
    drafter: DrafterSpec,
    hw: HardwareProfile,
    opt: RooflineOptions,
    n_req: float | Array,
    shape: PassShape,
    new: int,
) -> tuple[OperatorCost, ...]:
    """:func:`drafter_pass`'s operators for ``n_req`` requests whose pass has ``shape``: one
    pass (floats), or several at once (arrays over passes: every count is elementwise, so each
    pass's numbers are the ones it would get alone)."""
    full = drafter.model
    m = per_gpu(full, opt)
    check_layers(m)
    b = drafter.block_size
    t = shape.tokens
    zero = np.zeros(())
    h, v = m.hidden, m.vocab
    new_t = np.asarray(n_req * new)
    fc_in = drafter.taps * h
    raws: list[tuple[Raw, int]] = [
        (("embedding", zero, zero, zero, 2.0 * t * h, 1), 1),
        (gemm_op("ctx_fc", new_t, new_t, fc_in, h), 1),
        (("ctx_norm", 4.0 * new_t * h, np.asarray(float(h)), zero, 2.0 * new_t * h, 1), 1),
        # K/V of the new context tokens; weights are those of k_proj/v_proj, counted there
        (
            ("ctx_kv_proj", 2.0 * new_t * h * 2 * m.h_kv, zero, 2.0 * new_t * m.h_kv, new_t * h, 2),
            m.layers,
        ),
    ]
    plain = _untensored(opt) if opt.tensor_parallel > 1 else opt  # m is split
    raws += [(op, m.layers) for op in layer_ops(m, shape, plain, masked=False)]
    logit_rows = np.asarray(n_req * (b - 1))
    raws.append((("final_norm", 4.0 * t * h, np.asarray(float(h)), zero, 2.0 * t * h, 1), 1))
    raws.append((gemm_op("lm_head", logit_rows, logit_rows, h, v), 1))
    priced = price_raws(raws, hw, opt)
    if opt.tensor_parallel > 1:
        priced = (*priced, comm_op(full, hw, opt.tensor_parallel, opt.bytes_per_act, t))
    return priced


@functools.lru_cache(maxsize=64)
def _untensored(opt: RooflineOptions) -> RooflineOptions:
    """``opt`` on one GPU (the options a split model's own layers are counted with)."""
    return replace(opt, tensor_parallel=1)


LINE_BLOCK = 64  # DrafterPricer prices the lines of this many batch sizes at once


@public
class DrafterPricer:
    """:func:`drafter_pass` of a whole batch in a few numpy calls, with identical numbers.

    For a fixed number n of requests every FLOP and byte count of a drafter pass is affine in
    the sum of their contexts Σc (attention pairs b·Σc + n·b², KV tokens Σc + n·b); everything
    else (tile padding, experts touched, the LM head's rows) depends on n alone. So each
    operator's compute and memory seconds are read off two evaluations of :func:`drafter_pass`
    the first time a batch size is seen (Σc = 0 and Σc = 1), and a pass then costs
    Σ_op max(compute_op(Σc), memory_op(Σc)) + launches.
    """

    def __init__(
        self, drafter: DrafterSpec, hw: HardwareProfile, options: RooflineOptions | None = None
    ) -> None:
        self.drafter, self.hw = drafter, hw
        self.options = options or RooflineOptions()
        self._lines: dict[int, tuple[Array, Array, float]] = {}

    def line(self, requests: int) -> tuple[Array, Array, float]:
        """(per-operator [compute…, memory…] seconds at Σc = 0, their change per context
        token, the launch seconds) for a pass over ``requests`` requests."""
        line = self._lines.get(requests)
        if line is None:
            if requests < 1:
                raise ConfigError(f"a drafter pass needs at least one request; got {requests}")
            first = (requests - 1) // LINE_BLOCK * LINE_BLOCK + 1
            self._lines.update(self._block(np.arange(first, first + LINE_BLOCK)))
            line = self._lines[requests]
        return line

    def _block(self, sizes: npt.NDArray[np.int64]) -> dict[int, tuple[Array, Array, float]]:
        """The lines of several batch sizes n in one pricing: drafter_pass of n requests at
        contexts 0 … 0 and 1, 0 … 0 (their features are whole numbers, n·b tokens, n·b² and
        n·b² + b attention pairs, n·b and n·b + 1 KV tokens, exact as of_batch sums them), each
        operator's seconds priced elementwise over the sizes: the numbers of one size alone."""
        b, opt = float(self.drafter.block_size), self.options
        n = sizes.astype(np.float64)
        tokens, pairs = n * b, n * b * b
        passes = []
        for extra in (0.0, 1.0):  # a context of one token on the first request: Σc = 1
            shape = PassShape(tokens, pairs + extra * b, tokens + extra, np.zeros(()))
            passes.append(_priced(self.drafter, self.hw, opt, n, shape, self.drafter.block_size))
        count = sizes.shape[0]

        def seconds(ops: tuple[OperatorCost, ...]) -> Array:  # [sizes, compute… memory…]
            every = [np.broadcast_to(op.compute_s, (count,)) for op in ops]
            every += [np.broadcast_to(op.memory_s, (count,)) for op in ops]
            return np.stack(every, axis=1).astype(np.float64)

        c0, c1 = seconds(passes[0]), seconds(passes[1])
        slope = c1 - c0
        launch = float(sum(op.launch_s for op in passes[0]))
        # the all-reduces (tensor parallelism) depend on the block's tokens alone: a constant
        comm = np.broadcast_to(
            sum((np.asarray(op.comm_s) for op in passes[0]), np.zeros(())), (count,)
        )
        return {
            int(size): (c0[i].copy(), slope[i].copy(), launch + float(comm[i]))
            for i, size in enumerate(sizes.tolist())
        }

    def total_s(self, requests: int, context_sum: float) -> float:
        """Seconds of one drafter pass over ``requests`` requests holding ``context_sum``
        cached tokens in all."""
        # the line's cache read here (a call less per pass); a size not seen yet: line()
        at0, slope, launch_s = self._lines.get(requests) or self.line(requests)
        if _drafter_s is not None:  # the same operations, compiled (tests/test_drafter_lines.py)
            return float(_drafter_s(at0, slope, float(context_sum))) + launch_s
        y = at0 + float(context_sum) * slope
        n = y.shape[0] // 2
        return float(np.add.reduce(np.maximum(y[:n], y[n:]))) + launch_s
