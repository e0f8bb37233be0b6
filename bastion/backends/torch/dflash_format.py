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

from bastion.cost.models import config_int, target_layer_ids
from bastion.errors import CheckpointError, ConfigError
from bastion.files import remove_leftovers, temp_prefix
from bastion.guard import integer, public

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "DFlashConfig",
    "default_target_layer_ids",
    "read_checkpoint",
    "read_config",
    "state_dict_keys",
    "state_dict_shapes",
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


def _activations() -> set[str]:
    from transformers.activations import ACT2FN

    return set(ACT2FN)


@public(
    error=ConfigError,
    num_draft_layers=integer(1, 1 << 16),
    num_target_layers=integer(1, 1 << 16),
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
    @public(error=ConfigError)
    def from_dict(cls, d: dict[str, Any], origin: str = "DFlash config") -> DFlashConfig:
        """Validate a DFlash ``config.json`` field by field; a :class:`ConfigError` names
        ``origin`` (the file) and the field that is missing or wrong."""
        if not isinstance(d, dict):
            raise ConfigError(f"{origin}: a DFlash config is a JSON object, got {type(d).__name__}")
        missing = [k for k in (*_REQUIRED, "block_size") if k not in d]
        if missing:
            raise ConfigError(f"{origin} lacks {missing}; see docs/real-backend.md")
        inner = d.get("dflash_config") or {}
        if not isinstance(inner, dict):
            raise ConfigError(f"{origin}: field dflash_config must be an object")

        def pick(key: str) -> Any:
            return inner[key] if key in inner else d.get(key)

        def integer(key: str, value: Any, minimum: int = 1) -> int:
            return config_int(value, key, origin, minimum=minimum)

        def number(key: str, default: float, positive: bool = True) -> float:
            value = d.get(key)
            if value is None:
                return default
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or (positive and value <= 0)
            ):
                raise ConfigError(
                    f"{origin}: {key!r} must be a {'positive ' if positive else ''}finite number, "
                    f"got {value!r}"
                )
            return float(value)

        hidden, heads = (
            integer("hidden_size", d["hidden_size"]),
            integer("num_attention_heads", d["num_attention_heads"]),
        )
        kv_heads = integer("num_key_value_heads", d["num_key_value_heads"])
        if heads % kv_heads:
            raise ConfigError(
                f"{origin}: num_key_value_heads ({kv_heads}) must divide num_attention_heads "
                f"({heads})"
            )
        if d.get("head_dim") is not None:
            head_dim = integer("head_dim", d["head_dim"])
        elif hidden % heads:
            raise ConfigError(f"{origin}: no head_dim and hidden_size % num_attention_heads != 0")
        else:
            head_dim = hidden // heads
        if head_dim % 2:
            raise ConfigError(f"{origin}: head_dim must be even (rotary embedding); got {head_dim}")
        n_layers = integer("num_hidden_layers", d["num_hidden_layers"])
        vocab = integer("vocab_size", d["vocab_size"])
        block_size = integer("block_size", d["block_size"], minimum=2)
        mask_token_id = pick("mask_token_id")
        if mask_token_id is None:
            raise ConfigError(f"{origin} has no mask_token_id (in dflash_config or top level)")
        mask_token_id = integer("mask_token_id", mask_token_id, minimum=0)
        if mask_token_id >= vocab:
            raise ConfigError(
                f"{origin}: mask_token_id {mask_token_id} is outside the vocabulary "
                f"(0 … {vocab - 1})"
            )
        num_target = d.get("num_target_layers")
        if num_target is not None:
            num_target = integer("num_target_layers", num_target)
        taps = pick("target_layer_ids")
        if taps is None:
            if num_target is None:
                raise ConfigError(f"{origin} needs target_layer_ids or num_target_layers")
            taps = default_target_layer_ids(n_layers, num_target)
        taps = target_layer_ids(taps, origin)
        if num_target is None:
            num_target = max(taps) + 1
        elif max(taps) >= num_target:
            raise ConfigError(
                f"{origin}: target_layer_ids {list(taps)} are out of range for "
                f"num_target_layers = {num_target}"
            )
        act = d.get("hidden_act", "silu")
        known = _activations()
        if not isinstance(act, str) or act not in known:
            raise ConfigError(
                f"{origin}: unknown hidden_act {act!r}; accepted: {', '.join(sorted(known))}"
            )
        bias = d.get("attention_bias", False)
        if not isinstance(bias, bool):
            raise ConfigError(f"{origin}: attention_bias must be true or false, got {bias!r}")
        cap = d.get("final_logit_softcapping")
        if cap is not None:
            cap = number("final_logit_softcapping", 0.0)
        return cls(
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=integer("intermediate_size", d["intermediate_size"]),
            vocab_size=vocab,
            block_size=block_size,
            num_target_layers=num_target,
            mask_token_id=mask_token_id,
            target_layer_ids=taps,
            rms_norm_eps=number("rms_norm_eps", 1e-6),
            attention_bias=bias,
            hidden_act=act,
            input_embedding_scale=number("input_embedding_scale", 1.0),
            output_multiplier=number("output_multiplier", 1.0),
            final_logit_softcapping=cap,
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


@public
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


@public
def state_dict_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a checkpoint of ``cfg`` holds (``state_dict_keys`` order)."""
    h, hd, ffn = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {}
    for key in state_dict_keys(cfg):
        name = key.rsplit(".", 2)[-2]
        if key == "fc.weight":
            shape: tuple[int, ...] = (h, len(cfg.target_layer_ids) * h)
        elif name in ("q_norm", "k_norm"):
            shape = (hd,)
        elif key.endswith("norm.weight") or "layernorm" in key:
            shape = (h,)
        elif name in ("q_proj", "k_proj", "v_proj"):
            out = q if name == "q_proj" else kv
            shape = (out, h) if key.endswith("weight") else (out,)
        elif name == "o_proj":
            shape = (h, q) if key.endswith("weight") else (h,)
        elif name in ("gate_proj", "up_proj"):
            shape = (ffn, h)
        else:  # down_proj
            shape = (h, ffn)
        shapes[key] = shape
    return shapes


@public
def read_config(path: str | os.PathLike[str]) -> DFlashConfig:
    """The validated ``config.json`` of a checkpoint directory (no weights are read)."""
    from bastion.files import read_json_file

    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"drafter checkpoint {root} is not a directory")
    cfg_path = root / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"drafter checkpoint {root} lacks {CONFIG_FILE}")
    try:
        data = read_json_file(cfg_path, "DFlash config")
    except ConfigError as exc:  # unreadable, binary, not JSON: the checkpoint is broken
        raise CheckpointError(f"{cfg_path} is not a valid DFlash config: {exc}") from None
    return DFlashConfig.from_dict(data, origin=str(cfg_path))


@public
def read_checkpoint(
    path: str | os.PathLike[str], cfg: DFlashConfig | None = None
) -> tuple[DFlashConfig, dict[str, torch.Tensor]]:
    """Read and check a checkpoint directory; errors name the missing or bad file or key.

    ``cfg`` (from :func:`read_config`, checked against a target by the caller) skips reading
    the config again. Tensor names and shapes are checked from the safetensors header before
    any tensor is loaded."""
    from safetensors import safe_open

    root = Path(path)
    cfg = cfg or read_config(root)
    weights_path = root / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"drafter checkpoint {root} lacks {WEIGHTS_FILE}")
    expected = state_dict_shapes(cfg)
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            names = {k.removeprefix("model."): k for k in f.keys()}  # noqa: SIM118
            missing = sorted(expected.keys() - names.keys())
            extra = sorted(names.keys() - expected.keys())
            extra = [k for k in extra if not k.startswith(("embed_tokens.", "lm_head."))]
            if missing or extra:
                raise CheckpointError(
                    f"{weights_path} does not match the DFlash format of {root / CONFIG_FILE}: "
                    f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
                    f"unexpected {extra[:5]}"
                )
            for key, shape in expected.items():
                got = tuple(f.get_slice(names[key]).get_shape())
                if got != shape:
                    raise CheckpointError(
                        f"{weights_path}: tensor {key} has shape {list(got)} but "
                        f"{root / CONFIG_FILE} implies {list(shape)}"
                    )
            state = {key: f.get_tensor(names[key]) for key in expected}
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own SafetensorError on corrupt files
        raise CheckpointError(f"{weights_path} cannot be read as safetensors: {exc}") from exc
    return cfg, state


@public
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
    remove_leftovers(root.parent)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(root.name), dir=root.parent))
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        save_file({k: state[k].detach().contiguous().cpu() for k in keys}, str(tmp / WEIGHTS_FILE))
        if root.exists():
            root.rmdir()
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
