"""``bastion generate`` end to end, trace recording, the calibration hook, lazy torch import,
and the GPU variant of the greedy check (skipped without CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from bastion.trace import read_trace


def test_import_bastion_and_cli_without_torch() -> None:
    code = (
        "import sys, bastion, bastion.cli, bastion.acceptance, bastion.trace, bastion.backends;"
        "bastion.cli.build_parser(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bastion.backends.torch import DFlashDrafter, generate  # noqa: E402
from bastion.backends.torch.timing import fit_affine_cost_model, verify_timer  # noqa: E402
from bastion.cli import main  # noqa: E402
from bastion.records import shipped_schema  # noqa: E402
from tests.torch_models import greedy_reference, tiny_target  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny_target("llama")
    target.save_pretrained(root / "target")
    DFlashDrafter.random_init(target, num_layers=1, block_size=8).save_pretrained(root / "drafter")
    return target, root / "target", root / "drafter"


@pytest.mark.parametrize("policy", ["chain", "fixed:16", "bastion", "ar"])
def test_generate_json_matches_reference(dirs, policy, capsys, tmp_path) -> None:
    target, tdir, ddir = dirs
    trace = tmp_path / "t.json"
    argv = [
        "generate",
        "--target",
        str(tdir),
        "--drafter",
        str(ddir),
        "--policy",
        policy,
        "--prompt-ids",
        "3,1,4,1,5",
        "--max-new-tokens",
        "10",
        "--json",
        "--record-trace",
        str(trace),
    ]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    jsonschema.validate(document, shipped_schema())
    out = document["records"][0]
    assert out["output_ids"] == greedy_reference(target, [3, 1, 4, 1, 5], 10)
    assert {"committed_per_step", "tpot_s", "stage_times"} <= out.keys()
    tr = read_trace(trace)
    assert list(tr.output_ids) == out["output_ids"]
    if policy == "ar":  # target-only decoding never drafts: nothing to replay
        assert tr.steps == ()
    else:
        assert len(tr.steps) == len(out["committed_per_step"])
        assert tr.steps[0].position == 5
    assert tr.metadata["temperature"] == 0.0


PROMPTS = ["3,1,4,1,5", "2,7", "1,8,2,8,1,8,2,8,4", "9", "6,6,6", "5,3"]


@pytest.mark.parametrize("policy", ["fixed:16", "bastion", "ar"])
def test_generate_batched_json_matches_each_prompt_alone(dirs, policy, capsys, tmp_path) -> None:
    """Six prompts, four at a time: every record is that prompt's HF greedy output."""
    target, tdir, ddir = dirs
    argv = ["generate", "--target", str(tdir), "--drafter", str(ddir), "--policy", policy]
    for ids in PROMPTS:
        argv += ["--prompt-ids", ids]
    traces = [tmp_path / f"t{i}.json" for i in range(len(PROMPTS))]
    for t in traces:
        argv += ["--record-trace", str(t)]
    argv += ["--max-new-tokens", "12", "--batch-size", "4", "--repeats", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, shipped_schema())  # the record vocabulary (bastion.records)
    assert out["policy_spec"] == policy and out["tpot_s"] > 0
    assert len(out["records"]) == len(PROMPTS) and out["batch_size"] == 4
    for ids, rec, trace in zip(PROMPTS, out["records"], traces, strict=True):
        prompt = [int(x) for x in ids.split(",")]
        assert rec["output_ids"] == greedy_reference(target, prompt, 12)
        assert {"committed_per_step", "tpot_s", "ttft_s"} <= set(rec)
        assert list(read_trace(trace).output_ids) == rec["output_ids"]
        assert read_trace(trace).metadata["batch_size"] == 4
    assert out["throughput_tok_s"] > 0 and out["repeats"]["runs"] == 2
    assert out["mean_batch"] > 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be ≥ 1"),
        (["--repeats", "0"], "--repeats must be ≥ 1"),
        (["--warmup", "-1"], "--warmup must be ≥ 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be ≥ 1"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--temperature", "-1"], "--temperature must be ≥ 0"),
        (["--record-trace", "a.json"], "2 prompts"),
        (["--dense-trace"], "--dense-trace needs --record-trace"),
        (["--prompt-ids", "1,x"], "--prompt-ids must be integers"),
    ],
)
def test_generate_flags_are_validated(dirs, flags, message, capsys) -> None:
    _, tdir, ddir = dirs
    argv = ["generate", "--target", str(tdir), "--drafter", str(ddir)]
    argv += ["--prompt-ids", "1,2", "--prompt-ids", "3", "--policy", "chain", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_generate_text_output_and_errors(dirs, capsys, tmp_path) -> None:
    _, tdir, ddir = dirs
    assert (
        main(
            [
                "generate",
                "--target",
                str(tdir),
                "--drafter",
                str(ddir),
                "--policy",
                "chain",
                "--prompt-ids",
                "1 2 3",
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    assert "τ" in capsys.readouterr().out
    trace = tmp_path / "never.json"
    rc = main(
        [
            "generate",
            "--target",
            str(tdir),
            "--drafter",
            str(tmp_path / "missing"),
            "--prompt-ids",
            "1",
            "--record-trace",
            str(trace),
        ]
    )
    assert rc == 2 and not trace.exists()
    assert "not a directory" in capsys.readouterr().err
    rc = main(["generate", "--target", str(tdir), "--policy", "chain", "--prompt-ids", "1"])
    assert rc == 2 and "--drafter" in capsys.readouterr().err
    rc = main(["generate", "--target", str(tdir), "--policy", "ar", "--prompt", "hello"])
    assert rc == 2 and "--prompt-ids" in capsys.readouterr().err
    if not torch.cuda.is_available():
        rc = main(
            [
                "generate",
                "--target",
                str(tdir),
                "--policy",
                "ar",
                "--prompt-ids",
                "1",
                "--device",
                "cuda",
            ]
        )
        assert rc == 2 and "CUDA" in capsys.readouterr().err


def test_verify_timer_hook(dirs) -> None:
    target = dirs[0]
    timer = verify_timer(target, repeats=2)
    assert timer(8, 16) > 0
    model = fit_affine_cost_model(timer, 16, sizes=(1, 8, 32))
    curve = model.cost_curve(8, __import__("bastion.interfaces").interfaces.StepLoad(16))
    assert curve.verify_s.shape == (8,) and (curve.verify_s > 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_greedy_lossless_on_cuda() -> None:
    target = tiny_target("qwen3").to("cuda")
    drafter = DFlashDrafter.random_init(target, num_layers=2, block_size=6, top_k=4)
    prompt = [1, 2, 3, 4, 5]
    ref = greedy_reference(target.cpu(), prompt, 16)
    target.to("cuda")
    for policy in ("ar", "chain", "fixed:16"):
        rep = generate(target, drafter, policy, prompt, max_new_tokens=16, eos_token_id=None)
        assert rep.output_ids == ref


PLUGIN = """
from bastion.interfaces import TreeChoice
from bastion.tree import best_first_tree


class Greedy:
    def __init__(self, size):
        self.size, self.name = size, f"greedy:{size}"

    def choose(self, marginals, context):
        return TreeChoice(best_first_tree(marginals, self.size))
"""


def test_generate_runs_a_plugin_policy_losslessly(dirs, capsys, tmp_path) -> None:
    """A policy defined only in the test's directory, named by file path, decodes exactly."""
    target, tdir, ddir = dirs
    (tmp_path / "mine.py").write_text(PLUGIN)
    argv = ["generate", "--target", str(tdir), "--drafter", str(ddir), "--json"]
    argv += ["--policy", f"{tmp_path / 'mine.py'}:Greedy:12", "--prompt-ids", "3,1,4,1,5"]
    assert main([*argv, "--max-new-tokens", "10"]) == 0
    out = json.loads(capsys.readouterr().out)["records"][0]
    assert out["policy"] == "greedy:12"
    assert out["output_ids"] == greedy_reference(target, [3, 1, 4, 1, 5], 10)
    assert max(out["committed_per_step"]) <= 13  # at most the tree's 12 nodes and the bonus
