"""KV-cache memory in the simulator: the plan, admission, preemption, the KV room of trees."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from bastion.batch import BatchMarginals, KVRoom, TreeBatch
from bastion.cli import main
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BudgetError, ConfigError, MemoryLimitError
from bastion.joint import forest_batch
from bastion.kvroom import fit_trees
from bastion.policies import make_policy
from bastion.sim.arrivals import Arrival
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.memory import MemoryPlan, lookahead_tokens, plan_memory
from bastion.sim.serving import serve
from bastion.sim.simulate import SimSpec, simulate
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload, write_workload

GB = 1e9


def _config(name: str) -> dict[str, int]:
    text = (resources.files("bastion.cost") / "configs" / f"{name}.json").read_text()
    cfg: dict[str, int] = json.loads(text)
    return cfg


def _by_hand_qwen3_8b_on_a6000(drafts: bool, concurrency: int, chunk: int) -> int:
    """The KV capacity (tokens) of Qwen3-8B (and its 5-layer DFlash drafter) on an RTX A6000
    (48e9 bytes) at utilization 0.9, from the config's numbers, written out by hand."""
    c = _config("qwen3-8b")
    h, layers, v, f = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], 12288
    hq, hkv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    assert (h, layers, hq, hkv, v, f) == (4096, 36, 4096, 1024, 151936, c["intermediate_size"])
    qk_norm = 2 * c["head_dim"]
    layer = h * hq + 2 * h * hkv + hq * h + 3 * h * f + 2 * h + qk_norm
    weights = layers * layer + h + 2 * v * h  # untied embedding and LM head, final norm
    kv = 2 * layers * hkv * 2  # K and V, bf16, per token
    look = 1
    if drafts:  # 5 layers at the target's widths, fc over 5 taps, two norms; its own cache
        weights += 5 * layer + 5 * h * h + 2 * h
        kv += 2 * 5 * hkv * 2
        look = 16
    weights *= 2  # bf16
    tokens = chunk + concurrency * look
    rows = concurrency * look + (1 if chunk else 0)
    activations = tokens * 2 * (2 * h + hq + 2 * hkv + 3 * f) + rows * 4 * v
    blocks = int((0.9 * 48e9 - weights - activations) // (16 * kv))
    return 16 * blocks


@pytest.mark.parametrize("drafts", [False, True])
def test_kv_capacity_is_the_hand_computation(drafts: bool) -> None:
    m = get_model("qwen3-8b")
    plan = plan_memory(
        get_profile("rtx-a6000"),
        m,
        DrafterSpec.dflash_for(m) if drafts else None,
        utilization=0.9,
        concurrency=64,
        prefill_chunk=512,
        lookahead=16 if drafts else 1,
    )
    assert plan.capacity_tokens == _by_hand_qwen3_8b_on_a6000(drafts, 64, 512)
    # and the simulation reports it, per policy (AR carries no drafter)
    spec = SimSpec(gpu="rtx-a6000", concurrency=64, policies=("chain",))
    assert spec.memory_plan(drafts) == plan


def test_a_model_too_big_for_its_gpu_is_refused() -> None:
    refused = r"qwen3-32b does not fit on l4: it needs 65\.\d+ GB"
    with pytest.raises(MemoryLimitError, match=refused):
        SimSpec(model="qwen3-32b", gpu="l4")
    with pytest.raises(MemoryLimitError, match=r"21\.60 GB usable"):
        plan_memory(get_profile("l4"), get_model("qwen3-32b"))
    SimSpec(model="qwen3-32b", gpu="l4", gpu_memory_utilization=None)  # memory off: served
    # the drafter's weights and cache can tip a model over: it is counted for drafting runs
    m = get_model("qwen3-8b")
    alone = plan_memory(get_profile("l4"), m, utilization=0.77)
    with pytest.raises(MemoryLimitError, match="with its drafter"):
        plan_memory(get_profile("l4"), m, DrafterSpec.dflash_for(m), utilization=0.77)
    assert alone.blocks >= 1


def test_memory_inputs_are_validated() -> None:
    for bad in (0, 1.5, -0.1, float("nan"), True, "0.9"):
        with pytest.raises(ConfigError, match="gpu_memory_utilization"):
            SimSpec(gpu_memory_utilization=bad)  # type: ignore[arg-type]
    for key in ("slo_ttft_s", "slo_tpot_s"):
        for bad in (0, -1.0, float("inf"), True):
            with pytest.raises(ConfigError, match=key):
                SimSpec(**{key: bad})
    with pytest.raises(ConfigError):
        plan_memory(get_profile("l4"), get_model("qwen3-8b"), utilization=0.0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu-memory-utilization", "1.2"], "--gpu-memory-utilization must be in (0, 1]"),
        (["--gpu-memory-utilization", "lots"], "a number in (0, 1] or off; got 'lots'"),
        (["--slo-tpot", "0"], "--slo-tpot must be > 0"),
        (["--slo-ttft", "-2"], "--slo-ttft must be > 0"),
        (["--model", "qwen3-32b", "--gpu", "l4"], "does not fit on l4: it needs"),
    ],
)
def test_the_cli_refuses_bad_memory_and_slo_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_lookahead_is_the_largest_tree_a_policy_verifies() -> None:
    sizes = {
        "ar": 1,
        "bastion": 1,
        "bastion:paper": 1,
        "chain": 16,
        "fixed:64": 64,
        "beam:4x15": 61,
        "eagle:10,7,60": 60,
    }
    for spec, look in sizes.items():
        assert lookahead_tokens(make_policy(spec), 15) == look, spec


