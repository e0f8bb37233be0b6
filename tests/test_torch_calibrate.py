"""Calibration on the real device: `bastion calibrate --target DIR --device cpu`, and its use."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bastion.backends.torch import DFlashDrafter, generate, load_target  # noqa: E402
from bastion.backends.torch.calibrate import cached_cost_model  # noqa: E402
from bastion.cli import main  # noqa: E402
from bastion.cost.calibration import CACHE_DIR_ENV, CalibrationCache  # noqa: E402
from bastion.errors import BastionError  # noqa: E402
from tests.torch_models import tiny_target  # noqa: E402

GRID = ["--tokens", "1,4,16,32", "--contexts", "8,32", "--repeats", "1"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("calib")
    target = tiny_target("qwen3")
    target.save_pretrained(root / "target")
    DFlashDrafter.random_init(target, num_layers=1, block_size=8).save_pretrained(root / "drafter")
    return root / "target", root / "drafter"


def test_calibrate_target_on_cpu_writes_and_reuses_a_record(
    model_dirs: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tdir, _ = model_dirs
    argv = ["calibrate", "--target", str(tdir), "--device", "cpu", "--cache-dir", str(tmp_path)]
    assert main([*argv, *GRID, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    from bastion.backends.torch.cpu_linear import kernel_available

    # the CLI loads the target with linears="auto": streamed where the kernel runs
    backend = "torch-cpu-stream" if kernel_available() else "torch-cpu"
    assert record["backend"] == backend and len(record["points"]) == 8
    assert record["rmse_calibrated_s"] <= record["rmse_bare_s"]
    path = Path(record["path"])
    stamp = path.stat().st_mtime_ns
    assert main([*argv, *GRID]) == 0  # cached: no new sweep, the file is untouched
    assert path.stat().st_mtime_ns == stamp
    # the probed CPU profile is kept, under a name keyed by this machine
    assert len(list(tmp_path.glob("this-machine-*.toml"))) == 1
    # what this process measured is not announced as a reuse; in a later process it is
    assert "reusing" not in capsys.readouterr().err
    from bastion.cost import notices

    monkeypatch.setattr(notices, "_MEASURED_HERE", set())
    assert main([*argv, *GRID]) == 0
    assert path.stat().st_mtime_ns == stamp
    assert "reusing the calibration record" in capsys.readouterr().err
    model = cached_cost_model(load_target(tdir, "cpu"), cache=CalibrationCache(tmp_path))
    assert model is not None and model.mode == "static"


def test_generate_uses_the_cached_record(
    model_dirs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tdir, ddir = model_dirs
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    target = load_target(tdir, "cpu")
    drafter = DFlashDrafter.from_pretrained(ddir, target)
    with caplog.at_level(logging.INFO):
        generate(target, drafter, "bastion", [1, 2, 3], max_new_tokens=4)
    assert "no calibration record" in caplog.text
    assert main(["calibrate", "--target", str(tdir), "--cache-dir", str(tmp_path), *GRID]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO):
        generate(target, drafter, "bastion", [1, 2, 3], max_new_tokens=4)
    assert "calibrated roofline from the cached record" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_calibrate_on_absent_cuda_is_a_clear_error(
    model_dirs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tdir, _ = model_dirs
    argv = ["calibrate", "--target", str(tdir), "--device", "cuda", "--cache-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "cuda" in capsys.readouterr().err.lower()


def test_calibrate_needs_a_model_or_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--gpu", "h100-sxm"]) == 2
    assert "--target" in capsys.readouterr().err


def test_drafter_timing_is_fitted_cached_and_priced(
    model_dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    """T_draft(B, ΣC) from timed batched drafter passes: cached atomically, reused, and added to
    Ĉ by the wrapper (both the per-request curve and the joint budget's curve)."""
    from bastion.backends.torch.calibrate import cached_drafter_timing, calibrate_drafter
    from bastion.backends.torch.timing import (
        AffineCostModel,
        DraftTimedCostModel,
        DraftTiming,
        with_draft_timing,
    )
    from bastion.interfaces import RequestLoad, StepLoad

    tdir, ddir = model_dirs
    target = load_target(tdir, "cpu")
    drafter = DFlashDrafter.from_pretrained(ddir, target)
    store = CalibrationCache(tmp_path)
    assert cached_drafter_timing(target, drafter, store) is None
    timing = calibrate_drafter(target, drafter, store, batch_sizes=(1, 2), contexts=(8, 32))
    assert len(timing.points) == 4 and timing.seconds(1, 8) > 0
    [path] = tmp_path.glob("drafter__*.json")
    stamp = path.stat().st_mtime_ns
    assert calibrate_drafter(target, drafter, store) == timing  # cached: no new sweep
    assert path.stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind
    assert drafter.context_len(-1) == 0  # the timing requests were released

    inner = AffineCostModel(1e-3, 1e-5)
    cm = with_draft_timing(inner, timing)
    load = StepLoad(40, (RequestLoad(5, 20),))
    curve = cm.cost_curve(8, load)
    assert curve.draft_s == pytest.approx(timing.seconds(2, 60))
    assert (curve.verify_s == inner.cost_curve(8, load).verify_s).all()
    joint = cm.joint_cost_curve(np.array([40, 20]), np.array([0, 1, 0]))  # type: ignore[attr-defined]
    assert joint.draft_s == pytest.approx(timing.seconds(2, 60))
    assert cm.step_cost(3, load).draft_s == pytest.approx(timing.seconds(2, 60))

    class NoJoint:  # a CostModel without joint_cost_curve stays without one
        def step_cost(self, n, load):  # type: ignore[no-untyped-def]
            return inner.step_cost(n, load)

        def cost_curve(self, n, load):  # type: ignore[no-untyped-def]
            return inner.cost_curve(n, load)

        def observe(self, n, load, s):  # type: ignore[no-untyped-def]
            return None

    plain = with_draft_timing(NoJoint(), timing)
    assert type(plain) is DraftTimedCostModel and not hasattr(plain, "joint_cost_curve")
    with pytest.raises(BastionError, match="coefficients"):
        DraftTiming(-1.0, 0.0, 0.0)


def test_generate_prices_the_drafter_and_reports_the_cycle(
    model_dirs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from bastion.backends.torch import generate_batch

    tdir, ddir = model_dirs
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    target = load_target(tdir, "cpu")
    drafter = DFlashDrafter.from_pretrained(ddir, target)
    with caplog.at_level(logging.INFO):
        rep = generate_batch(
            target, drafter, "bastion:paper", [[1, 2, 3], [4, 5]], batch_size=2, max_new_tokens=6
        )
    assert "T_draft from the drafter's timing" in caplog.text
    assert list(tmp_path.glob("drafter__*.json"))
    c = rep.cycle
    assert c["predicted_draft_s"] > 0 and c["measured_draft_s"] > 0
    assert c["predicted_s"] >= c["predicted_draft_s"] + c["predicted_verify_s"] - 1e-12


def test_learning_controller_startup_times_the_lattice_on_the_device(
    model_dirs: tuple[Path, Path],
) -> None:
    """Start-up timing fills every lattice cell up to n_max, and the AR and chain cells, with
    the ratio of real passes to the prior; the result still decodes exactly as AR."""
    from bastion.backends.torch import generate_batch
    from bastion.backends.torch.calibrate import calibrate_cycles_on_device
    from bastion.backends.torch.timing import AffineCostModel
    from bastion.learned import LearnedCostModel, lattice_index, token_lattice
    from tests.torch_models import greedy_reference

    tdir, ddir = model_dirs
    target = load_target(tdir, "cpu")
    drafter = DFlashDrafter.from_pretrained(ddir, target)
    learner = LearnedCostModel(AffineCostModel(1e-3, 1e-5, draft_s=1e-3))
    done = calibrate_cycles_on_device(learner, target, drafter, n_max=32, context_len=16)
    sizes = token_lattice(32)
    assert done["cells"] == sizes.size + 2 and done["passes"] == 2 * done["cells"]
    assert done["device_s"] > 0
    counts = learner.table.count("tree", 1)
    assert np.all(counts[lattice_index(sizes)] == 2)
    assert learner.table.count("ar", 1)[0] == 2 and learner.table.count("chain", 1)[0] == 2
    assert np.all(np.isfinite(learner.table.ratios("tree", 1)[lattice_index(sizes)]))
    prompt = [3, 1, 4, 1, 5]
    from bastion.controller import LearningPolicy

    predicted: list[float] = []
    choose = LearningPolicy.choose_batch

    def spy(self, marginals, context):  # type: ignore[no-untyped-def]
        choice = choose(self, marginals, context)
        predicted.append(choice.diagnostics.predicted_cycle_s)
        return choice

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LearningPolicy, "choose_batch", spy)
        report = generate_batch(
            target, drafter, "bastion", [prompt], max_new_tokens=12, cost_model=learner
        )
    assert list(report.records[0].output_ids) == greedy_reference(target, prompt, 12)
    # the report's predicted cycle is the controller's own, step by step
    assert len(predicted) == report.steps
    assert report.cycle["predicted_s"] == pytest.approx(float(np.mean(predicted)), rel=1e-12)
