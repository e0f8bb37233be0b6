"""The DFlash drafter checkpoint format: config, keys, files (docs/real-backend.md).

A checkpoint is a directory with ``config.json`` (a Qwen3 config plus ``block_size``,
``num_target_layers`` and ``mask_token_id`` / ``target_layer_ids``, kept inside
``dflash_config`` in newer files and at the top level in older ones — both are read,
``dflash_config`` wins) and ``model.safetensors`` holding the drafter's own weights: no
``model.`` prefix, no embedding, no LM head (those are the target's).

What this module does not do: build or run the network (see :mod:`.drafter`). Writing is atomic:
files go to a temporary sibling directory that is renamed into place, so a failed save leaves
no partial checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bastion.errors import CheckpointError, ConfigError

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "DFlashConfig",
    "default_target_layer_ids",
    "read_checkpoint",
    "state_dict_keys",
    "write_checkpoint",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


def default_target_layer_ids(num_draft_layers: int, num_target_layers: int) -> list[int]:
    """One tap per draft layer, spread evenly from target layer 1 to ``num_target_layers − 3``
    (rounded half up); a single draft layer taps the middle layer (``num_target_layers // 2``)."""
    if num_draft_layers < 1 or num_target_layers < 1:
        raise ConfigError("default taps need ≥ 1 draft layer and ≥ 1 target layer")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    step = (end - start) / (num_draft_layers - 1)
    return [math.floor(start + i * step + 0.5) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    """The fields of a DFlash ``config.json`` that shape the drafter; ``raw`` keeps the file."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    hidden_act: str = "silu"
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DFlashConfig:
        missing = [k for k in (*_REQUIRED, "block_size") if k not in d]
        if missing:
            raise ConfigError(f"DFlash config.json lacks {missing}; see docs/real-backend.md")
        inner = d.get("dflash_config") or {}
        if not isinstance(inner, dict):
            raise ConfigError("DFlash config field dflash_config must be an object")

        def pick(key: str) -> Any:
            return inner[key] if key in inner else d.get(key)

        mask_token_id = pick("mask_token_id")
        if mask_token_id is None:
            raise ConfigError("DFlash config has no mask_token_id (in dflash_config or top level)")
        n_layers = int(d["num_hidden_layers"])
        num_target = d.get("num_target_layers")
        taps = pick("target_layer_ids")
        if taps is None:
            if num_target is None:
                raise ConfigError("DFlash config needs target_layer_ids or num_target_layers")
            taps = default_target_layer_ids(n_layers, int(num_target))
        if num_target is None:
            num_target = max(taps) + 1
        heads = int(d["num_attention_heads"])
        return cls(
            hidden_size=int(d["hidden_size"]),
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(d["num_key_value_heads"]),
            head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            intermediate_size=int(d["intermediate_size"]),
            vocab_size=int(d["vocab_size"]),
            block_size=int(d["block_size"]),
            num_target_layers=int(num_target),
            mask_token_id=int(mask_token_id),
            target_layer_ids=tuple(int(j) for j in taps),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            attention_bias=bool(d.get("attention_bias", False)),
            hidden_act=str(d.get("hidden_act", "silu")),
            input_embedding_scale=float(d.get("input_embedding_scale") or 1.0),
            output_multiplier=float(d.get("output_multiplier") or 1.0),
            final_logit_softcapping=d.get("final_logit_softcapping"),
            raw=dict(d),
        )

    def to_dict(self) -> dict[str, Any]:
        """The newer layout: Qwen3 fields plus ``dflash_config`` (older top-level keys dropped)."""
        d = {k: v for k, v in self.raw.items() if k not in ("mask_token_id", "target_layer_ids")}
        d.update(
            model_type="qwen3",
            architectures=["DFlashDraftModel"],
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            block_size=self.block_size,
            num_target_layers=self.num_target_layers,
            rms_norm_eps=self.rms_norm_eps,
            attention_bias=self.attention_bias,
            hidden_act=self.hidden_act,
            tie_word_embeddings=False,
            dflash_config={
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        )
        return d


def state_dict_keys(cfg: DFlashConfig) -> list[str]:
    """Every tensor name a checkpoint of ``cfg`` holds, in the format's spelling."""
    keys = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        keys += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        for proj in ("q", "k", "v", "o"):
            keys.append(f"{p}self_attn.{proj}_proj.weight")
            if cfg.attention_bias:
                keys.append(f"{p}self_attn.{proj}_proj.bias")
        keys += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        keys += [f"{p}mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
    return keys


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[DFlashConfig, dict[str, torch.Tensor]]:
    """Read and check a checkpoint directory; errors name the missing or bad file or key."""
    from safetensors.torch import load_file

    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"drafter checkpoint {root} is not a directory")
    cfg_path, weights_path = root / CONFIG_FILE, root / WEIGHTS_FILE
    for p in (cfg_path, weights_path):
        if not p.is_file():
            raise CheckpointError(f"drafter checkpoint {root} lacks {p.name}")
    try:
        cfg = DFlashConfig.from_dict(json.loads(cfg_path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise CheckpointError(f"{cfg_path} is not a valid DFlash config: {exc}") from exc
    try:
        state = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own SafetensorError on corrupt files
        raise CheckpointError(f"{weights_path} cannot be read as safetensors: {exc}") from exc
    state = {k.removeprefix("model."): v for k, v in state.items()}
    expected = set(state_dict_keys(cfg))
    missing, extra = sorted(expected - state.keys()), sorted(state.keys() - expected)
    extra = [k for k in extra if not k.startswith(("embed_tokens.", "lm_head."))]
    if missing or extra:
        raise CheckpointError(
            f"{weights_path} does not match the DFlash format: missing {missing[:5]}"
            f"{'…' if len(missing) > 5 else ''}, unexpected {extra[:5]}"
        )
    return cfg, {k: state[k] for k in state_dict_keys(cfg)}


def write_checkpoint(
    path: str | os.PathLike[str], cfg: DFlashConfig, state: dict[str, torch.Tensor]
) -> None:
    """Write ``config.json`` and ``model.safetensors`` atomically (temp dir, then rename)."""
    from safetensors.torch import save_file

    root = Path(path)
    keys = state_dict_keys(cfg)
    if set(keys) != set(state):
        raise CheckpointError(f"state dict keys do not match the DFlash format: {sorted(state)}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CheckpointError(f"refusing to overwrite {root}; give a new or empty directory")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        save_file({k: state[k].detach().contiguous().cpu() for k in keys}, str(tmp / WEIGHTS_FILE))
        if root.exists():
            root.rmdir()
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
