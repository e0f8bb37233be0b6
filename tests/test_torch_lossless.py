"""Greedy losslessness of the torch backend: every policy reproduces ``model.generate``.

Invariant: at T = 0, for any drafter and any tree policy, the engine's output is token-for-token
the target's own greedy decoding (EOS included). Tiny random fp32 targets on CPU; the lm_head is
scaled up so argmax near-ties (where a tree pass and a sequential pass could round differently)
do not occur for these seeds.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bastion.backends.torch import DFlashDrafter, generate  # noqa: E402
from bastion.backends.torch.timing import AffineCostModel  # noqa: E402
from tests.torch_models import OracleDrafter, greedy_reference, tiny_target  # noqa: E402

POLICIES = [
    "ar",
    "chain",
    "fixed:8",
    "fixed:32",
    "beam:2x4",
    "eagle:3,4,16",
    "bastion:64",
    "bastion:64,every=3",
]
PROMPTS = [[5], [1, 2, 3, 4, 5], [17, 9, 60, 3, 3, 41, 8, 22, 90]]
COST = AffineCostModel(1e-3, 2e-5, draft_s=5e-4)  # a plain stand-in CostModel for bastion


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def target(request: pytest.FixtureRequest) -> torch.nn.Module:
    return tiny_target(request.param)


@pytest.fixture(scope="module")
def dflash(target: torch.nn.Module) -> DFlashDrafter:
    return DFlashDrafter.random_init(target, num_layers=2, block_size=6, top_k=4, seed=1)


@pytest.mark.parametrize("policy", POLICIES)
def test_dflash_drafter_matches_generate(target, dflash, policy) -> None:
    for prompt, n in zip(PROMPTS, (1, 12, 20), strict=True):
        ref = greedy_reference(target, prompt, n)
        rep = generate(
            target, dflash, policy, prompt, max_new_tokens=n, eos_token_id=None, cost_model=COST
        )
        assert rep.output_ids == ref, (policy, prompt)
        assert rep.output_len == n
        assert sum(rep.committed_per_step) >= n - 1  # the first token comes from prefill


@pytest.mark.parametrize("policy", POLICIES)
def test_deep_acceptance_matches_generate(target, policy) -> None:
    """A drafter that knows the answer: trees are accepted deep, often through rank-1 branches,
    so KV compaction gathers non-contiguous nodes; the output must still be exact."""
    prompt, n = PROMPTS[1], 24
    ref = greedy_reference(target, prompt, n)
    oracle = OracleDrafter(prompt + ref + [0] * 8, vocab=96, depth=6, k=3)
    rep = generate(
        target, oracle, policy, prompt, max_new_tokens=n, eos_token_id=None, cost_model=COST
    )
    assert rep.output_ids == ref
    if policy != "ar":
        assert max(rep.committed_per_step) >= 3
    if policy in ("fixed:32", "bastion:64"):
        gathered = [
            t for t in rep.trees if t["accepted_path"] != list(range(len(t["accepted_path"])))
        ]
        assert gathered, "expected accepted paths through non-first branches"


@pytest.mark.parametrize("policy", ["ar", "chain", "fixed:16", "eagle:3,4,16"])
def test_stops_at_eos_like_generate(target, dflash, policy) -> None:
    prompt = PROMPTS[2]
    free = greedy_reference(target, prompt, 16)
    eos = free[5]
    ref = greedy_reference(target, prompt, 16, eos=eos)
    assert ref[-1] == eos and len(ref) <= 6
    for drafter in (dflash, OracleDrafter(prompt + free + [0] * 8, vocab=96)):
        rep = generate(
            target, drafter, policy, prompt, max_new_tokens=16, eos_token_id=eos, cost_model=COST
        )
        assert rep.output_ids == ref


def test_report_fields(target, dflash) -> None:
    rep = generate(target, dflash, "fixed:8", [1, 2, 3], max_new_tokens=6, eos_token_id=None)
    d = rep.to_dict()
    for key in (
        "output_ids",
        "prompt_len",
        "output_len",
        "ttft_s",
        "tpot_s",
        "committed_per_step",
        "stage_times",
        "trees",
    ):
        assert key in d
    assert set(rep.stage_times) == {"draft", "build", "mask", "verify", "commit"}
    assert all(v >= 0 for v in rep.stage_times.values())
    assert len(rep.trees) == len(rep.committed_per_step)
    assert rep.prompt_len == 3 and rep.tpot_s > 0
