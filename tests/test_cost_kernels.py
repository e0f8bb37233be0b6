"""Kernel-aware pricing (bastion.cost.kernels): the GEMM tile/wave model against an independent
scalar oracle of its documented formula, steps at GPU-dependent positions, row-wise kernels in
waves of resident blocks, and the profile keys it needs. Every GPU here is a synthetic profile
written by the test, not a shipped one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.cost.hardware import get_profile, load_profile, profile_to_toml
from bastion.cost.kernels import (
    TILE_CONFIGS,
    KernelDevice,
    KernelParams,
    gemm_time,
    kernel_pass,
    row_kernel_time,
)
from bastion.cost.models import get_model
from bastion.cost.validation import MEASURED_OPTIONS
from bastion.errors import ConfigError

PARAMS = KernelParams(
    dram_efficiency=0.8,
    stream_efficiency=0.9,
    tensor_efficiency=0.7,
    l2_bytes_per_flop=0.02,
    tile_cycles=1500.0,
    kernel_s=2e-6,
    row_cycles=3000.0,
    sm_bytes_per_clock=10.0,
    l2_fraction=0.5,
    gather_cycles=50.0,
)


def write_profile(
    tmp_path: Path,
    name: str,
    sms: int = 100,
    clock: float | None = 1.5e9,
    threads: int | None = 2048,
    per_sm_clock_flops: float = 2048.0,
    bandwidth: float = 2e12,
    l2: float = 40e6,
) -> Path:
    """A made-up GPU: peak = SMs × clock × FLOP per clock per SM, every number 'sourced'."""
    peak = sms * (clock or 1.5e9) * per_sm_clock_flops
    lines = [
        f'name = "{name}"',
        "[peak]",
        f"bf16_flops = {peak!r}",
        f"memory_bandwidth = {bandwidth!r}",
        "memory_bytes = 80e9",
        f"l2_bytes = {l2!r}",
        f"sm_count = {sms}",
    ]
    keys = ["bf16_flops", "memory_bandwidth", "memory_bytes", "l2_bytes", "sm_count"]
    if clock is not None:
        lines.append(f"sm_clock_hz = {clock!r}")
        keys.append("sm_clock_hz")
    if threads is not None:
        lines.append(f"max_threads_per_sm = {threads}")
        keys.append("max_threads_per_sm")
    lines += ["[efficiency]", "compute = 0.7", "memory = 0.8", "launch_overhead_s = 2e-6"]
    lines += ["[sources]"] + [f'{k} = "test"' for k in (*keys, "compute", "memory")]
    lines.append('launch_overhead_s = "test"')
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def oracle(m: int, k: int, n: int, dev: KernelDevice, p: KernelParams) -> float:
    """The module docstring's GEMM formula, written out again for one M (plain Python)."""
    best = math.inf
    for c in TILE_CONFIGS:
        ks = math.ceil(k / c.split_k)
        row_tiles = math.ceil(m / c.m)
        tiles = row_tiles * math.ceil(n / c.n) * c.split_k
        rows = m / row_tiles
        compute = 2 * c.m * c.n * ks / (p.tensor_efficiency * dev.peak_per_sm)
        feed = (rows + c.n) * ks * 2 / (p.l2_bytes_per_flop * dev.peak_per_sm)
        t_tile = max(compute, feed) + p.tile_cycles / dev.clock_hz
        waves = math.ceil(tiles / dev.sms)
        act = m * k * 2
        dram = k * n * 2 + act * (1 if act <= p.l2_fraction * dev.l2_bytes else waves)
        partials = 4 * m * n * c.split_k if c.split_k > 1 else 0  # fp32
        dram += m * n * 2 + (2 * partials if partials > p.l2_fraction * dev.l2_bytes else 0)
        t = max(waves * t_tile, dram / (p.dram_efficiency * dev.dram_bandwidth))
        best = min(best, t + p.kernel_s * (2 if c.split_k > 1 else 1))
    return best


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 3000),
    k=st.sampled_from([512, 4096, 11008, 14336]),
    n=st.sampled_from([128, 4096, 6144, 12288, 28672]),
    sms=st.sampled_from([46, 84, 108, 132]),
)
def test_gemm_matches_the_documented_formula(m: int, k: int, n: int, sms: int) -> None:
    dev = KernelDevice("x", sms, 1.5e9, 2048, 40e6, 2e12, 1.5e9 * 2048)
    got = float(np.asarray(gemm_time(np.array([m]), k, n, dev, PARAMS))[0])
    assert got == pytest.approx(oracle(m, k, n, dev, PARAMS), rel=1e-12)


