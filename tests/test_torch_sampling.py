"""Losslessness at T > 0: sample-and-match reproduces the target's sampling distribution.

Invariant: over many seeded runs, the first generated tokens after a fixed prompt are distributed
as the target's own processed distribution (the 2nd and 3rd tokens pass through tree
verification). A chi-square test passes for the real verifier under several tree policies, at
batch 1 and batched (several requests per verification pass, joining and leaving), and fails for
a deliberately wrong verifier (it accepts the drafter's first child without sampling), batched
or not. Seeded runs repeat exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
stats = pytest.importorskip("scipy.stats")

from bastion.acceptance import WalkResult  # noqa: E402
from bastion.backends.torch import (  # noqa: E402
    SamplingParams,
    TorchVerifier,
    generate,
    generate_batch,
)
from bastion.backends.torch.sampling import processed_probs  # noqa: E402
from bastion.backends.torch.timing import AffineCostModel  # noqa: E402
from bastion.interfaces import DraftContext  # noqa: E402
from bastion.tree import DraftMarginals, DraftTree  # noqa: E402
from tests.torch_models import tiny_target  # noqa: E402

VOCAB = 12
PROMPT = [3, 7, 1]
PARAMS = SamplingParams(temperature=1.5)
COST = AffineCostModel(1e-3, 2e-5, draft_s=5e-4)  # for the adaptive policy


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("qwen3", vocab=VOCAB, layers=2, seed=3)


@torch.no_grad()
def exact_marginals(model: torch.nn.Module, params: SamplingParams) -> tuple[np.ndarray, ...]:
    """P(t1), P(t2), P(t3) of the target's own sampling, by enumeration (plain softmax)."""

    def dist(seqs: torch.Tensor) -> torch.Tensor:
        return processed_probs(model(input_ids=seqs).logits[:, -1], params).double()

    base = torch.tensor([PROMPT])
    p1 = dist(base)[0]  # [V]
    s2 = torch.cat([base.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], 1)
    p2_given = dist(s2)  # [V(t1), V(t2)]
    s3 = torch.cat([s2.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(VOCAB)[:, None]], 1)
    p3_given = dist(s3).view(VOCAB, VOCAB, VOCAB)
    joint12 = p1[:, None] * p2_given
    p3 = (joint12[:, :, None] * p3_given).sum((0, 1))
    return p1.numpy(), joint12.sum(0).numpy(), p3.numpy()


class TopTokensDrafter:
    """Proposes the target's most likely tokens (a good drafter: trees get accepted)."""

    def __init__(self, model: torch.nn.Module, depth: int = 3, k: int = 4) -> None:
        self.model, self.depth, self.k = model, depth, k
        self.memo: dict[tuple[int, ...], DraftMarginals] = {}

    def draft(self, context: DraftContext) -> DraftMarginals:
        if context.committed not in self.memo:
            self.memo[context.committed] = self._draft(list(context.committed))
        return self.memo[context.committed]

    @torch.no_grad()
    def _draft(self, seq: list[int]) -> DraftMarginals:
        ids, probs = [], []
        for _ in range(self.depth):
            p = processed_probs(self.model(input_ids=torch.tensor([seq])).logits[0, -1], PARAMS)
            top = torch.topk(p, self.k)
            ids.append(top.indices.tolist())
            probs.append(top.values.double().tolist())
            seq.append(int(top.indices[0]))
        return DraftMarginals(ids, probs)


class AcceptFirstChildVerifier(TorchVerifier):
    """WRONG on purpose: follows the first child without sampling (the negative control)."""

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> WalkResult:
        path = [0]
        while len(kids := tree.children(path[-1])):
            path.append(int(kids[0]))
        bonus = self._choose(logits[path[-1]])
        return WalkResult(tuple(path), tuple(int(tree.tokens[n]) for n in path[1:]), bonus)


_DRAFTERS: dict[int, TopTokensDrafter] = {}


def sample_tokens(model, policy: str, runs: int, wrong: bool = False, batch: int = 1) -> np.ndarray:
    """``runs`` samples of the first three tokens. With ``batch`` > 1 each seeded run decodes
    2·batch copies of the prompt, ``batch`` at a time (joins and leaves included), all drawing
    from one generator in step order; every copy is one sample."""
    drafter = _DRAFTERS.setdefault(id(model), TopTokensDrafter(model))
    copies = 1 if batch == 1 else 2 * batch
    out = np.zeros((runs, 3), dtype=np.int64)
    accepted = []
    for seed in range(runs // copies):
        gen = torch.Generator().manual_seed(seed)
        cls = AcceptFirstChildVerifier if wrong else TorchVerifier
        ver = cls(model, sampling=PARAMS, generator=gen)
        rep = generate_batch(
            model,
            drafter,
            policy,
            [PROMPT] * copies,
            batch_size=batch,
            max_new_tokens=3,
            sampling=PARAMS,
            eos_token_id=None,
            verifier=ver,
            cost_model=COST,
        )
        for i, r in enumerate(rep.records):
            out[seed * copies + i] = r.output_ids
            accepted.append(sum(r.accepted_per_step))  # draft tokens delivered
    assert sum(accepted) > runs // 4  # draft tokens were accepted, not only bonus tokens
    return out


def chi_square_p(samples: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit, cells with expected count < 5 pooled."""
    n = samples.size
    observed = np.bincount(samples, minlength=probs.size).astype(float)
    expected = probs * n
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    expected *= observed.sum() / expected.sum()
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize(
    ("policy", "batch"),
    [
        ("chain", 1),
        ("fixed:10", 1),
        ("fixed:10", 4),
        ("bastion:paper,32", 4),
        ("bastion:32", 4),  # the learning controller, decisions repeated between (every=8)
    ],
)
def test_sampling_matches_target_distribution(target, policy, batch) -> None:
    exact = exact_marginals(target, PARAMS)
    toks = sample_tokens(target, policy, runs=600, batch=batch)
    for pos in range(3):
        p = chi_square_p(toks[:, pos], exact[pos])
        assert p > 1e-3, (policy, batch, pos, p)


@pytest.mark.parametrize("batch", [1, 4])
def test_negative_control_fails(target, batch) -> None:
    exact = exact_marginals(target, PARAMS)
    toks = sample_tokens(target, "fixed:10", runs=304, wrong=True, batch=batch)
    worst = min(chi_square_p(toks[:, pos], exact[pos]) for pos in (1, 2))
    assert worst < 1e-6, worst


def test_seeded_runs_repeat_and_seeds_differ(target) -> None:
    drafter = TopTokensDrafter(target)

    def run(seed: int) -> list[int]:
        return generate(
            target,
            drafter,
            "fixed:10",
            PROMPT,
            max_new_tokens=12,
            sampling=PARAMS,
            seed=seed,
            eos_token_id=None,
        ).output_ids

    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(4)}) > 1


def test_processed_probs_matches_transformers_warpers() -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=gen) * 3
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
    x = logits.clone()
    for w in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)):
        x = w(None, x)
    torch.testing.assert_close(processed_probs(logits, params), torch.softmax(x, -1))
