"""Batched tree verification and continuous batching on the torch backend.

Invariants: one batched verification pass gives every request exactly what verifying it alone
gives (paths, bonus tokens, the drafter's features, the compacted cache); at T = 0 in fp32 every
request of a batched run is token-for-token ``model.generate(do_sample=False)`` on its prompt
alone, for every policy, with prompts of different lengths, EOS in the middle of the batch and
requests joining and leaving; the adaptive policy takes the joint batch budget at B > 1; the
drafter's batched pass equals its batch-1 pass; the Hugging Face-style entry point returns
``model.generate``'s sequences.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bastion.backends.torch import (  # noqa: E402
    DFlashDrafter,
    TorchVerifier,
    generate_batch,
    speculative_generate,
)
from bastion.backends.torch.timing import AffineCostModel  # noqa: E402
from bastion.batch import StepRequests, TreeBatch  # noqa: E402
from bastion.errors import BastionError  # noqa: E402
from bastion.tree import DraftMarginals, best_first_tree  # noqa: E402
from tests.torch_models import BatchOracleDrafter, greedy_reference, tiny_target  # noqa: E402

POLICIES = [
    "ar",
    "chain",
    "fixed:8",
    "fixed:32",
    "beam:2x4",
    "eagle:3,4,16",
    "bastion:64",
    "bastion:per-request,64",
]
PROMPTS = [[5], [1, 2, 3, 4, 5], [17, 9, 60, 3, 3, 41, 8, 22, 90], [7, 7, 7], [30, 31, 32, 33]]
NEW = 16
COST = AffineCostModel(1e-3, 2e-5, draft_s=5e-4)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny models run fastest on one thread, and do not stall when the CPUs are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def dflash(target: torch.nn.Module) -> DFlashDrafter:
    return DFlashDrafter.random_init(target, num_layers=2, block_size=6, top_k=4, seed=1)


@pytest.fixture(scope="module")
def free_refs(target: torch.nn.Module) -> list[list[int]]:
    return [greedy_reference(target, p, NEW + 8) for p in PROMPTS]


def _random_tree(rng: np.random.Generator, size: int, root: int, vocab: int = 96):
    ids = np.stack([rng.choice(vocab, 4, replace=False) for _ in range(5)])
    probs = np.sort(rng.dirichlet(np.ones(6), 5)[:, :4], axis=1)[:, ::-1]
    return best_first_tree(DraftMarginals(ids, probs), size, root_token=root)


def test_one_batched_pass_equals_verifying_each_request_alone(target) -> None:
    """Same paths, bonus tokens and features as batch-1 verification, over two steps (so the
    second step reads the caches the first one compacted), with a resident request that sits
    the first step out."""
    taps = (1, 3)
    batched = TorchVerifier(target, tap_layer_ids=taps)
    alone = {i: TorchVerifier(target, tap_layer_ids=taps) for i in range(3)}
    roots = {}
    for i, p in enumerate(PROMPTS[:3]):
        first, fb = batched.prefill(i, p)
        first_alone, fb_alone = alone[i].prefill(i, p)
        assert first == first_alone
        torch.testing.assert_close(fb.features, fb_alone.features)
        roots[i] = first
    rng = np.random.default_rng(0)
    for step, (ids, sizes) in enumerate((([2, 0], [9, 17]), ([0, 1, 2], [5, 1, 12]))):
        trees = [_random_tree(rng, n, roots[i]) for i, n in zip(ids, sizes, strict=True)]
        req = StepRequests.of(ids, [batched.context_len(i) for i in ids], [roots[i] for i in ids])
        result = batched.verify_batch(req, TreeBatch.from_trees(trees))
        for j, (i, tree) in enumerate(zip(ids, trees, strict=True)):
            got, want = result.result(j), alone[i].verify(i, tree)
            assert got.accepted_nodes == want.accepted_nodes, (step, i)
            assert got.bonus_token == want.bonus_token
            assert got.feedback.start == want.feedback.start
            torch.testing.assert_close(got.feedback.features, want.feedback.features)
            assert batched.context_len(i) == alone[i].context_len(i)
            roots[i] = got.bonus_token
        assert batched.cache_length() == max(batched.context_len(i) for i in range(3))
    for i in range(3):  # each row holds exactly the request's own cache after compaction
        n = batched.context_len(i)
        r = batched.resident.index(i)
        for mine, theirs in zip(batched._cache.layers, alone[i]._cache.layers, strict=True):
            torch.testing.assert_close(mine.keys[r, :, :n], theirs.keys[0, :, :n])
            torch.testing.assert_close(mine.values[r, :, :n], theirs.values[0, :, :n])
    batched.release(1)
    assert batched.resident == (0, 2)
    assert batched.cache_length() == max(batched.context_len(i) for i in (0, 2))
    with pytest.raises(BastionError, match="out of step"):
        batched.verify_batch(
            StepRequests.of([0], [batched.context_len(0) + 1], [roots[0]]),
            TreeBatch.from_trees([_random_tree(rng, 3, roots[0])]),
        )


def test_drafter_batch_pass_equals_batch_one(target, dflash) -> None:
    verifier = TorchVerifier(target, tap_layer_ids=dflash.cfg.target_layer_ids)
    fbs, firsts = [], []
    for i, p in enumerate(PROMPTS[:3]):
        first, fb = verifier.prefill(i, p)
        firsts.append(first)
        fbs.append(fb)
    dflash.release_all()
    one = [dflash.block_probs(i, firsts[i], fbs[i]) for i in range(3)]
    dflash.release_all()
    batched = dflash.batch_probs([0, 1, 2], firsts, fbs)
    for i in range(3):
        torch.testing.assert_close(batched[i], one[i], rtol=1e-5, atol=1e-6)
    dflash.release_all()


@pytest.mark.parametrize("policy", POLICIES)
def test_batched_runs_match_generate_with_joins_leaves_and_eos(
    target, dflash, free_refs, policy
) -> None:
    """Five prompts of different lengths, three at a time; an EOS id that stops one request
    after a few tokens while the others go on; a random DFlash drafter and an oracle one whose
    trees are accepted deep (non-contiguous KV gathers in the batched cache)."""
    eos = free_refs[1][3]
    refs = [greedy_reference(target, p, NEW, eos=eos) for p in PROMPTS]
    lengths = [len(r) for r in refs]
    assert min(lengths) < NEW == max(lengths), "EOS must stop some requests and not others"
    oracle = BatchOracleDrafter(
        {i: p + r + [0] * 8 for i, (p, r) in enumerate(zip(PROMPTS, free_refs, strict=True))},
        vocab=96,
    )
    for drafter in (dflash, oracle):
        rep = generate_batch(
            target,
            drafter,
            policy,
            PROMPTS,
            batch_size=3,
            max_new_tokens=NEW,
            eos_token_id=eos,
            cost_model=COST,
        )
        assert [r.output_ids for r in rep.records] == refs, (policy, type(drafter).__name__)
        assert 1 < rep.mean_batch <= 3
    if policy != "ar":
        assert max(n for r in rep.records for n in r.committed_per_step) >= 3
    no_eos = generate_batch(
        target,
        oracle,
        policy,
        PROMPTS,
        batch_size=4,
        max_new_tokens=NEW,
        eos_token_id=None,
        cost_model=COST,
    )
    assert [r.output_ids for r in no_eos.records] == [r[:NEW] for r in free_refs]


def test_llama_batched_deep_acceptance(free_refs) -> None:
    target = tiny_target("llama")
    refs = [greedy_reference(target, p, NEW) for p in PROMPTS]
    oracle = BatchOracleDrafter(
        {i: p + r + [0] * 8 for i, (p, r) in enumerate(zip(PROMPTS, refs, strict=True))}, 96
    )
    for policy in ("fixed:16", "bastion:64"):
        rep = generate_batch(
            target,
            oracle,
            policy,
            PROMPTS,
            batch_size=5,
            max_new_tokens=NEW,
            eos_token_id=None,
            cost_model=COST,
        )
        assert [r.output_ids for r in rep.records] == refs
        gathered = [
            t
            for r in rep.records
            for t in r.trees
            if t["accepted_path"] != list(range(len(t["accepted_path"])))
        ]
        assert gathered, "expected accepted paths through non-first branches"


def test_adaptive_policy_takes_the_joint_budget_when_batched(target, dflash, monkeypatch) -> None:
    import bastion.controller

    calls: list[int] = []

    def spying(real):  # type: ignore[no-untyped-def]
        def spy(marginals, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(marginals.size)
            return real(marginals, *args, **kwargs)

        return spy

    # the joint budget: compiled, or its Python loop where the kernel is missing or declines
    for name in ("_choose_joint_compiled", "choose_joint_batch"):
        monkeypatch.setattr(bastion.controller, name, spying(getattr(bastion.controller, name)))
    generate_batch(
        target,
        dflash,
        "bastion:64",
        PROMPTS[:3],
        batch_size=3,
        max_new_tokens=6,
        eos_token_id=None,
        cost_model=COST,
    )
    assert calls and max(calls) == 3
    calls.clear()
    generate_batch(
        target,
        dflash,
        "bastion:64",
        PROMPTS[:2],
        batch_size=1,
        max_new_tokens=6,
        eos_token_id=None,
        cost_model=COST,
    )
    assert calls == []  # batch 1: the per-request controller


def test_report_and_repeats(target, dflash) -> None:
    rep = generate_batch(
        target,
        dflash,
        "fixed:8",
        PROMPTS,
        batch_size=2,
        max_new_tokens=6,
        eos_token_id=None,
        repeats=2,
        warmup=1,
        predict_cycles=COST,
    )
    d = rep.to_dict()
    assert len(d["records"]) == len(PROMPTS) and d["batch_size"] == 2
    for r in d["records"]:
        assert {"output_ids", "committed_per_step", "tpot_s"} <= r.keys()
        assert r["ttft_s"] >= r["prefill_s"] > 0
    assert d["repeats"]["runs"] == 2 and len(d["repeats"]["wall_s"]) == 2
    s = d["repeats"]["tpot_s"]
    assert s["min"] <= s["median"] <= s["max"]
    assert d["throughput_tok_s"] > 0 and d["tokens"] == 6 * len(PROMPTS)
    assert d["cycle"]["predicted_s"] > 0 and d["cycle"]["measured_s"] > 0
    # later requests waited for a slot: their TTFT includes the queue
    assert rep.records[-1].queue_s > rep.records[0].queue_s
    with pytest.raises(BastionError, match="batch_size"):
        generate_batch(target, dflash, "chain", PROMPTS, batch_size=0)
    with pytest.raises(BastionError, match="repeats"):
        generate_batch(target, dflash, "chain", PROMPTS, repeats=0)
    with pytest.raises(BastionError, match="prompt 1 is empty"):
        generate_batch(target, dflash, "chain", [[1], []])


def test_hf_entry_point_returns_generate_sequences(target, dflash, free_refs) -> None:
    """Left-padded batch in, ``model.generate``'s sequences out (EOS rows padded)."""
    pad = 0
    eos = free_refs[2][4]
    prompts = PROMPTS[:4]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    want = target.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    for policy in ("fixed:8", "bastion:64"):
        out = speculative_generate(
            target,
            ids,
            mask,
            drafter=dflash,
            policy=policy,
            max_new_tokens=NEW,
            eos_token_id=eos,
            pad_token_id=pad,
            batch_size=2,
            cost_model=COST,
        )
        assert torch.equal(out.sequences, want)
        assert len(out.records) == 4 and min(out.num_new_tokens) < NEW
    # right padding: same prompts, decoded alone; the output keeps the input row as given
    right = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
    out = speculative_generate(
        target,
        right,
        right != pad,
        drafter=dflash,
        policy="chain",
        max_new_tokens=NEW,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    assert [r.output_ids for r in out.records] == [
        greedy_reference(target, p, NEW, eos=eos) for p in prompts
    ]
    with pytest.raises(BastionError, match="holes"):
        speculative_generate(
            target,
            ids,
            torch.tensor([[1, 0, 1] + [1] * (width - 3)] * 4),
            drafter=dflash,
            policy="chain",
            max_new_tokens=2,
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_greedy_lossless_on_cuda() -> None:
    target = tiny_target("qwen3")
    refs = [greedy_reference(target, p, NEW) for p in PROMPTS]
    target.to("cuda")
    drafter = DFlashDrafter.random_init(target, num_layers=2, block_size=6, top_k=4)
    for policy in ("ar", "chain", "fixed:16", "bastion:64"):
        rep = generate_batch(
            target,
            drafter,
            policy,
            PROMPTS,
            batch_size=3,
            max_new_tokens=NEW,
            eos_token_id=None,
            cost_model=COST,
        )
        assert [r.output_ids for r in rep.records] == refs, policy


def test_the_cycle_report_prices_each_step_as_the_step_it_was() -> None:
    """The report's predicted cycle: a drafted step is priced with its draft pass, a step that
    drafted nothing (a learning controller's AR step) without it, and a step whose controller
    predicted its own cycle counts that prediction."""
    from bastion.backends.torch.reports import _cycle_report
    from bastion.interfaces import StepCost

    class Priced:
        def step_cost(self, tree_size, load):  # type: ignore[no-untyped-def]
            return StepCost(2e-3, 1e-3, 1e-3 * tree_size)

    nan = float("nan")
    tree = ([4], [10], 0.0, 0.0, 0.0, True, nan)  # 2 + 1 + 4 ms
    ar = ([1], [10], 0.0, 0.0, 0.0, False, nan)  # 1 + 1 ms, no draft
    own = ([8], [10], 0.0, 0.0, 0.0, True, 5e-3)  # the controller said 5 ms
    report = _cycle_report(Priced(), [tree, ar, own], True)  # type: ignore[arg-type]
    assert report["predicted_s"] == pytest.approx((7e-3 + 2e-3 + 5e-3) / 3)
    assert report["predicted_draft_s"] == pytest.approx((2e-3 + 0 + 2e-3) / 3)
    assert _cycle_report(Priced(), [ar], False)["predicted_s"] == pytest.approx(2e-3)  # type: ignore[arg-type]