def test_gemm_is_nondecreasing_and_memory_bound_when_short(tmp_path: Path) -> None:
    dev = KernelDevice.of(load_profile(write_profile(tmp_path, "g")))
    m = np.arange(1, 2049, dtype=np.float64)
    t = np.asarray(gemm_time(m, 4096, 14336, dev, PARAMS))
    assert np.all(np.diff(t) >= 0)
    weights = 4096 * 14336 * 2 / (PARAMS.dram_efficiency * dev.dram_bandwidth)
    assert t[0] == pytest.approx(weights + PARAMS.kernel_s, rel=0.02)  # one token: the weights
    assert t[-1] > 5 * t[0]  # 2048 tokens: compute-bound


def _steps(t: np.ndarray, m: np.ndarray, jump: float = 0.05) -> list[int]:
    return [int(m[i + 1]) for i in range(len(t) - 1) if t[i + 1] > (1 + jump) * t[i]]


def test_steps_fall_at_tile_boundaries_that_depend_on_the_gpu(tmp_path: Path) -> None:
    """Compute-bound GEMM on two made-up GPUs that differ only in SM count: the steps sit just
    past a multiple of a tile height, and not at the same token counts."""
    m = np.arange(1, 1025, dtype=np.float64)
    steps = {}
    for sms in (64, 132):
        hw = load_profile(write_profile(tmp_path, f"s{sms}", sms=sms, bandwidth=20e12))
        t = np.asarray(gemm_time(m, 4096, 4096, KernelDevice.of(hw), PARAMS))
        steps[sms] = _steps(t, m)
        assert steps[sms], sms
        assert all((s - 1) % 32 == 0 for s in steps[sms]), steps[sms]
    assert steps[64] != steps[132]


