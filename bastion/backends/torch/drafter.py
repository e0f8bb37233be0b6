"""The DFlash block-diffusion drafter (the checkpoint format is :mod:`.dflash_format`'s).

One :meth:`DFlashDrafter.draft_batch` call is one forward pass over the blocks of every request
of a step (``draft`` is a batch of one). A block has ``block_size`` slots:
the bonus token followed by ``block_size − 1`` mask tokens, embedded with the *target's* input
embedding table. Each draft layer is a Qwen3 decoder layer whose attention takes queries from the
block only and keys/values from ``[ctx ; block]``, non-causally; ``ctx`` is
``hidden_norm(fc(concat of the target's tapped hidden states))`` and enters every layer's k/v
projections as it is (no input RMSNorm), ``k_norm`` applies to all keys, and context and block
share one absolute RoPE position axis. The context K/V of every layer persist in the drafter's own
batched cache (one row per request, right-padded like the verifier's: row r holds its C_r
context tokens at columns 0 … C_r − 1 of a preallocated buffer that grows by doubling); the
block's K/V are dropped after each draft. In a batched pass each block sees its own row's first
C_r columns (a boolean context mask) and its own block. Slots 1 … block_size − 1 go through the
final norm and the *target's* LM head; each row's full-vocabulary softmax gives the
position-wise marginal, of which the top K become the step's :class:`BatchMarginals`.

What this module does not do: train, or implement "DFlash 2" (its left-to-right selector breaks
the independent-marginals assumption). The file format lives in :mod:`.dflash_format`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bastion.batch import BatchMarginals, StepRequests
from bastion.errors import BudgetError, ConfigError
from bastion.guard import INT64_LIMIT, has, integer, public
from bastion.interfaces import DraftContext
from bastion.tree import DraftMarginals

from .cpu_linear import stream_linears, streams
from .dflash_format import (
    DFlashConfig,
    default_target_layer_ids,
    read_checkpoint,
    read_config,
    write_checkpoint,
)
from .verifier import FeedbackRun, TargetFeedback

__all__ = ["DFlashDraftModel", "DFlashDrafter"]

log = logging.getLogger(__name__)


def _qwen3_config(cfg: DFlashConfig) -> Any:
    """A transformers Qwen3Config for the rotary embedding and MLP (handles every RoPE type)."""
    from transformers import Qwen3Config

    raw = {k: v for k, v in cfg.raw.items() if k not in ("auto_map", "architectures")}
    raw.update(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        hidden_act=cfg.hidden_act,
        vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_hidden_layers,
    )
    return Qwen3Config(**raw)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, T, head_dim] with cos/sin [B or 1, T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def check_against_target(cfg: DFlashConfig, target: Any, origin: str = "drafter") -> None:
    """Refuse a drafter config that does not fit ``target`` (vocabulary, hidden size, layer
    count, tapped layers, mask token), with a :class:`ConfigError` naming both numbers."""
    tcfg = target.config
    try:
        n_target = int(tcfg.num_hidden_layers)
        theirs = {"vocab_size": int(tcfg.vocab_size), "hidden_size": int(tcfg.hidden_size)}
        rows = int(target.get_input_embeddings().num_embeddings)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"the target has no usable config for a DFlash drafter ({exc})") from None
    mine = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size}
    for name, value in theirs.items():
        if mine[name] != value:
            raise ConfigError(f"{origin}: {name} {mine[name]} does not match the target's {value}")
    if cfg.num_target_layers != n_target:
        raise ConfigError(
            f"{origin}: num_target_layers {cfg.num_target_layers} does not match the target's "
            f"{n_target} layers"
        )
    bad = [j for j in cfg.target_layer_ids if not 0 <= j < n_target]
    if bad:
        raise ConfigError(
            f"{origin}: target_layer_ids {bad} are out of range for a {n_target}-layer target"
        )
    if not 0 <= cfg.mask_token_id < rows:
        raise ConfigError(
            f"{origin}: mask_token_id {cfg.mask_token_id} is not a row of the target's embedding "
            f"table (0 … {rows - 1})"
        )


class _DraftAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        h, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            hd,
        )
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, self.heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=bias)
        self.q_norm = Qwen3RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(hd, eps=cfg.rms_norm_eps)

    def key_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed, rotated keys and values [B, kv_heads, T, head_dim] of x [B, T, hidden]."""
        n, t = x.shape[0], x.shape[1]
        k = self.k_norm(self.k_proj(x).view(n, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        ctx_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Block queries x [B, b, hidden] over [ctx ; block] keys. ``ctx_mask`` [B, C] (bool)
        hides context positions a block may not see (batched training and recording)."""
        n, b = x.shape[0], x.shape[1]
        q = self.q_norm(self.q_proj(x).view(n, b, self.heads, self.head_dim)).transpose(1, 2)
        q = _rope(q, cos, sin)
        k_b, v_b = self.key_values(x, cos, sin)
        k, v = torch.cat((ctx_k, k_b), dim=2), torch.cat((ctx_v, v_b), dim=2)
        mask = None
        if ctx_mask is not None:  # [B, 1, 1, C + b]: the block always sees itself
            block = torch.ones((n, b), dtype=torch.bool, device=x.device)
            mask = torch.cat((ctx_mask, block), dim=1)[:, None, None, :]
        # grouped-query attention without copying K/V per query head (measured bit-identical
        # to repeat_interleave on CPU, with and without the mask)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.head_dim**-0.5, enable_gqa=True
        )
        return cast(
            torch.Tensor, self.o_proj(out.transpose(1, 2).reshape(n, b, self.heads * self.head_dim))
        )


class _DraftLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, qcfg: Any) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = _DraftAttention(cfg)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = Qwen3MLP(qcfg)  # type: ignore[no-untyped-call]  # transformers lacks hints

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        ctx_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, ctx_mask)
        return cast(torch.Tensor, h + self.mlp(self.post_attention_layernorm(h)))


@public
class DFlashDraftModel(nn.Module):
    """The drafter's own weights; ``state_dict()`` keys are the checkpoint format's."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

        self.cfg = cfg
        qcfg = _qwen3_config(cfg)
        width = len(cfg.target_layer_ids) * cfg.hidden_size
        self.fc = nn.Linear(width, cfg.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(_DraftLayer(cfg, qcfg) for _ in range(cfg.num_hidden_layers))
        self.norm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(qcfg)  # buffers only, not persistent

    def cos_sin(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables for ``positions`` [T] (shared) or [B, T] (one row per block)."""
        cos, sin = self.rotary(x, positions if positions.dim() == 2 else positions[None])
        return cos.to(x.dtype), sin.to(x.dtype)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """ctx = hidden_norm(fc(tapped target features)) for features [B, C, taps·hidden]."""
        return cast(torch.Tensor, self.hidden_norm(self.fc(features)))

    def block_hidden(
        self,
        ctx: torch.Tensor,
        anchors: torch.Tensor,
        seq: torch.Tensor,
        block_embeds: torch.Tensor,
    ) -> torch.Tensor:
        """Final hidden states [A, block, hidden] of A blocks drafted from batched contexts.

        ``ctx`` [B, C, hidden] holds each sequence's context features at positions 0 … C−1;
        block a belongs to sequence ``seq[a]``, starts at position ``anchors[a]`` and sees only
        the context before it. Training and dense trace recording use this; one request's
        decoding uses the cached path of :class:`DFlashDrafter`.
        """
        b, c = block_embeds.shape[1], ctx.shape[1]
        positions = torch.arange(c, device=ctx.device)
        cos_c, sin_c = self.cos_sin(ctx, positions)
        block_pos = anchors[:, None] + torch.arange(b, device=ctx.device)[None]
        cos_b, sin_b = self.cos_sin(block_embeds, block_pos)
        visible = positions[None, :] < anchors[:, None]  # [A, C]
        h = block_embeds
        for layer in cast(list[_DraftLayer], self.layers):
            k, v = layer.self_attn.key_values(ctx, cos_c, sin_c)  # [B, kv, C, hd]
            h = layer(h, cos_b, sin_b, k[seq], v[seq], visible)
        return cast(torch.Tensor, self.norm(h))


class _ContextStore:
    """The drafter's context K/V of every resident request: one row per request, per layer a
    preallocated buffer [R, kv_heads, capacity, head_dim] holding row r's ``lengths[r]`` context
    tokens at columns 0 … lengths[r] − 1 (right padding, zeros beyond)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.lengths: list[int] = []
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        return int(self.k[0].shape[2]) if self.k else 0

    def row(self, request_id: int) -> int | None:
        try:
            return self.ids.index(request_id)
        except ValueError:
            return None

    def add(self, request_id: int, shapes: list[tuple[int, int]], like: torch.Tensor) -> int:
        """A new empty row; ``shapes`` are (kv_heads, head_dim) per layer."""
        cap = max(self.capacity, 64)
        if not self.k:
            self.k = [like.new_zeros(0, h, cap, d) for h, d in shapes]
            self.v = [like.new_zeros(0, h, cap, d) for h, d in shapes]
        for buf in (self.k, self.v):
            for i, t in enumerate(buf):
                buf[i] = torch.cat((t, t.new_zeros(1, *t.shape[1:])))
        self.ids.append(request_id)
        self.lengths.append(0)
        return len(self.ids) - 1

    def drop(self, request_id: int) -> None:
        r = self.row(request_id)
        if r is None:
            return
        del self.ids[r]
        del self.lengths[r]
        if not self.ids:
            self.k, self.v = [], []
            return
        keep = torch.tensor([i for i in range(len(self.ids) + 1) if i != r])
        for buf in (self.k, self.v):
            for i, t in enumerate(buf):
                buf[i] = t[keep.to(t.device)]

    def reserve(self, length: int) -> None:
        """Grow every buffer to hold ``length`` columns (doubling, multiples of 64)."""
        if length <= self.capacity:
            return
        cap = max(length, 2 * self.capacity)
        cap = -(-cap // 64) * 64
        for buf in (self.k, self.v):
            for i, t in enumerate(buf):
                grown = t.new_zeros(t.shape[0], t.shape[1], cap, t.shape[3])
                grown[:, :, : t.shape[2]] = t
                buf[i] = grown


@public
class DFlashDrafter:
    """A :class:`bastion.interfaces.Drafter` sharing the target's embedding and LM head.

    ``top_k`` candidates are kept per position (capped at the vocabulary size).
    """

    def __init__(self, model: DFlashDraftModel, target: Any, *, top_k: int = 16) -> None:
        cfg = model.cfg
        check_against_target(cfg, target)
        self.embed = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise BudgetError(f"top_k must be an integer ≥ 1; got {top_k!r}")
        param = next(target.parameters())
        self.model = model.to(device=param.device, dtype=param.dtype).eval()
        if streams(target):  # the target multiplies with the CPU kernel: so does its drafter
            stream_linears(self.model)
        self.cfg = cfg
        self.top_k = min(int(top_k), cfg.vocab_size)
        self.device = param.device
        self._store = _ContextStore()

    # ---------------------------------------------------------------- construction

    @classmethod
    @public(error=ConfigError, own=("top_k",), target=has("config", "parameters"))
    def from_pretrained(
        cls, path: str | os.PathLike[str], target: Any, *, top_k: int = 16
    ) -> DFlashDrafter:
        """Load a DFlash checkpoint directory (no remote code). Its config is checked against
        ``target`` (and the weights' names and shapes against the config) before any weight
        is loaded."""
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise BudgetError(f"top_k must be an integer ≥ 1; got {top_k!r}")
        cfg = read_config(path)
        check_against_target(cfg, target, origin=f"drafter {path}")
        cfg, state = read_checkpoint(path, cfg)
        model = DFlashDraftModel(cfg)
        model.load_state_dict(state, strict=True)
        return cls(model, target, top_k=top_k)

    @classmethod
    @public(
        error=ConfigError,
        target=has("config", "parameters"),
        num_layers=integer(1, 1 << 16),
        top_k=integer(lo=1),
        seed=integer(0, INT64_LIMIT - 1),
    )
    def random_init(
        cls,
        target: Any,
        *,
        num_layers: int = 1,
        block_size: int = 16,
        target_layer_ids: tuple[int, ...] | None = None,
        mask_token_id: int | None = None,
        top_k: int = 16,
        seed: int = 0,
    ) -> DFlashDrafter:
        """A randomly initialised drafter shaped for ``target`` (tests, smoke runs)."""
        t = target.config
        n_target = int(t.num_hidden_layers)
        raw = {
            k: getattr(t, k)
            for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
        }
        raw.update(
            head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
            intermediate_size=t.intermediate_size,
            num_hidden_layers=num_layers,
            block_size=block_size,
            num_target_layers=n_target,
            rms_norm_eps=float(getattr(t, "rms_norm_eps", 1e-6)),
            max_position_embeddings=getattr(t, "max_position_embeddings", 4096),
            dflash_config={
                "mask_token_id": t.vocab_size - 1 if mask_token_id is None else mask_token_id,
                "target_layer_ids": list(
                    target_layer_ids or default_target_layer_ids(num_layers, n_target)
                ),
            },
        )
        cfg = DFlashConfig.from_dict(raw)
        gen = torch.Generator().manual_seed(seed)
        model = DFlashDraftModel(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        return cls(model, target, top_k=top_k)

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write the checkpoint in the DFlash format (atomically)."""
        write_checkpoint(path, self.cfg, dict(self.model.state_dict()))

    # ---------------------------------------------------------------- drafting

    def release(self, request_id: int) -> None:
        self._store.drop(request_id)

    def release_all(self) -> None:
        for rid in list(self._store.ids):
            self._store.drop(rid)

    def context_len(self, request_id: int) -> int:
        r = self._store.row(request_id)
        return 0 if r is None else self._store.lengths[r]

    @torch.no_grad()
    def append_context(self, items: Sequence[tuple[int, object]]) -> None:
        """Append the target's features to the requests' contexts (new requests get a row).

        Every request's features go through ``fc`` and ``hidden_norm`` and every layer's k/v
        projections in one flat pass (each token at its own position), then are written into
        the rows' buffers."""
        store = self._store
        layers = cast(list[_DraftLayer], self.model.layers)
        todo = []
        for rid, fb in items:
            if isinstance(fb, FeedbackRun):  # the steps it skipped, in one block
                fb = fb.merged()
            if not isinstance(fb, TargetFeedback):
                raise BudgetError(f"DFlash drafter needs TargetFeedback; got {type(fb)}")
            r = store.row(rid)
            if r is None:
                shapes = [(a.kv_heads, a.head_dim) for a in (la.self_attn for la in layers)]
                r = store.add(rid, shapes, self.embed.weight)
            if fb.start != store.lengths[r]:
                raise BudgetError(
                    f"drafter context holds {store.lengths[r]} tokens but the target's features "
                    f"start at position {fb.start}; the drafter and target are out of step"
                )
            if int(fb.features.shape[0]):
                todo.append((r, fb))
        if not todo:
            return
        feats = torch.cat([fb.features.to(self.device) for _, fb in todo])[None]
        positions = torch.cat(
            [
                torch.arange(fb.start, fb.start + int(fb.features.shape[0]), device=self.device)
                for _, fb in todo
            ]
        )
        rows = torch.cat(
            [torch.full((int(fb.features.shape[0]),), r, device=self.device) for r, fb in todo]
        )
        store.reserve(int(positions.max()) + 1)
        ctx = self.model.hidden_norm(self.model.fc(feats.to(self.embed.weight.dtype)))
        cos, sin = self.model.cos_sin(ctx, positions)
        for i, layer in enumerate(layers):
            k, v = layer.self_attn.key_values(ctx, cos, sin)  # [1, kv, Σm, hd]
            store.k[i][rows, :, positions] = k[0].transpose(0, 1)
            store.v[i][rows, :, positions] = v[0].transpose(0, 1)
        for r, fb in todo:
            store.lengths[r] += int(fb.features.shape[0])

    @torch.no_grad()
    def batch_probs(
        self,
        request_ids: Sequence[int],
        bonus_tokens: Sequence[int],
        feedback: Sequence[object | None] | None = None,
    ) -> torch.Tensor:
        """Full-vocabulary marginals [B, block_size − 1, V] (float32) for the positions after each
        request's bonus token, after appending its ``feedback``; one pass over the B blocks."""
        ids = [int(r) for r in request_ids]
        if len(set(ids)) != len(ids):
            raise BudgetError(f"a step lists a request twice: {ids}")
        if feedback is not None:
            self.append_context(
                [(rid, fb) for rid, fb in zip(ids, feedback, strict=True) if fb is not None]
            )
        store = self._store
        rows = []
        for rid in ids:
            r = store.row(rid)
            if r is None or store.lengths[r] == 0:
                raise BudgetError(
                    f"the DFlash drafter has no context for request {rid} yet; pass the "
                    "prefill's TargetFeedback first"
                )
            rows.append(r)
        lengths = torch.tensor([store.lengths[r] for r in rows], device=self.device)
        c_max = int(lengths.max())
        b = self.cfg.block_size
        tokens = torch.full(
            (len(ids), b), self.cfg.mask_token_id, dtype=torch.long, device=self.device
        )
        tokens[:, 0] = torch.tensor([int(t) for t in bonus_tokens], device=self.device)
        h = self.embed(tokens) * self.cfg.input_embedding_scale
        positions = lengths[:, None] + torch.arange(b, device=self.device)[None]
        cos, sin = self.model.cos_sin(h, positions)
        ctx_mask = None
        if bool((lengths != c_max).any()):
            ctx_mask = torch.arange(c_max, device=self.device)[None] < lengths[:, None]
        every = rows == list(range(len(store.ids)))
        index = None if every else torch.tensor(rows, device=self.device)
        for i, layer in enumerate(cast(list[_DraftLayer], self.model.layers)):
            ctx_k, ctx_v = store.k[i][:, :, :c_max], store.v[i][:, :, :c_max]
            if index is not None:
                ctx_k, ctx_v = ctx_k[index], ctx_v[index]
            h = layer(h, cos, sin, ctx_k, ctx_v, ctx_mask)
        return self.probs_from_hidden(self.model.norm(h[:, 1:]))

    @torch.no_grad()
    def block_probs(self, request_id: int, bonus_token: int, feedback: object) -> torch.Tensor:
        """Full-vocabulary marginals [block_size − 1, V] (float32) for the positions after the
        bonus token, after appending ``feedback`` to the request's context (a batch of one)."""
        return self.batch_probs([request_id], [bonus_token], [feedback])[0]

    def probs_from_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary softmax (float32) of final-normed block hidden states [..., hidden]."""
        logits = self.lm_head(h).float() * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return torch.softmax(logits, dim=-1)

    def draft_batch(self, requests: StepRequests) -> BatchMarginals:
        """Top-K marginals of every request of the step, from one block pass over the batch."""
        probs = self.batch_probs(
            requests.request_ids.tolist(), requests.bonus_tokens.tolist(), requests.feedback
        )
        top = torch.topk(probs, self.top_k, dim=-1)
        return BatchMarginals(
            top.indices.cpu().numpy().astype(np.int64),
            top.values.double().clamp_(0.0, 1.0).cpu().numpy(),
        )

    def draft(self, context: DraftContext) -> DraftMarginals:
        probs = self.block_probs(context.request_id, context.bonus_token, context.feedback)
        top = torch.topk(probs, self.top_k, dim=-1)
        return DraftMarginals(
            top.indices.cpu().numpy(), top.values.double().clamp_(0.0, 1.0).cpu().numpy()
        )
