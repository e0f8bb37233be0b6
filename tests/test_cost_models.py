"""Model specs from Hugging Face configs: dense Llama/Qwen3, Qwen3-MoE, DFlash drafters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bastion.cost.models import DrafterSpec, ModelSpec, get_model, known_models
from bastion.errors import ConfigError, UnknownNameError

TINY_QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "tie_word_embeddings": True,
}


def test_bundled_names() -> None:
    assert set(known_models()) == {
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-32b",
        "qwen3-coder-30b-a3b",
        "llama-3.1-8b",
        "llama-3.1-70b",
    }


# The published Hugging Face config.json values of the bundled targets used at scale
# (meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B, Qwen/Qwen3-32B), as their model cards'
# config.json files give them.
PUBLISHED = {
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
    "llama-3.1-70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1000000,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_bundled_configs_hold_the_published_values(name: str) -> None:
    from importlib import resources

    text = (resources.files("bastion.cost") / "configs" / f"{name}.json").read_text()
    shipped = json.loads(text)
    for key, value in PUBLISHED[name].items():
        assert shipped[key] == value, f"{name}: {key}"
    m = get_model(name)
    published = PUBLISHED[name]
    assert (m.hidden, m.ffn, m.layers) == (
        published["hidden_size"],
        published["intermediate_size"],
        published["num_hidden_layers"],
    )
    assert (m.q_heads, m.kv_heads, m.vocab) == (
        published["num_attention_heads"],
        published["num_key_value_heads"],
        published["vocab_size"],
    )


def test_llama_70b_has_70b_parameters() -> None:
    m = get_model("llama-3.1-70b")
    assert m.head_dim == 128 and not m.tied_embeddings and not m.qk_norm
    assert m.param_count() == pytest.approx(70.6e9, rel=0.01)


def test_qwen3_4b_has_wider_queries_than_hidden() -> None:
    m = get_model("qwen3-4b")
    assert (m.hidden, m.h_q, m.h_kv) == (2560, 4096, 1024)
    assert m.tied_embeddings and m.qk_norm and not m.is_moe


def test_llama_head_dim_is_implicit() -> None:
    m = get_model("llama-3.1-8b")
    assert m.head_dim == 128 and m.kv_heads == 8 and m.ffn == 14336 and not m.qk_norm
    assert m.param_count() == pytest.approx(8.03e9, rel=0.01)


def test_qwen3_moe() -> None:
    m = get_model("qwen3-coder-30b-a3b")
    assert m.is_moe and (m.experts, m.experts_per_token, m.expert_ffn) == (128, 8, 768)
    assert m.moe_saturation_tokens == 16
    assert m.param_count() == pytest.approx(30.5e9, rel=0.02)


def test_any_config_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    for target in (tmp_path, tmp_path / "config.json"):
        m = get_model(str(target))
        assert (m.hidden, m.h_q, m.layers, m.vocab) == (64, 128, 2, 1000)


@pytest.mark.parametrize(
    "key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
)
def test_missing_key_is_refused(key: str) -> None:
    cfg = dict(TINY_QWEN3)
    del cfg[key]
    with pytest.raises(ConfigError, match=key):
        ModelSpec.from_hf_config(cfg)


def test_moe_without_expert_width_is_refused() -> None:
    cfg = dict(TINY_QWEN3, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2)
    with pytest.raises(ConfigError, match="moe_intermediate_size"):
        ModelSpec.from_hf_config(cfg)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError):
        ModelSpec.from_hf_config(dict(TINY_QWEN3, num_key_value_heads=3))
    with pytest.raises(ConfigError):
        ModelSpec.from_hf_config(dict(TINY_QWEN3, hidden_size=0))


def test_unknown_model_lists_known() -> None:
    with pytest.raises(UnknownNameError, match="qwen3-8b"):
        get_model("qwen3-9b")


def test_dflash_drafter_config() -> None:
    cfg = dict(
        TINY_QWEN3, num_hidden_layers=1, block_size=8,
        dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 3, 5]},
    )  # fmt: skip
    d = DrafterSpec.from_hf_config(cfg)
    assert (d.block_size, d.taps, d.model.layers) == (8, 3, 1)
    d2 = DrafterSpec.dflash_for(get_model("qwen3-8b"))
    assert (d2.block_size, d2.taps, d2.model.hidden, d2.model.layers) == (16, 5, 4096, 5)


def test_a_path_with_a_nul_character_is_refused_by_name() -> None:
    """The fuzzer found os.stat's ValueError ("embedded null byte") escaping the file reader."""
    from bastion.cost.models import DrafterSpec
    from bastion.errors import BastionError
    from bastion.files import read_json_file, read_text_file

    for call in (
        lambda: DrafterSpec.from_dflash_config("\x00"),
        lambda: read_text_file("a\x00b.txt", "notes"),
        lambda: read_json_file("config\x00.json", "config"),
    ):
        with pytest.raises(BastionError, match="NUL character"):  # the guard's, or the reader's
            call()
