"""The shipped trained pair: `bastion demo`, losslessness, and trace-replay agreement.

Uses the weights in bastion/demo/models (trained by `bastion train`, not by the tests).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bastion.cli import main  # noqa: E402
from bastion.cost.hardware import get_profile  # noqa: E402
from bastion.cost.models import DrafterSpec, ModelSpec  # noqa: E402
from bastion.demo import DRAFTER_DIR, TARGET_DIR  # noqa: E402
from bastion.demo.run import DEMO_DTYPES, load_prompts, run_demo  # noqa: E402
from bastion.errors import ConfigError  # noqa: E402
from bastion.policies import make_policy  # noqa: E402
from bastion.records import shipped_schema  # noqa: E402
from bastion.sim.gpu import SimulatedGPU  # noqa: E402
from bastion.sim.replay import trace_source  # noqa: E402
from bastion.sim.serving import serve  # noqa: E402

if not (TARGET_DIR / "config.json").exists():  # pragma: no cover - a packaging error
    pytest.skip("the demo models are not installed", allow_module_level=True)

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    traces = tmp_path_factory.mktemp("traces")
    result = run_demo(
        load_prompts()[:3],
        max_new_tokens=NEW_TOKENS,
        policies=("ar", "chain", "fixed:32", "beam:4x15"),
        calibrate=False,
        record_dir=traces,
        batch_sizes=(1, 2),
        warmup=0,
    )
    return result, traces


def test_every_policy_reproduces_ar_and_the_trained_drafter_is_accepted(demo) -> None:  # type: ignore[no-untyped-def]
    result, _ = demo
    assert result.identical  # every policy, at batch 1 and batched, equals AR at batch 1
    assert set(result.batched_outputs) == {1, 2}
    by = {r.policy: r for r in result.rows if r.batch_size == 1}
    assert by["ar"].tau == 1.0
    assert by["chain"].tau > 1.3, "a trained drafter must be accepted well beyond chance"
    assert by["fixed:32"].tau > by["chain"].tau


def test_an_untrained_drafter_is_not_accepted(tmp_path: Path) -> None:
    """Negative control for the acceptance check above: same shapes, random weights."""
    from bastion.backends.torch import DFlashDrafter, load_target

    target = load_target(TARGET_DIR, "cpu")
    trained = DFlashDrafter.from_pretrained(DRAFTER_DIR, target)
    DFlashDrafter.random_init(
        target,
        num_layers=trained.cfg.num_hidden_layers,
        target_layer_ids=tuple(trained.cfg.target_layer_ids),
        mask_token_id=trained.cfg.mask_token_id,
    ).save_pretrained(tmp_path / "random")
    result = run_demo(
        load_prompts()[:3],
        max_new_tokens=NEW_TOKENS,
        policies=("ar", "chain"),
        calibrate=False,
        drafter_dir=tmp_path / "random",
        warmup=0,
    )
    assert result.identical
    assert result.rows[1].tau < 1.1


def replay(trace_dir: Path, recorded: str, policy: str, n: int) -> list[list[int]]:
    """Per-request committed lengths when the simulator replays ``recorded``'s traces."""
    spec = ModelSpec.from_hf_config(TARGET_DIR / "config.json", name="demo")
    gpu = SimulatedGPU(get_profile("h100-sxm"), spec, DrafterSpec.dflash_for(spec, layers=2))
    files = sorted(trace_dir.glob(f"{recorded.replace(':', '-')}-*.json"))
    committed = []
    for f in files:
        result = serve(make_policy(policy), gpu, trace_source(f), 1)
        committed.append(result.requests[0].committed)
    assert len(committed) == n
    return committed


@pytest.mark.parametrize("policy", ["chain", "fixed:32"])
def test_replay_of_the_recorded_policy_is_exact(demo, policy: str) -> None:  # type: ignore[no-untyped-def]
    """At T = 0 the simulator's per-step acceptance equals the real run's (DESIGN decision 2),
    the last step included: both count only the tokens a request receives."""
    result, traces = demo
    real = result.acceptance[policy]
    sim = replay(traces, policy, policy, len(real))
    assert sim == real


