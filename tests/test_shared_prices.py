"""What the simulator shares across runs is what each run would price afresh: the simulated
GPU's noise-free truths (one store per profile, model, drafter, truth and N_max) and the
learning controller's prior at its anchors (kept on the prior cost model, per correction)."""

from __future__ import annotations

import numpy as np

import bastion.sim.gpu as gpu_module
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.curvecache import Memo
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.learned import LearnedCostModel
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.truth import get_truth

MODEL = get_model("qwen3-8b")
HW = get_profile("h100-sxm")
DRAFTER = DrafterSpec.dflash_for(MODEL)


def test_gpus_of_one_configuration_share_their_truths_and_price_them_alike() -> None:
    gpu_module._SHARED.clear()
    first = SimulatedGPU(HW, MODEL, DRAFTER, seed=1)
    values = [first.verify_truth([s], [c]) for s in (1, 7, 90) for c in (0, 300, 5000)]
    values += [first.ar_truth([c]) + first.draft_truth([c]) for c in (17, 4000)]
    second = SimulatedGPU(HW, MODEL, DRAFTER, seed=2)
    assert second.pricer is first.pricer and second._verify_cache is first._verify_cache
    gpu_module._SHARED.clear()
    fresh = SimulatedGPU(HW, MODEL, DRAFTER, seed=3)
    assert fresh.pricer is not first.pricer
    again = [fresh.verify_truth([s], [c]) for s in (1, 7, 90) for c in (0, 300, 5000)]
    again += [fresh.ar_truth([c]) + fresh.draft_truth([c]) for c in (17, 4000)]
    assert again == values


def test_other_truths_and_tree_caps_do_not_share() -> None:
    a = SimulatedGPU(HW, MODEL, DRAFTER)
    assert SimulatedGPU(HW, MODEL, DRAFTER, get_truth("cudagraph")).pricer is not a.pricer
    assert SimulatedGPU(HW, MODEL, DRAFTER, max_tree_size=64)._verify_cache is not (a._verify_cache)


def test_a_full_store_of_truths_is_emptied_not_grown() -> None:
    cache: dict[int, float] = {}
    for key in range(gpu_module._Shared.ENTRIES + 5):
        gpu_module._remember(cache, key, 1.0)
    assert len(cache) == 5


def test_the_prior_at_its_anchors_is_priced_once_per_prior_and_correction() -> None:
    prior = RooflineCostModel(HW, MODEL, DRAFTER)
    calls = []
    joint = prior.joint_cost_curve

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return joint(*args, **kwargs)

    prior.joint_cost_curve = counted  # type: ignore[method-assign]
    ctx = np.array([700, 900, 1100, 1300], np.int64)
    first = np.asarray(LearnedCostModel(prior).priced.even(ctx, 64))
    priced = len(calls)
    assert priced > 0
    second = LearnedCostModel(prior).priced
    assert np.array_equal(np.asarray(second.even(ctx, 64)), first) and len(calls) == priced
    prior.prep_s += 1e-4  # another correction: priced afresh
    third = LearnedCostModel(prior).priced.even(ctx, 64)
    assert len(calls) > priced and not np.array_equal(np.asarray(third), first)


def test_a_memo_is_emptied_beyond_its_bytes_and_hands_out_read_only_arrays() -> None:
    memo = Memo(limit=100)
    kept = memo.put("a", np.zeros(10))
    assert not kept.flags.writeable and memo.get("a") is kept
    memo.put("b", np.zeros(10))  # 160 bytes > 100: emptied first
    assert memo.get("a") is None and memo.get("b") is not None
