"""PassPricer: one forward pass's truth, its features priced on the per-operator roofline.

The truth is the per-operator roofline of :mod:`bastion.cost.roofline` evaluated with what real
GPUs add and the bare roofline does not know (the :class:`~bastion.sim.ground_truth.GroundTruth`
fields: efficiencies, tile steps, launch cost, the tree mask's penalty on attention, grouped-GEMM
effects on the experts, measured or kernel-aware GEMM shape factors, the host's dispatch).

Passes are priced from the per-operator FLOP and byte counts of
:class:`~bastion.cost.roofline.LinearPricer` (built with the truth's device and options): every
count of a target pass is affine in seven features (1, T, padded T, attention pairs, KV tokens,
mask elements, experts touched), so one pass is one small matrix-vector product, the per-operator
max(compute, memory) and a weighted sum (the tree-attention penalty is a per-operator weight).
A drafter pass over n requests is affine in Σ c_i for fixed n (tile padding and experts touched
depend on n alone), so its per-operator counts are read off
:func:`~bastion.cost.roofline.drafter_pass` at Σ c = 0 and Σ c = 1 once per batch size. Both routes
give the per-operator roofline's numbers to rounding (≪ 1e-12 relative; the tests compare them
with ``price_pass`` and ``drafter_pass``). The pass's features come from
:class:`~bastion.sim.batching.BatchSums`; this module knows nothing of noise or caching per
context.
"""

from __future__ import annotations

import bisect
import logging
import math
import struct
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from bastion.cost.drafterpass import DrafterPricer
from bastion.cost.hardware import HardwareProfile
from bastion.cost.kernels import step_factors
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import check_tp, tp_shard
from bastion.cost.roofline import LinearPricer
from bastion.errors import ConfigError
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.prefill import Chunks
from bastion.sim.routing import expected_experts, routing_draws, routing_draws_one

try:  # the optional compiled kernel (setup.py): a pass's operator sums in one call
    from bastion import _bestfirst as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _kernel = None
_pass_sums = getattr(_kernel, "pass_sums", None)

_ATTENTION_OPS = ("attn_scores", "attn_values")

# one pass's seven features written as doubles into a kept buffer (what np.array of their
# list holds, Python ints and floats converted alike) — a third of np.array's time per pass
_PACK_ROW = struct.Struct("7d").pack_into

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# (drafter, device, options) reprs → the drafter's pass pricer (see SimulatedGPU.__post_init__)
_DRAFTERS: dict[tuple[str, str, str], DrafterPricer] = {}

# (model, profile, options) reprs → the kernel-aware step factors [T, operators]
_STEP_FACTORS: dict[tuple[str, str, str], Array] = {}

# Operators that are GEMMs over the pass's tokens (the measured shape factor applies to them)
_GEMM_OPS = frozenset(
    (
        "q_proj",
        "k_proj",
        "v_proj",
        "qkv_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "gate_up_proj",
        "down_proj",
        "lm_head",
        "router",
    )
)
_EXPERT_OPS = frozenset(("experts_gate_up", "experts_act", "experts_down"))


_KERNEL_KEYS = ("sm_clock_hz", "max_threads_per_sm")
_NO_KERNEL_MODEL: set[tuple[str, str | None]] = set()  # profiles already warned about


def _kernel_model_applies(hw: HardwareProfile) -> bool:
    """Whether the kernel-aware GEMM model (``[gemm_shape] model = "kernel"``) can price
    ``hw``: it models GPU kernels (tiles and waves over SMs at the SM clock, resident threads),
    so it needs the profile's ``[peak] sm_clock_hz`` and ``max_threads_per_sm``. A profile
    without them — every ``bastion hw probe`` profile (a CPU has neither), or a GPU profile
    that omits them — gets no kernel steps: its GEMMs are priced on the smooth roofline
    (factor 1), with one warning per profile and process saying which keys would apply it."""
    missing = [k for k in _KERNEL_KEYS if getattr(hw, k) is None]
    if not missing:
        return True
    if (hw.name, hw.path) not in _NO_KERNEL_MODEL:
        _NO_KERNEL_MODEL.add((hw.name, hw.path))
        log.warning(
            'profile %r%s has no %s: the truth\'s [gemm_shape] model = "kernel" (GPU GEMM '
            "tiles and waves) is not applied to it, its GEMMs are priced on the smooth roofline "
            "(factor 1). A GPU: add those keys to the profile's [peak] table; a CPU: a truth "
            "without [gemm_shape] says the same without this warning",
            hw.name,
            f" ({hw.path})" if hw.path else "",
            " and ".join(f"[peak].{k}" for k in missing),
        )
    return False