# -- the KV room of a step's trees ------------------------------------------------------------


def _marginals(rng: np.random.Generator, b: int, depth: int = 6, k: int = 4) -> BatchMarginals:
    p = np.sort(rng.dirichlet(np.ones(k + 1), size=(b, depth))[:, :, :k], axis=2)[:, :, ::-1]
    ids = np.broadcast_to(np.arange(k), (b, depth, k)).copy()
    return BatchMarginals(ids, np.ascontiguousarray(p))


@given(
    seed=st.integers(0, 2**32 - 1),
    b=st.integers(1, 6),
    total=st.integers(0, 120),
    free=st.integers(0, 6),
    bt=st.sampled_from([1, 2, 4, 16]),
)
def test_cut_trees_fit_and_are_the_joint_budgets_allocation(
    seed: int, b: int, total: int, free: int, bt: int
) -> None:
    rng = np.random.default_rng(seed)
    marginals = _marginals(rng, b)
    trees = forest_batch(marginals, 64, b + total)
    room = KVRoom(rng.integers(1, 2 * bt + 1, size=b), free, bt)
    cut = fit_trees(trees, room)
    assert room.fits(cut.sizes)
    assert np.all(cut.sizes <= trees.sizes) and np.all(cut.sizes >= 1)
    if cut is not trees:  # the longest prefix of the merged order: one more node would not fit
        assert not room.fits(forest_batch(marginals, 64, int(cut.sizes.sum()) + 1).sizes)
    # best-first trees: the cut is the joint budget's own allocation at its total
    again = forest_batch(marginals, 64, int(cut.sizes.sum()))
    assert np.array_equal(again.sizes, cut.sizes) and np.array_equal(again.ranks, cut.ranks)


def test_a_cut_keeps_each_trees_prefix_and_refuses_a_room_of_another_batch() -> None:
    rng = np.random.default_rng(3)
    trees = forest_batch(_marginals(rng, 3), 64, 60)
    cut = fit_trees(trees, KVRoom(np.array([1, 1, 1]), 1, 4))
    for i in range(3):
        n = int(cut.sizes[i])
        assert np.array_equal(cut.tree(i).parents, trees.tree(i).parents[:n])
    with pytest.raises(BudgetError, match="for 2 requests"):
        fit_trees(trees, KVRoom(np.array([1, 1]), 1, 4))
    roots = TreeBatch.roots(3)
    assert fit_trees(roots, KVRoom(np.array([1, 1, 1]), 0, 16)) is roots


# -- admission and preemption -----------------------------------------------------------------


def _gpu() -> SimulatedGPU:
    m = get_model("qwen3-8b")
    return SimulatedGPU(get_profile("h100-sxm"), m, DrafterSpec.dflash_for(m), GroundTruth(noise=0))


def _tiny(blocks: int) -> MemoryPlan:
    """A KV cache of ``blocks`` 16-token blocks (the rest of the plan is not used by serving)."""
    return MemoryPlan(80e9, 0.9, 0.0, 0.0, 1.0, blocks)


POLICIES = ("ar", "chain", "fixed:8", "fixed:40", "bastion:paper")


def _serve(policy: str, arrivals: list[Arrival], memory: MemoryPlan | None, **kw: object):  # type: ignore[no-untyped-def]
    g = _gpu()
    p = make_policy(policy)
    cost = RooflineCostModel(g.hardware, g.model, g.drafter) if policy == "bastion:paper" else None
    src = SyntheticSource(get_workload("math"), seed=1)
    return serve(p, g, src, arrivals=arrivals, memory=memory, cost_model=cost, **kw)  # type: ignore[arg-type]


