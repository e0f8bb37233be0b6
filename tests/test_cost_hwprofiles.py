"""The A40, A10G, L4 and L40 profiles: datasheet numbers (dense), every number sourced."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.cost.hardware import get_profile

DENSE = {  # name: (BF16 FLOP/s, FP8 FLOP/s or None, bytes/s, bytes, L2 bytes, SMs)
    "a40": (149.7e12, None, 696e9, 48e9, 6e6, 84),
    "a10g": (70e12, None, 600e9, 24e9, 6e6, 80),
    "l4": (121e12, 242.5e12, 300e9, 24e9, 48e6, 58),
    "l40": (181.05e12, 362e12, 864e9, 48e9, 96e6, 142),
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_new_profiles_hold_the_datasheet_numbers(name: str) -> None:
    hw = get_profile(name)
    got = (
        hw.bf16_flops,
        hw.fp8_flops,
        hw.memory_bandwidth,
        hw.memory_bytes,
        hw.l2_bytes,
        hw.sm_count,
    )
    assert got == DENSE[name]
    assert hw.path is not None and "Datasheet: http" in Path(hw.path).read_text()
    for key in ("bf16_flops", "memory_bandwidth", "l2_bytes", "sm_count", "compute", "memory"):
        assert hw.sources[key].strip()
