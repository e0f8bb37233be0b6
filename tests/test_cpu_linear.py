"""The weight-streaming CPU product (bastion.backends.torch.cpu_linear): equal to PyTorch's
product, batch invariant bit for bit, exact with bf16-stored weights, lossless in decoding, and
refusing what it cannot do with the project's errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from bastion.backends.torch import DFlashDrafter, generate, load_target  # noqa: E402
from bastion.backends.torch.cpu_linear import (  # noqa: E402
    StreamingLinear,
    apply_linears,
    check_linears,
    kernel_available,
    stream_linears,
    streams,
)
from bastion.backends.torch.timing import AffineCostModel  # noqa: E402
from bastion.errors import ConfigError  # noqa: E402
from tests.torch_models import OracleDrafter, greedy_reference, tiny_target  # noqa: E402

needs_kernel = pytest.mark.skipif(not kernel_available(), reason="no AVX-512 or AVX2 kernel here")


def _layer(n: int, k: int, *, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias)


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 40])
@pytest.mark.parametrize(("n", "k"), [(1, 16), (3, 48), (17, 32), (64, 384)])
def test_matches_torch(m: int, n: int, k: int) -> None:
    dense = _layer(n, k, bias=True, seed=m * 1000 + n)
    fast = StreamingLinear(dense.weight, dense.bias)
    x = torch.randn(2, m, k)
    want = dense(x)
    got = fast(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("n", [5, 64])
def test_batch_invariant_bitwise(n: int) -> None:
    """Each row's outputs are the same bits alone as in a pass of 1..20 rows, at any position."""
    dense = _layer(n, 96, seed=n)
    fast = StreamingLinear(dense.weight, None)
    x = torch.randn(20, 96)
    alone = torch.cat([fast(x[i : i + 1]) for i in range(20)])
    for m in (2, 6, 7, 12, 20):
        assert torch.equal(fast(x[:m]), alone[:m]), m
    assert torch.equal(fast(x[3:17]), alone[3:17])


@needs_kernel
def test_bf16_storage_is_exact() -> None:
    """Weights that are exactly bf16 values are stored as bf16 and give the fp32 result's bits;
    weights that are not stay fp32."""
    dense = _layer(48, 64)
    with torch.no_grad():
        dense.weight.copy_(dense.weight.to(torch.bfloat16).float())
    as_bf16 = StreamingLinear(dense.weight, None)
    assert as_bf16.packed.dtype == torch.bfloat16 and as_bf16.weight is dense.weight
    x = torch.randn(9, 64)
    via_fp32 = StreamingLinear(dense.weight, None)
    via_fp32.packed = dense.weight.detach().clone()  # the same values held in fp32
    via_fp32._bf16 = 0
    assert torch.equal(as_bf16(x), via_fp32(x))
    inexact = _layer(48, 64, seed=1)
    assert StreamingLinear(inexact.weight, None).packed.dtype == torch.float32


@needs_kernel
def test_other_dtypes_fall_back_to_torch() -> None:
    dense = _layer(8, 32)
    fast = StreamingLinear(dense.weight, None)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    torch.testing.assert_close(fast(x), dense.to(torch.bfloat16)(x), rtol=2e-2, atol=2e-2)


@needs_kernel
def test_stream_linears_swaps_only_eligible_layers() -> None:
    model = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 7), nn.Linear(7, 4))
    assert stream_linears(model) == 2  # the 7-wide input is not a multiple of 16
    assert [type(m).__name__ for m in model] == ["StreamingLinear", "StreamingLinear", "Linear"]
    assert sorted(model.state_dict()) == [f"{i}.{p}" for i in range(3) for p in ("bias", "weight")]
    assert streams(model) and not streams(nn.Linear(16, 16)) and not streams(object())


def test_choices_validated() -> None:
    for bad in ("fast", "", None, 1, "STREAM"):
        with pytest.raises(ConfigError, match="linears"):
            check_linears(bad)
    assert check_linears("torch") == "torch" and check_linears("auto") == "auto"


@needs_kernel
def test_stream_refuses_other_dtypes_and_devices() -> None:
    model = nn.Sequential(nn.Linear(16, 16))
    with pytest.raises(ConfigError, match="fp32 models on CPU"):
        apply_linears(model, "stream", torch.device("cpu"), torch.bfloat16)
    assert apply_linears(model, "auto", torch.device("cpu"), torch.bfloat16) is False
    assert apply_linears(model, "torch", torch.device("cpu"), torch.float32) is False
    assert apply_linears(model, "auto", torch.device("cpu"), torch.float32) is True


def test_load_target_refuses_bad_linears(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="linears"):
        load_target(str(tmp_path), "cpu", linears="fastest")


@needs_kernel
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_streamed_decoding_is_lossless(family: str) -> None:
    """A streamed target reproduces its own greedy decoding under every kind of policy, with a
    DFlash drafter (streamed along with it) and with a drafter that knows the answer (deep,
    gathered acceptance); and its greedy decoding equals the unstreamed model's here."""
    plain = tiny_target(family)
    target = tiny_target(family)
    assert stream_linears(target) > 0
    dflash = DFlashDrafter.random_init(target, num_layers=2, block_size=6, top_k=4, seed=1)
    assert streams(dflash.model)
    cost = AffineCostModel(1e-3, 2e-5, draft_s=5e-4)
    for prompt in ([5], [1, 2, 3, 4, 5], [17, 9, 60, 3, 3, 41, 8, 22, 90]):
        want = greedy_reference(target, prompt, 24)
        assert want == greedy_reference(plain, prompt, 24)
        oracle = OracleDrafter(prompt + want + [0] * 8, vocab=96, depth=6, k=3)
        for drafter in (dflash, oracle):
            for policy in ("chain", "fixed:8", "beam:2x4", "bastion:64"):
                rep = generate(
                    target,
                    drafter,
                    policy,
                    prompt,
                    max_new_tokens=24,
                    eos_token_id=None,
                    cost_model=cost,
                )
                assert rep.output_ids == want, (family, prompt, policy)


@needs_kernel
def test_calibration_records_keyed_by_the_products() -> None:
    """A record timed with PyTorch's products is never reused for a streamed model (its passes
    cost differently), for the target's roofline record and the drafter's timing alike."""
    from bastion.backends.torch.calibrate import _backend_name, _drafter_record_path
    from bastion.cost.calibration import CalibrationCache

    plain, streamed = tiny_target("qwen3"), tiny_target("qwen3")
    stream_linears(streamed)
    assert _backend_name(plain) == "torch-cpu"
    assert _backend_name(streamed) == "torch-cpu-stream"
    cache = CalibrationCache("unused")  # paths only: nothing is read or written
    paths = {
        _drafter_record_path(m, DFlashDrafter.random_init(m, num_layers=1, seed=1), cache)
        for m in (plain, streamed)
    }
    assert len(paths) == 2
