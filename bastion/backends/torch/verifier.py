"""Tree verification of a Hugging Face causal LM (Qwen3, Llama families; transformers 5.x).

One :meth:`TorchVerifier.verify` call:

1. *mask*: the tree's nodes are already linearised in expansion order (parents before
   children). The additive mask has shape [1, 1, N, past + N]: 0 where visible, the dtype's
   minimum elsewhere; every node sees the whole prefix, itself and its ancestors. Position ids
   are ``past + depth``.
2. *forward*: one pass over the N tree tokens with the KV cache (SDPA or eager attention; a
   FlashAttention-2 kernel cannot take the mask), hidden states kept for the drafter's taps.
3. *accept*: :func:`bastion.acceptance.walk` from the root — the argmax at T = 0, a sample from
   the processed distribution at T > 0, drawn only at visited nodes.
4. *commit*: KV compaction. The cache holds past + N entries; the accepted path's entries are
   gathered to positions past … past + len(path) − 1 and the rest cropped with a negative count
   (``Cache.crop`` in transformers 5.x only accepts that). The bonus token is *not* cached: it is
   the next tree's root.

The feedback returned for the drafter is :class:`TargetFeedback`: the tapped hidden states of the
tokens just written to the cache (the prompt after prefill, the accepted path after a step).

What this module does not do: batching (one sequence per request) or caches that cannot be
cropped (sliding-window, linear-attention and recurrent layers are refused up front).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bastion.acceptance import WalkResult, greedy_walk, walk
from bastion.errors import BackendError, BudgetError, ConfigError
from bastion.interfaces import VerifyResult
from bastion.tree import DraftTree, ancestor_matrix

from .sampling import SamplingParams, sample_token
from .timing import Clock, device_clock

__all__ = ["TargetFeedback", "TorchVerifier", "VerifyTiming", "check_croppable"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetFeedback:
    """What the drafter needs after a target pass: features of the tokens newly in the cache."""

    features: torch.Tensor  # [m, len(taps) · hidden]: hidden_states[j + 1] for each tapped j
    start: int  # sequence position of the first of the m tokens


@dataclass(frozen=True)
class VerifyTiming:
    """Wall time of one verification's stages, seconds (synchronised on CUDA)."""

    mask_s: float  # mask and position preparation
    forward_s: float  # the target's forward pass
    accept_s: float  # the acceptance walk (sampling included)
    commit_s: float  # KV compaction and feedback gathering


@dataclass
class _Request:
    cache: Any  # transformers Cache
    past: int  # tokens in the cache
    timings: list[VerifyTiming] = field(default_factory=list)


def check_croppable(cache: Any) -> None:
    """Refuse caches whose layers cannot be gathered and cropped (full attention only)."""
    layers = getattr(cache, "layers", None)
    if layers is None or not hasattr(cache, "crop"):
        raise BackendError(
            f"the target's KV cache ({type(cache).__name__}) cannot be cropped: tree verification "
            "needs a transformers DynamicCache of full-attention layers"
        )
    for i, layer in enumerate(layers):
        if (
            not getattr(layer, "is_croppable", False)
            or getattr(layer, "is_sliding", False)
            or not hasattr(layer, "keys")
        ):
            raise BackendError(
                f"layer {i} of the target's KV cache ({type(layer).__name__}) cannot be cropped; "
                "sliding-window, linear-attention and recurrent layers are not supported"
            )