@given(
    policy=st.sampled_from(POLICIES),
    blocks=st.integers(8, 60),
    concurrency=st.integers(1, 8),
    chunk=st.sampled_from([0, 64, 512]),
    requests=st.lists(
        st.tuples(st.floats(0.0, 0.05), st.integers(1, 300), st.integers(2, 60)),
        min_size=1,
        max_size=8,
    ),
)
def test_admission_never_exceeds_the_kv_capacity(
    policy: str,
    blocks: int,
    concurrency: int,
    chunk: int,
    requests: list[tuple[float, int, int]],
) -> None:
    """Over random arrivals and lengths: the blocks held never exceed the cache (trees' slots
    included), and every request — preempted or not — gets exactly its tokens, once."""
    look = lookahead_tokens(make_policy(policy), 15)
    cap = 16 * blocks
    arrivals = sorted(
        (
            Arrival(t, min(prompt, cap - out - look), out)
            for t, prompt, out in requests
            if cap - out - look >= 1  # a request that fits the cache alone
        ),
        key=lambda a: a.time_s,
    )
    if not arrivals:
        return
    r = _serve(policy, arrivals, _tiny(blocks), concurrency=concurrency, prefill_chunk=chunk)
    event("preempted" if r.preemptions else "no preemption")
    event("queued" if any(q.queue_s > 0 for q in r.requests) else "never queued")
    assert r.kv_capacity_tokens == cap
    assert 0 < r.kv_peak_tokens <= cap
    assert r.max_running <= concurrency
    assert [q.request_id for q in r.requests] == list(range(len(arrivals)))
    for q, a in zip(r.requests, arrivals, strict=True):
        assert q.tokens == a.output_len
        assert sum(q.committed) == a.output_len - 1  # nothing lost, nothing counted twice
        assert q.arrival_s <= q.start_s <= q.end_s


def _crowd() -> list[Arrival]:
    return [Arrival(0.001 * i, 200, 40) for i in range(6)]


def test_without_a_limit_the_same_requests_overflow_the_cache() -> None:
    """The negative control of the capacity property: memory off, the peak passes what a
    20-block cache holds; with it, admission and preemption keep within it."""
    free = _serve("fixed:40", _crowd(), None, concurrency=6, prefill_chunk=64)
    assert free.kv_capacity_tokens is None and free.kv_peak_tokens > 16 * 20
    bound = _serve("fixed:40", _crowd(), _tiny(20), concurrency=6, prefill_chunk=64)
    assert bound.kv_peak_tokens <= 16 * 20
    assert bound.max_running < free.max_running
    assert sum(q.queue_s for q in bound.requests) > 0


def test_a_running_request_that_cannot_grow_is_preempted_and_finishes() -> None:
    # two long requests, each alone fits, both together outgrow the cache mid-decode
    arrivals = [Arrival(0.0, 150, 120), Arrival(0.0, 150, 120)]
    r = _serve("fixed:8", arrivals, _tiny(30), concurrency=2, prefill_chunk=64)
    assert r.preemptions >= 1
    assert sum(q.preempted for q in r.requests) == r.preemptions
    assert r.kv_peak_tokens <= 16 * 30
    for q in r.requests:
        assert q.tokens == 120 and sum(q.committed) == 119


def test_the_joint_budget_never_forces_a_preemption() -> None:
    """The joint budget plans within the free blocks (its KV room is the root): where fixed
    trees of 40 force preemptions, the adaptive controller's trees are cut to fit instead."""
    crowd = [Arrival(0.0, 100, 60) for _ in range(4)]
    fixed = _serve("fixed:40", crowd, _tiny(36), concurrency=4, prefill_chunk=0)
    joint = _serve("bastion:paper", crowd, _tiny(36), concurrency=4, prefill_chunk=0)
    assert fixed.preemptions > 0
    assert joint.preemptions == 0 and joint.kv_peak_tokens <= 16 * 36


def test_a_request_longer_than_the_cache_is_refused() -> None:
    with pytest.raises(MemoryLimitError, match="request 0 needs 400 tokens"):
        _serve("chain", [Arrival(0.0, 400, 10)], _tiny(20), prefill_chunk=64)


# -- simulate: records, unchanged results when memory does not bind ---------------------------

_SMALL = SimSpec(requests=4, output_len=48, concurrency=2, policies=("chain", "fixed:16"))


