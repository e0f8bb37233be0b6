"""The simulator's parts: ground-truth GPU, synthetic workloads, acceptance, serving."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.acceptance import walk
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BastionError, ConfigError
from bastion.policies import ChainPolicy, FixedPolicy, make_policy
from bastion.tree import DraftMarginals, best_first_tree
from sim.backend import accepted_path
from sim.gpu import GroundTruth, SimulatedGPU
from sim.serving import serve
from sim.workloads import PRESETS, SyntheticRequest, Workload, get_workload
from tests.strategies import marginals


def gpu(model: str = "qwen3-8b", device: str = "h100-sxm", **truth: float) -> SimulatedGPU:
    m = get_model(model)
    return SimulatedGPU(get_profile(device), m, DrafterSpec.dflash_for(m), GroundTruth(**truth))


def test_truth_grows_with_tree_size_and_steps_at_tiles() -> None:
    g = gpu(noise=0.0)
    curve = g.verify_curve(1024)
    assert np.all(np.diff(curve) >= 0)
    jumps = np.diff(curve)
    # the jump into a new 64-token tile is larger than the steps inside a tile
    assert jumps[63] > 5 * np.median(jumps[:62])
    # a masked tree pass of one token costs at least an AR step
    assert g.verify_truth([1], [1024]) >= g.ar_truth([1024])


def test_truth_is_not_the_nominal_roofline() -> None:
    """Decision 1: the simulated device is slower than the profile's defaults say."""
    from bastion.cost.roofline import verify_pass

    g = gpu(noise=0.0)
    nominal = float(verify_pass(g.model, g.hardware, [(64, 1024)]).total_s)
    assert g.verify_truth([64], [1024]) > 1.05 * nominal


def test_noise_is_seeded() -> None:
    a, b = gpu(noise=0.05), gpu(noise=0.05)
    xs = [a.verify_s([16], [512]) for _ in range(5)]
    assert xs == [b.verify_s([16], [512]) for _ in range(5)]
    assert len(set(xs)) == 5


def test_batched_pass_costs_more_than_one_request() -> None:
    g = gpu(noise=0.0)
    one = g.verify_truth([16], [1000])
    batch = g.verify_truth([16] * 32, [1000] * 32)
    assert one < batch < 32 * one


@pytest.mark.parametrize("field", ["compute_scale", "memory_scale", "context_quantum"])
def test_bad_ground_truth(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        GroundTruth(**{field: 0})


def test_synthetic_marginals_are_valid_and_seeded() -> None:
    w = get_workload("code")
    a = SyntheticRequest(w, np.random.default_rng(3))
    b = SyntheticRequest(w, np.random.default_rng(3))
    for _ in range(40):  # crosses a refill
        ma, mb = a.draft(), b.draft()
        DraftMarginals(ma.token_ids, ma.probs)  # validates: sorted, distinct ids, sums ≤ 1
        np.testing.assert_array_equal(ma.probs, mb.probs)
        np.testing.assert_array_equal(a.target_tokens(), b.target_tokens())
        a.commit(1)
        b.commit(1)


def chain_tau(w: Workload, n_steps: int = 3000) -> float:
    req = SyntheticRequest(w, np.random.default_rng(11))
    total = 0
    for _ in range(n_steps):
        m = req.draft()
        tree = best_first_tree(m.truncate(k=1), w.depth + 1)
        total += len(accepted_path(tree, req.target_tokens()))  # root + accepted = committed
    return total / n_steps


def test_presets_reach_the_reported_chain_acceptance() -> None:
    """DFlash chain τ (block 16): ≈ 5–8 on math and code, lower on chat (docs/simulator.md)."""
    taus = {name: chain_tau(w) for name, w in PRESETS.items()}
    assert 5.0 <= taus["math"] <= 8.0
    assert 5.0 <= taus["code"] <= 8.0
    assert taus["chat"] < taus["code"] and 2.5 <= taus["chat"] <= 5.0


def test_alignment_knob_controls_acceptance() -> None:
    """Negative control for the calibration of presets: a worse-aligned drafter accepts less."""
    w = get_workload("math")
    assert chain_tau(w.with_(alignment=0.6), 1000) < chain_tau(w, 1000) - 1.0


def test_unknown_workload_lists_presets() -> None:
    with pytest.raises(BastionError, match="math"):
        get_workload("poetry")


@given(marginals(max_depth=6, max_k=4), st.data())
def test_accepted_path_is_the_greedy_walk(m: DraftMarginals, data: st.DataObject) -> None:
    """The simulator's vectorised acceptance equals the core's sample-and-match walk."""
    tree = best_first_tree(m, data.draw(st.integers(1, 60)))
    # a target continuation that follows the tree for a while, then leaves it
    pick = data.draw(st.lists(st.integers(0, 3), min_size=m.depth, max_size=m.depth))
    target = np.array([int(m.token_ids[d, min(r, m.k - 1)]) for d, r in enumerate(pick)])
    target[data.draw(st.integers(0, m.depth - 1))] = 10**9  # an off-tree token somewhere
    ours = accepted_path(tree, target)
    ref = walk(
        tree, lambda node: int(target[tree.depths[node]]) if tree.depths[node] < m.depth else -1
    )
    assert ours == list(ref.path)


def small(name: str = "math", out: int = 96) -> Workload:
    return get_workload(name).with_(output_len=out)


def factory(w: Workload, seed: int = 0):  # type: ignore[no-untyped-def]
    return lambda i: SyntheticRequest(w, np.random.default_rng([seed, i]), request_id=i)


def test_serving_is_deterministic_and_counts_tokens() -> None:
    w = small()
    runs = [serve(FixedPolicy(32), gpu(), factory(w), 3, concurrency=2) for _ in range(2)]
    a, b = runs
    assert [r.committed for r in a.requests] == [r.committed for r in b.requests]
    assert a.elapsed_s == b.elapsed_s
    assert all(r.tokens == 96 for r in a.requests)
    assert max(a.batch_sizes) <= 2
    assert a.tau > 1.5


def test_ar_commits_one_token_per_step() -> None:
    r = serve(make_policy("ar"), gpu(), factory(small(out=20)), 2)
    assert r.tau == 1.0 and r.mean_tree_size == 1.0 and r.draft_s == 0.0
    assert all(len(q.committed) == 19 for q in r.requests)  # the first token came from prefill


def test_batching_raises_throughput_but_slows_each_request() -> None:
    w = small(out=64)
    one = serve(ChainPolicy(), gpu(), factory(w), 8, concurrency=1)
    eight = serve(ChainPolicy(), gpu(), factory(w), 8, concurrency=8)
    assert eight.throughput > 3 * one.throughput
    assert eight.tpot_s > one.tpot_s


def test_bad_concurrency() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        serve(ChainPolicy(), gpu(), factory(small()), 2, concurrency=0)
