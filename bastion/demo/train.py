"""Training the demo pair on CPU: ``bastion train target`` and ``bastion train drafter``.

- **Target**: a Qwen3-architecture causal LM (``transformers.Qwen3Config``, about 2 M
  parameters) trained with next-token cross-entropy on random 256-token windows of the training
  split. Held-out loss is reported on windows of the held-out files.
- **Drafter**: the DFlash-format drafter of :mod:`bastion.backends.torch.drafter` trained against
  the *frozen* target with the block-diffusion objective: from the target's tapped hidden states
  of the context (tokens before the anchor), predict the block's positions 1 … 15 at once from
  [bonus token, mask × 15]; cross-entropy per position, weighted by 0.85^(k−1) so that early
  positions, which decide acceptance, count most. It shares the target's embedding and LM head.

Both are deterministic for a seed (a fixed number of steps, seeded data order and init, inside
``torch.random.fork_rng`` so the caller's global RNG is untouched) and show progress bars. The
default budgets take well under an hour each on 2 CPU cores.

What this module does not do: decode (see :mod:`bastion.demo.run`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from bastion.demo.corpus import SPECIALS, Corpus, load_corpus, train_tokenizer
from bastion.errors import ConfigError
from bastion.files import atomic_directory
from bastion.guard import public

__all__ = [
    "DRAFTER_PRESETS",
    "TARGET_PRESETS",
    "DrafterTraining",
    "TargetTraining",
    "train_drafter",
    "train_target",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetTraining:
    vocab_size: int = 2048
    hidden: int = 192
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 576
    context: int = 1024  # max_position_embeddings
    seq_len: int = 256
    batch: int = 16
    steps: int = 3000
    lr: float = 2e-3
    warmup: int = 100
    seed: int = 0
    # "bf16": forward and backward under CPU bf16 autocast (fp32 master weights and optimizer
    # state), about 2.5× faster on CPUs with AVX-512 BF16; "fp32": plain fp32
    precision: str = "fp32"
    save_dtype: str = "float32"  # the stored weights' dtype; loading upcasts to the run's


@dataclass(frozen=True)
class DrafterTraining:
    layers: int = 2
    block_size: int = 16
    taps: tuple[int, ...] = (1, 3)
    seq_len: int = 256
    batch: int = 8
    anchors: int = 12  # blocks per sequence per step
    steps: int = 3000
    lr: float = 2e-3
    warmup: int = 100
    decay: float = 0.85  # loss weight of position k is decay^(k − 1)
    seed: int = 0
    # "text": blocks of the corpus's own text; "target": blocks of the target's own
    # continuations (DFlash's and EAGLE's recipe): ``sequences`` continuations of
    # ``prompt_len`` training-split tokens each, generated in fp32 before training, greedy
    # except a ``sampled_share`` drawn at T = 1; blocks start inside the continuation
    data: str = "text"
    prompt_len: int = 64
    sequences: int = 3072
    sampled_share: float = 0.25
    gen_batch: int = 64
    precision: str = "fp32"  # as TargetTraining.precision
    save_dtype: str = "float32"


_PRECISIONS = ("fp32", "bf16")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _check_precision(precision: str, save_dtype: str) -> None:
    if precision not in _PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not one of {', '.join(_PRECISIONS)}")
    if save_dtype not in _DTYPES:
        raise ConfigError(f"save_dtype {save_dtype!r} is not one of {', '.join(_DTYPES)}")


def _autocast(precision: str) -> Any:
    """CPU bf16 autocast for "bf16", a no-op context for "fp32"."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


# the shipped pairs' recipes: "small" (the tests' pair, inside the L3 cache) and "base" (a target
# of 72 MB in fp32, beyond a 32 MB L3, so that its step is dominated by reading its weights)
TARGET_PRESETS: dict[str, TargetTraining] = {
    "small": TargetTraining(),
    "base": TargetTraining(
        hidden=384,
        layers=8,
        heads=6,
        kv_heads=2,
        ffn=1536,
        steps=2200,
        lr=1.5e-3,
        precision="bf16",
        save_dtype="bfloat16",
    ),
}


DRAFTER_PRESETS: dict[str, DrafterTraining] = {
    "small": DrafterTraining(),
    "base": DrafterTraining(
        layers=2,
        taps=(1, 4, 7),
        batch=12,
        anchors=16,
        steps=3000,
        data="target",
        precision="bf16",
        save_dtype="bfloat16",
    ),
}


