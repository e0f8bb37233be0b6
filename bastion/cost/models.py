"""Model shapes for the cost model, read from Hugging Face ``config.json`` files.

:class:`ModelSpec` holds what the roofline needs about a decoder-only transformer: widths,
layers, attention heads, FFN or mixture-of-experts shape, vocabulary. It is built from a
``config.json`` (dense Llama / Qwen3, and Qwen3-MoE); the five targets of the paper ship as
package data under short names (``qwen3-8b``…). :class:`DrafterSpec` adds what a DFlash
block-diffusion drafter needs on top of its (Qwen3-format) config.

What this module does not do: hold any model dimension itself (they live only in the configs),
or load weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError, UnknownNameError
from bastion.guard import integer, public

__all__ = ["DrafterSpec", "ModelSpec", "get_model", "known_models"]

_CONFIG_PACKAGE = "bastion.cost"
_CONFIG_DIR = "configs"
_MOE_TYPES = ("qwen3_moe", "qwen2_moe")
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")


#: Largest accepted integer in a model config (widths, layers, heads, vocabulary, experts): the
#: roofline's float arithmetic stays exact and finite below it.
MAX_CONFIG_INT = 2**31 - 1


def _int_field(cfg: Mapping[str, Any], key: str, origin: str, *, minimum: int = 1) -> int:
    if key not in cfg:
        raise ConfigError(f"{origin}: config.json is missing required key {key!r}")
    return config_int(cfg[key], key, origin, minimum=minimum)


def config_int(value: Any, key: str, origin: str, *, minimum: int = 1) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not minimum <= value <= MAX_CONFIG_INT
    ):
        raise ConfigError(
            f"{origin}: {key!r} must be an integer in [{minimum}, {MAX_CONFIG_INT}], got "
            f"{_show(value)}"
        )
    return value


def _optional_int(cfg: Mapping[str, Any], key: str, origin: str, *, minimum: int = 1) -> int | None:
    """An integer field that may be absent or null (``None`` then)."""
    value = cfg.get(key)
    return None if value is None else config_int(value, key, origin, minimum=minimum)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_config_json(
    path: str | os.PathLike[str], what: str = "model config"
) -> tuple[dict[str, Any], Path]:
    """A ``config.json`` (or a directory holding one) as a dict, and the file it came from;
    missing, unreadable, binary, invalid or non-object files are a :class:`ConfigError`."""
    from bastion.files import read_json_file

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = read_json_file(p, what)
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p}: expected a JSON object, got {type(cfg).__name__}")
    return cfg, p


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer (per the paper's Table 11 notation)."""

    name: str
    model_type: str  # HF model_type ("llama", "qwen3", "qwen3_moe")
    hidden: int  # h: residual-stream width
    layers: int  # L
    q_heads: int  # n_q
    kv_heads: int  # n_kv
    head_dim: int  # d; h_q = n_q·d may differ from h
    ffn: int  # dense FFN width (intermediate_size); unused by an all-MoE model
    vocab: int  # V
    tied_embeddings: bool
    experts: int = 0  # E (0 for a dense model)
    experts_per_token: int = 0  # K
    expert_ffn: int = 0  # FFN width of one expert
    qk_norm: bool = False  # Qwen3's per-head RMSNorm on q and k

    @property
    def h_q(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def h_kv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_saturation_tokens(self) -> float:
        """s = E/K, where the saturating expert-touch count reaches every expert."""
        return self.experts / self.experts_per_token if self.is_moe else float("inf")

    def layer_params(self) -> int:
        """Parameters of one decoder layer (norm weights included)."""
        attn = self.hidden * (self.h_q + 2 * self.h_kv) + self.h_q * self.hidden
        if self.is_moe:
            ffn = self.hidden * self.experts + self.experts * 3 * self.hidden * self.expert_ffn
        else:
            ffn = 3 * self.hidden * self.ffn
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attn + ffn + norms

    def param_count(self) -> int:
        """All parameters; a tied embedding table counts once."""
        table = self.vocab * self.hidden
        return (
            self.layers * self.layer_params()
            + self.hidden
            + table * (1 if self.tied_embeddings else 2)
        )

    def shape_digest(self) -> str:
        """8 hex digits of a hash of the shape (every field but the name): the real backend
        names a loaded target ``DIRNAME-DIGEST`` (``bastion.backends.torch.calibrate.
        target_spec``), so its calibration records are matched to a spec by shape."""
        shape = json.dumps({k: v for k, v in asdict(self).items() if k != "name"}, sort_keys=True)
        return hashlib.sha256(shape.encode()).hexdigest()[:8]

    @classmethod
    @public(error=ConfigError)
    def from_hf_config(
        cls, path_or_dict: str | os.PathLike[str] | Mapping[str, Any], name: str | None = None
    ) -> ModelSpec:
        """Build a spec from a ``config.json`` path (or a directory holding one) or a dict."""
        if isinstance(path_or_dict, Mapping):
            cfg: Mapping[str, Any] = path_or_dict
            origin = name or "<config dict>"
        else:
            cfg, p = read_config_json(path_or_dict)
            origin = str(p)
            name = name or (p.parent.name if p.name == "config.json" else p.stem)
        model_type = cfg.get("model_type", "")
        if not isinstance(model_type, str):
            raise ConfigError(f"{origin}: 'model_type' must be a string, got {_show(model_type)}")
        hidden = _int_field(cfg, "hidden_size", origin)
        layers = _int_field(cfg, "num_hidden_layers", origin)
        q_heads = _int_field(cfg, "num_attention_heads", origin)
        kv_heads = _optional_int(cfg, "num_key_value_heads", origin) or q_heads
        if q_heads % kv_heads:
            raise ConfigError(
                f"{origin}: num_key_value_heads ({kv_heads}) must divide "
                f"num_attention_heads ({q_heads})"
            )
        if cfg.get("head_dim") is not None:
            head_dim = _int_field(cfg, "head_dim", origin)
        elif hidden % q_heads:
            raise ConfigError(f"{origin}: no head_dim and hidden_size % num_attention_heads != 0")
        else:
            head_dim = hidden // q_heads
        vocab = _int_field(cfg, "vocab_size", origin)
        for key in ("num_experts", "num_local_experts", "num_experts_per_tok"):
            _optional_int(cfg, key, origin, minimum=0)
        for key in ("moe_intermediate_size", "intermediate_size", "decoder_sparse_step"):
            _optional_int(cfg, key, origin, minimum=0)
        tied = cfg.get("tie_word_embeddings", False)
        if not isinstance(tied, bool):
            raise ConfigError(
                f"{origin}: 'tie_word_embeddings' must be true or false, got {_show(tied)}"
            )
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        is_moe = model_type in _MOE_TYPES or experts > 0
        if is_moe:
            experts = _int_field(cfg, "num_experts", origin)
            k = _int_field(cfg, "num_experts_per_tok", origin)
            expert_ffn = _int_field(cfg, "moe_intermediate_size", origin)
            if k > experts:
                raise ConfigError(f"{origin}: num_experts_per_tok {k} > num_experts {experts}")
            if cfg.get("shared_expert_intermediate_size") or cfg.get("mlp_only_layers"):
                raise ConfigError(
                    f"{origin}: shared experts and dense-only layers are not modelled; accepted:"
                    " Qwen3-MoE with every layer MoE and no shared expert"
                )
            if (cfg.get("decoder_sparse_step") or 1) != 1:
                raise ConfigError(f"{origin}: decoder_sparse_step must be 1 (every layer MoE)")
            ffn = int(cfg.get("intermediate_size") or 0)
        else:
            k, expert_ffn = 0, 0
            ffn = _int_field(cfg, "intermediate_size", origin)
        return cls(
            name=name or model_type or "model",
            model_type=model_type,
            hidden=hidden,
            layers=layers,
            q_heads=q_heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            ffn=ffn,
            vocab=vocab,
            tied_embeddings=tied,
            experts=experts if is_moe else 0,
            experts_per_token=k,
            expert_ffn=expert_ffn,
            qk_norm=model_type in _QK_NORM_TYPES,
        )


@dataclass(frozen=True)
class DrafterSpec:
    """A DFlash block-diffusion drafter: a small transformer over one block of tokens.

    Its K/V come from the block and from the target's tapped hidden states ("context features"),
    projected by ``fc`` (``taps·hidden → hidden``) and cached across steps; it shares the
    target's embedding table and LM head.
    """

    model: ModelSpec  # the drafter's own layers (widths usually equal to the target's)
    block_size: int = 16  # tokens per block: the bonus token + block_size − 1 masked slots
    taps: int = 5  # target layers whose hidden states feed ``fc``

    @classmethod
    @public(
        error=ConfigError,
        layers=integer(1, MAX_CONFIG_INT),
        block_size=integer(2, MAX_CONFIG_INT),
        taps=integer(1, MAX_CONFIG_INT),
    )
    def dflash_for(
        cls, target: ModelSpec, layers: int = 5, block_size: int = 16, taps: int | None = None
    ) -> DrafterSpec:
        """The published DFlash layout for ``target``: its widths, ``layers`` layers."""
        if layers < 1 or block_size < 2:
            raise ConfigError("a DFlash drafter needs layers ≥ 1 and block_size ≥ 2")
        dense = ModelSpec(
            name=f"{target.name}-dflash-b{block_size}",
            model_type="qwen3",
            hidden=target.hidden,
            layers=layers,
            q_heads=target.q_heads,
            kv_heads=target.kv_heads,
            head_dim=target.head_dim,
            ffn=target.ffn if not target.is_moe else target.expert_ffn * target.experts_per_token,
            vocab=target.vocab,
            tied_embeddings=False,
            qk_norm=True,
        )
        return cls(model=dense, block_size=block_size, taps=layers if taps is None else taps)

    @classmethod
    @public(error=ConfigError)
    def from_hf_config(
        cls, path_or_dict: str | os.PathLike[str] | Mapping[str, Any]
    ) -> DrafterSpec:
        """Read a DFlash ``config.json`` (``block_size``, ``dflash_config.target_layer_ids``).

        Lenient: a plain model config is a drafter of its layers with a 16-token block and one
        tap per layer. :meth:`from_dflash_config` insists on the DFlash fields."""
        if isinstance(path_or_dict, Mapping):
            return cls._from_mapping(path_or_dict, "<drafter config dict>")
        cfg, p = read_config_json(path_or_dict, "drafter config")
        return cls._from_mapping(cfg, str(p))

    @classmethod
    def from_dflash_config(
        cls, path: str | os.PathLike[str], target: ModelSpec | None = None
    ) -> DrafterSpec:
        """A DFlash drafter's ``config.json`` (or the checkpoint directory holding one), as the
        real backend reads it (``docs/real-backend.md``): ``block_size``, ``mask_token_id`` and
        ``target_layer_ids`` or ``num_target_layers`` (inside ``dflash_config`` or at the top
        level) are required, besides the Qwen3 shape fields. With ``target``, the drafter must
        fit it: the same vocabulary and hidden size (it shares the target's embedding and LM
        head), taps inside its layers, ``num_target_layers`` (if given) its layer count.

        A missing, unreadable or non-DFlash file, or a misfit, is a :class:`ConfigError`
        naming the file and what is missing or wrong. Torch-free (no weights are read)."""
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise ConfigError(
                f"a drafter config is a path to a DFlash config.json or its directory; got "
                f"{_show(path)}"
            )
        cfg, p = read_config_json(path, "drafter config")
        origin = str(p)
        inner = cfg.get("dflash_config") or {}
        if not isinstance(inner, Mapping):
            raise ConfigError(f"{origin}: 'dflash_config' must be an object, got {_show(inner)}")

        def given(key: str) -> bool:
            return inner.get(key, cfg.get(key)) is not None

        missing = [k for k in ("block_size",) if cfg.get(k) is None]
        missing += [k for k in ("mask_token_id",) if not given(k)]
        if not given("target_layer_ids") and cfg.get("num_target_layers") is None:
            missing.append("target_layer_ids or num_target_layers")
        if missing:
            raise ConfigError(
                f"{origin}: not a DFlash drafter config: missing {', '.join(missing)} (at the top "
                "level or in dflash_config; see docs/real-backend.md)"
            )
        spec = cls._from_mapping(cfg, origin)
        mask_id = inner.get("mask_token_id", cfg.get("mask_token_id"))
        mask = config_int(mask_id, "mask_token_id", origin, minimum=0)
        if mask >= spec.model.vocab:
            raise ConfigError(
                f"{origin}: mask_token_id {mask} is outside the vocabulary (0 … "
                f"{spec.model.vocab - 1})"
            )
        num_target = _optional_int(cfg, "num_target_layers", origin)
        taps_ids = inner.get("target_layer_ids", cfg.get("target_layer_ids"))
        taps = () if taps_ids is None else target_layer_ids(taps_ids, origin)
        if num_target is not None and taps and max(taps) >= num_target:
            raise ConfigError(
                f"{origin}: target_layer_ids {list(taps)} are out of range for "
                f"num_target_layers = {num_target}"
            )
        if target is not None:
            for key, mine, theirs in (
                ("vocab_size", spec.model.vocab, target.vocab),
                ("hidden_size", spec.model.hidden, target.hidden),
            ):
                if mine != theirs:
                    raise ConfigError(
                        f"{origin}: {key} {mine} does not match the target's {theirs} "
                        f"({target.name})"
                    )
            if num_target is not None and num_target != target.layers:
                raise ConfigError(
                    f"{origin}: num_target_layers {num_target} does not match the target's "
                    f"{target.layers} layers ({target.name})"
                )
            bad = [j for j in taps if j >= target.layers]
            if bad:
                raise ConfigError(
                    f"{origin}: target_layer_ids {bad} are out of range for the "
                    f"{target.layers}-layer target ({target.name})"
                )
        return spec

    @classmethod
    def _from_mapping(cls, cfg: Mapping[str, Any], origin: str) -> DrafterSpec:
        model = ModelSpec.from_hf_config(cfg, name=origin if origin[0] != "<" else None)
        model = replace(model, name="dflash-drafter")
        inner = cfg.get("dflash_config") or {}
        if not isinstance(inner, Mapping):
            raise ConfigError(f"{origin}: 'dflash_config' must be an object, got {_show(inner)}")
        taps_ids = inner.get("target_layer_ids", cfg.get("target_layer_ids"))
        taps = model.layers if taps_ids is None else len(target_layer_ids(taps_ids, origin))
        block = cfg.get("block_size", 16)
        return cls(
            model=model, block_size=config_int(block, "block_size", origin, minimum=2), taps=taps
        )


def target_layer_ids(value: Any, origin: str) -> tuple[int, ...]:
    """A drafter's ``target_layer_ids``: a non-empty list of integers ≥ 0 (a string
    such as ``"12"`` is refused, not read as ``[1, 2]``)."""
    if (
        not isinstance(value, list | tuple)
        or not value
        or any(isinstance(j, bool) or not isinstance(j, int) for j in value)
    ):
        raise ConfigError(
            f"{origin}: 'target_layer_ids' must be a non-empty list of layer indices, got "
            f"{_show(value)}"
        )
    for j in value:
        config_int(j, "target_layer_ids", origin, minimum=0)
    return tuple(value)


def _bundled() -> dict[str, Any]:
    root = resources.files(_CONFIG_PACKAGE) / _CONFIG_DIR
    return {p.name[: -len(".json")]: p for p in root.iterdir() if p.name.endswith(".json")}


def known_models() -> list[str]:
    """Short names of the bundled model configs, sorted."""
    return sorted(_bundled())


@public(error=ConfigError)
def get_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A bundled model by short name (``qwen3-8b``) or any ``config.json`` path / directory."""
    if not isinstance(name_or_path, str | os.PathLike) or not os.fspath(name_or_path):
        raise ConfigError(
            f"a model is a bundled name ({', '.join(known_models())}) or a config.json path; "
            f"got {_show(name_or_path)}"
        )
    text = os.fspath(name_or_path)
    bundled = _bundled()
    if text in bundled:
        return ModelSpec.from_hf_config(json.loads(bundled[text].read_text()), name=text)
    if text.endswith(".json") or os.sep in text or Path(text).is_dir():
        return ModelSpec.from_hf_config(text)
    raise UnknownNameError(
        f"unknown model {text!r}; known: {', '.join(sorted(bundled))} "
        "(or give a path to a config.json)"
    )
