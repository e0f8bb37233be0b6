"""Tensor parallelism: the profile's interconnect, the all-reduces' price, the per-GPU shares of
weights and KV cache, the refusals, and the same structure in the truth and the belief."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile, load_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import all_reduce_s, check_tp, comm_line, kv_heads_per_gpu, tp_shard
from bastion.cost.roofline import LinearPricer, PassShape, verify_pass
from bastion.errors import ConfigError, MemoryLimitError
from bastion.interfaces import StepLoad
from bastion.sim.experiments.config import load_config
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.memory import plan_memory
from bastion.sim.simulate import SimSpec, calibrated_cost_model

H100 = get_profile("h100-sxm")
LLAMA_8B = get_model("llama-3.1-8b")
LLAMA_70B = get_model("llama-3.1-70b")


def _faster(hw_factor: float):  # type: ignore[no-untyped-def]
    """The H100 profile with its interconnect's bandwidth × ``hw_factor``."""
    link = H100.interconnect
    assert link is not None
    return replace(H100, interconnect=replace(link, bandwidth=link.bandwidth * hw_factor))


# -- the all-reduce's price ---------------------------------------------------------------------


def test_all_reduce_is_the_ring_formula_from_the_profile() -> None:
    link = H100.interconnect
    assert link is not None and link.kind == "nvlink" and link.max_gpus == 8
    nbytes = 1024 * 8192 * 2.0
    for n in (2, 4, 8):
        by_hand = 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency_s
        assert all_reduce_s(nbytes, n, H100) == pytest.approx(by_hand, rel=1e-12)
    assert all_reduce_s(nbytes, 1, H100) == 0.0  # one GPU: nothing to reduce
    assert comm_line(LLAMA_70B, H100, 1, 2.0) == (0.0, 0.0)


def test_doubling_the_bandwidth_halves_the_bandwidth_part() -> None:
    nbytes = 3.0e6
    latency = 2 * 3 * H100.interconnect.latency_s  # type: ignore[union-attr]
    slow = all_reduce_s(nbytes, 4, H100) - latency
    fast = all_reduce_s(nbytes, 4, _faster(2.0)) - latency
    assert fast == pytest.approx(slow / 2, rel=1e-12)
    # per pass: 2L all-reduces of T·h·2 bytes; the slope halves, the latency part stays
    c0, c1 = comm_line(LLAMA_70B, H100, 4, 2.0)
    d0, d1 = comm_line(LLAMA_70B, _faster(2.0), 4, 2.0)
    assert d0 == c0 == pytest.approx(2 * 80 * 2 * 3 * 1.9e-6)
    assert d1 == pytest.approx(c1 / 2, rel=1e-12)
    assert c1 == pytest.approx(2 * 80 * 1.5 * 8192 * 2 / 450e9, rel=1e-12)


def test_the_pass_includes_its_all_reduces() -> None:
    opt = RooflineOptions(tensor_parallel=4)
    rb = verify_pass(LLAMA_70B, H100, [(16, 1024)] * 8, opt)
    c0, c1 = comm_line(LLAMA_70B, H100, 4, 2.0)
    assert float(rb.op("all_reduce").comm_s) == pytest.approx(c0 + c1 * 128, rel=1e-12)
    # the device's part is one GPU's share of the model, priced at tp 1
    one_gpu = verify_pass(tp_shard(LLAMA_70B, 4), H100, [(16, 1024)] * 8)
    assert float(rb.total_s) == pytest.approx(float(one_gpu.total_s) + c0 + c1 * 128, rel=1e-12)
    # and the matrix form gives the same numbers
    shape = PassShape.of([(16, 1024)] * 8)
    assert float(LinearPricer(LLAMA_70B, H100, opt).total_s(shape)) == pytest.approx(
        float(rb.total_s), rel=1e-12
    )


# -- what is split ----------------------------------------------------------------------------


