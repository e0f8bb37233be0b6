"""The wheel: the simulator installs as bastion.sim (never a top-level ``sim``), with its data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]


def _big(directory: str, names: list[str]) -> set[str]:
    """Results and caches are not needed to build the wheel (and the tests' own caches change
    while other test processes run)."""
    caches = {"out", ".mypy_cache", ".ruff_cache", ".hypothesis", ".pytest_cache"}
    skip = {"docs": {"experiments", "figures"}, ROOT.name: caches}
    return set(names) & skip.get(Path(directory).name, set())


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"  # a clean copy: no stale build/ directory can leak into the wheel
    ignore = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so")
    shutil.copytree(ROOT, src, symlinks=True, ignore=lambda d, n: {*ignore(d, n), *_big(d, n)})
    build = subprocess.run(
        [*PIP_WHEEL, "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{build.stdout[-2000:]}\n{build.stderr[-2000:]}")
    (wheel,) = out.glob("bastion-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_no_top_level_sim_module(wheel_names: list[str]) -> None:
    tops = {n.split("/")[0] for n in wheel_names}
    assert "sim" not in tops
    assert {n for n in tops if not n.endswith(".dist-info")} == {"bastion"}


def test_simulator_and_its_data_ship_inside_bastion(wheel_names: list[str]) -> None:
    names = set(wheel_names)
    for module in ("simulate", "gpu", "serving", "truth", "workloads"):
        assert f"bastion/sim/{module}.py" in names
    for module in ("__init__", "config", "executors", "reports/__init__", "reports/generic"):
        assert f"bastion/sim/experiments/{module}.py" in names  # a package since issue 19
    for data in (
        "sim/truths/hf-eager.toml",
        "workloads/qwen3-8b-math.toml",
        "experiments/budget-sweep.toml",
        "hwprofiles/h100-sxm.toml",
        "schemas/records.schema.json",  # the records' JSON Schema (bastion.records)
    ):
        assert f"bastion/{data}" in names, data
