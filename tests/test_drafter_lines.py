"""DrafterPricer's lines, priced for a block of batch sizes at once, are the lines two
drafter_pass calls give each size alone (as the pricer computed them before), bit for bit, on
every bundled model, with and without tensor parallelism; and a whole pass priced from them is
drafter_pass's."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.cost.breakdown import RooflineBreakdown
from bastion.cost.drafterpass import LINE_BLOCK, DrafterPricer, drafter_pass
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model, known_models
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import check_tp
from bastion.errors import ConfigError


def _reference_line(pricer: DrafterPricer, requests: int) -> tuple[np.ndarray, np.ndarray, float]:
    zero = [0.0] * requests
    at0 = drafter_pass(pricer.drafter, pricer.hw, zero, pricer.options)
    at1 = drafter_pass(pricer.drafter, pricer.hw, [1.0, *zero[1:]], pricer.options)

    def seconds(b: RooflineBreakdown) -> np.ndarray:
        return np.array(
            [float(op.compute_s) for op in b.operators] + [float(op.memory_s) for op in b.operators]
        )

    c0 = seconds(at0)
    return c0, seconds(at1) - c0, float(at0.launch_s) + float(at0.comm_s)


def _options(tp: int, **kw: object) -> RooflineOptions:
    return RooflineOptions(tensor_parallel=tp, **kw) if tp > 1 else RooflineOptions(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", known_models())
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_block_lines_are_drafter_pass_lines(name: str, tp: int) -> None:
    model = get_model(name)
    drafter = DrafterSpec.dflash_for(model)
    hw = get_profile("h100-sxm")
    try:
        check_tp(model, tp, hw)
        check_tp(drafter.model, tp)
    except ConfigError:
        pytest.skip(f"{name} does not split {tp} ways")
    pricer = DrafterPricer(drafter, hw, _options(tp))
    for n in (*range(1, 9), 31, 32, 33, LINE_BLOCK, LINE_BLOCK + 1, 129, 200):
        got, want = pricer.line(n), _reference_line(pricer, n)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert got[2] == want[2]


@pytest.mark.parametrize("gpu", ["rtx-a6000", "h100-sxm"])
def test_block_lines_under_other_options(gpu: str) -> None:
    model = get_model("qwen3-8b")
    drafter = DrafterSpec.dflash_for(model)
    for opt in (
        _options(1, tile_tokens=64),
        _options(1, l2_resident=True),
        _options(2, bytes_per_act=4.0),
    ):
        pricer = DrafterPricer(drafter, get_profile(gpu), opt)
        for n in (1, 5, 64, 70):
            got, want = pricer.line(n), _reference_line(pricer, n)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
            assert got[2] == want[2]


def test_a_pass_from_the_lines_is_drafter_pass() -> None:
    model = get_model("llama-3.1-70b")
    drafter = DrafterSpec.dflash_for(model)
    hw = get_profile("h100-sxm")
    pricer = DrafterPricer(drafter, hw, _options(4))
    rng = np.random.default_rng(2)
    for _ in range(10):
        ctx = rng.integers(0, 30000, int(rng.integers(1, 90))).astype(np.float64)
        whole = drafter_pass(drafter, hw, ctx.tolist(), _options(4))
        per_op = np.maximum(
            np.array([float(op.compute_s) for op in whole.operators]),
            np.array([float(op.memory_s) for op in whole.operators]),
        )
        want = float(np.add.reduce(per_op)) + float(whole.launch_s) + float(whole.comm_s)
        assert pricer.total_s(ctx.shape[0], float(ctx.sum())) == pytest.approx(want, rel=1e-12)


def test_a_pass_needs_a_request() -> None:
    pricer = DrafterPricer(DrafterSpec.dflash_for(get_model("qwen3-8b")), get_profile("h100-sxm"))
    with pytest.raises(ConfigError):
        pricer.line(0)


@pytest.mark.skipif(
    getattr(__import__("bastion.cost.drafterpass").cost.drafterpass, "_drafter_s", None) is None,
    reason="no compiled kernel",
)
@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 17, 64, 129, 300])
def test_the_compiled_pass_sum_is_numpys(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """total_s's operator sum compiled (drafter_s) gives numpy's double, bit for bit, for any
    count of operators (numpy sums pairwise: plain below 8, in 8 lanes to 128, halves above),
    contexts where either branch wins, and a NaN anywhere."""
    import bastion.cost.drafterpass as dp

    rng = np.random.default_rng(n)
    pricer = DrafterPricer(DrafterSpec.dflash_for(get_model("qwen3-8b")), get_profile("h100-sxm"))
    for trial in range(20):
        at0 = rng.lognormal(-12, 3, 2 * n)
        slope = rng.lognormal(-20, 3, 2 * n) * rng.choice([0.0, 1.0], 2 * n)
        if trial == 19:
            at0[int(rng.integers(2 * n))] = np.nan
        context_sum = float(rng.choice([0.0, 1.0, 4096.0, rng.uniform(0, 1e6)]))
        monkeypatch.setattr(pricer, "line", lambda _b, a=at0, s=slope: (a, s, 1e-5))
        got = pricer.total_s(4, context_sum)
        with monkeypatch.context() as m:
            m.setattr(dp, "_drafter_s", None)
            want = pricer.total_s(4, context_sum)
        assert got == want or (np.isnan(got) and np.isnan(want)), (trial, got, want)