def test_tp_splits_heads_ffn_and_vocabulary() -> None:
    part = tp_shard(LLAMA_70B, 4)
    assert (part.q_heads, part.kv_heads, part.ffn, part.vocab) == (16, 2, 7168, 32064)
    assert (part.hidden, part.layers, part.head_dim) == (8192, 80, 128)
    # fewer KV heads than GPUs: one per GPU, replicated (vLLM)
    assert kv_heads_per_gpu(LLAMA_8B, 16) == 1 and tp_shard(LLAMA_8B, 16).kv_heads == 1
    assert tp_shard(LLAMA_70B, 1) is LLAMA_70B


def _by_hand_llama_8b_tp2(concurrency: int, chunk: int) -> int:
    """KV capacity (tokens) of Llama-3.1-8B, AR, over 2 × H100 SXM at 0.9, from its config."""
    h, layers, d, v = 4096, 32, 128, 128256
    hq, hkv, f, v_gpu = 16 * d, 4 * d, 14336 // 2, 128256 // 2  # one GPU's share
    layer = h * (hq + 2 * hkv) + hq * h + 3 * h * f + 2 * h
    weights = 2.0 * (layers * layer + h + 2 * v_gpu * h)
    rows = concurrency + (1 if chunk else 0)
    activations = (chunk + concurrency) * 2 * (2 * h + hq + 2 * hkv + 3 * f) + rows * 4 * v
    kv = 2 * layers * hkv * 2
    return 16 * int((0.9 * 80e9 - weights - activations) // (16 * kv))


def test_kv_capacity_with_tp_2_is_the_hand_computation() -> None:
    plan = plan_memory(H100, LLAMA_8B, None, concurrency=64, prefill_chunk=512, tp=2)
    assert plan.capacity_tokens == _by_hand_llama_8b_tp2(64, 512)
    assert plan.gpus == 2 and plan.memory_bytes == 80e9  # per GPU, of two
    single = plan_memory(H100, LLAMA_8B, None, concurrency=64, prefill_chunk=512)
    assert plan.capacity_tokens > 2 * single.capacity_tokens  # half the weights, half the KV
    spec = SimSpec(model="llama-3.1-8b", tp=2, concurrency=64, policies=("chain",))
    assert spec.memory_plan(False) == plan


def test_a_model_too_big_for_its_gpus_is_refused() -> None:
    with pytest.raises(
        MemoryLimitError,
        match=r"llama-3\.1-70b does not fit on h100-sxm: it "
        r"needs 1\d\d\.\d\d GB \(\d+ bytes",
    ):
        plan_memory(H100, LLAMA_70B, tp=1)
    with pytest.raises(MemoryLimitError, match="does not fit on h100-sxm"):
        SimSpec(model="llama-3.1-70b", gpu="h100-sxm", concurrency=64)
    plan = plan_memory(H100, LLAMA_70B, DrafterSpec.dflash_for(LLAMA_70B), concurrency=64, tp=4)
    assert plan.blocks > 0 and plan.weight_bytes < 40e9
    SimSpec(model="llama-3.1-70b", gpu="h100-sxm", concurrency=64, tp=4)


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp, message",
    [
        (0, "tp (tensor parallelism) must be an integer ≥ 1"),
        (True, "tp must be an integer"),
        (2.0, "tp must be an integer"),
        (3, "does not divide llama-3.1-8b's 32 attention heads"),
        (16, "exceeds the interconnect of profile 'h100-sxm': its nvlink links at most 8 GPUs"),
    ],
)
def test_bad_tp_is_refused(tp: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SimSpec(model="llama-3.1-8b", tp=tp)  # type: ignore[arg-type]


def test_tp_beyond_a_bridge_or_without_a_link_is_refused() -> None:
    with pytest.raises(ConfigError, match="at most 2 GPUs"):
        check_tp(LLAMA_70B, 4, get_profile("h100-pcie"))
    with pytest.raises(ConfigError, match="no \\[interconnect\\] table"):
        check_tp(LLAMA_70B, 2, replace(H100, interconnect=None))
    with pytest.raises(ConfigError, match="one must divide the other"):
        check_tp(replace(LLAMA_70B, kv_heads=3, q_heads=48), 4)


def test_the_cli_refuses_a_bad_tp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--tp", "3", "--model", "llama-3.1-8b"]) == 2
    assert "attention heads" in capsys.readouterr().err
    assert main(["simulate", "--model", "llama-3.1-70b", "--tp", "1"]) == 2
    assert "does not fit on h100-sxm: it needs" in capsys.readouterr().err


def test_the_grid_key_is_checked(tmp_path: Path) -> None:
    config = tmp_path / "tp.toml"
    config.write_text('name = "tp"\n[grid]\nmodel = "llama-3.1-8b"\ntp = [1, 2]\n')
    runs = load_config(config).runs()
    assert [r["spec"]["tp"] for r in runs] == [1, 2]
    config.write_text('name = "tp"\n[grid]\nmodel = "llama-3.1-8b"\ntp = [3]\n')
    with pytest.raises(ConfigError, match="attention heads"):
        load_config(config).runs()


# -- the profile's [interconnect] ---------------------------------------------------------------


def test_every_shipped_profile_has_a_sourced_interconnect() -> None:
    from bastion.cost.hardware import known_profiles

    for name in known_profiles():
        p = get_profile(name)
        assert p.interconnect is not None and p.interconnect.kind in ("nvlink", "pcie"), name
        assert p.interconnect.bandwidth > 0 and 0 < p.interconnect.latency_s < 1e-4, name
        for key in ("kind", "bandwidth", "latency_s", "max_gpus"):
            assert p.sources[f"interconnect_{key}"].strip(), (name, key)


def _h100_text() -> str:
    path = H100.path
    assert path is not None
    return Path(path).read_text()


@pytest.mark.parametrize(
    "edit, message",
    [
        (("bandwidth = 4.5e+11", ""), r"\[interconnect\]\.bandwidth missing"),
        (("bandwidth = 4.5e+11", "bandwidth = -4.5e+11"), r"\[interconnect\]\.bandwidth must be"),
        (("bandwidth = 4.5e+11", 'bandwidth = "fast"'), r"\[interconnect\]\.bandwidth must be"),
        (("latency_s = 1.9e-06", "latency_s = 0"), r"\[interconnect\]\.latency_s must be"),
        (("max_gpus = 8", "max_gpus = 0"), r"\[interconnect\]\.max_gpus must be"),
        (('kind = "nvlink"', 'kind = "infiniband"'), r"\[interconnect\]\.kind is 'infiniband'"),
        (("interconnect_latency_s = ", "ignored_latency = "), r"interconnect_latency_s missing"),
    ],
)
def test_a_bad_interconnect_is_refused_naming_file_and_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    text = _h100_text()
    assert edit[0] in text
    bad = tmp_path / "bad-link.toml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError, match=message) as info:
        load_profile(bad)
    assert str(bad) in str(info.value)


def test_a_profile_without_interconnect_loads_for_one_gpu(tmp_path: Path) -> None:
    text = _h100_text()
    start = text.index("\n[interconnect]\n")
    lone = tmp_path / "lone.toml"
    lone.write_text(text[:start] + text[text.index("\n[sources]\n") :])
    p = load_profile(lone)
    assert p.interconnect is None
    with pytest.raises(ConfigError, match="no \\[interconnect\\] table"):
        SimSpec(model="llama-3.1-8b", gpu=str(lone), tp=2)
    SimSpec(model="llama-3.1-8b", gpu=str(lone))


# -- truth and belief ---------------------------------------------------------------------------


def test_the_truth_prices_the_all_reduces_over_its_link() -> None:
    """The noise-free truth of a tp-4 pass moves by exactly the all-reduces' bandwidth part
    when the truth's link is twice as fast (interconnect_scale 1 → 2)."""
    drafter = DrafterSpec.dflash_for(LLAMA_70B)
    truth = GroundTruth(noise=0.0, interconnect_scale=1.0)
    slow = SimulatedGPU(H100, LLAMA_70B, drafter, truth, tp=4)
    fast = SimulatedGPU(H100, LLAMA_70B, drafter, replace(truth, interconnect_scale=2.0), tp=4)
    sizes, contexts = [16] * 8, [1024] * 8
    t_slow = slow.verify_truth(sizes, contexts)
    t_fast = fast.verify_truth(sizes, contexts)
    _, c1 = comm_line(LLAMA_70B, H100, 4, 2.0)
    assert t_slow - t_fast == pytest.approx(c1 / 2 * 128, rel=1e-9)
    # and the tp-4 truth is one GPU's share plus its all-reduces: cheaper than one GPU's
    # whole model would be, dearer than the share alone
    share = SimulatedGPU(H100, tp_shard(LLAMA_70B, 4), drafter, truth).verify_truth(sizes, contexts)
    c0, _ = comm_line(LLAMA_70B, H100, 4, 2.0)
    assert t_slow == pytest.approx(share + c0 + c1 * 128, rel=1e-9)


def test_the_belief_has_the_same_structure_and_tracks_the_truth() -> None:
    """The roofline belief at tp 4 prices the all-reduce term (bare: exactly the roofline's
    pass with its all_reduce entry), and calibrated on the simulated tp-4 GPUs it predicts
    their passes within a few per cent."""
    drafter = DrafterSpec.dflash_for(LLAMA_70B)
    opt = RooflineOptions(tensor_parallel=4)
    bare = RooflineCostModel(H100, LLAMA_70B, drafter, options=opt)
    load = StepLoad(context_len=1024)
    curve = bare.cost_curve(64, load)
    c0, c1 = comm_line(LLAMA_70B, H100, 4, 2.0)
    for n in (1, 16, 64):
        rb = verify_pass(LLAMA_70B, H100, [(n, 1024)], opt)
        assert curve.verify_s[n - 1] == pytest.approx(float(rb.total_s), rel=1e-12)
        assert float(rb.op("all_reduce").comm_s) == pytest.approx(c0 + c1 * n, rel=1e-12)
    no_link = RooflineCostModel(H100, tp_shard(LLAMA_70B, 4), drafter).cost_curve(64, load)
    assert curve.verify_s[15] - no_link.verify_s[15] == pytest.approx(c0 + c1 * 16, rel=1e-9)
    # the batch's joint curve and its growth bound carry the same term
    joint = bare.joint_cost_curve(np.array([1024, 1024]), np.array([0, 1, 0]))
    plain = RooflineCostModel(H100, tp_shard(LLAMA_70B, 4), drafter).joint_cost_curve(
        np.array([1024, 1024]), np.array([0, 1, 0])
    )
    tokens = np.array([2.0, 3.0, 4.0, 5.0])
    assert np.allclose(joint.verify_s - plain.verify_s, c0 + c1 * tokens, rtol=1e-9)
    assert joint.ar_step_s - plain.ar_step_s == pytest.approx(c0 + c1 * 2, rel=1e-9)
    assert joint.growth_s >= plain.growth_s + c1 * (1 - 1e-9)
    # calibrated on the simulated tp-4 GPUs (the truth's link 0.92 of the profile's)
    gpu = SimulatedGPU(H100, LLAMA_70B, drafter, GroundTruth(interconnect_scale=0.92), tp=4)
    model, _ = calibrated_cost_model(gpu)
    assert model.options.tensor_parallel == 4
    for n, c in ((1, 256), (16, 1024), (64, 512)):
        predicted = model.cost_curve(64, StepLoad(context_len=c)).verify_s[n - 1]
        truth = gpu.verify_truth([n], [c])
        assert math.isclose(predicted, truth, rel_tol=0.1), (n, c, predicted, truth)


def test_a_single_device_profile_round_trips_with_kind_none(tmp_path: Path) -> None:
    """What `bastion hw probe` writes: kind "none", one GPU, no numbers; tp > 1 refused."""
    from bastion.cost.hardware import Interconnect, profile_to_toml

    sources = {**H100.sources, "interconnect_kind": "one device", "interconnect_max_gpus": "1"}
    lone = replace(H100, interconnect=Interconnect(kind="none", max_gpus=1), sources=sources)
    path = tmp_path / "lone.toml"
    path.write_text(profile_to_toml(lone))
    loaded = load_profile(path)
    assert loaded.interconnect == Interconnect(kind="none", max_gpus=1)
    with pytest.raises(ConfigError, match='interconnect kind "none"'):
        check_tp(LLAMA_8B, 2, loaded)
    path.write_text(profile_to_toml(lone).replace("max_gpus = 1", "max_gpus = 2"))
    with pytest.raises(ConfigError, match='max_gpus must be 1 for kind "none"'):
        load_profile(path)