def _check_drafter(cfg: DrafterTraining) -> None:
    _check_precision(cfg.precision, cfg.save_dtype)
    if cfg.data not in ("text", "target"):
        raise ConfigError(f"data {cfg.data!r} is not one of text, target")
    if cfg.data == "target":
        if not 1 <= cfg.prompt_len <= cfg.seq_len - cfg.block_size - 1:
            raise ConfigError(
                f"prompt_len {cfg.prompt_len} leaves no block of {cfg.block_size} tokens inside "
                f"a continuation of a {cfg.seq_len}-token sequence"
            )
        if cfg.sequences < 1 or cfg.gen_batch < 1:
            raise ConfigError("sequences and gen_batch must be ≥ 1")
        if not 0.0 <= cfg.sampled_share <= 1.0:
            raise ConfigError(f"sampled_share {cfg.sampled_share} is not in [0, 1]")


def _progress(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def _lr_at(step: int, steps: int, warmup: int, peak: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _optimise(
    model: torch.nn.Module,
    loss_of_next_batch: Callable[[], torch.Tensor],
    steps: int,
    warmup: int,
    lr: float,
    weight_decay: float,
    name: str,
    progress: bool,
) -> None:
    """AdamW with warmup + cosine decay and gradient clipping at 1; a progress bar if asked."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    bar = _progress(steps, name) if progress else None
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, warmup, lr)
        loss = loss_of_next_batch()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    if bar is not None:
        bar.close()


def tokenize_corpus(tokenizer: Any, corpus: Corpus, split: str) -> np.ndarray:
    """All documents of a split as one token stream, separated by ``<|endoftext|>``."""
    eos = tokenizer.convert_tokens_to_ids(SPECIALS[0])
    out: list[int] = []
    for text in corpus.texts(split):
        out.extend(tokenizer(text)["input_ids"])
        out.append(eos)
    return np.asarray(out, dtype=np.int64)


def _windows(stream: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> torch.Tensor:
    starts = rng.integers(0, stream.size - length - 1, size=batch)
    return torch.from_numpy(np.stack([stream[s : s + length + 1] for s in starts]))


@torch.no_grad()
def heldout_loss(model: Any, stream: np.ndarray, length: int, n: int = 32, seed: int = 1) -> float:
    """Mean next-token cross-entropy (nats/token) on ``n`` seeded held-out windows."""
    model.eval()
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(max(1, n // 8)):
        x = _windows(stream, rng, 8, length)
        logits = model(input_ids=x[:, :-1]).logits
        losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)))
    return float(torch.stack(losses).mean())


@torch.no_grad()
def target_continuations(
    target: Any,
    stream: np.ndarray,
    n: int,
    prompt_len: int,
    seq_len: int,
    *,
    sampled_share: float = 0.0,
    batch: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> torch.Tensor:
    """``n`` sequences of ``seq_len`` tokens: ``prompt_len`` tokens of a seeded random window
    of ``stream``, then the target's own continuation, decoded with its KV cache in the
    target's dtype: greedy, except the last ``round(n × sampled_share)`` sequences, sampled at
    T = 1. There is no stop at EOS (a continuation goes on as the target would)."""
    from bastion.backends.torch.verifier import _cache_kwarg

    kw = _cache_kwarg(target)  # "cache" (transformers 5) or "past_key_values" (4)
    rng = np.random.default_rng(seed)
    draw = torch.Generator().manual_seed(seed)
    n_sampled = round(n * sampled_share)
    out: list[torch.Tensor] = []
    bar = _progress(n, "continuations") if progress else None
    for start in range(0, n, batch):
        rows = min(batch, n - start)
        seq = _windows(stream, rng, rows, prompt_len - 1)
        sample = torch.arange(start, start + rows) >= n - n_sampled
        res = target(input_ids=seq, use_cache=True)
        new: list[torch.Tensor] = []
        for i in range(seq_len - prompt_len):
            logits = res.logits[:, -1].float()
            tok = logits.argmax(-1)
            if bool(sample.any()):
                drawn = torch.multinomial(torch.softmax(logits, -1), 1, generator=draw)[:, 0]
                tok = torch.where(sample, drawn, tok)
            new.append(tok)
            if i < seq_len - prompt_len - 1:
                res = target(input_ids=tok[:, None], use_cache=True, **{kw: res[kw]})
        out.append(torch.cat([seq, torch.stack(new, dim=1)], dim=1))
        if bar is not None:
            bar.update(rows)
    if bar is not None:
        bar.close()
    return torch.cat(out)


def _data(tokenizer: Any, corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    train = tokenize_corpus(tokenizer, corpus, "train")
    return train, tokenize_corpus(tokenizer, corpus, "heldout")


@public
def train_target(
    out: Path,
    cfg: TargetTraining = TargetTraining(),
    corpus: Corpus | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the tokenizer and the target; save both (HF format) to ``out``; return a report."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _check_precision(cfg.precision, cfg.save_dtype)
    corpus = corpus or load_corpus()
    tokenizer = train_tokenizer(corpus, cfg.vocab_size)
    train, held = _data(tokenizer, corpus)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=cfg.context,
        tie_word_embeddings=True,
        bos_token_id=ids[SPECIALS[0]],
        eos_token_id=ids[SPECIALS[0]],
        pad_token_id=ids[SPECIALS[1]],
    )
    start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = Qwen3ForCausalLM(config)
        rng = np.random.default_rng(cfg.seed)
        model.train()

        def next_token_loss() -> torch.Tensor:
            x = _windows(train, rng, cfg.batch, cfg.seq_len)
            with _autocast(cfg.precision):
                logits = model(input_ids=x[:, :-1]).logits
            logits = logits.float()
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

        _optimise(model, next_token_loss, cfg.steps, cfg.warmup, cfg.lr, 0.1, "target", progress)
    report = {
        "params": sum(p.numel() for p in model.parameters()),
        "train_tokens": int(train.size),
        "heldout_tokens": int(held.size),
        "heldout_loss": heldout_loss(model, held, cfg.seq_len),
        "train_minutes": (time.perf_counter() - start) / 60,
        "config": asdict(cfg),
    }
    with atomic_directory(out, replace=True) as tmp:  # a kill leaves the old model or the new
        model.to(_DTYPES[cfg.save_dtype])  # type: ignore[arg-type]  # the stubs miss dtype
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


@public
def train_drafter(
    target_dir: Path,
    out: Path,
    cfg: DrafterTraining = DrafterTraining(),
    corpus: Corpus | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train a DFlash drafter against the frozen target in ``target_dir``; save it to ``out``."""
    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter, load_target

    _check_drafter(cfg)
    target = load_target(target_dir, "cpu", linears="torch")  # the recipe as it was recorded
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    train, held = _data(tokenizer, corpus or load_corpus())
    mask_id = int(tokenizer.convert_tokens_to_ids(SPECIALS[2]))  # type: ignore[arg-type]
    for p in target.parameters():
        p.requires_grad_(False)
    start = time.perf_counter()
    on_target = cfg.data == "target"
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        if on_target:  # the target's own continuations, generated once before training
            seqs = target_continuations(
                target,
                train,
                cfg.sequences,
                cfg.prompt_len,
                cfg.seq_len,
                sampled_share=cfg.sampled_share,
                batch=cfg.gen_batch,
                seed=cfg.seed,
                progress=progress,
            )
            held_seqs = target_continuations(
                target, held, 64, cfg.prompt_len, cfg.seq_len, batch=cfg.gen_batch, seed=cfg.seed
            )
        generated_minutes = (time.perf_counter() - start) / 60
        drafter = DFlashDrafter.random_init(
            target,
            num_layers=cfg.layers,
            block_size=cfg.block_size,
            target_layer_ids=cfg.taps,
            mask_token_id=mask_id,
            seed=cfg.seed,
        )
        model = drafter.model
        with torch.no_grad():  # a sane start: small random weights, unit norms
            for name, param in model.named_parameters():
                if not (name.endswith("norm.weight") or "layernorm" in name):
                    param.normal_(0.0, 0.02)
        model.train()
        low = cfg.prompt_len if on_target else 8  # the first anchor position a block may take
        loss_fn = _block_loss(target, drafter, cfg, mask_id, low)
        rng = np.random.default_rng(cfg.seed)

        if on_target:  # the target is frozen: its features of the fixed sequences, once
            taps = [j + 1 for j in drafter.cfg.target_layer_ids]
            feats = torch.cat(
                [
                    tapped_features(
                        target, seqs[i : i + cfg.gen_batch], taps, cfg.precision
                    ).float()
                    for i in range(0, len(seqs), cfg.gen_batch)
                ]
            )

        def block_loss() -> torch.Tensor:
            if on_target:
                pick = torch.from_numpy(rng.integers(0, len(seqs), size=cfg.batch))
                return loss_fn(seqs[pick], rng, feats[pick])[0]
            return loss_fn(_windows(train, rng, cfg.batch, cfg.seq_len)[:, :-1], rng)[0]

        _optimise(model, block_loss, cfg.steps, cfg.warmup, cfg.lr, 0.0, "drafter", progress)
        model.eval()
        with torch.no_grad():
            eval_rng = np.random.default_rng(cfg.seed + 1)
            if on_target:
                batches = [held_seqs[i : i + 8] for i in range(0, len(held_seqs), 8)]
            else:
                batches = [_windows(held, eval_rng, 8, cfg.seq_len)[:, :-1] for _ in range(4)]
            hits = torch.cat([loss_fn(x, eval_rng)[1] for x in batches])
    report = {
        "params": sum(p.numel() for p in model.parameters()),
        "data": cfg.data,
        # top-1 agreement at each block position (given the true tokens before it), and the
        # share of blocks whose first k positions all agree (a chain's acceptance by depth),
        # on held-out text ("text") or the target's greedy continuations of held-out text
        "heldout_top1_by_position": [round(float(a), 4) for a in hits.float().mean(dim=0)],
        "heldout_chain_acceptance_by_depth": [
            round(float(a), 4) for a in hits.int().cumprod(dim=1).float().mean(dim=0)
        ],
        "generate_minutes": generated_minutes,
        "train_minutes": (time.perf_counter() - start) / 60,
        "config": asdict(cfg),
    }
    model.to(_DTYPES[cfg.save_dtype])
    with atomic_directory(out, replace=True) as tmp:  # a kill leaves the old model or the new
        drafter.save_pretrained(tmp)
        (tmp / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


@torch.no_grad()
def tapped_features(target: Any, x: torch.Tensor, taps: Sequence[int], precision: str) -> Any:
    """The drafter's input: the target's hidden states at ``taps``, concatenated."""
    with _autocast(precision):
        hidden = target(input_ids=x, output_hidden_states=True).hidden_states
        return torch.cat([hidden[j] for j in taps], dim=-1)


def _block_loss(
    target: Any, drafter: Any, cfg: DrafterTraining, mask_id: int, low: int
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """loss(x, rng, features=None) → (weighted block cross-entropy, top-1 hits [blocks, b − 1])
    for blocks anchored at random positions ≥ ``low``; ``features``: the target's tapped
    features of ``x`` when already computed."""
    b = cfg.block_size
    weights = torch.tensor([cfg.decay**k for k in range(b - 1)])
    weights = weights / weights.sum()
    embed, lm_head = drafter.embed, drafter.lm_head
    taps = [j + 1 for j in drafter.cfg.target_layer_ids]

    def loss_fn(
        x: torch.Tensor, rng: np.random.Generator, features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, length = x.shape
        if features is None:
            features = tapped_features(target, x, taps, cfg.precision)
        with _autocast(cfg.precision):
            ctx = drafter.model.context(features)
        anchors = torch.from_numpy(rng.integers(low, length - b, size=(n, cfg.anchors)))
        seq = torch.arange(n)[:, None].expand(n, cfg.anchors).reshape(-1)
        anchors = anchors.reshape(-1)
        block = torch.full((anchors.numel(), b), mask_id, dtype=torch.long)
        block[:, 0] = x[seq, anchors]
        labels = x[seq[:, None], anchors[:, None] + torch.arange(1, b)[None]]
        with _autocast(cfg.precision):
            h = drafter.model.block_hidden(ctx, anchors, seq, embed(block))
            logits = lm_head(h[:, 1:])
        logits = logits.float()
        flat = logits.reshape(-1, logits.shape[-1])
        ce = F.cross_entropy(flat, labels.reshape(-1), reduction="none")
        loss = (ce.view(-1, b - 1) * weights).sum(dim=1).mean()
        return loss, (logits.argmax(-1) == labels).detach()

    return loss_fn