def test_row_kernels_step_every_wave_of_resident_blocks(tmp_path: Path) -> None:
    """One block of 1024 threads per row: 1536 threads per SM hold one block (a step every SMs
    rows), 2048 hold two (every 2 × SMs)."""
    rows = np.arange(1, 700, dtype=np.float64)
    p = KernelParams(row_cycles=20000.0, sm_bytes_per_clock=1000.0)  # latency-bound waves
    for threads, every in ((1536, 84), (2048, 168)):
        dev = KernelDevice.of(
            load_profile(write_profile(tmp_path, f"r{threads}", 84, threads=threads))
        )
        t = row_kernel_time(rows, 16384.0, 4096, dev, p)
        assert _steps(t, rows) == [
            k * every + 1 for k in range(1, 700 // every + 1) if k * every + 1 < 700
        ]


def test_a_partial_wave_of_rows_moves_only_its_own_rows_bytes(tmp_path: Path) -> None:
    """DRAM-bound rows (a slow DRAM, a fast SM): within a wave the time grows with the rows of
    the partial last wave, and a full wave costs what one row per SM at the DRAM's share costs.
    Negative control: pricing every partial wave as a full one (the earlier form) is flat
    inside the wave, which this test refuses."""
    hw = load_profile(write_profile(tmp_path, "slowdram", 84, threads=1536, bandwidth=50e9))
    dev = KernelDevice.of(hw)
    p = KernelParams(row_cycles=100.0, sm_bytes_per_clock=1000.0, stream_efficiency=1.0)
    nbytes = 65536.0
    rows = np.arange(1, 169, dtype=np.float64)  # two waves of 84
    t = row_kernel_time(rows, nbytes, 4096, dev, p)
    base = p.row_cycles / dev.clock_hz + p.kernel_s
    assert t[0] == pytest.approx(base + nbytes / 50e9, rel=1e-9)  # one row: its own bytes
    assert t[83] == pytest.approx(base + 84 * nbytes / 50e9, rel=1e-9)  # a full wave
    assert np.all(np.diff(t[:84]) > 0)  # grows inside the wave
    flat = np.full(84, t[83])  # the earlier form: every partial wave priced as a full one
    assert not np.allclose(t[:84], flat, rtol=0.05)
    # latency-bound (fast DRAM): a partial wave costs what a full one costs, as before
    fast = KernelDevice.of(load_profile(write_profile(tmp_path, "fast", 84, threads=1536)))
    q = KernelParams(row_cycles=20000.0, sm_bytes_per_clock=1000.0, stream_efficiency=1.0)
    u = row_kernel_time(rows[:84], 16384.0, 4096, fast, q)
    assert np.ptp(u) / u[0] < 0.05


def test_split_k_partials_stay_in_l2_while_they_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory-bound split-K product (only a 32×128 split-4 kernel offered): its fp32
    partials cost a DRAM round trip only once they outgrow the usable L2 (``l2_fraction`` of
    it). Negative control: the same GEMM on a GPU whose L2 holds the activations but not the
    partials is slower by exactly that round trip."""
    import bastion.cost.kernels as kernels

    monkeypatch.setattr(kernels, "_CFG", np.array([(32.0, 128.0, 4.0)]))
    slow = {"bandwidth": 20e9}  # DRAM-bound
    big = KernelDevice.of(load_profile(write_profile(tmp_path, "bigl2", l2=400e6, **slow)))
    small = KernelDevice.of(load_profile(write_profile(tmp_path, "smalll2", l2=2e6, **slow)))
    m, k, n = 64.0, 4096, 4096
    partials = 4.0 * m * n * 4  # fp32 × split 4: 4.2 MB, more than half of 2 MB
    assert m * k * 2 <= PARAMS.l2_fraction * 2e6 < partials  # activations fit, partials not
    t_big = float(np.asarray(gemm_time(np.array([m]), k, n, big, PARAMS))[0])
    t_small = float(np.asarray(gemm_time(np.array([m]), k, n, small, PARAMS))[0])
    extra = 2.0 * partials / (PARAMS.dram_efficiency * 20e9)
    assert t_small - t_big == pytest.approx(extra, rel=1e-9)


def test_kernel_pass_prices_every_operator_of_a_synthetic_gpu(tmp_path: Path) -> None:
    hw = load_profile(write_profile(tmp_path, "p"))
    model = get_model("llama-3.1-8b")
    t = np.array([1.0, 64.0, 512.0])
    out = kernel_pass(model, hw, t, MEASURED_OPTIONS, PARAMS)
    assert {"qkv_proj", "gate_up_proj", "input_norm", "act", "rope", "lm_head"} <= set(out)
    for name, sec in out.items():
        assert sec.shape == t.shape and np.all(np.isfinite(sec)), name
        assert np.all(np.diff(sec) >= 0), name
    moe = kernel_pass(get_model("qwen3-coder-30b-a3b"), hw, t, None, PARAMS)
    assert np.all(np.diff(moe["experts_gate_up"]) > 0)


def test_profiles_without_the_keys_are_refused_by_name(tmp_path: Path) -> None:
    hw = load_profile(write_profile(tmp_path, "old", clock=None, threads=None))
    assert hw.sm_clock_hz is None and hw.max_threads_per_sm is None
    with pytest.raises(ConfigError, match=r"\[peak\]\.sm_clock_hz and \[peak\]\.max_threads"):
        KernelDevice.of(hw)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sm_clock_hz", "1410", "must be a positive number"),
        ("sm_clock_hz", "0", "positive finite"),
        ("sm_clock_hz", "1410.0", r"in Hz and must be in \[1e7, 1e11\]"),
        ("max_threads_per_sm", "1536.5", "whole number"),
        ("max_threads_per_sm", "16", "whole number in"),
    ],
)
def test_bad_clock_or_thread_values_are_config_errors(
    tmp_path: Path, key: str, value: str, message: str
) -> None:
    path = write_profile(tmp_path, "bad")
    text = path.read_text()
    old = next(
        line for line in text.splitlines() if line.startswith(f"{key} = ") and '"' not in line
    )
    value = f'"{value}"' if message == "must be a positive number" else value
    path.write_text(text.replace(old, f"{key} = {value}"))
    with pytest.raises(ConfigError, match=message):
        load_profile(path)


def test_a_new_key_needs_a_source_and_round_trips(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "src")
    path.write_text(path.read_text().replace('sm_clock_hz = "test"\n', ""))
    with pytest.raises(ConfigError, match=r"\[sources\]\.sm_clock_hz missing"):
        load_profile(path)
    hw = get_profile("h100-sxm")
    again = tmp_path / "again.toml"
    again.write_text(profile_to_toml(hw))
    back = load_profile(again)
    assert (back.sm_clock_hz, back.max_threads_per_sm) == (hw.sm_clock_hz, hw.max_threads_per_sm)


def test_every_shipped_profile_has_a_clock_consistent_with_its_peak() -> None:
    from bastion.cost.hardware import known_profiles

    for name in known_profiles():
        hw = get_profile(name)
        assert hw.sm_clock_hz and hw.max_threads_per_sm in (1536, 2048), name
        per_clock = hw.bf16_flops / hw.sm_count / hw.sm_clock_hz  # FLOP per clock per SM
        assert min(abs(per_clock / 2**k - 1) for k in range(9, 14)) < 0.01, (name, per_clock)
        assert hw.sources["sm_clock_hz"].strip() and hw.sources["max_threads_per_sm"].strip()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dram_efficiency": 1.5}, "fraction in"),
        ({"tile_cycles": -1.0}, "must be > 0"),
        ({"kernel_s": float("nan")}, "finite number"),
    ],
)
def test_kernel_params_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KernelParams(**kwargs)
    with pytest.raises(ConfigError, match="unknown key"):
        KernelParams.from_dict({"speed": 1.0})
    assert KernelParams.from_dict(PARAMS.to_dict()) == PARAMS