def test_records_are_unchanged_when_memory_does_not_bind() -> None:
    on = simulate(_SMALL)
    off = simulate(replace(_SMALL, gpu_memory_utilization=None))
    for a, b in zip(on.rows, off.rows, strict=True):
        da, db = a.__dict__.copy(), b.__dict__.copy()
        for key in ("wall_s", "kv_capacity_tokens"):
            da.pop(key), db.pop(key)
        assert json.dumps(da, default=str) == json.dumps(db, default=str)
        assert a.kv_capacity_tokens is not None and a.kv_capacity_tokens > 100_000
        assert a.preemptions == 0 and a.max_running == 2


def test_slo_attainment_and_goodput() -> None:
    r = simulate(replace(_SMALL, slo_tpot_s=0.004, slo_ttft_s=1.0))
    served = {s.policy: s for s in r.served}
    for row in r.rows:
        reqs = served[row.policy].requests
        met = [q.tpot_s <= 0.004 and q.ttft_s <= 1.0 for q in reqs]
        assert row.slo_attainment == pytest.approx(np.mean(met))
        assert row.goodput_rps == pytest.approx(sum(met) / row.simulated_s)
    assert r.row("ar").slo_attainment == 0.0 and r.row("fixed:16").slo_attainment == 1.0
    plain = simulate(_SMALL).rows[0]
    assert np.isnan(plain.slo_attainment) and np.isnan(plain.goodput_rps)


def test_long_prompts_on_an_a6000_run_at_most_the_hand_computed_number(tmp_path: Path) -> None:
    """The issue's check: Qwen3-8B on an RTX A6000, 24k-token prompts, concurrency 64. Each
    admitted request holds its prompt's ⌈24576 / 16⌉ = 1536 blocks, so at most ⌊blocks / 1536⌋
    run at once (5 with the drafter, 7 for AR); the others queue, and that is reported."""
    long = get_workload("math").with_(
        name="math-24k", prompt_len=24576, prompt_len_sigma=0.0, prompt_len_max=32768
    )
    workload = tmp_path / "math-24k.toml"
    write_workload(workload, long)
    spec = SimSpec(
        model="qwen3-8b",
        gpu="rtx-a6000",
        workload=str(workload),
        concurrency=64,
        requests=16,
        output_len=64,
        policies=("chain",),
    )
    r = simulate(spec)
    for row, drafts in ((r.row("ar"), False), (r.row("chain"), True)):
        capacity = _by_hand_qwen3_8b_on_a6000(drafts, 64, 512)
        assert row.kv_capacity_tokens == capacity
        at_once = (capacity // 16) // (24576 // 16)
        assert at_once == (5 if drafts else 7)
        assert row.max_running == at_once
        assert row.kv_peak_tokens <= capacity
        assert row.queue_delay_p99_s > row.queue_delay_p50_s > 0


def test_the_generic_report_shows_slos_and_plots_them(tmp_path: Path) -> None:
    from bastion.sim.experiments import records_of
    from bastion.sim.experiments.reports import summary

    spec = replace(_SMALL, slo_tpot_s=0.004)
    rows, _ = records_of(simulate(spec), {"spec": spec.to_dict()})
    text = summary("generic", rows, tmp_path)
    assert "SLO met %" in text and "goodput req/s" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "slo.png").is_file()
    plain, _ = records_of(simulate(_SMALL), {"spec": _SMALL.to_dict()})
    assert "SLO met %" not in summary("generic", plain, tmp_path / "plain")
    assert "preemptions" not in summary("generic", plain, tmp_path / "plain")


@given(
    tokens=st.lists(st.integers(0, 10**6), min_size=2, max_size=2),
    add=st.integers(0, 300),
    sizes=st.one_of(st.none(), st.lists(st.integers(1, 2000), min_size=2, max_size=2)),
    block=st.sampled_from([1, 2, 7, 16, 64]),
)
def test_one_requests_blocks_are_its_share_of_a_batchs(
    tokens: list[int], add: int, sizes: list[int] | None, block: int
) -> None:
    """blocks_of of one request (counted on Python ints) is its share of a two-request batch's
    count (the compiled or numpy count), whatever the lookahead and the trees."""
    from bastion.sim.memory import KVCache

    kv = KVCache(None)
    kv.block_tokens = block
    t = np.array(tokens, np.int64)
    s = None if sizes is None else np.array(sizes, np.int64)
    alone = [kv.blocks_of(t[i : i + 1], add, None if s is None else s[i : i + 1]) for i in (0, 1)]
    assert sum(alone) == kv.blocks_of(t, add, s)
