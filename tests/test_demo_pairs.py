"""The shipped pairs, ``small`` and ``base``: lossless decoding with each, the ``--pair`` flag,
the base pair's size claims, and the recipes' validation.

At T = 0 every policy's output equals AR's at batch 1 and batched. At T > 0 the first three
tokens after a held-out prompt, sampled through tree verification with the pair's trained
DFlash drafter, follow the target's own sampling distribution (enumerated exactly under a
top-k filter); a verifier that follows the drafter's first child without sampling fails the
same test (the negative control).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
stats = pytest.importorskip("scipy.stats")

from bastion.acceptance import WalkResult  # noqa: E402
from bastion.cli import main  # noqa: E402
from bastion.demo import PAIRS, Pair, get_pair  # noqa: E402
from bastion.errors import ConfigError  # noqa: E402
from bastion.tree import DraftTree  # noqa: E402

INSTALLED = [name for name, pair in PAIRS.items() if (pair.drafter / "config.json").is_file()]
if "small" not in INSTALLED:  # pragma: no cover - a packaging error
    pytest.skip("the demo models are not installed", allow_module_level=True)

from bastion.backends.torch import (  # noqa: E402
    DFlashDrafter,
    SamplingParams,
    TorchVerifier,
    generate_batch,
    load_target,
)
from bastion.backends.torch.sampling import processed_probs  # noqa: E402
from bastion.backends.torch.timing import AffineCostModel  # noqa: E402
from bastion.demo.run import load_prompts, run_demo  # noqa: E402

PARAMS = SamplingParams(temperature=1.0, top_k=6)  # six tokens a step: enumerable
COST = AffineCostModel(2e-3, 2e-5, draft_s=2e-3)


def _pairs() -> list[object]:
    """small in the default run, base (3× the pass time) under CI."""
    marks = {name: [pytest.mark.slow] if name == "base" else [] for name in PAIRS}
    for name in PAIRS:
        if name not in INSTALLED:
            marks[name].append(pytest.mark.skip(reason="not installed"))
    return [pytest.param(name, marks=marks[name]) for name in PAIRS]


@pytest.fixture(scope="module", params=_pairs())
def loaded(request: pytest.FixtureRequest) -> tuple[str, object, object, list[int]]:
    from transformers import AutoTokenizer

    pair = get_pair(request.param)
    target = load_target(pair.target, "cpu")
    drafter = DFlashDrafter.from_pretrained(pair.drafter, target)
    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    prompt = list(tokenizer(load_prompts()[1])["input_ids"])[:40]
    return request.param, target, drafter, prompt


# --- T = 0 -----------------------------------------------------------------------------------


@pytest.mark.slow  # (CI=true or -m slow: the default run stays within 5 minutes)
def test_base_pair_every_policy_equals_ar_at_batch_1_and_2() -> None:
    if "base" not in INSTALLED:
        pytest.skip("the base pair is not installed")
    pair = get_pair("base")
    result = run_demo(
        load_prompts()[:3],
        max_new_tokens=32,
        policies=("ar", "chain", "fixed:32", "beam:4x15", "bastion:paper", "bastion"),
        calibrate=False,
        batch_sizes=(1, 2),
        warmup=0,
        target_dir=pair.target,
        drafter_dir=pair.drafter,
    )
    assert result.identical  # every policy, at batch 1 and 2, equals AR at batch 1
    by = {r.policy: r for r in result.rows if r.batch_size == 1}
    # the drafter is accepted well beyond chance (1.86 on these 3 × 32 tokens; 2.61 on the
    # report's 8 × 96)
    assert by["chain"].tau > 1.5
    assert by["fixed:32"].tau > by["chain"].tau


# --- T > 0 -----------------------------------------------------------------------------------


@torch.no_grad()
def exact_marginals(target: object, prompt: list[int]) -> list[np.ndarray]:
    """P(t1), P(t2), P(t3) of the target's own sampling under PARAMS, by enumerating the
    top-k support (k² sequences for the third token)."""
    vocab = int(target.config.vocab_size)  # type: ignore[attr-defined]

    def dist(seqs: list[list[int]]) -> torch.Tensor:
        logits = target(input_ids=torch.tensor(seqs)).logits[:, -1]  # type: ignore[operator]
        return processed_probs(logits, PARAMS).double()

    p1 = dist([prompt])[0]
    support1 = torch.nonzero(p1).flatten().tolist()
    p2 = torch.zeros(vocab, dtype=torch.float64)
    p3 = torch.zeros(vocab, dtype=torch.float64)
    p2_given = dist([[*prompt, t] for t in support1])
    for i, t1 in enumerate(support1):
        support2 = torch.nonzero(p2_given[i]).flatten().tolist()
        p2 += p1[t1] * p2_given[i]
        p3_given = dist([[*prompt, t1, t2] for t2 in support2])
        for j, t2 in enumerate(support2):
            p3 += p1[t1] * p2_given[i, t2] * p3_given[j]
    return [p1.numpy(), p2.numpy(), p3.numpy()]


class AcceptFirstChildVerifier(TorchVerifier):
    """WRONG on purpose: follows the drafter's first child without sampling."""

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> WalkResult:
        path = [0]
        while len(kids := tree.children(path[-1])):
            path.append(int(kids[0]))
        bonus = self._choose(logits[path[-1]])
        return WalkResult(tuple(path), tuple(int(tree.tokens[n]) for n in path[1:]), bonus)


