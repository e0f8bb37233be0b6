"""The simulator's parts: ground-truth GPU, synthetic workloads, acceptance, serving."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.acceptance import walk
from bastion.batch import TreeBatch
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BastionError, ConfigError
from bastion.policies import ChainPolicy, FixedPolicy, make_policy
from bastion.sim.backend import accepted_counts, accepted_path
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.serving import serve
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import PRESETS, Workload, get_workload
from bastion.tree import DraftMarginals, best_first_tree
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


ONE = np.zeros(1, np.int64)


def stream(w: Workload, seed: int = 3, index: int = 0, **kw: int) -> SyntheticSource:
    src = SyntheticSource(w, seed, **kw)
    src.admit(0, index)
    return src


def test_synthetic_marginals_are_valid_and_seeded() -> None:
    w = get_workload("code")
    a, b = stream(w, block_steps=16), stream(w, block_steps=16)
    for _ in range(40):  # crosses refills
        (ma, ta), (mb, tb) = a.draft(ONE, ONE), b.draft(ONE, ONE)
        DraftMarginals(ma.token_ids[0], ma.probs[0])  # validates: sorted, distinct ids, sums ≤ 1
        np.testing.assert_array_equal(ma.probs, mb.probs)
        np.testing.assert_array_equal(ta, tb)
        assert ta.shape == (1, w.depth + 1) and np.all(ta[:, : w.depth] <= w.k)


def test_a_request_stream_does_not_depend_on_its_slot_or_neighbours() -> None:
    """Request i draws from its own generator: same marginals in any slot, beside anyone."""
    w = get_workload("math")
    alone = stream(w, seed=5, index=7)
    crowd = SyntheticSource(w, 5)
    for slot, index in ((0, 1), (1, 2), (2, 7)):
        crowd.admit(slot, index)
    both = np.array([2, 0])
    for _ in range(70):
        m1, t1 = alone.draft(ONE, ONE)
        m2, t2 = crowd.draft(both, both)
        np.testing.assert_array_equal(m1.probs[0], m2.probs[0])
        np.testing.assert_array_equal(t1[0], t2[0])


def chain_tau(w: Workload, n_steps: int = 3000, **kw: int) -> float:
    src = stream(w, seed=11, **kw)
    total = 0
    for _ in range(n_steps):
        m, target = src.draft(ONE, ONE)
        tree = best_first_tree(m.row(0).truncate(k=1), w.depth + 1)
        total += len(accepted_path(tree, target[0, : w.depth]))  # root + accepted = committed
    return total / n_steps


def tree_tau(w: Workload, n: int, steps: int, bank: int) -> float:
    src = SyntheticSource(w, 2, bank_size=bank)
    slots = np.arange(8)
    for s in slots:
        src.admit(int(s), int(s))
    total = 0
    for _ in range(steps):
        m, target = src.draft(slots, slots)
        trees = TreeBatch.from_trees([best_first_tree(m.row(i), n) for i in range(8)])
        total += int(accepted_counts(trees, target)[0].sum()) + 8
    return total / (8 * steps)


def test_the_spread_bank_keeps_tree_acceptance() -> None:
    """Runner-up spreads drawn from a bank of 4096 Dirichlet rows give the same tree τ as a
    bank 16× larger (practically fresh draws) to within 1 %; a bank of a single row (every
    position sharing one runner-up shape: the negative control) does not."""
    w = get_workload("chat")
    base = tree_tau(w, 32, 1500, 4096)
    assert abs(base - tree_tau(w, 32, 1500, 65536)) < 0.01 * base
    assert abs(base - tree_tau(w, 32, 1500, 1)) > 0.01 * base


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
    return get_workload(name).with_(output_len=out, output_len_sigma=0.0)


def factory(w: Workload, seed: int = 0) -> SyntheticSource:
    return SyntheticSource(w, seed)


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
    with pytest.raises(ConfigError, match="concurrency"):
        serve(ChainPolicy(), gpu(), factory(small()), 2, concurrency=0)


def target_law_error(w: Workload, claimed_alignment: float) -> float:
    """Largest z-score, over ranks 0–2 and 'outside', of the target's empirical rank frequency
    against λ·q[r] (row by row), over 32 requests × 256 steps × 15 positions."""
    src = SyntheticSource(w, seed=9)
    slots = np.arange(32)
    for s in slots:
        src.admit(int(s), int(s))
    hits, expected, variance = np.zeros(4), np.zeros(4), np.zeros(4)
    for _ in range(256):
        m, target = src.draft(slots, slots)
        q = claimed_alignment * m.probs  # [B, D, K]
        rank = target[:, : w.depth]
        law = np.concatenate((q[:, :, :3], 1.0 - q.sum(axis=2, keepdims=True)), axis=2)
        seen = np.stack([rank == 0, rank == 1, rank == 2, rank == w.k], axis=2)
        hits += seen.sum(axis=(0, 1))
        expected += law.sum(axis=(0, 1))
        variance += (law * (1 - law)).sum(axis=(0, 1))
    return float(np.max(np.abs(hits - expected) / np.sqrt(variance)))


def test_target_tokens_follow_the_alignment_law() -> None:
    """The target takes the drafter's rank-r candidate with probability λ·q[r] (z < 5 for every
    rank); the same check with a wrong λ (the negative control) fails."""
    w = get_workload("chat")
    assert target_law_error(w, w.alignment) < 5.0
    assert target_law_error(w, w.alignment * 0.97) > 5.0


def test_compiled_commit_is_the_numpy_update() -> None:
    """A verified step's counts updated by the compiled ``commit`` as by numpy's fancy-indexed
    updates (distinct slots), across outputs reached or not; anything it does not take (a
    dtype, a read-only pool, a slot out of range, lengths that differ) changes nothing and
    says so (the numpy path then runs)."""
    from bastion.sim import backend

    commit = backend._commit
    if commit is None:
        pytest.skip("built without the compiled kernel")
    rng = np.random.default_rng(9)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        ctx = rng.integers(0, 5000, n).astype(np.int64)
        gen = rng.integers(0, 300, n).astype(np.int64)
        out = gen + rng.integers(0, 20, n).astype(np.int64)
        slots = rng.permutation(n)[: int(rng.integers(1, n + 1))].astype(np.int64)
        made = rng.integers(1, 17, slots.shape[0]).astype(np.int64)
        want_ctx, want_gen = ctx.copy(), gen.copy()
        want_ctx[slots] += made
        want_gen[slots] = np.minimum(want_gen[slots] + made, out[slots])
        assert commit(ctx, gen, out, slots, made)
        assert np.array_equal(ctx, want_ctx) and np.array_equal(gen, want_gen)
    ctx, gen, out = np.zeros(4, np.int64), np.zeros(4, np.int64), np.full(4, 9, np.int64)
    one, two = np.array([1], np.int64), np.array([2], np.int64)
    frozen = ctx.copy()
    frozen.flags.writeable = False
    for args in (
        (ctx.astype(np.int32), gen, out, one, two),
        (frozen, gen, out, one, two),
        (ctx, gen, out, np.array([4], np.int64), two),
        (ctx, gen, out, np.array([-1], np.int64), two),
        (ctx, gen, out, one, np.array([2, 3], np.int64)),
        (ctx, gen[:3], out, one, two),
    ):
        assert commit(*args) is False
    assert not ctx.any() and not gen.any()
