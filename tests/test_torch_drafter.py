"""The DFlash drafter and its checkpoint format; bad-input errors of the torch backend.

Invariants: save → load gives identical marginals; the saved key names are the format's; both
config layouts load; the context KV cache grown step by step equals one built at once; every
malformed input raises a BastionError naming the problem and leaves no partial files.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from bastion.backends.torch import DFlashDrafter, TargetFeedback, TorchVerifier, generate  # noqa: E402
from bastion.backends.torch.dflash_format import (  # noqa: E402
    DFlashConfig,
    default_target_layer_ids,
    read_checkpoint,
    state_dict_keys,
)
from bastion.backends.torch.runner import load_target, resolve_device  # noqa: E402
from bastion.backends.torch.verifier import check_croppable  # noqa: E402
from bastion.errors import BackendError, BastionError, CheckpointError, ConfigError  # noqa: E402
from bastion.interfaces import DraftContext  # noqa: E402
from tests.torch_models import tiny_target  # noqa: E402


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def drafter(target) -> DFlashDrafter:
    return DFlashDrafter.random_init(target, num_layers=2, block_size=5, top_k=6, seed=2)


def _features(target, n: int, start: int = 0) -> TargetFeedback:
    gen = torch.Generator().manual_seed(start)
    return TargetFeedback(torch.randn(n, 2 * 32, generator=gen), start)


def test_round_trip_identical_marginals(target, drafter, tmp_path) -> None:
    drafter.save_pretrained(tmp_path / "d")
    loaded = DFlashDrafter.from_pretrained(tmp_path / "d", target, top_k=6)
    for d in (drafter, loaded):
        d.release(0)
    ctx = DraftContext(0, (1, 2, 3, 4), 4, _features(target, 3))
    a, b = drafter.block_probs(0, 4, ctx.feedback), loaded.block_probs(0, 4, ctx.feedback)
    assert torch.equal(a, b)
    assert a.shape == (4, 96)
    drafter.release(0)
    m = drafter.draft(ctx)
    assert m.depth == 4 and m.k == 6


def test_key_names_follow_the_format(drafter, tmp_path) -> None:
    drafter.save_pretrained(tmp_path / "d")
    keys = set(safetensors_torch.load_file(str(tmp_path / "d" / "model.safetensors")))
    layer = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]  # written out from dflash-format.md, not from the code
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    expected |= {f"layers.{i}.{k}" for i in range(2) for k in layer}
    assert keys == expected == set(state_dict_keys(drafter.cfg))
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["dflash_config"]["target_layer_ids"] == list(drafter.cfg.target_layer_ids)
    assert cfg["block_size"] == 5 and cfg["model_type"] == "qwen3"
    assert "auto_map" not in cfg


def test_both_config_layouts(drafter, tmp_path) -> None:
    drafter.save_pretrained(tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    old = {k: v for k, v in raw.items() if k != "dflash_config"}
    old.update(mask_token_id=7, target_layer_ids=[0, 2])
    assert DFlashConfig.from_dict(old).target_layer_ids == (0, 2)
    assert DFlashConfig.from_dict(old).mask_token_id == 7
    both = dict(old, dflash_config={"mask_token_id": 9, "target_layer_ids": [1, 3]})
    assert DFlashConfig.from_dict(both).target_layer_ids == (1, 3)  # dflash_config wins
    assert DFlashConfig.from_dict(both).mask_token_id == 9


def test_default_taps() -> None:
    assert default_target_layer_ids(5, 36) == [1, 9, 17, 25, 33]  # published Qwen3-8B drafter
    assert default_target_layer_ids(1, 36) == [18]


def test_incremental_context_cache_equals_one_shot(target, drafter) -> None:
    feats = _features(target, 9)
    drafter.release(1)
    drafter.release(2)
    drafter.block_probs(1, 5, TargetFeedback(feats.features[:4], 0))
    drafter.block_probs(1, 5, TargetFeedback(feats.features[4:6], 4))
    step = drafter.block_probs(1, 5, TargetFeedback(feats.features[6:], 6))
    once = drafter.block_probs(2, 5, feats)
    torch.testing.assert_close(step, once, rtol=1e-5, atol=1e-6)
    with pytest.raises(BastionError, match="out of step"):
        drafter.block_probs(1, 5, TargetFeedback(feats.features[:1], 3))


def test_real_drafter_through_the_verifier_keeps_in_step(target, drafter, monkeypatch) -> None:
    held: list[int] = []
    release = drafter.release

    def spy(request_id: int) -> None:  # the runner releases a finished request's context
        held.append(drafter.context_len(request_id))
        release(request_id)

    monkeypatch.setattr(drafter, "release", spy)
    rep = generate(target, drafter, "fixed:12", [4, 5, 6], max_new_tokens=15, eos_token_id=None)
    # the drafter's context ends where the last step began: prompt + all earlier commits
    assert held[-1] == 3 + sum(rep.committed_per_step[:-1])
    assert drafter.context_len(0) == 0
    assert rep.output_len == 15


# ---------------------------------------------------------------------------- bad input


def test_mismatched_target_is_refused(drafter, tmp_path) -> None:
    drafter.save_pretrained(tmp_path / "d")
    with pytest.raises(ConfigError, match="vocab_size"):
        DFlashDrafter.from_pretrained(tmp_path / "d", tiny_target("qwen3", vocab=64))
    other = tiny_target("qwen3", layers=2)
    with pytest.raises(ConfigError, match="num_target_layers"):
        DFlashDrafter.from_pretrained(tmp_path / "d", other)
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    with pytest.raises(ConfigError, match="hidden_size"):
        t = tiny_target("qwen3")
        t.config.hidden_size = 48
        DFlashDrafter.from_pretrained(tmp_path / "d", t)
    raw["dflash_config"]["target_layer_ids"] = [0, 9]
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="out of range"):
        DFlashDrafter.from_pretrained(tmp_path / "d", tiny_target("qwen3"))


def test_tap_out_of_range_in_verifier(target) -> None:
    with pytest.raises(ConfigError, match="out of range"):
        TorchVerifier(target, tap_layer_ids=[4])


def test_missing_and_corrupt_checkpoint_files(drafter, target, tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        read_checkpoint(tmp_path / "nope")
    drafter.save_pretrained(tmp_path / "d")
    (tmp_path / "d" / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="safetensors"):
        read_checkpoint(tmp_path / "d")
    (tmp_path / "d" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"lacks model\.safetensors"):
        read_checkpoint(tmp_path / "d")
    drafter.save_pretrained(tmp_path / "e")
    (tmp_path / "e" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid"):
        read_checkpoint(tmp_path / "e")
    drafter.save_pretrained(tmp_path / "f")
    state = safetensors_torch.load_file(str(tmp_path / "f" / "model.safetensors"))
    del state["fc.weight"]
    safetensors_torch.save_file(state, str(tmp_path / "f" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"fc\.weight"):
        read_checkpoint(tmp_path / "f")


def test_save_never_overwrites_or_leaves_partial_files(drafter, tmp_path) -> None:
    drafter.save_pretrained(tmp_path / "d")
    with pytest.raises(CheckpointError, match="overwrite"):
        drafter.save_pretrained(tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_uncroppable_cache_and_long_prompt_and_missing_cuda(target) -> None:
    with pytest.raises(BackendError, match="cannot be cropped"):
        check_croppable(object())
    with pytest.raises(BastionError, match="context"):
        generate(target, None, "ar", list(range(90)) * 2, max_new_tokens=4)
    with pytest.raises(BastionError, match="context"):
        TorchVerifier(target).prefill(0, [1] * 128)
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="CUDA"):
            resolve_device("cuda")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_target("/nonexistent/target")


def test_dense_recording_matches_incremental_drafting() -> None:
    """The batched block pass (training, dense traces) equals the cached decoding pass."""
    from bastion.backends.torch.record import dense_marginals
    from bastion.backends.torch.verifier import TorchVerifier

    target = tiny_target("qwen3")
    drafter = DFlashDrafter.random_init(target, num_layers=2, block_size=8, top_k=5)
    verifier = TorchVerifier(target, tap_layer_ids=drafter.cfg.target_layer_ids)
    prompt = [5, 9, 2, 7, 11, 3]
    first, feedback = verifier.prefill(0, prompt)
    incremental = drafter.block_probs(0, first, feedback)
    top = torch.topk(incremental, 5, dim=-1)
    dense = dense_marginals(target, drafter, [*prompt, first], len(prompt))
    m = dense[len(prompt)]
    np.testing.assert_array_equal(m.token_ids, top.indices.numpy())
    np.testing.assert_allclose(m.probs, top.values.double().numpy(), rtol=1e-5, atol=1e-7)


def test_tapped_feedback_is_gathered_on_first_read_and_equals_the_eager_gather() -> None:
    """A verification's feedback gathers its rows from the tapped layers only when a drafter
    reads them (an AR step's, handed over with the next draft); what it reads is the eager
    gather, and chaining skipped steps needs only the lengths."""
    gen = torch.Generator().manual_seed(3)
    layers = [torch.randn(2, 7, 4, generator=gen) for _ in range(3)]
    rows = [0, 2, 5]
    lazy = TargetFeedback.tapped(layers, rows, 1, 10)
    assert lazy.length == 3 and lazy._features is None
    run = lazy.then(TargetFeedback.tapped(layers, [6], 1, 13))
    assert lazy._features is None  # chaining reads no features
    eager = torch.cat([h[1, torch.tensor(rows)] for h in layers], dim=-1)
    assert torch.equal(lazy.features, eager)
    merged = run.merged()  # type: ignore[attr-defined]
    assert merged.start == 10 and merged.length == 4
    assert torch.equal(merged.features[3], torch.cat([h[1, 6] for h in layers]))
    assert not torch.equal(lazy.features, torch.cat([h[0, torch.tensor(rows)] for h in layers], -1))
