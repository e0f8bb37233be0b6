"""Truth files: loading, validation, lookup, and the effects they switch on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bastion.cost.hardware import get_profile
from bastion.cost.hardware import load_profile as load_profile_path
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import ConfigError, UnknownNameError
from bastion.sim.gpu import GroundTruth, SimulatedGPU, expected_experts, routing_draws
from bastion.sim.simulate import SimSpec
from bastion.sim.truth import (
    TRUTH_DIR_ENV,
    gemm_shape_from_csv,
    get_truth,
    known_truths,
    load_truth,
    truth_from_dict,
)

DATA = Path(__file__).resolve().parents[1] / "docs" / "data"


def gpu(truth: GroundTruth, model: str = "qwen3-8b", device: str = "a100-sxm-80gb") -> SimulatedGPU:
    m = get_model(model)
    return SimulatedGPU(get_profile(device), m, DrafterSpec.dflash_for(m), truth)


def test_shipped_truths_load_and_differ() -> None:
    assert {"hf-eager", "cudagraph", "builtin"} <= set(known_truths())
    eager, graph = get_truth("hf-eager"), get_truth("cudagraph")
    assert eager.name == "hf-eager" and graph.name == "cudagraph"
    assert eager.host_layer_s > 0 and graph.host_layer_s == 0  # measured vs graph replay
    assert eager.causal_reads_mask and not graph.causal_reads_mask
    # every shipped truth takes each GPU's GEMM steps from the kernel-aware model; the
    # A100-measured curve is validation data (test_kernel_steps_…), not every GPU's shape
    assert eager.gemm_shape_model == graph.gemm_shape_model == "kernel"
    assert eager.gemm_shape_tokens == graph.gemm_shape_tokens == ()
    assert get_truth("builtin") == GroundTruth()


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="known: builtin, cudagraph, hf-eager"):
        get_truth("tensorrt")
    with pytest.raises(UnknownNameError, match="unknown truth"):
        SimSpec(truth="tensorrt")


def test_user_truth_by_path_and_by_environment(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    text = 'name = "mine"\n[framework]\npass_overhead_s = 1e-3\n'
    (tmp_path / "mine.toml").write_text(text)
    assert load_truth(tmp_path / "mine.toml").pass_overhead_s == 1e-3
    assert get_truth(str(tmp_path / "mine.toml")).name == "mine"
    monkeypatch.setenv(TRUTH_DIR_ENV, str(tmp_path))
    assert "mine" in known_truths() and get_truth("mine").pass_overhead_s == 1e-3
    assert SimSpec(truth="mine").truth == "mine"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"name": "x", "framework": {"pass_overhead": 1}}, r"unknown key\(s\) in \[framework\]"),
        ({"name": "x", "gpu": {}}, "unknown key"),
        ({"framework": {}}, "'name'"),
        ({"name": "x", "framework": {"pass_overhead_s": "1ms"}}, r"pass_overhead_s: must be"),
        ({"name": "x", "framework": {"pass_overhead_s": -1.0}}, "pass_overhead_s"),
        ({"name": "x", "attention": {"causal_reads_mask": 1}}, "true or false"),
        ({"name": "x", "framework": {"host_adds": 1}}, r"\[framework\]\.host_adds: must be true"),
        ({"name": "x", "framework": {"host_adds": "yes"}}, "true or false"),
        ({"name": "x", "device": {"weight_bytes": -4}}, "weight_bytes"),
        ({"name": "x", "device": {"weight_bytes": "fp32"}}, r"\[device\]\.weight_bytes: must be"),
        (
            {"name": "x", "device": {"activation_bytes": 64}},
            r"activation_bytes must be 0 .* \(0, 16\]",
        ),
        ({"name": "x", "host": {"host_adds": True}}, r"unknown key\(s\) in \[host\]"),
        ({"name": "x", "device": {"tile_tokens": 1.5}}, "whole number"),
        ({"name": "x", "moe": {"routing_correlation": 1.0}}, "routing_correlation"),
        ({"name": "x", "gemm_shape": {"tokens": [1, 2], "factor": [1.0]}}, "same length"),
        ({"name": "x", "gemm_shape": {"tokens": [4, 2], "factor": [1, 1]}}, "rise strictly"),
        ({"name": "x", "gemm_shape": {"model": "table"}}, 'accepted: "kernel"'),
        ({"name": "x", "gemm_shape": {"model": 1}}, 'accepted: "kernel"'),
        (
            {"name": "x", "gemm_shape": {"model": "kernel", "tokens": [1], "factor": [1]}},
            "not both",
        ),
    ],
)
def test_bad_truth_files_name_file_and_key(data: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=match) as err:
        truth_from_dict(data, origin="bad.toml")
    assert "bad.toml" in str(err.value)


def test_a_cpu_truth_file_says_its_widths_and_that_host_and_device_add(tmp_path: Path) -> None:
    """[device] weight_bytes / activation_bytes and [framework] host_adds reach the simulated
    GPU: its roofline options and its pass = host + device."""
    text = (
        'name = "cpu-fp32"\n[device]\nweight_bytes = 4\nactivation_bytes = 4.0\n'
        "[framework]\nhost_adds = true\nhost_layer_s = 1e-3\n"
    )
    (tmp_path / "cpu.toml").write_text(text)
    t = load_truth(tmp_path / "cpu.toml")
    assert (t.weight_bytes, t.activation_bytes, t.host_adds) == (4.0, 4.0, True)
    g = gpu(t)
    assert (g.options.bytes_per_param, g.options.bytes_per_act) == (4.0, 4.0)
    assert SimSpec(truth=str(tmp_path / "cpu.toml")).truth == str(tmp_path / "cpu.toml")


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_truth(tmp_path / "t.toml")
    with pytest.raises(ConfigError, match="not found"):
        load_truth(tmp_path / "none.toml")


def test_expected_experts_uniform_formula_and_skew() -> None:
    """Uniform routing gives E·(1 − (1 − K/E)^x); a skewed popularity touches fewer experts;
    correlated tokens of one request are fewer independent draws."""
    x = np.array([1.0, 16.0, 1025.0])
    uniform = expected_experts(x, 128, 8)
    np.testing.assert_allclose(uniform, 128 * (1 - (1 - 8 / 128) ** x), rtol=1e-12)
    flat = expected_experts(x, 128, 8, np.full(128, 1 / 128))
    np.testing.assert_allclose(flat, uniform, rtol=1e-9)
    skewed = expected_experts(x, 128, 8, GroundTruth(routing_skew=0.3).expert_popularity(128))
    assert skewed[1] < uniform[1] and skewed[2] <= uniform[2]  # both saturate at 1025
    assert skewed[0] == pytest.approx(8, rel=1e-6)
    assert routing_draws(16, 1, 0.1) == pytest.approx(1 + 15 * 0.9)
    assert routing_draws(36, 36, 0.5) == 36  # one token per request: no correlation to use


def test_moe_truth_is_not_the_cost_models_saturating_belief() -> None:
    """Decision 7: the truth's experts come from its own routing model: at 16 tokens far fewer
    than the 128 the saturating min(E, K·s) believes, and skew lowers them further."""
    g = gpu(GroundTruth(routing_skew=0.3, routing_correlation=0.1), "qwen3-coder-30b-a3b")
    assert 50 < float(g.experts_touched(16, 1)) < 80
    plain = gpu(GroundTruth(), "qwen3-coder-30b-a3b")
    assert float(plain.experts_touched(16, 1)) == pytest.approx(128 * (1 - (15 / 16) ** 16))


def test_grouped_gemm_occupancy_makes_small_passes_relatively_slower() -> None:
    base = gpu(GroundTruth(noise=0), "qwen3-coder-30b-a3b")
    occ = gpu(GroundTruth(noise=0, moe_half_occupancy_per_sm=0.1), "qwen3-coder-30b-a3b")
    ratio_base = base.verify_truth([16], [512]) / base.ar_truth([512])
    ratio_occ = occ.verify_truth([16], [512]) / occ.ar_truth([512])
    assert occ.ar_truth([512]) > base.ar_truth([512]) * 1.1
    assert ratio_occ < ratio_base


def test_chain_is_causal_tree_is_masked() -> None:
    g = gpu(GroundTruth(noise=0, tree_attention_penalty=0.5))
    sizes, ctx = [16] * 32, [2000] * 32
    assert g.verify_truth(sizes, ctx, tree=False) < g.verify_truth(sizes, ctx)
    # a framework that materialises the causal mask runs the masked kernel for the chain too
    h = gpu(GroundTruth(noise=0, causal_reads_mask=True))
    assert h.verify_truth(sizes, ctx, tree=False) == pytest.approx(
        h.verify_truth(sizes, ctx), rel=1e-3
    )
    # batch 1: the cached causal curve equals the batched route
    one = g.verify_truth([16], [2000], tree=False)
    two = g.verify_truth([16, 1], [2000, 0], tree=False)
    assert one < two


def test_eager_host_bound_pass_is_flat_until_the_gpu_takes_over() -> None:
    t = GroundTruth(noise=0, host_layer_s=1e-3, pass_overhead_s=0.0, tile_tokens=0)
    g = gpu(t)
    host = g.model.layers * 1e-3
    assert g.ar_truth([100]) == pytest.approx(host)
    assert g.verify_truth([64], [100]) == pytest.approx(host)
    assert g.verify_truth([4096], [100]) > host * 1.5


def test_gemm_shape_from_the_measured_csv_has_its_cliffs() -> None:
    tokens, factor, eta_m, eta_c = gemm_shape_from_csv(
        DATA / "a100-80gb_llama-3-8b_per-layer-ops.csv"
    )
    f = dict(zip(tokens, factor, strict=True))
    assert f[1.0] == 1.0 and 0.7 < eta_m < 0.85 and 0.6 < eta_c < 0.85
    assert f[136.0] > 1.3 * f[128.0]  # the kernel switch past 128 tokens
    g = gpu(GroundTruth(noise=0, tile_tokens=0, gemm_shape_tokens=tokens, gemm_shape_factor=factor))
    curve = g.verify_curve(512)
    assert curve[128] - curve[127] > 10 * np.median(np.diff(curve[:100]))


def test_prep_from_operations() -> None:
    t = get_truth("cudagraph")
    g = gpu(t)
    ctx = [1000] * 36
    tree, chain = g.prep_truth([16] * 36, True, ctx), g.prep_truth([16] * 36, False, ctx)
    assert tree > 3 * chain  # softmax + top-K over the vocabulary vs an argmax
    assert g.prep_truth([64] * 36, True, ctx) > tree  # mask and builder grow with the trees
    # the controller's measured time replaces the fixed builder's
    with_controller = g.prep_truth([16] * 36, True, ctx, controller=True)
    assert with_controller - tree == pytest.approx(
        t.controller_step_s
        - t.tree_step_s
        - 36 * 16 * t.tree_node_s
        - 36 * t.tree_request_s
        + 36 * t.controller_request_s,
        rel=1e-9,
    )


def test_kernel_steps_differ_between_gpus() -> None:
    """The shipped truth's GEMM steps come from each GPU's own SMs, bandwidth and L2: the
    token counts where a batch-1 pass jumps are tile boundaries (1 past a multiple of 32) or
    the count where a split-K product's fp32 workspace (4 · T · N · splits bytes) outgrows the
    usable L2 (``KernelParams().l2_fraction`` × the profile's L2), and an H100 and a B200 do
    not have the A100's."""
    from bastion.cost.kernels import KernelParams
    from bastion.cost.roofline import gemm_dims

    truth = replace(get_truth("cudagraph"), noise=0.0)
    found = {}
    for device in ("a100-sxm-80gb", "h100-sxm", "a40", "b200"):
        g = gpu(truth, "llama-3.1-8b", device)
        curve = g.verify_curve(512)
        jumps = [s + 1 for s in range(1, curve.size) if curve[s] > 1.03 * curve[s - 1]]
        usable = KernelParams().l2_fraction * g.hardware.l2_bytes
        cliffs = {
            int(usable // (4 * n * split)) + 1
            for _, n in gemm_dims(g.model, g.options).values()
            for split in (2, 4)
        }
        assert jumps and all((s - 1) % 32 == 0 or s in cliffs for s in jumps), (device, jumps)
        assert sum((s - 1) % 32 == 0 for s in jumps) >= len(jumps) - 1, (device, jumps)
        found[device] = tuple(jumps)
    a100 = found["a100-sxm-80gb"]
    assert found["h100-sxm"] != a100 and found["b200"] != a100, found


@pytest.mark.parametrize("kwargs", [{"max_tokens": 10**9}, {"reference_tokens": 1 << 40}])
def test_step_factors_refuses_a_table_too_long_to_build(kwargs: dict[str, int]) -> None:
    """The fuzzer found a junk max_tokens allocating until the memory cap (a MemoryError)."""
    from bastion.cost.kernels import step_factors
    from bastion.errors import ArgumentError

    g = gpu(GroundTruth())
    with pytest.raises(ArgumentError, match="tokens"):
        step_factors(g.model, g.hardware, g.options, **kwargs)


def test_kernel_shape_multiplies_each_gemm_by_its_own_factor() -> None:
    """verify_curve with model = "kernel" = the same truth without a shape, plus each GEMM's
    time × (its step factor − 1), operator by operator (price_pass on the truth's device)."""
    from bastion.cost.kernels import step_factors
    from bastion.cost.roofline import PassShape, price_pass

    plain = GroundTruth(noise=0.0, tile_tokens=0, tile_step_s=0.0, tree_attention_penalty=0.0)
    shaped = replace(plain, gemm_shape_model="kernel")
    g0, g1 = gpu(plain), gpu(shaped)
    names, phi = step_factors(g1.model, g1.hardware, g1.options)
    s = np.arange(1, 301, dtype=np.float64)
    ops = price_pass(g1.model, g1.device, PassShape.of_batch(s[:1], [512.0]), g1.options).operators
    assert [op.name for op in ops] == list(names)
    extra = np.zeros(s.size)
    for j, name in enumerate(names):
        if np.all(phi[:, j] == 1.0):
            continue
        for i, n in enumerate(s):
            op = price_pass(g1.model, g1.device, PassShape.of_batch([n], [512.0]), g1.options).op(
                name
            )
            extra[i] += float(op.time_s - op.launch_s) * (phi[i, j] - 1.0)
    np.testing.assert_allclose(
        g1.verify_curve(512)[:300], g0.verify_curve(512)[:300] + extra, rtol=1e-9
    )
    assert np.max(extra) > 0.05 * np.max(g0.verify_curve(512)[:300])  # the steps are there


def test_kernel_shape_skips_a_profile_without_a_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel model prices GPU kernels from the SM clock and resident threads; a profile
    without them (a probed CPU's) gets factor 1 — the truth without [gemm_shape] — and one
    warning naming the keys that would apply it, not an error."""
    import bastion.sim.pass_pricing as pass_pricing
    from tests.test_cost_kernels import write_profile

    monkeypatch.setattr(pass_pricing, "_NO_KERNEL_MODEL", set())
    path = write_profile(tmp_path, "old", clock=None, threads=None)
    hw = load_profile_path(path)
    m = get_model("qwen3-8b")
    kernel = GroundTruth(noise=0.0, tile_tokens=0, gemm_shape_model="kernel")
    with caplog.at_level("WARNING", logger="bastion.sim.pass_pricing"):
        g = SimulatedGPU(hw, m, DrafterSpec.dflash_for(m), kernel)
        SimulatedGPU(hw, m, DrafterSpec.dflash_for(m), kernel)  # warned once
    assert g.pricer.phi is None
    plain = SimulatedGPU(hw, m, DrafterSpec.dflash_for(m), replace(kernel, gemm_shape_model=""))
    np.testing.assert_array_equal(g.verify_curve(512), plain.verify_curve(512))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert "[peak].sm_clock_hz and [peak].max_threads_per_sm" in warned[0]
    assert str(path) in warned[0] and "factor 1" in warned[0]
    # a profile with them keeps its steps (the control)
    clocked = load_profile_path(write_profile(tmp_path, "new"))
    assert SimulatedGPU(clocked, m, DrafterSpec.dflash_for(m), kernel).pricer.phi is not None


def test_kernel_shape_one_pass_equals_the_vectorised_route() -> None:
    """A batched pass (priced one row at a time) gets the same factors as the same passes priced
    together; tokens beyond the factor table take its last row."""
    g = gpu(GroundTruth(noise=0.0, tile_tokens=0, gemm_shape_model="kernel"))
    p = g.pricer
    assert p.phi is not None
    rows = np.array(
        [[1.0, t, t, t * 600.0, 600.0 + t, t * 600.0, 0.0] for t in (3.0, 77.0, 300.0, 9000.0)]
    )
    tokens, touched = rows[:, 1], np.zeros(4)
    together = p.price(rows, tokens, touched, 1.0)
    one_by_one = [
        float(p.price(rows[i : i + 1], tokens[i : i + 1], touched[:1], 1.0)[0]) for i in range(4)
    ]
    np.testing.assert_allclose(together, one_by_one, rtol=1e-12)
    assert p.phi_rows(np.array([9000.0]))[0] == p.phi.shape[0] - 1