class PassPricer:
    """The truth's price of target and drafter passes on one device, from their features."""

    def __init__(
        self,
        hardware: HardwareProfile,
        model: ModelSpec,
        drafter: DrafterSpec,
        truth: GroundTruth,
        tp: int = 1,
    ) -> None:
        self.model, self.drafter, self.truth = model, drafter, truth
        t = truth
        hw = hardware
        eff_c = min(1.0, hw.compute_efficiency * t.compute_scale)
        eff_m = min(1.0, hw.memory_efficiency * t.memory_scale)
        self.device = hw.with_efficiency(eff_c, eff_m, hw.launch_overhead_s * t.launch_scale)
        if tp > 1:  # the truth's link: the profile's bandwidth × interconnect_scale
            check_tp(model, tp, hw)
            link = hw.interconnect
            assert link is not None  # check_tp
            scaled = replace(link, bandwidth=link.bandwidth * t.interconnect_scale)
            self.device = replace(self.device, interconnect=scaled)
        plain = RooflineOptions()  # 0 widths: the roofline's (2 bytes)
        self.options = RooflineOptions(
            tile_tokens=t.tile_tokens,
            bytes_per_param=float(t.weight_bytes or plain.bytes_per_param),
            bytes_per_act=float(t.activation_bytes or plain.bytes_per_act),
            tensor_parallel=tp,
        )
        # The target's per-operator counts, read off the masked LinearPricer (the unmasked one
        # differs only by a zero mask column, and an unmasked pass has a zero mask feature).
        # Rows: the features (1, T, padded T, attention pairs, KV tokens, mask elements,
        # experts touched); columns: compute seconds of every operator, then memory seconds.
        pricer = LinearPricer(self.model, self.device, self.options, masked=True)
        names = pricer.names
        self._ops = len(names)
        self._peak, self.byte_rate = pricer.flop_rate, pricer.byte_rate
        self._matrix = np.hstack(
            (
                np.vstack(pricer.flops) / self._peak,
                np.vstack(pricer.nbytes) / self.byte_rate,
            )
        )
        self._attention = np.array([n in _ATTENTION_OPS for n in names], dtype=np.float64)
        self._gemm = np.array([n in _GEMM_OPS for n in names], dtype=np.float64)
        self._expert_idx = np.array([i for i, n in enumerate(names) if n in _EXPERT_OPS], int)
        self._lm = names.index("lm_head")
        # the LM head's compute and memory columns (_lm_head: a prefill chunk's logit rows)
        self._lm_columns = self._matrix[:, [self._lm, self._ops + self._lm]]
        self._launch = np.asarray(pricer.launch_s, dtype=np.float64)
        # tensor parallelism: each pass's all-reduces, comm_const + comm_slope · T seconds
        self._comm = pricer.has_comm
        self._comm_const, self._comm_slope = pricer.comm_const, pricer.comm_slope
        self._launch_plain = float(self._launch.sum())
        self._launch_attention = float(np.dot(self._launch, self._attention))
        self._tile = t.tile_tokens
        self._step_s = self.model.layers * t.tile_step_s if t.tile_tokens else 0.0
        self._shape_t = np.asarray(t.gemm_shape_tokens, dtype=np.float64)
        self._shape_f = np.asarray(t.gemm_shape_factor, dtype=np.float64)
        self._shape_list = list(t.gemm_shape_tokens)
        # the kernel-aware model's step factor of every operator at T = 1 … its length (ones
        # for the non-GEMMs), for this GPU, model and kernel layout; shared like the drafter's
        self.phi: Array | None = None
        # (not for a profile without an SM clock, a probed CPU's: factor 1, one warning)
        if t.gemm_shape_model == "kernel" and _kernel_model_applies(hw):
            phi_key = (repr(self.model), repr(hw), repr(self.options))
            if phi_key not in _STEP_FACTORS:
                # one GPU's GEMMs: the split model's shapes (the all-reduces are no GEMMs)
                one = replace(self.options, tensor_parallel=1)
                phi_names, table = step_factors(tp_shard(self.model, tp), hw, one)
                if phi_names != names:
                    raise ConfigError("internal: kernel step factors out of operator order")
                _STEP_FACTORS[phi_key] = table
            self.phi = _STEP_FACTORS[phi_key]
        m = self.model
        self._moe = m.is_moe
        self._experts, self._per_token = m.experts, m.experts_per_token
        self._popularity = t.expert_popularity(m.experts) if m.is_moe and t.routing_skew else None
        self._half = t.moe_half_occupancy_per_sm * hw.sm_count
        self._layers = float(m.layers)
        self._host = t.host_layer_s > 0 or t.host_expert_s > 0
        # the [1, 7] feature rows of the pass being priced and of its LM head (price_mixed),
        # rewritten per pass through a memoryview and read at once by _price_one: no row
        # allocated (numpy's own aligned memory, which BLAS takes as it takes a fresh row)
        self._row, self._head = np.zeros((1, 7)), np.zeros((1, 7))
        self._row_bytes, self._head_bytes = self._row.data, self._head.data
        # one pass's operator sums in one compiled call (_price_one) where they need no more
        # than the kernel does: a dense target, no measured shape factors, and an attention
        # selector of at most two ones (its matrix product then sums the same in any order)
        self._sums = None
        ones = self._attention == 1.0
        if (
            _pass_sums is not None
            and not self._moe
            and not self._shape_list
            and int(np.count_nonzero(ones)) <= 2
            and bool(np.all(ones | (self._attention == 0.0)))
        ):
            self._sums = _pass_sums
        # shared by every simulated GPU of the same drafter, device and options: its lines are
        # a pure function of them, and each costs two full roofline evaluations to read off
        key = (repr(self.drafter), repr(self.device), repr(self.options))
        if key not in _DRAFTERS:
            _DRAFTERS[key] = DrafterPricer(self.drafter, self.device, self.options)
        self._drafter = _DRAFTERS[key]

    def experts_touched(self, tokens: npt.ArrayLike, requests: npt.ArrayLike = 1) -> Array:
        """The truth's expected distinct experts per layer for a pass of ``tokens`` tokens from
        ``requests`` requests (its own routing model, not the cost model's)."""
        draws = routing_draws(tokens, requests, self.truth.routing_correlation)
        return expected_experts(draws, self._experts, self._per_token, self._popularity)

    def touched(self, draws: float) -> float:
        """Expected distinct experts per layer for ``draws`` independent routings (0: dense)."""
        if not self._moe:
            return 0.0
        if self._popularity is None:
            e = self._experts
            return float(e * (1.0 - (1.0 - self._per_token / e) ** draws))
        return float(expected_experts(draws, self._experts, self._per_token, self._popularity))

    def _shape(self, tokens: float) -> float:
        """The measured GEMM shape factor at ``tokens`` (that of the next measured count)."""
        if not self._shape_list:
            return 1.0
        i = bisect.bisect_left(self._shape_list, tokens)
        return float(self._shape_f[min(i, len(self._shape_list) - 1)])

    def price(
        self,
        x: Array,
        tokens: Array,
        touched: Array,
        share: Array | float,
        head: tuple[Array, Array] | None = None,
    ) -> Array:
        """Truth of passes with feature rows ``x`` [n, 7] (``tokens`` [n] = column 1, ``touched``
        [n] = column 6), ``share`` of their attention pairs behind a masked kernel, and optionally
        the LM head priced on other rows (``head`` = its feature rows and token counts)."""
        per_op = self._per_op(x, tokens, touched)
        pen = self.truth.tree_attention_penalty * np.asarray(share, dtype=np.float64)
        total = np.add.reduce(per_op, axis=1) + pen * (per_op @ self._attention)
        if head is not None:
            total = total - per_op[:, self._lm] + _lm_head(self, *head)
        total = total + self._launch_plain + pen * self._launch_attention
        if self._comm:  # the all-reduces of tensor parallelism, after the device's time
            total = total + (self._comm_const + self._comm_slope * tokens)
        if self._step_s:
            total = total + self._step_s * (np.ceil(tokens / self._tile) - 1.0)
        return self._with_host(total, touched)

    def _per_op(self, x: Array, tokens: Array, touched: Array) -> Array:
        """[n, operators]: each operator's seconds in the passes of rows ``x`` (the longer of
        its compute and memory times, the grouped-GEMM and shape factors applied)."""
        n_ops = self._ops
        y = x @ self._matrix
        comp, mem = y[:, :n_ops], y[:, n_ops:]
        if self._moe and self._expert_idx.size:
            self._moe_efficiency(comp, mem, tokens, touched)
        per_op = np.maximum(comp, mem)
        if self._shape_list:
            idx = np.minimum(np.searchsorted(self._shape_t, tokens), self._shape_t.size - 1)
            phi = self._shape_f[idx]
            per_op = per_op * (1.0 + np.multiply.outer(phi - 1.0, self._gemm))
        elif self.phi is not None:
            if tokens.shape[0] == 1:  # one pass (the per-step path): a row, no index arrays
                per_op = per_op * self.phi[self.phi_row(float(tokens[0]))]
            else:
                per_op = per_op * self.phi[self.phi_rows(tokens)]
        return per_op

    def phi_row(self, tokens: float) -> int:
        """:meth:`phi_rows` of one pass, on Python numbers."""
        assert self.phi is not None
        return min(max(round(tokens) - 1, 0), int(self.phi.shape[0]) - 1)

    def phi_rows(self, tokens: Array) -> IntArray:
        """Rows of the kernel step table for these token counts (beyond it: its last row)."""
        assert self.phi is not None
        rows = np.rint(np.asarray(tokens, dtype=np.float64)).astype(np.int64) - 1
        return np.clip(rows, 0, self.phi.shape[0] - 1)

    def _moe_efficiency(self, comp: Array, mem: Array, tokens: Array, touched: Array) -> None:
        """Grouped-GEMM effects on the expert operators, in place: every touched expert's rows
        padded to ``moe_block_tokens`` (compute), and bandwidth that reaches its achievable
        level only when enough experts fill the SMs: × U / (U + U½), U½ = per-SM value × SMs."""
        t = self.truth
        idx = self._expert_idx
        u = np.maximum(touched, 1e-9)
        if t.moe_block_tokens:
            rows = tokens * self._per_token
            b = float(t.moe_block_tokens)
            padded = u * np.ceil(rows / u / b) * b
            comp[:, idx] *= (padded / np.maximum(rows, 1e-9))[:, None]
        if self._half > 0:
            mem[:, idx] *= ((u + self._half) / u)[:, None]

    def _with_host(self, gpu: Array, touched: Array) -> Array:
        """The framework's part: the host dispatches every layer's kernels (eager) while the
        GPU runs them, so a pass takes the longer of the two — or, with ``host_adds`` (a CPU,
        where one set of cores does both), their sum — plus a fixed per-pass overhead."""
        t = self.truth
        if self._host:
            host = self._layers * (t.host_layer_s + t.host_expert_s * touched)
            gpu = gpu + host if t.host_adds else np.maximum(gpu, host)
        return gpu + t.pass_overhead_s if t.pass_overhead_s else gpu

    def price_pass(
        self, requests: int, tokens: float, pairs: float, kv: float, tree: bool, causal_pairs: float
    ) -> float:
        """Truth of a decode pass without prefill chunks whose every token produces logits.

        ``tree``: the pass reads a tree mask (``pairs`` = the full s·(c + s) blocks); otherwise
        it is causal (``causal_pairs``), and the masked kernel runs only where the framework
        materialises the causal mask of a multi-token pass (``causal_reads_mask``)."""
        tile = self._tile
        padded = math.ceil(tokens / tile) * tile if tile > 0 else tokens
        masked = tree or (self.truth.causal_reads_mask and tokens > requests)
        p = pairs if masked else causal_pairs
        draws = routing_draws_one(tokens, requests, self.truth) if self._moe else 0.0
        touched = self.touched(draws) if self._moe else 0.0
        _PACK_ROW(self._row_bytes, 0, 1.0, tokens, padded, p, kv, p if masked else 0.0, touched)
        return _price_one(self, self._row, tokens, touched, 1.0 if masked else 0.0)

    def price_mixed(
        self,
        decode: tuple[int, float, float, float],
        chunks: Chunks,
        tree: bool,
        causal_pairs: float = 0.0,
    ) -> float:
        """Truth of one pass of decode requests (``decode`` = count, tokens, pairs, KV tokens;
        the count may be 0) and prefill chunks (not empty; contexts not yet quantised)."""
        n_decode, tokens, decode_pairs, kv = decode
        new, ctx = chunks
        q = self.truth.context_quantum
        masked = n_decode > 0 and (tree or (self.truth.causal_reads_mask and tokens > n_decode))
        masked_pairs = decode_pairs if masked else 0.0
        all_pairs = decode_pairs if masked else causal_pairs
        for n, c in zip(new, ctx, strict=True):
            cq = math.ceil(c / q) * q
            all_pairs += n * cq + n * (n + 1.0) / 2.0  # causal_chunk_pairs
            kv += cq + n
        touched = 0.0  # experts touched per layer: the routings of every token (MoE only)
        if self._moe:
            draws = routing_draws_one(tokens, n_decode, self.truth) if n_decode else 0.0
            for n in new:
                draws += routing_draws_one(n, 1, self.truth)
            touched = self.touched(draws)
        total_tokens = tokens + sum(new)
        logit_rows = tokens + len(new)
        tile = self._tile
        padded = math.ceil(total_tokens / tile) * tile if tile > 0 else total_tokens
        x, head = self._row, self._head
        _PACK_ROW(
            self._row_bytes, 0, 1.0, total_tokens, padded, all_pairs, kv, masked_pairs, touched
        )
        h_pad = math.ceil(logit_rows / tile) * tile if tile > 0 else logit_rows
        _PACK_ROW(self._head_bytes, 0, 1.0, logit_rows, h_pad, 0.0, 0.0, 0.0, 0.0)
        share = masked_pairs / all_pairs if all_pairs > 0 else 0.0
        return _price_one(self, x, total_tokens, touched, share, (head, float(logit_rows)))

    def price_curve(self, c: float, tree: bool, max_tree_size: int) -> Array:
        """Noise-free truth of a batch-1 pass for s = 1 … ``max_tree_size`` at the quantised
        context ``c``: tree passes (``tree``) or causal ones."""
        s = np.arange(1, max_tree_size + 1, dtype=np.float64)
        x = np.zeros((s.shape[0], 7))
        x[:, 0], x[:, 1], x[:, 4] = 1.0, s, c + s
        masked = np.full_like(s, 1.0 if tree else 0.0)
        if not tree and self.truth.causal_reads_mask:
            masked[1:] = 1.0  # the framework's materialised causal mask (s > 1)
        pairs = np.where(masked > 0, s * (c + s), s * c + s * (s + 1.0) / 2.0)
        x[:, 3] = pairs
        x[:, 5] = pairs * masked
        tile = self._tile
        x[:, 2] = np.ceil(s / tile) * tile if tile > 0 else s
        touched = np.zeros_like(s)
        if self._moe:
            touched = self.experts_touched(s, 1)
            x[:, 6] = touched
        return self.price(x, s, touched, masked)

    def price_draft(self, buckets: Array) -> float:
        """Noise-free truth of one DFlash drafter pass over requests whose contexts are
        ``buckets`` context quanta (its roofline, plus the framework's per-pass overhead and, in
        eager mode, the host's dispatch of its layers)."""
        return self.price_draft_sum(buckets.shape[0], float(np.add.reduce(buckets)))

    def price_draft_sum(self, b: int, bucket_sum: float) -> float:
        """:meth:`price_draft` of ``b`` requests whose buckets sum to ``bucket_sum``."""
        if b == 0:
            raise ConfigError("a pass needs at least one request")
        gpu = self._drafter.total_s(b, self.truth.context_quantum * bucket_sum)
        t = self.truth
        if t.host_layer_s:
            host = self.drafter.model.layers * t.host_layer_s
            gpu = gpu + host if t.host_adds else max(gpu, host)
        return gpu + t.pass_overhead_s


