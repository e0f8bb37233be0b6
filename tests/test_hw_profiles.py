"""Hardware profiles: every bundled file loads with a source per number; bad files are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from bastion.cli import main
from bastion.cost.hardware import (
    PROFILE_DIR_ENV,
    get_profile,
    known_profiles,
    load_profile,
    profile_from_dict,
    profile_to_toml,
)
from bastion.errors import ConfigError, UnknownNameError

EXPECTED = {
    "a100-sxm-80gb",
    "a100-pcie-40gb",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "b200",
    "rtx-a6000",
    "rtx-pro-6000-blackwell",
    "rtx-pro-6000-blackwell-server",
    "l40s",
}


def _good() -> dict:
    return tomllib.loads(profile_to_toml(get_profile("a100-sxm-80gb")))


def test_every_required_device_has_a_profile() -> None:
    assert set(known_profiles()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_loads_with_sources(name: str) -> None:
    prof = get_profile(name)
    assert prof.name == name
    assert 0 < prof.compute_efficiency <= 1 and 0 < prof.memory_efficiency <= 1
    assert prof.bf16_flops > 1e13 and prof.memory_bandwidth > 1e11
    needed = {"bf16_flops", "memory_bandwidth", "memory_bytes", "l2_bytes", "sm_count"}
    needed |= {"compute", "memory", "launch_overhead_s"}
    if prof.fp8_flops is not None:
        needed.add("fp8_flops")
        assert prof.fp8_flops == pytest.approx(2 * prof.bf16_flops, rel=0.05)
    assert needed <= set(prof.sources)


def test_datasheet_numbers() -> None:
    a100 = get_profile("a100-sxm-80gb")
    assert a100.bf16_flops == 312e12 and a100.memory_bandwidth == 2039e9 and a100.sm_count == 108
    assert a100.fp8_flops is None
    assert get_profile("h100-sxm").bf16_flops == 989e12  # dense, not the sparse 1,979


def test_toml_round_trip() -> None:
    prof = get_profile("h200-sxm")
    again = profile_from_dict(tomllib.loads(profile_to_toml(prof)))
    assert again.to_dict() == prof.to_dict()


@pytest.mark.parametrize(
    ("table", "key", "value", "message"),
    [
        ("peak", "memory_bandwidth", None, "missing field"),
        ("peak", "bf16_flops", 0, "positive"),
        ("peak", "l2_bytes", -1.0, "positive"),
        ("efficiency", "memory", 1.5, "(0, 1]"),
        ("efficiency", "launch_overhead_s", None, "missing field"),
        ("sources", "sm_count", None, "source"),
        ("peak", "sm_count", "many", "positive number"),
    ],
)
def test_bad_profile_is_refused(table: str, key: str, value: object, message: str) -> None:
    data = _good()
    if value is None:
        del data[table][key]
    else:
        data[table][key] = value
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")):
        profile_from_dict(data)


def test_unknown_name_lists_known() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_profile("a100")
    assert "a100-sxm-80gb" in str(err.value) and "h100-sxm" in str(err.value)


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_profile(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    with pytest.raises(ConfigError, match="TOML"):
        load_profile(bad)


def test_extra_profile_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _good()
    data["name"] = "my-gpu"
    (tmp_path / "my-gpu.toml").write_text(profile_to_toml(profile_from_dict(data)))
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    assert "my-gpu" in known_profiles()
    assert get_profile("my-gpu").memory_bandwidth == 2039e9


def test_cli_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "list"]) == 0
    assert "rtx-pro-6000-blackwell-server" in capsys.readouterr().out
    assert main(["hw", "show", "b200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak"]["bf16_flops"] == 2250e12
    assert main(["hw", "show", "nope"]) == 2
    assert "known:" in capsys.readouterr().err


def test_cli_probe_writes_a_loadable_profile(tmp_path: Path) -> None:
    out = tmp_path / "cpu.toml"
    assert main(["hw", "probe", "--quick", "--name", "cpu", "--output", str(out)]) == 0
    prof = load_profile(out)
    assert prof.name == "cpu" and prof.memory_bandwidth > 1e8 and prof.bf16_flops > 1e8