def sample_tokens(loaded: tuple, policy: str, seeds: int, wrong: bool = False) -> np.ndarray:
    """The first three tokens of 16 copies of the prompt per seed, 8 at a time."""
    _, target, drafter, prompt = loaded
    taps = drafter.cfg.target_layer_ids
    rows, accepted = [], 0
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        cls = AcceptFirstChildVerifier if wrong else TorchVerifier
        rep = generate_batch(
            target,
            drafter,
            policy,
            [prompt] * 16,
            batch_size=8,
            max_new_tokens=3,
            sampling=PARAMS,
            eos_token_id=None,
            verifier=cls(target, tap_layer_ids=taps, sampling=PARAMS, generator=gen),
            cost_model=COST,
        )
        for r in rep.records:
            rows.append(r.output_ids)
            accepted += sum(r.accepted_per_step)
    assert accepted > len(rows) // 4  # the trained drafter's tokens were accepted
    return np.asarray(rows)


def chi_square_p(samples: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit over the support, cells with expected count < 5 pooled."""
    n = samples.size
    observed = np.bincount(samples, minlength=probs.size).astype(float)
    if observed[probs == 0].any():  # a token outside the target's top-k: impossible
        return 0.0
    keep = probs > 0
    observed, expected = observed[keep], probs[keep] * n
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    expected *= observed.sum() / expected.sum()
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("policy", ["fixed:16", pytest.param("bastion:32", marks=pytest.mark.slow)])
def test_pair_samples_the_targets_distribution(loaded: tuple, policy: str) -> None:
    exact = exact_marginals(loaded[1], loaded[3])
    toks = sample_tokens(loaded, policy, seeds=25)  # 400 samples
    for pos in range(3):
        p = chi_square_p(toks[:, pos], exact[pos])
        assert p > 1e-3, (loaded[0], policy, pos, p)


def test_pair_negative_control_fails(loaded: tuple) -> None:
    exact = exact_marginals(loaded[1], loaded[3])
    toks = sample_tokens(loaded, "fixed:16", seeds=12, wrong=True)  # 192 samples
    worst = min(chi_square_p(toks[:, pos], exact[pos]) for pos in (1, 2))
    assert worst < 1e-6, (loaded[0], worst)


# --- the pairs and the flag ------------------------------------------------------------------


def test_base_pair_is_beyond_the_cache_and_small_on_disk() -> None:
    """The base target's weights are ≥ 60 MB in the fp32 it runs in; each pair ships in
    ≤ 50 MB."""
    if "base" not in INSTALLED:
        pytest.skip("the base pair is not installed")
    base = get_pair("base")
    target = load_target(base.target, "cpu")
    assert next(target.parameters()).dtype == torch.float32  # upcast at load
    assert sum(p.numel() * 4 for p in target.parameters()) >= 60e6
    for name in INSTALLED:
        pair = get_pair(name)
        size = sum(f.stat().st_size for d in (pair.target, pair.drafter) for f in d.iterdir())
        assert size <= 50e6, (name, size)
    report = json.loads((base.drafter / "training.json").read_text())
    assert report["data"] == "target"


def test_get_pair_rejects_unknown_names() -> None:
    assert get_pair("small") is PAIRS["small"]
    for bad in ("tiny", "", None, 3):
        with pytest.raises(ConfigError, match="unknown demo pair"):
            get_pair(bad)  # type: ignore[arg-type]


def test_a_missing_pair_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import bastion.demo as demo

    missing = Pair("base", tmp_path / "t", tmp_path / "d")
    with pytest.raises(ConfigError, match="not installed"):
        missing.require_installed()
    monkeypatch.setitem(demo.PAIRS, "base", missing)
    assert main(["demo", "--pair", "base", "--no-calibration", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bastion train target --pair base" in err


def test_demo_pair_flag_picks_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    import bastion.demo.run as run

    seen: list[tuple[Path, Path]] = []

    def fake(prompts, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((kwargs["target_dir"], kwargs["drafter_dir"]))
        raise ConfigError("stop here")

    monkeypatch.setattr(run, "run_demo", fake)
    for argv, name in ((["--pair", "small"], "small"), ([], "base")):
        if name not in INSTALLED:
            continue
        assert main(["demo", "--no-calibration", *argv]) == 2
        assert seen[-1] == (PAIRS[name].target, PAIRS[name].drafter)


# --- the recipes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("precision", "fp16", "precision"),
        ("save_dtype", "int8", "save_dtype"),
        ("data", "web", "data"),
        ("prompt_len", 0, "prompt_len"),
        ("prompt_len", 10_000, "prompt_len"),
        ("sequences", 0, "sequences"),
        ("gen_batch", 0, "gen_batch"),
        ("sampled_share", 1.5, "sampled_share"),
    ],
)
def test_drafter_recipe_is_validated_before_any_work(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    from bastion.demo.train import DRAFTER_PRESETS, train_drafter

    cfg = replace(DRAFTER_PRESETS["base"], **{field: value})
    with pytest.raises(ConfigError, match=message):
        train_drafter(tmp_path / "no-target", tmp_path / "out", cfg)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("field", "value"), [("precision", "half"), ("save_dtype", "fp8")])
def test_target_recipe_is_validated_before_any_work(tmp_path: Path, field: str, value: str) -> None:
    from bastion.demo.train import TARGET_PRESETS, train_target

    with pytest.raises(ConfigError, match=field):
        train_target(tmp_path / "out", replace(TARGET_PRESETS["base"], **{field: value}))
    assert not (tmp_path / "out").exists()


def test_target_continuations_are_the_targets_greedy_decode() -> None:
    """The KV-cached generation equals recomputing the whole sequence at every token; the
    sampled share differs from greedy."""
    from bastion.demo.train import target_continuations
    from tests.torch_models import greedy_reference, tiny_target

    model = tiny_target("qwen3", vocab=50, layers=2, seed=1)
    stream = np.random.default_rng(0).integers(1, 50, size=400)  # no 0: the reference pads with 0
    seqs = target_continuations(model, stream, 6, prompt_len=8, seq_len=20, batch=4, seed=2)
    assert seqs.shape == (6, 20)
    for row in seqs.tolist():
        assert greedy_reference(model, row[:8], 12, eos=None) == row[8:]
    mixed = target_continuations(
        model, stream, 6, prompt_len=8, seq_len=20, sampled_share=0.5, batch=4, seed=2
    )
    assert torch.equal(mixed[:3], seqs[:3])  # the same windows, greedy
    assert torch.equal(mixed[:, :8], seqs[:, :8])
    assert not torch.equal(mixed[3:, 8:], seqs[3:, 8:])  # drawn at T = 1
