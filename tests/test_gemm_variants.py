"""docs/gemm_variants.py (the GEMM variants tried against the kernel model's floor, not adopted)
and the floor helpers of docs/make_transfer_table.py: the ``base`` variant must stay the
library's gemm_time (else the documented variant numbers no longer measure a change to the
library), every other variant must differ from it, and the monotone floor must be the least
error of a non-decreasing curve."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import bastion.cost.kernels as kernels
from bastion.cost.hardware import get_profile
from bastion.cost.kernels import KernelDevice, KernelParams, gemm_time
from bastion.cost.transfer import FIT_START

DOCS = Path(__file__).resolve().parents[1] / "docs"
TOKENS = np.arange(1, 1025, dtype=np.float64)
SHAPES = ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096), (4096, 28672))
GPUS = ("a100-sxm-80gb", "a40", "h100-sxm")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # make_transfer_table imports gemm_variants by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def variants() -> ModuleType:
    return _load("gemm_variants")


@pytest.mark.parametrize("gpu", GPUS)
def test_base_variant_is_the_library(variants: ModuleType, gpu: str) -> None:
    dev, p = KernelDevice.of(get_profile(gpu)), KernelParams()
    for k_in, n_out in SHAPES:
        for groups in (1.0, 3.0):
            want = gemm_time(TOKENS, k_in, n_out, dev, p, groups=groups)
            got = variants.gemm_time_variant("base", TOKENS, k_in, n_out, dev, p, groups=groups)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0.0)


def test_every_other_variant_changes_the_price(variants: ModuleType) -> None:
    # the negative control of the test above: the comparison sees a change to the formula
    # (under the defaults the Hopper tile set never wins a price; under FIT_START it does)
    dev = {gpu: KernelDevice.of(get_profile(gpu)) for gpu in GPUS}
    for variant in variants.VARIANTS[1:]:
        moved = max(
            float(
                np.max(
                    np.abs(
                        variants.gemm_time_variant(variant, TOKENS, k, n, d, p)
                        / gemm_time(TOKENS, k, n, d, p)
                        - 1.0
                    )
                )
            )
            for d in dev.values()
            for k, n in SHAPES
            for p in (KernelParams(), FIT_START)
        )
        assert moved > 1e-3, variant


def test_use_variant_patches_the_pricer_and_restores_it(variants: ModuleType) -> None:
    original = kernels.gemm_time
    dev, p = KernelDevice.of(get_profile("h100-sxm")), KernelParams()
    want = variants.gemm_time_variant("padded-feed", TOKENS, 4096, 22016, dev, p)
    with variants.use_variant("padded-feed"):
        assert kernels.gemm_time is not original
        np.testing.assert_array_equal(kernels.gemm_time(TOKENS, 4096, 22016, dev, p), want)
    assert kernels.gemm_time is original
    with pytest.raises(ValueError, match="unknown variant"), variants.use_variant("nope"):
        pass
    assert kernels.gemm_time is original


def test_monotone_floor() -> None:
    script = _load("make_transfer_table")
    assert script.monotone_floor(np.array([1.0, 1.0, 2.0, 3.0, 3.0])) == 0.0
    # one dip among equal values: the best non-decreasing curve is flat at 2, the dip errs 100 %
    assert script.monotone_floor(np.array([2.0, 2.0, 1.0, 2.0, 2.0])) == pytest.approx(0.2)
    # a spike: flat through it is best (err 50 % of 1 point), not following it (the running
    # maximum would err 100 % on two points after it)
    y = np.array([1.0, 2.0, 1.0, 1.0])
    assert script.monotone_floor(y) == pytest.approx(0.5 / 4)
    running_max = np.maximum.accumulate(y)
    assert script.monotone_floor(y) < float(np.mean(np.abs(running_max / y - 1.0)))