def _cache_kwarg(model: Any) -> str:
    """transformers 5.x calls the cache argument ``cache``; 4.x calls it ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# A transformers PreTrainedModel: its config attributes are dynamic, so it is typed as Any.
HFModel = Any


class TorchVerifier:
    """Verifies draft trees with a Hugging Face causal LM; batch 1 per request.

    ``tap_layer_ids`` are the target layers whose outputs the drafter reads (empty: no
    feedback). ``generator`` (on the model's device) drives sampling at T > 0.
    """

    def __init__(
        self,
        model: HFModel,
        *,
        tap_layer_ids: Sequence[int] = (),
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.model = model
        self.config = model.config
        n_layers = int(self.config.num_hidden_layers)
        bad = [j for j in tap_layer_ids if not 0 <= j < n_layers]
        if bad:
            raise ConfigError(
                f"tapped target layer ids {bad} are out of range; the target has {n_layers} "
                f"layers (ids 0 … {n_layers - 1})"
            )
        self.tap_layer_ids = tuple(int(j) for j in tap_layer_ids)
        self.sampling = sampling or SamplingParams()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0)
        self.generator = generator
        self.clock: Clock = clock or device_clock(self.device)
        self._cache_kw = _cache_kwarg(model)
        self._requests: dict[int, _Request] = {}

    # ---------------------------------------------------------------- model access

    def _forward(
        self,
        input_ids: torch.Tensor,
        cache: Any,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {self._cache_kw: cache}
        return self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            output_hidden_states=bool(self.tap_layer_ids),
            **kwargs,
        )

    def _features(self, hidden_states: Sequence[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        if not self.tap_layer_ids:
            return torch.empty(int(rows.numel()), 0, device=self.device, dtype=self.dtype)
        return torch.cat([hidden_states[j + 1][0, rows] for j in self.tap_layer_ids], dim=-1)

    def _choose(self, logits: torch.Tensor) -> int:
        """The target's token from one row of logits [V]."""
        if self.sampling.greedy:
            return int(torch.argmax(logits).item())
        return sample_token(logits, self.sampling, self.generator)

    # ---------------------------------------------------------------- requests

    def context_len(self, request_id: int) -> int:
        return self._request(request_id).past

    def timings(self, request_id: int) -> list[VerifyTiming]:
        return self._request(request_id).timings

    def release(self, request_id: int) -> None:
        self._requests.pop(request_id, None)

    def _request(self, request_id: int) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise BudgetError(
                f"request {request_id} has not been prefilled; call prefill() first"
            ) from None

    @torch.no_grad()
    def prefill(self, request_id: int, prompt_ids: Sequence[int]) -> tuple[int, TargetFeedback]:
        """Run the prompt through the target; returns its first token and the prompt features."""
        from transformers import DynamicCache

        if len(prompt_ids) == 0:
            raise BudgetError("the prompt is empty; give at least one token id")
        vocab = int(self.config.vocab_size)
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise BudgetError(f"prompt token ids must be in [0, {vocab}); got {list(prompt_ids)}")
        limit = getattr(self.config, "max_position_embeddings", None)
        if limit is not None and len(prompt_ids) >= int(limit):
            raise BudgetError(
                f"the prompt has {len(prompt_ids)} tokens; the target's context holds {limit} "
                "(max_position_embeddings), leaving no room to generate"
            )
        cache = DynamicCache(config=self.config)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        out = self._forward(ids, cache)
        check_croppable(cache)
        self._requests[request_id] = _Request(cache, len(prompt_ids))
        first = self._choose(out.logits[0, -1])
        rows = torch.arange(len(prompt_ids), device=self.device)
        return first, TargetFeedback(self._features(out.hidden_states, rows), 0)

    # ---------------------------------------------------------------- verification

    def tree_mask(self, tree: DraftTree, past: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The additive mask [1, 1, N, past + N] and position ids [1, N] of a tree."""
        n = tree.size
        anc = torch.from_numpy(ancestor_matrix(tree)).to(self.device)
        mask = torch.zeros(1, 1, n, past + n, dtype=self.dtype, device=self.device)
        mask[0, 0, :, past:].masked_fill_(~anc, torch.finfo(self.dtype).min)
        positions = torch.from_numpy(past + tree.depths).to(self.device)[None]
        return mask, positions

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> WalkResult:
        """The acceptance walk over logits [N, V] (greedy at T = 0, sample-and-match at T > 0)."""
        if self.sampling.greedy:
            return greedy_walk(tree, torch.argmax(logits, dim=-1).cpu().numpy())
        return walk(tree, lambda node: self._choose(logits[node]))

    @torch.no_grad()
    def verify(self, request_id: int, tree: DraftTree) -> VerifyResult:
        req = self._request(request_id)
        if tree.tokens[0] < 0:
            raise BudgetError("the tree's root token is unset; the engine sets it to the bonus")
        t0 = self.clock()
        mask, positions = self.tree_mask(tree, req.past)
        ids = torch.from_numpy(tree.tokens.copy()).to(self.device)[None]
        t1 = self.clock()
        out = self._forward(ids, req.cache, positions, mask)
        t2 = self.clock()
        result = self.accept(tree, out.logits[0])
        t3 = self.clock()
        path = torch.tensor(result.path, dtype=torch.long, device=self.device)
        self._compact(req, path, tree.size)
        feedback = TargetFeedback(self._features(out.hidden_states, path), req.past)
        req.past += len(result.path)
        t4 = self.clock()
        req.timings.append(VerifyTiming(t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        return VerifyResult(result.path, result.accepted_tokens, result.bonus_token, feedback)

    def _compact(self, req: _Request, path: torch.Tensor, n: int) -> None:
        """Keep the accepted path's K/V right after the prefix and drop the other tree nodes."""
        m = int(path.numel())
        if not torch.equal(path, torch.arange(m, device=path.device)):
            src = req.past + path
            for layer in req.cache.layers:
                layer.keys[..., req.past : req.past + m, :] = layer.keys[..., src, :]
                layer.values[..., req.past : req.past + m, :] = layer.values[..., src, :]
        if n > m:
            req.cache.crop(-(n - m))
        got = req.cache.get_seq_length()
        if got != req.past + m:  # pragma: no cover - a transformers behaviour change
            raise BackendError(
                f"KV cache holds {got} tokens after compaction; expected {req.past + m}"
            )
