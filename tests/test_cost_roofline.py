"""The roofline's hand checks (weights read, a decode step) and its structural properties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.cost.hardware import get_profile, known_profiles
from bastion.cost.models import DrafterSpec, get_model, known_models
from bastion.cost.roofline import (
    RooflineOptions,
    ar_step,
    drafter_pass,
    experts_touched,
    verify_pass,
    weight_bytes,
)
from bastion.errors import ConfigError

A100 = get_profile("a100-sxm-80gb")
GATHERED = RooflineOptions(full_embedding_table=False)


@pytest.mark.parametrize("name", ["qwen3-8b", "llama-3.1-8b"])
def test_weight_bytes_of_an_8b_model(name: str) -> None:
    """Hand check: ≈ 15–16.5 GB read at s = 1 in bf16; the paper counts the whole table."""
    m = get_model(name)
    full = weight_bytes(m, A100)
    rows = weight_bytes(m, A100, options=GATHERED)
    assert 15.0e9 <= rows < full <= 16.5e9
    assert full - rows == pytest.approx(2 * m.vocab * m.hidden, rel=1e-9)  # one table, bf16
    assert full == pytest.approx(2 * m.param_count(), rel=1e-9)  # untied: every weight once


def test_tied_table_is_read_twice() -> None:
    """Paper (G.2): even tied, embedding and LM head weight accesses count separately."""
    m = get_model("qwen3-4b")
    assert weight_bytes(m, A100) == pytest.approx(
        2 * (m.param_count() + m.vocab * m.hidden), rel=1e-9
    )


@pytest.mark.parametrize("context", [128, 512, 1024])
def test_llama_decode_step_on_a100(context: int) -> None:
    """Uncalibrated batch-1 decode of Llama-3.1-8B on A100 80GB: inside the public 7–11 ms."""
    t = float(ar_step(get_model("llama-3.1-8b"), A100, context).total_s)
    assert 7e-3 <= t <= 11e-3


def test_gemm_flops_are_two_per_weight_per_token() -> None:
    m = get_model("qwen3-8b")
    b = verify_pass(m, A100, [(64, 0)])
    gemm = sum(float(o.flops) for o in b.operators if o.name.endswith(("proj", "lm_head")))
    assert gemm == pytest.approx(2 * 64 * (m.param_count() - m.vocab * m.hidden), rel=1e-3)


def test_attention_counts_prefix_and_tree() -> None:
    m = get_model("llama-3.1-8b")
    s, c = 32, 1000
    op = verify_pass(m, A100, [(s, c)]).op("attn_values")
    assert float(op.flops) == pytest.approx(2 * m.h_q * s * (c + s) * m.layers)
    assert float(op.kv_bytes) == pytest.approx(2 * m.h_kv * (c + s) * m.layers)


def test_vectorised_equals_scalar() -> None:
    m = get_model("qwen3-32b")
    n = np.arange(1, 65)
    vec = verify_pass(m, A100, [(n, 700), (8, 300)]).total_s
    for i in (0, 7, 63):
        assert vec[i] == pytest.approx(
            float(verify_pass(m, A100, [(i + 1, 700), (8, 300)]).total_s)
        )


def test_batching_shares_the_weights() -> None:
    m = get_model("qwen3-8b")
    one = float(verify_pass(m, A100, [(16, 512)]).total_s)
    two = float(verify_pass(m, A100, [(16, 512), (16, 512)]).total_s)
    assert one < two < 1.2 * one


def test_expert_touch_forms() -> None:
    s = np.arange(1, 200)
    sat = experts_touched(s, 128, 8, "saturating")
    uni = experts_touched(s, 128, 8, "uniform")
    assert sat[15] == 128 and sat[14] == 120 and np.all(sat[15:] == 128)
    assert uni[0] == pytest.approx(8) and np.all(uni <= sat + 1e-9) and uni[-1] > 127
    assert uni[9] == pytest.approx(128 * (1 - (1 - 8 / 128) ** 10))
    with pytest.raises(ConfigError):
        experts_touched(s, 128, 8, "zipf")  # type: ignore[arg-type]


def test_moe_reads_only_touched_experts() -> None:
    m = get_model("qwen3-coder-30b-a3b")
    decode = weight_bytes(m, A100)
    active = m.param_count() - m.layers * (m.experts - m.experts_per_token) * 3 * m.hidden * (
        m.expert_ffn
    )
    assert decode == pytest.approx(2 * active, rel=1e-6)
    assert weight_bytes(m, A100, tokens=16) == pytest.approx(2 * m.param_count(), rel=1e-6)


def test_drafter_and_ar_step() -> None:
    m = get_model("qwen3-8b")
    d = DrafterSpec.dflash_for(m)
    draft = float(drafter_pass(d, A100, [1024]).total_s)
    ar = float(ar_step(m, A100, 1024).total_s)
    assert 0 < draft < ar  # 5 layers + LM head vs 36 layers + LM head
    assert float(drafter_pass(d, A100, [1024, 1024]).total_s) > draft
    assert ar < float(verify_pass(m, A100, [(1, 1024)]).total_s)  # no tree mask


def test_breakdown_records_and_bounds() -> None:
    b = verify_pass(get_model("qwen3-8b"), A100, [(512, 64)])
    recs = b.to_records()
    assert {r["op"] for r in recs} >= {"q_proj", "attn_scores", "gate_proj", "lm_head"}
    assert b.op("gate_proj").compute_s > b.op("gate_proj").memory_s  # 512 tokens: compute bound
    assert sum(r["time_s"] for r in recs) == pytest.approx(float(b.total_s))  # type: ignore[misc]


def test_bad_pass_is_refused() -> None:
    m = get_model("qwen3-8b")
    with pytest.raises(ConfigError):
        verify_pass(m, A100, [(0, 10)])
    with pytest.raises(ConfigError):
        verify_pass(m, A100, [])
    with pytest.raises(ConfigError):
        RooflineOptions(bytes_per_param=0)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(known_models()),
    profile=st.sampled_from(known_profiles()),
    tokens=st.integers(1, 2048),
    context=st.integers(0, 32768),
    faster=st.floats(1.0, 4.0),
)
def test_a_faster_device_never_costs_more(
    model: str, profile: str, tokens: int, context: int, faster: float
) -> None:
    """Metamorphic: more FLOP/s and more bandwidth never raise the predicted time."""
    hw = get_profile(profile)
    quick = dataclasses.replace(
        hw, bf16_flops=hw.bf16_flops * faster, memory_bandwidth=hw.memory_bandwidth * faster
    )
    m = get_model(model)
    slow = float(verify_pass(m, hw, [(tokens, context)]).total_s)
    fast = float(verify_pass(m, quick, [(tokens, context)]).total_s)
    assert fast <= slow * (1 + 1e-12)


@given(
    st.sampled_from(["qwen3-8b", "qwen3-4b", "llama-3.1-8b", "qwen3-coder-30b-a3b"]),
    st.sampled_from([0, 64, 128]),
    st.sampled_from(["saturating", "uniform"]),
    st.booleans(),
    st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 8192)), min_size=1, max_size=6),
)
def test_linear_pricer_equals_price_pass(
    model: str, tile: int, touch: str, masked: bool, reqs: list[tuple[int, int]]
) -> None:
    """The matrix form of the roofline gives the per-operator numbers of price_pass."""
    from bastion.cost.roofline import LinearPricer, PassShape, price_pass

    spec = get_model(model)
    hw = get_profile("a100-sxm-80gb")
    opt = RooflineOptions(tile_tokens=tile, expert_touch=touch)  # type: ignore[arg-type]
    shape = PassShape.of(reqs, masked=masked)
    ref = price_pass(spec, hw, shape, opt, masked=masked)
    pricer = LinearPricer(spec, hw, opt, masked=masked)
    compute, memory = pricer.branches(shape)
    np.testing.assert_allclose(pricer.total_s(shape), ref.total_s, rtol=1e-12)
    np.testing.assert_allclose(compute, [op.compute_s for op in ref.operators], rtol=1e-12)
    np.testing.assert_allclose(memory, [op.memory_s for op in ref.operators], rtol=1e-12)
    assert pricer.names == tuple(op.name for op in ref.operators)


def test_linear_pricer_public_coefficients_give_its_branches() -> None:
    """flops / nbytes / flop_rate / byte_rate (what the simulated GPU and the cost model read)
    reproduce branches(), and the shared coefficient arrays cannot be written through."""
    from bastion.cost.roofline import LinearPricer, PassShape

    spec, hw = get_model("qwen3-coder-30b-a3b"), get_profile("h100-sxm")
    pricer = LinearPricer(spec, hw, RooflineOptions(tile_tokens=64), masked=True)
    shape = PassShape.of([(61, 900), (16, 40)], masked=True)
    x = pricer.features(shape)
    (f0, f), (b0, b) = pricer.flops, pricer.nbytes
    compute, memory = pricer.branches(shape)
    np.testing.assert_allclose((f0 + x @ f) / pricer.flop_rate, compute, rtol=1e-12)
    np.testing.assert_allclose((b0 + x @ b) / pricer.byte_rate, memory, rtol=1e-12)
    assert f.shape == b.shape == (6, len(pricer.names))
    assert pricer.flop_rate == hw.peak_flops("bf16") * hw.compute_efficiency
    for array in (f0, f, b0, b):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0.0