def test_short_outputs_count_the_same_on_both_backends(tmp_path: Path) -> None:
    """With 5 new tokens a 32-node tree of the trained drafter often accepts more than is still
    wanted. The real backend and the simulator replaying its traces then cut the step alike: per
    step the same counts, which sum to the tokens after the first, and the same τ."""
    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter, generate_batch, load_target

    target = load_target(TARGET_DIR, "cpu")
    drafter = DFlashDrafter.from_pretrained(DRAFTER_DIR, target)
    tokenizer = AutoTokenizer.from_pretrained(TARGET_DIR)
    prompts = [list(tokenizer(t)["input_ids"])[:40] for t in load_prompts()[:4]]
    paths = [tmp_path / f"t{i}.json" for i in range(len(prompts))]
    rep = generate_batch(
        target,
        drafter,
        "fixed:32",
        prompts,
        max_new_tokens=5,
        eos_token_id=None,
        record_traces=paths,
        batch_size=2,
    )
    real = [r.committed_per_step for r in rep.records]
    for r in rep.records:
        assert r.output_len == 5 and sum(r.committed_per_step) == 4
        assert all(
            0 <= a <= c for a, c in zip(r.accepted_per_step, r.committed_per_step, strict=True)
        )
    spec = ModelSpec.from_hf_config(TARGET_DIR / "config.json", name="demo")
    gpu = SimulatedGPU(get_profile("h100-sxm"), spec, DrafterSpec.dflash_for(spec, layers=2))
    served = [serve(make_policy("fixed:32"), gpu, trace_source(p), 1).requests[0] for p in paths]
    assert [q.committed for q in served] == real
    assert [q.accepted for q in served] == [r.accepted_per_step for r in rep.records]
    assert np.mean([q.tau for q in served]) == pytest.approx(np.mean([r.tau for r in rep.records]))
    # the cut is exercised: some step committed (accepted path, root as the bonus's place)
    # more tokens than its request received
    assert any(
        len(t["accepted_path"]) > c
        for r in rep.records
        for t, c in zip(r.trees, r.committed_per_step, strict=True)
    )


@pytest.mark.parametrize(("recorded", "other"), [("chain", "fixed:32"), ("fixed:32", "beam:4x15")])
def test_replay_of_other_policies_agrees_in_mean_tau(demo, recorded: str, other: str) -> None:  # type: ignore[no-untyped-def]
    """A dense trace replays another policy: mean τ within 1 % of that policy's real run."""
    result, traces = demo
    real = result.acceptance[other]
    sim = replay(traces, recorded, other, len(real))
    real_tau = np.mean([np.mean(r[:-1]) for r in real])
    sim_tau = np.mean([np.mean(s[:-1]) for s in sim])
    assert abs(sim_tau - real_tau) <= 0.01 * real_tau


def test_demo_pair_batched_equals_generate_alone() -> None:
    """Five held-out prompts, three at a time (joins, leaves, EOS where the model stops):
    every request equals ``model.generate(do_sample=False)`` on its prompt alone."""
    from transformers import AutoTokenizer

    from bastion.backends.torch import DFlashDrafter, generate_batch, load_target
    from bastion.backends.torch.timing import AffineCostModel
    from tests.torch_models import greedy_reference

    target = load_target(TARGET_DIR, "cpu")
    tokenizer = AutoTokenizer.from_pretrained(TARGET_DIR)
    drafter = DFlashDrafter.from_pretrained(DRAFTER_DIR, target)
    prompts = [
        list(tokenizer(t)["input_ids"])[: 40 + 9 * i] for i, t in enumerate(load_prompts()[:5])
    ]
    eos = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    refs = [greedy_reference(target, p, 32, eos=eos) for p in prompts]
    cost = AffineCostModel(2e-3, 2e-5, draft_s=2e-3)
    for policy in ("fixed:16", "bastion:paper", "bastion"):
        rep = generate_batch(
            target,
            drafter,
            policy,
            prompts,
            batch_size=3,
            max_new_tokens=32,
            eos_token_id=eos,
            cost_model=cost,
        )
        assert [r.output_ids for r in rep.records] == refs, policy
        if policy != "bastion":  # the learning one may decode by AR where AR is faster
            assert rep.tau > 1.3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be ≥ 1"),
        (["--batch-size", "1,x"], "--batch-size takes integers"),
        (["--repeats", "0"], "--repeats must be ≥ 1"),
        (["--warmup", "-2"], "--warmup must be ≥ 0"),
        (["--num-prompts", "99"], "--num-prompts must be ≤"),
        (["--policy", "fixed:zero"], "bad policy spec"),
    ],
)
def test_demo_flags_are_validated(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--no-calibration", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_demo_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "demo",
            "--max-new-tokens",
            "16",
            "--no-calibration",
            "--policy",
            "chain,fixed:16",
            "--batch-size",
            "1,2",
            "--num-prompts",
            "2",
            "--repeats",
            "2",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, shipped_schema())  # the record vocabulary (bastion.records)
    assert code == 0 and out["identical"] is True
    assert [(p["policy"], p["batch_size"]) for p in out["records"]] == [
        (name, b) for b in (1, 2) for name in ("ar", "chain", "fixed:16")
    ]
    for p in out["records"]:
        assert {"policy", "tau", "mean_tree_size", "tpot_s", "throughput_tok_s"} <= set(p)
        assert p["tpot_min_s"] <= p["tpot_s"] <= p["tpot_max_s"]
        assert p["policy_spec"] == p["policy"] and p["ttft_p50_s"] > 0
        drafted = p["policy"] != "ar"
        assert (p["acceptance_rate"] is not None) == drafted
        assert bool(p["acceptance_by_position"]) == drafted


