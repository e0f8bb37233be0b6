"""Tree verification of a Hugging Face causal LM (Qwen3, Llama families; transformers 5.x).

Every prefilled request owns one row of a *batched* KV cache (one transformers ``DynamicCache``
whose batch dimension is the resident requests). One :meth:`TorchVerifier.verify_batch` call
verifies every request's tree in one forward pass of the unmodified model:

1. *linearise and pad*: each tree is already in expansion order (parents before children); the
   trees are padded to the longest, N_max tokens per row.
2. *mask*: one additive 4D mask [R, 1, N_max, L + N_max] (R rows, L the cache's length): 0
   where visible, the dtype's minimum elsewhere. Row r's node j sees the row's own prefix
   (columns 0 … past_r − 1), itself and its ancestors (columns L + ancestor); never another
   request's entries (they are in another row), the padding between past_r and L, or another
   node. A padding query sees only itself, so no row of the softmax is empty. Position ids are
   ``past_r + depth``.
3. *forward*: one pass over R × N_max tokens (SDPA or eager attention; a FlashAttention-2
   kernel cannot take the mask), hidden states kept for the drafter's taps.
4. *accept*, per request: :func:`bastion.acceptance.walk` from the root — the argmax at T = 0,
   a sample from the processed distribution at T > 0, drawn only at visited nodes.
5. *commit*, per request: KV compaction in the batched cache. The accepted path's entries are
   gathered from columns L + path to past_r … past_r + len(path) − 1 (one indexed copy per
   layer for the whole batch) and the cache is cropped to the longest row. The bonus token is
   *not* cached: it is the next tree's root.

Layout: **right padding**. Row r holds its request's tokens at columns 0 … past_r − 1; columns
past_r … L − 1 are padding (masked, finite). New tokens are appended for every row at column L,
so compaction only moves a row's accepted entries left to its own end; no row is ever shifted.
A request joins after its own prefill (batch 1, exactly as ``model.generate`` would run it): its
cache is padded to the batch's length and appended as a row. A released request's row is
dropped and the cache cropped to the longest remaining row. Resident requests that are not in a
step get a padding row that writes nothing.

The feedback returned for the drafter is :class:`TargetFeedback`: the tapped hidden states of the
tokens just written to the cache (the prompt after prefill, the accepted path after a step).

What this module does not do: batched prefill (each prompt is prefilled alone), or caches that
cannot be cropped (sliding-window, linear-attention and recurrent layers are refused up front).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from bastion.acceptance import WalkResult, greedy_walk, walk
from bastion.batch import BatchVerifyResult, StepRequests, TreeBatch
from bastion.errors import BackendError, BudgetError, ConfigError
from bastion.guard import each, has, integer, public
from bastion.interfaces import VerifyResult
from bastion.tree import DraftTree, ancestor_matrix

from .clock import Clock, device_clock
from .sampling import SamplingParams, sample_token

__all__ = ["TargetFeedback", "TorchVerifier", "VerifyTiming", "check_croppable"]

log = logging.getLogger(__name__)


def _tapped_layers(value: object) -> str | None:
    """a non-empty list of [batch, tokens, hidden] tensors"""
    ok = (
        isinstance(value, list | tuple)
        and len(value) > 0
        and all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in value)
    )
    return None if ok else _tapped_layers.__doc__


class TargetFeedback:
    """What the drafter needs after a target pass: features of the tokens newly in the cache.

    ``features`` [m, len(taps) · hidden] holds hidden_states[j + 1] of each tapped layer j at
    the m tokens; ``start`` is the sequence position of the first. A verification builds them
    lazily (:meth:`tapped`): the rows are gathered when a drafter first reads them, so a step
    the drafter never reads at once (an AR step of the ``bastion`` policy, handed over only with
    the next draft) costs no gather until then."""

    __slots__ = ("_features", "_source", "length", "start")

    def __init__(self, features: torch.Tensor, start: int) -> None:
        if not isinstance(features, torch.Tensor) or features.dim() != 2:
            raise BackendError(
                f"features must be a 2-D tensor [tokens, taps · hidden]; got {features!r:.80}"
            )
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise BackendError(f"start must be a sequence position ≥ 0; got {start!r:.80}")
        self._features: torch.Tensor | None = features
        self._source: tuple[list[torch.Tensor], list[int], int] | None = None
        self.length = int(features.shape[0])  # m
        self.start = int(start)

    @classmethod
    @public(
        error=BackendError,
        layers=_tapped_layers,
        rows=each(integer(lo=0)),
        batch_row=integer(lo=0),
        start=integer(lo=0),
    )
    def tapped(
        cls, layers: list[torch.Tensor], rows: list[int], batch_row: int, start: int
    ) -> TargetFeedback:
        """The features of ``rows`` of one batch row of the tapped layers' outputs, gathered
        on first read (the outputs are the pass's own tensors: nothing overwrites them)."""
        self = object.__new__(cls)
        self._features = None
        self._source = (layers, rows, batch_row)
        self.length = len(rows)
        self.start = int(start)
        return self

    @property
    def features(self) -> torch.Tensor:
        if self._features is None:
            assert self._source is not None
            layers, rows, batch_row = self._source
            index = torch.tensor(rows, dtype=torch.long, device=layers[0].device)
            self._features = torch.cat([h[batch_row, index] for h in layers], dim=-1)
            self._source = None
        return self._features

    def then(self, later: object) -> object:
        """This feedback followed by ``later`` (the next step's), for a drafter that skipped
        a step (an AR step of the ``bastion`` policy): a :class:`FeedbackRun`."""
        return FeedbackRun([self]).then(later)


@dataclass
class FeedbackRun:
    """Target features of consecutive steps the drafter skipped, kept as parts (appending is
    O(1); they are concatenated once, when the drafter next drafts: :meth:`merged`)."""

    parts: list[TargetFeedback]

    def then(self, later: object) -> object:
        if not isinstance(later, TargetFeedback):
            return later if later is not None else self
        last = self.parts[-1]
        if later.start != last.start + last.length:
            return later  # not contiguous: keep the newest, the drafter will say so
        self.parts.append(later)
        return self

    def merged(self) -> TargetFeedback:
        if len(self.parts) == 1:
            return self.parts[0]
        features = torch.cat([p.features for p in self.parts])
        return TargetFeedback(features, self.parts[0].start)


@dataclass(frozen=True)
class VerifyTiming:
    """Wall time of one verification's stages, seconds (synchronised on CUDA).

    In a batched step every request of the step gets the step's timing (the pass is shared)."""

    mask_s: float  # mask and position preparation
    forward_s: float  # the target's forward pass
    accept_s: float  # the acceptance walks (sampling included)
    commit_s: float  # KV compaction and feedback gathering
    batch_size: int = 1  # requests verified in the pass


@dataclass
class _Request:
    past: int  # tokens of this request in its row of the batched cache
    timings: list[VerifyTiming] = field(default_factory=list)


@public
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


def _pad_seq(t: torch.Tensor, length: int) -> torch.Tensor:
    """Right-pad a [B, heads, T, head_dim] cache tensor with zeros to ``length`` positions."""
    extra = length - int(t.shape[-2])
    return F.pad(t, (0, 0, 0, extra)) if extra > 0 else t


def _tree_mask(
    tree: DraftTree, past: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive mask [1, 1, N, past + N] and position ids [1, N] of one tree."""
    n = tree.size
    anc = torch.from_numpy(ancestor_matrix(tree)).to(device)
    mask = torch.zeros(1, 1, n, past + n, dtype=dtype, device=device)
    mask[0, 0, :, past:].masked_fill_(~anc, torch.finfo(dtype).min)
    positions = torch.from_numpy(past + tree.depths).to(device)[None]
    return mask, positions


def _batch_mask(
    pasts: Sequence[int],
    rows: Sequence[int],
    trees: Sequence[DraftTree],
    length: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, the additive mask and position ids of a step (:meth:`TorchVerifier.batch_mask`)
    over a cache of ``length`` columns whose row r holds ``pasts[r]`` tokens."""
    n_rows = len(pasts)
    n = max(t.size for t in trees)
    past = np.array(pasts, dtype=np.int64)
    sizes = np.zeros(n_rows, dtype=np.int64)
    tokens = np.zeros((n_rows, n), dtype=np.int64)
    positions = np.repeat(past[:, None], n, axis=1)
    tree_vis = np.zeros((n_rows, n, n), dtype=bool)
    tree_vis[:, np.arange(n), np.arange(n)] = True  # padding queries see themselves
    for r, tree in zip(rows, trees, strict=True):
        k = tree.size
        sizes[r] = k
        tokens[r, :k] = tree.tokens
        positions[r, :k] += tree.depths
        tree_vis[r, :k, :k] = ancestor_matrix(tree)
    past_t = torch.from_numpy(past).to(device)
    sizes_t = torch.from_numpy(sizes).to(device)
    prefix = (torch.arange(length, device=device)[None, None, :] < past_t[:, None, None]) & (
        torch.arange(n, device=device)[None, :, None] < sizes_t[:, None, None]
    )
    visible = torch.cat((prefix, torch.from_numpy(tree_vis).to(device)), dim=-1)
    mask = torch.zeros(n_rows, 1, n, length + n, dtype=dtype, device=device)
    mask.masked_fill_(~visible[:, None], torch.finfo(dtype).min)
    return (
        torch.from_numpy(tokens).to(device),
        mask,
        torch.from_numpy(positions).to(device),
    )


# A transformers PreTrainedModel: its config attributes are dynamic, so it is typed as Any.
HFModel = Any


@public(model=has("config", "parameters"))
class TorchVerifier:
    """Verifies draft trees with a Hugging Face causal LM, every request of a step in one pass.

    Implements both :class:`bastion.interfaces.BatchVerifier` (``verify_batch``, which the engine
    calls) and :class:`bastion.interfaces.Verifier` (``verify``: a batch of one).
    ``tap_layer_ids`` are the target layers whose outputs the drafter reads (empty: no
    feedback). ``generator`` (on the model's device) drives sampling at T > 0; the requests of
    a batch draw from it in step order.
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
        self._cache_kw = _cache_kwarg(model)
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0)
        self.generator = generator
        self.clock: Clock = clock or device_clock(self.device)
        self._requests: dict[int, _Request] = {}
        self._rows: list[int] = []  # request id of each row of the batched cache
        self._cache: Any = None  # the batched DynamicCache (None while no request is resident)
        self.last_timing: VerifyTiming | None = None  # the stages of the last verify_batch

    # ---------------------------------------------------------------- model access

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: Any,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> Any:
        """One target forward pass over ``input_ids`` appended to ``cache`` (the model's output,
        hidden states of the tapped layers included). No bookkeeping: what the verifier and the
        timers (:mod:`.timing`) build on."""
        kwargs: dict[str, Any] = {self._cache_kw: cache}
        return self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            output_hidden_states=bool(self.tap_layer_ids),
            **kwargs,
        )

    def _features(
        self, hidden_states: Sequence[torch.Tensor], rows: torch.Tensor, batch_row: int = 0
    ) -> torch.Tensor:
        if not self.tap_layer_ids:
            return torch.empty(int(rows.numel()), 0, device=self.device, dtype=self.dtype)
        return torch.cat(
            [hidden_states[j + 1][batch_row, rows] for j in self.tap_layer_ids], dim=-1
        )

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

    @property
    def resident(self) -> tuple[int, ...]:
        """The request ids holding a row of the batched cache, in row order."""
        return tuple(self._rows)

    def cache_length(self) -> int:
        """Columns of the batched cache (the longest row; 0 when empty)."""
        return 0 if self._cache is None else int(self._cache.get_seq_length())

    def release(self, request_id: int) -> None:
        """Drop a request's row (no-op if it holds none); the cache shrinks to the longest row."""
        if self._requests.pop(request_id, None) is None:
            return
        r = self._rows.index(request_id)
        del self._rows[r]
        if not self._rows:
            self._cache = None
            return
        keep = torch.tensor([i for i in range(len(self._rows) + 1) if i != r], device=self.device)
        length = max(self._requests[rid].past for rid in self._rows)
        for layer in self._cache.layers:
            layer.keys = layer.keys[keep, :, :length]
            layer.values = layer.values[keep, :, :length]

    def release_all(self) -> None:
        for rid in list(self._rows):
            self.release(rid)

    def _request(self, request_id: int) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise BudgetError(
                f"request {request_id} has not been prefilled; call prefill() first"
            ) from None

    @torch.no_grad()
    def prefill(self, request_id: int, prompt_ids: Sequence[int]) -> tuple[int, TargetFeedback]:
        """Run the prompt through the target alone and add the request as a row of the batched
        cache; returns its first token and the prompt features. A resident ``request_id`` is
        released first."""
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
        self.release(request_id)
        cache = DynamicCache(config=self.config)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        out = self.forward(ids, cache)
        check_croppable(cache)
        self._admit(request_id, cache, len(prompt_ids))
        first = self._choose(out.logits[0, -1])
        rows = torch.arange(len(prompt_ids), device=self.device)
        return first, TargetFeedback(self._features(out.hidden_states, rows), 0)

    def _admit(self, request_id: int, cache: Any, length: int) -> None:
        """Append a prefilled batch-1 cache as the last row (right padding to a common length)."""
        self._requests[request_id] = _Request(length)
        self._rows.append(request_id)
        if self._cache is None:
            self._cache = cache
            return
        total = max(self.cache_length(), length)
        for mine, new in zip(self._cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat((_pad_seq(mine.keys, total), _pad_seq(new.keys, total)))
            mine.values = torch.cat((_pad_seq(mine.values, total), _pad_seq(new.values, total)))

    # ---------------------------------------------------------------- verification

    def tree_mask(self, tree: DraftTree, past: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The additive mask [1, 1, N, past + N] and position ids [1, N] of one tree."""
        return _tree_mask(tree, past, self.device, self.dtype)

    def batch_mask(
        self, rows: Sequence[int], trees: Sequence[DraftTree]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids [R, N_max], the additive mask [R, 1, N_max, L + N_max] and position ids
        [R, N_max] of a step whose j-th tree belongs to cache row ``rows[j]`` (see the module
        docstring). Rows without a tree get one padding query that sees only itself."""
        past = [self._requests[rid].past for rid in self._rows]
        return _batch_mask(past, rows, trees, self.cache_length(), self.device, self.dtype)

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> WalkResult:
        """The acceptance walk over logits [N, V] (greedy at T = 0, sample-and-match at T > 0)."""
        if self.sampling.greedy:
            return greedy_walk(tree, torch.argmax(logits, dim=-1).cpu().numpy())
        return walk(tree, lambda node: self._choose(logits[node]))

    @torch.no_grad()
    def verify(self, request_id: int, tree: DraftTree) -> VerifyResult:
        """One request's tree (a batch of one; other resident rows are left as they are)."""
        req = self._request(request_id)
        requests = StepRequests.of([request_id], [req.past], [int(tree.tokens[0])])
        return self.verify_batch(requests, TreeBatch.from_trees([tree])).result(0)

    @torch.no_grad()
    def verify_batch(self, requests: StepRequests, trees: TreeBatch) -> BatchVerifyResult:
        """Verify every request's tree in one forward pass, then accept and compact per request."""
        ids = requests.request_ids.tolist()
        if len(set(ids)) != len(ids):
            raise BudgetError(f"a step lists a request twice: {ids}")
        if trees.size != len(ids):
            raise BudgetError(f"{trees.size} trees for a step of {len(ids)} requests")
        rows = []
        for j, rid in enumerate(ids):
            req = self._request(rid)
            if int(requests.context_lens[j]) != req.past:
                raise BudgetError(
                    f"request {rid}: the step says {int(requests.context_lens[j])} tokens are "
                    f"cached but the verifier holds {req.past}; the caller is out of step"
                )
            rows.append(self._rows.index(rid))
        tree_list = trees.trees()
        if any(int(t.tokens[0]) < 0 for t in tree_list):
            raise BudgetError("a tree's root token is unset; the engine sets it to the bonus")
        t0 = self.clock()
        length = self.cache_length()
        tokens, mask, positions = self.batch_mask(rows, tree_list)
        t1 = self.clock()
        out = self.forward(tokens, self._cache, positions, mask)
        t2 = self.clock()
        logits = out.logits
        if self.sampling.greedy and type(self).accept is TorchVerifier.accept:
            best = torch.argmax(logits, dim=-1).cpu().numpy()  # one transfer for the batch
            walks = [
                greedy_walk(t, best[r, : t.size]) for r, t in zip(rows, tree_list, strict=True)
            ]
        else:
            walks = [
                self.accept(t, logits[r, : t.size]) for r, t in zip(rows, tree_list, strict=True)
            ]
        t3 = self.clock()
        feedback = self._commit(rows, ids, walks, out.hidden_states, length, tokens.shape[1])
        t4 = self.clock()
        timing = VerifyTiming(t1 - t0, t2 - t1, t3 - t2, t4 - t3, len(ids))
        self.last_timing = timing  # the step's stages, for the decode loop's step samples
        results = []
        for rid, w, fb in zip(ids, walks, feedback, strict=True):
            self._requests[rid].timings.append(timing)
            results.append(VerifyResult(w.path, w.accepted_tokens, w.bonus_token, fb))
        return BatchVerifyResult.from_results(results)

    def _commit(
        self,
        rows: Sequence[int],
        ids: Sequence[int],
        walks: Sequence[WalkResult],
        hidden_states: Sequence[torch.Tensor] | None,
        length: int,
        n: int,
    ) -> list[TargetFeedback]:
        """Keep each accepted path's K/V right after its row's prefix; crop the rest."""
        dev = self.device
        src_rows: list[int] = []
        src: list[int] = []
        dst: list[int] = []
        feedback = []
        for r, rid, w in zip(rows, ids, walks, strict=True):
            req = self._requests[rid]
            if self.tap_layer_ids and hidden_states:
                layers = [hidden_states[j + 1] for j in self.tap_layer_ids]
                feedback.append(TargetFeedback.tapped(layers, list(w.path), r, req.past))
            else:
                path = torch.tensor(w.path, dtype=torch.long, device=dev)
                feedback.append(TargetFeedback(self._features((), path, r), req.past))
            for i, node in enumerate(w.path):
                if length + node != req.past + i:
                    src_rows.append(r)
                    src.append(length + node)
                    dst.append(req.past + i)
            req.past += len(w.path)
        if src:
            r_t = torch.tensor(src_rows, dtype=torch.long, device=dev)
            s_t = torch.tensor(src, dtype=torch.long, device=dev)
            d_t = torch.tensor(dst, dtype=torch.long, device=dev)
            for layer in self._cache.layers:
                layer.keys[r_t, :, d_t] = layer.keys[r_t, :, s_t]
                layer.values[r_t, :, d_t] = layer.values[r_t, :, s_t]
        new_length = max(self._requests[rid].past for rid in self._rows)
        self._cache.crop(-(length + n - new_length))
        got = self._cache.get_seq_length()
        if got != new_length:  # pragma: no cover - a transformers behaviour change
            raise BackendError(
                f"KV cache holds {got} tokens after compaction; expected {new_length}"
            )
        return feedback
