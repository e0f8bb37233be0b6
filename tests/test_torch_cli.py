"""``bastion generate`` end to end, trace recording, the calibration hook, lazy torch import,
and the GPU variant of the greedy check (skipped without CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys

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
    out = json.loads(capsys.readouterr().out)
    assert out["output_ids"] == greedy_reference(target, [3, 1, 4, 1, 5], 10)
    assert {"acceptance_lengths", "time_per_output_token", "stage_times"} <= out.keys()
    tr = read_trace(trace)
    assert list(tr.output_ids) == out["output_ids"]
    if policy == "ar":  # target-only decoding never drafts: nothing to replay
        assert tr.steps == ()
    else:
        assert len(tr.steps) == len(out["acceptance_lengths"])
        assert tr.steps[0].position == 5
    assert tr.metadata["temperature"] == 0.0


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
