"""Config and data files: every malformed one is the project's error, naming the file and field.

HF ``config.json`` (cost model), hardware TOML, traces, DFlash drafter configs and checkpoints
(checked against the target before any weight is read), and the atomic writers' guarantees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bastion.cost.hardware import get_profile, load_profile, profile_to_toml
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BastionError, BudgetError, CheckpointError, ConfigError
from bastion.files import atomic_directory, check_output_file, save_figure_atomic
from bastion.trace import read_trace

BASE: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hidden_size": -4}, "hidden_size"),
        ({"hidden_size": 10**30}, "hidden_size"),
        ({"hidden_size": True}, "hidden_size"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"num_key_value_heads": "4"}, "num_key_value_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"num_experts": -1}, "num_experts"),
        ({**MOE, "num_experts": 4.5}, "num_experts"),
        ({**MOE, "moe_intermediate_size": -8}, "moe_intermediate_size"),
        ({**MOE, "num_experts_per_tok": -2}, "num_experts_per_tok"),
        ({**MOE, "num_experts_per_tok": 8}, "num_experts_per_tok"),
        ({**MOE, "decoder_sparse_step": "x"}, "decoder_sparse_step"),
        ({"intermediate_size": -1}, "intermediate_size"),
        ({"head_dim": "a"}, "head_dim"),
        ({"model_type": ["qwen3"]}, "model_type"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_bad_hf_config_fields_are_named(tmp_path: Path, fields: dict[str, Any], named: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **fields}))
    with pytest.raises(ConfigError, match=named) as err:
        get_model(path)
    assert str(path) in str(err.value)


def test_missing_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in BASE.items() if k != "vocab_size"}))
    with pytest.raises(ConfigError, match="vocab_size"):
        get_model(tmp_path)  # a directory holding config.json


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x01\xff\xfe", "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"hidden_size": 6', "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"", "not valid JSON"),
    ],
)
def test_unreadable_model_configs(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        get_model(path)
    with pytest.raises(ConfigError, match=message):
        DrafterSpec.from_hf_config(path)


def test_model_config_directory_and_wrong_types(tmp_path: Path) -> None:
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ConfigError, match="not found"):
        get_model(tmp_path / "d.json")  # a directory without a config.json
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").mkdir()
    with pytest.raises(ConfigError, match="directory"):
        get_model(tmp_path / "e")
    for bad in (None, 3, ""):
        with pytest.raises(ConfigError):
            get_model(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": -3}, "block_size"),
        ({"block_size": "16"}, "block_size"),
        ({"target_layer_ids": "12"}, "target_layer_ids"),  # not [1, 2]
        ({"dflash_config": {"target_layer_ids": "12"}}, "target_layer_ids"),
        ({"dflash_config": {"target_layer_ids": [-1]}}, "target_layer_ids"),
        ({"dflash_config": {"target_layer_ids": []}}, "target_layer_ids"),
        ({"dflash_config": [1]}, "dflash_config"),
    ],
)
def test_drafter_spec_fields(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        DrafterSpec.from_hf_config({**BASE, **fields})


# --- hardware profiles ----------------------------------------------------------------------


def _profile_text() -> str:
    return profile_to_toml(get_profile("h100-sxm"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("bf16_flops = ", "bf16_flops = -", 1), r"\[peak\].bf16_flops"),
        (lambda t: t.replace("sm_count = ", 'sm_count = "x" #'), r"\[peak\].sm_count"),
        (lambda t: t.replace("\ncompute = ", "\ncompute = 2.0 #"), r"\[efficiency\].compute"),
        (lambda t: t.replace('description = "', "description = 3 #"), "description"),
        (lambda t: t.replace("[sources]", "[sourcesx]"), r"\[sources\]"),
        (lambda t: t.replace("name = ", "name = 5 #", 1), "name"),
        (lambda t: t[: len(t) // 2] + "= =", "not valid TOML"),
        (lambda t: "a = " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_hardware_profiles(tmp_path: Path, edit: Any, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(edit(_profile_text()))
    with pytest.raises(ConfigError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_hardware_profile_binary_directory_missing(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "d.toml").mkdir()
    for name, message in (("b.toml", "UTF-8"), ("d.toml", "directory"), ("n.toml", "not found")):
        with pytest.raises(ConfigError, match=message):
            get_profile(str(tmp_path / name))
    with pytest.raises(ConfigError):
        get_profile(None)  # type: ignore[arg-type]


# --- traces ----------------------------------------------------------------------------------


def _trace(**changes: Any) -> dict[str, Any]:
    step = {"position": 2, "token_ids": [[5, 6]], "probs": [[0.6, 0.2]], "tree_size": 2}
    data: dict[str, Any] = {
        "format": "bastion-trace",
        "version": 1,
        "metadata": {},
        "prompt_ids": [1, 2, 3],
        "output_ids": [4, 5],
        "steps": [{**step, "committed": 1}],
    }
    for key, value in changes.items():
        if key.startswith("step_"):
            data["steps"][0][key[5:]] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (_trace(step_position=-1), r"steps\[0\].position"),
        (_trace(step_position="2"), r"steps\[0\].position"),
        (_trace(step_tree_size=0), r"steps\[0\].tree_size"),
        (_trace(step_committed=None), r"steps\[0\].committed"),
        (_trace(step_probs=[[0.6, "x"]]), r"steps\[0\]"),
        (_trace(step_token_ids=[[5, 6], [1]]), r"steps\[0\]"),
        (_trace(prompt_ids=[-1]), r"prompt_ids\[0\]"),
        (_trace(prompt_ids=[2**64]), r"prompt_ids\[0\]"),
        (_trace(output_ids="45"), "output_ids"),
        (_trace(steps={"a": 1}), "steps"),
        (_trace(steps=[3]), r"steps\[0\]"),
        (_trace(metadata=[1]), "metadata"),
        (_trace(dense=[{"position": -4, "token_ids": [[1]], "probs": [[0.5]]}]), "dense"),
        (_trace(version=2), "version"),
        ([1, 2], "not a bastion-trace"),
    ],
)
def test_bad_traces_name_the_field(tmp_path: Path, data: Any, named: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=named) as err:
        read_trace(path)
    assert str(path) in str(err.value)


def test_good_trace_reads(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace()))
    assert read_trace(path).steps[0].position == 2


# --- atomic writers ---------------------------------------------------------------------------


def test_save_figure_atomic_leaves_old_file_on_failure(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    out = tmp_path / "f.png"
    save_figure_atomic(fig, out, dpi=40)
    good = out.read_bytes()
    assert good.startswith(b"\x89PNG")

    class Broken:
        def savefig(self, f: Any, **kwargs: Any) -> None:
            f.write(b"half a png")
            raise KeyboardInterrupt  # a kill in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        save_figure_atomic(Broken(), out)
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]
    plt.close(fig)


def test_atomic_directory(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("1")
    assert (out / "a").read_text() == "1"
    with pytest.raises(RuntimeError), atomic_directory(out, replace=True) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("killed while saving")
    assert (out / "a").read_text() == "1"  # the old one stays
    with atomic_directory(out, replace=True) as tmp:
        (tmp / "b").write_text("3")
    assert sorted(p.name for p in out.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    with pytest.raises(ConfigError, match="not empty"), atomic_directory(out):
        pass


def test_check_output_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert check_output_file(tmp_path / "new" / "deeper" / "o.txt") is not None
    for bad, message in (
        (tmp_path, "directory"),
        (tmp_path / "f" / "o.txt", "not a directory"),
        ("", "file name"),
    ):
        with pytest.raises(ConfigError, match=message):
            check_output_file(bad)


# --- DFlash checkpoints (torch) ----------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def target() -> Any:
    from tests.torch_models import tiny_target

    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, target: Any) -> Path:
    from bastion.backends.torch import DFlashDrafter

    path = tmp_path_factory.mktemp("ckpt") / "d"
    DFlashDrafter.random_init(target, num_layers=2, block_size=4).save_pretrained(path)
    return path


def _copy_with(saved: Path, dest: Path, **fields: Any) -> Path:
    dest.mkdir()
    cfg = json.loads((saved / "config.json").read_text())
    for key, value in fields.items():
        if key.startswith("inner_"):
            cfg["dflash_config"][key[6:]] = value
        else:
            cfg[key] = value
    (dest / "config.json").write_text(json.dumps(cfg))
    (dest / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    return dest


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": -1}, "block_size"),
        ({"hidden_act": "nope"}, "hidden_act"),
        ({"inner_target_layer_ids": "12"}, "target_layer_ids"),
        ({"inner_mask_token_id": -1}, "mask_token_id"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
        ({"attention_bias": "no"}, "attention_bias"),
    ],
)
def test_bad_drafter_config_fields(
    saved: Path, tmp_path: Path, fields: dict[str, Any], named: str
) -> None:
    from bastion.backends.torch.dflash_format import read_checkpoint

    path = _copy_with(saved, tmp_path / "bad", **fields)
    with pytest.raises(ConfigError, match=named) as err:
        read_checkpoint(path)
    assert "config.json" in str(err.value)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hidden_size": 128, "head_dim": 16}, "hidden_size"),
        ({"vocab_size": 200}, "vocab_size"),
        ({"num_target_layers": 3}, "num_target_layers"),
        ({"inner_target_layer_ids": [0, 0, 0]}, "fc.weight"),  # 3 taps, fc sized for 2
    ],
)
def test_drafter_checked_against_target_before_weights(
    saved: Path, tmp_path: Path, target: Any, fields: dict[str, Any], named: str
) -> None:
    """A mismatch is reported from the config (or the safetensors header), never by
    load_state_dict; for a config mismatch the weights file is garbage, so reading it first
    would fail with a different error."""
    from bastion.backends.torch import DFlashDrafter

    path = _copy_with(saved, tmp_path / "bad", **fields)
    if named != "fc.weight":
        (path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(BastionError, match=named):
        DFlashDrafter.from_pretrained(path, target)


def test_truncated_and_mis_shaped_weights(saved: Path, tmp_path: Path, target: Any) -> None:
    from bastion.backends.torch import DFlashDrafter

    path = _copy_with(saved, tmp_path / "t")
    data = (saved / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        DFlashDrafter.from_pretrained(path, target)
    (path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        DFlashDrafter.from_pretrained(path, target)
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        DFlashDrafter.from_pretrained(path, target)
    with pytest.raises(BudgetError, match="top_k"):
        DFlashDrafter.from_pretrained(saved, target, top_k=0)