def test_demo_dtype_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--dtype runs the pair in that precision (bf16: the demo reports, and does not fail on,
    a difference from AR, which is the precision's); an unknown one is refused at once."""
    with pytest.raises(SystemExit):
        main(["demo", "--no-calibration", "--dtype", "float16"])
    assert "--dtype" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="dtype must be one of float32, bfloat16"):
        run_demo(["x = 1"], 2, ("ar",), calibrate=False, dtype="float16")
    flags = ["--max-new-tokens", "4", "--no-calibration", "--policy", "chain", "--num-prompts"]
    assert main(["demo", *flags, "1", "--dtype", "bfloat16", "--pair", "small"]) == 0
    out = capsys.readouterr().out
    assert "in bfloat16" in out and "outputs of all policies vs AR:" in out
    parser_choices = next(
        a.choices for a in _demo_parser()._actions if "--dtype" in a.option_strings
    )
    assert tuple(parser_choices) == DEMO_DTYPES


def _demo_parser() -> argparse.ArgumentParser:
    from bastion.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["demo"]


def test_shipped_drafter_matches_the_format(tmp_path: Path) -> None:
    """The shipped drafter is a DFlash checkpoint: config + safetensors with the format's keys."""
    cfg = json.loads((DRAFTER_DIR / "config.json").read_text())
    assert cfg["block_size"] == 16 and "dflash_config" in cfg
    assert (DRAFTER_DIR / "model.safetensors").exists()


def test_demo_times_the_policies_in_lockstep(monkeypatch: pytest.MonkeyPatch) -> None:
    """All policies of a batch size decode in one lockstep call (warm-ups and repeats passed
    on, each policy its own drafter), and a row's TPOT is the median of its runs' TPOTs, all
    of which it lists."""
    import bastion.backends.torch.lockstep as lockstep

    calls: list[tuple[list[str], int, int, int]] = []
    real = lockstep.generate_lockstep

    def spy(target, contenders, prompts, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(
            (
                [c.policy for c in contenders],
                kwargs["batch_size"],
                kwargs["repeats"],
                kwargs["warmup"],
            )
        )
        drafters = [id(c.drafter) for c in contenders if c.drafter is not None]
        assert len(set(drafters)) == len(drafters) == len(contenders) - 1  # all but AR's
        return real(target, contenders, prompts, **kwargs)

    monkeypatch.setattr(lockstep, "generate_lockstep", spy)
    policies = ("ar", "chain", "fixed:16")
    result = run_demo(
        load_prompts()[:2], 6, policies, calibrate=False, repeats=3, warmup=1, batch_sizes=(1, 2)
    )
    assert calls == [(list(policies), 1, 3, 1), (list(policies), 2, 3, 1)]
    assert result.identical
    for row in result.rows:
        assert len(row.tpot_runs_s) == 3
        assert row.tpot_s == sorted(row.tpot_runs_s)[1]
        assert row.tpot_min_s == min(row.tpot_runs_s) and row.tpot_max_s == max(row.tpot_runs_s)