def _lm_head(p: PassPricer, hx: Array, ht: Array) -> Array:
    """The LM head's seconds on its own feature rows ``hx`` (``ht`` token counts each)."""
    hy = hx @ p._lm_columns
    lm = np.maximum(hy[:, 0], hy[:, 1])
    if p._shape_list:
        hidx = np.minimum(np.searchsorted(p._shape_t, ht), p._shape_t.size - 1)
        return lm * p._shape_f[hidx]
    if p.phi is not None:
        return lm * p.phi[p.phi_rows(ht), p._lm]  # type: ignore[no-any-return]
    return lm


def _lm_head_one(p: PassPricer, hx: Array, tokens: float) -> float:
    """:func:`_lm_head` of one row as a float: without step or shape factors, the larger of its
    two products taken on Python floats as np.maximum takes it (NaN wins)."""
    if p._shape_list or p.phi is not None:
        return float(_lm_head(p, hx, np.array([tokens]))[0])
    compute, memory = (hx @ p._lm_columns)[0].tolist()
    return float(compute if compute >= memory or compute != compute else memory)


def _price_one(
    p: PassPricer,
    x: Array,
    tokens: float,
    touched: float,
    share: float,
    head: tuple[Array, float] | None = None,
) -> float:
    """:meth:`PassPricer.price` of one pass (``x`` one row) as a float: the features' product
    with the operator matrix in numpy as there, the operators' max, step factors and sums in
    the compiled ``pass_sums`` where it applies (numpy's operations in numpy's order, its
    pairwise sum included), the rest — the same additions and products of the same doubles, in
    the same order — on Python floats (a decode step prices one or two passes)."""
    pen = p.truth.tree_attention_penalty * share
    if p._sums is not None:  # the operators' max, step factors and sums in one call
        phi = p.phi
        factors = b"" if phi is None else phi[p.phi_row(tokens)]
        op_sum, attention, lm_op = p._sums(x @ p._matrix, factors, p._attention, p._lm)
        total = op_sum + pen * attention
    else:
        per_op = p._per_op(x, np.array([tokens]), np.array([touched]))
        total = float(np.add.reduce(per_op, axis=1)[0]) + pen * float((per_op @ p._attention)[0])
        lm_op = float(per_op[0, p._lm])
    if head is not None:
        total = total - lm_op + _lm_head_one(p, *head)
    total = total + p._launch_plain + pen * p._launch_attention
    if p._comm:  # the all-reduces of tensor parallelism, after the device's time
        total = total + (p._comm_const + p._comm_slope * tokens)
    if p._step_s:
        total = total + p._step_s * (math.ceil(tokens / p._tile) - 1.0)
    t = p.truth  # PassPricer._with_host of one pass
    if p._host:
        host = p._layers * (t.host_layer_s + t.host_expert_s * touched)
        if t.host_adds:
            total = total + host
        elif not (total >= host or total != total):  # np.maximum's (NaN wins)
            total = host
    return float(total + t.pass_overhead_s if t.pass_overhead_s else total)
