"""What ``bastion simulate`` can be told about a real pair: its drafter's config.

The demo pair (``bastion/demo/models``) stands for a user's own: a small Qwen3 target and a
2-layer DFlash drafter, which the simulator must price as 2 layers, not the published 5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bastion.cost.models import DrafterSpec, get_model
from bastion.demo import DRAFTER_DIR, TARGET_DIR
from bastion.errors import ConfigError
from bastion.sim.simulate import SimSpec, simulate

TARGET = str(TARGET_DIR)
DRAFTER = str(DRAFTER_DIR)


def _drafter_cfg() -> dict[str, Any]:
    data = json.loads((DRAFTER_DIR / "config.json").read_text())
    assert isinstance(data, dict)
    return data


def _write(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


# --- the drafter's config ----------------------------------------------------------------------


def test_the_demo_drafter_is_read_as_two_layers() -> None:
    target = get_model(TARGET)
    d = DrafterSpec.from_dflash_config(DRAFTER, target=target)
    assert (d.model.layers, d.block_size, d.taps) == (2, 16, 2)
    assert (d.model.hidden, d.model.vocab) == (target.hidden, target.vocab)
    assert DrafterSpec.from_dflash_config(DRAFTER_DIR / "config.json") == d  # file or directory
    assert SimSpec(model=TARGET, drafter_config=DRAFTER).drafter() == d
    assert SimSpec(model=TARGET).drafter() == DrafterSpec.dflash_for(target)  # the default: 5


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("block_size", "missing block_size"),
        ("dflash_config", "missing mask_token_id, target_layer_ids or num_target_layers"),
        ("hidden_size", "hidden_size"),
    ],
)
def test_a_non_dflash_config_names_the_file_and_what_is_missing(
    tmp_path: Path, drop: str, named: str
) -> None:
    cfg = {k: v for k, v in _drafter_cfg().items() if k != drop}
    cfg.pop("num_target_layers", None)
    path = _write(tmp_path, cfg)
    with pytest.raises(ConfigError, match=named) as err:
        DrafterSpec.from_dflash_config(path)
    assert str(path) in str(err.value)


def test_the_target_config_is_not_a_drafter_config() -> None:
    with pytest.raises(ConfigError, match="not a DFlash drafter config") as err:
        SimSpec(model=TARGET, drafter_config=TARGET)
    assert str(TARGET_DIR / "config.json") in str(err.value)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"vocab_size": 4096}, "vocab_size 4096 does not match the target's 2048"),
        ({"hidden_size": 96, "head_dim": 24}, "hidden_size 96 does not match the target's 192"),
        ({"num_target_layers": 8}, "num_target_layers 8 does not match the target's 4"),
        ({"dflash_config": {"mask_token_id": 2, "target_layer_ids": [1, 4]}}, "out of range"),
        (
            {
                "num_target_layers": None,
                "dflash_config": {"mask_token_id": 2, "target_layer_ids": [1, 4]},
            },
            r"\[4\] are out of range for the 4-layer target",
        ),
        ({"dflash_config": {"mask_token_id": 2048, "target_layer_ids": [1]}}, "mask_token_id"),
        ({"dflash_config": {"mask_token_id": 2, "target_layer_ids": "13"}}, "target_layer_ids"),
        ({"block_size": 1}, "block_size"),
    ],
)
def test_a_drafter_that_does_not_fit_the_target_is_refused(
    tmp_path: Path, edit: dict[str, Any], named: str
) -> None:
    path = _write(tmp_path, {**_drafter_cfg(), **edit})
    with pytest.raises(ConfigError, match=named) as err:
        SimSpec(model=TARGET, drafter_config=str(path))
    assert str(path) in str(err.value)


def test_missing_and_wrong_typed_drafter_configs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        SimSpec(model=TARGET, drafter_config=str(tmp_path / "none.json"))
    for bad in (3, DRAFTER_DIR, ""):  # a path is given as a str, as every SimSpec path
        with pytest.raises(ConfigError, match=r"drafter_config|drafter config"):
            SimSpec(model=TARGET, drafter_config=bad)  # type: ignore[arg-type]


def test_simulate_prices_the_given_drafter() -> None:
    """The demo's 2-layer drafter drafts faster than the published 5-layer layout on the same
    target, and the record says which drafter priced it."""
    base = SimSpec(model=TARGET, policies=("chain",), requests=2, output_len=16, warmup_steps=0)
    five = simulate(base).row("chain")
    two = simulate(SimSpec(**{**base.to_dict(), "policies": ("chain",), "drafter_config": DRAFTER}))
    assert two.spec.to_dict()["drafter_config"] == DRAFTER
    row = two.row("chain")
    assert row.draft_s < 0.8 * five.draft_s
    assert row.verify_s == pytest.approx(five.verify_s, rel=0.05)  # the same target


def test_an_experiment_grid_takes_a_drafter_config(tmp_path: Path) -> None:
    """``drafter_config`` is a grid key: a relative path is read from the config's directory,
    the run key follows the drafter's shape, and a bad one fails before any run."""
    from bastion.sim import experiments

    (tmp_path / "d").mkdir()
    _write(tmp_path / "d", _drafter_cfg())
    config = tmp_path / "exp.toml"
    config.write_text(
        f'name = "drafters"\n[grid]\nmodel = "{TARGET}"\ndrafter_config = ["d", "{DRAFTER}"]\n'
        'policies = ["chain"]\nrequests = 1\noutput_len = 8\n'
    )
    runs = experiments.load_config(config).runs()
    assert [r["spec"]["drafter_config"] for r in runs] == [str(tmp_path / "d"), DRAFTER]
    key = runs[0]["key"]
    _write(tmp_path / "d", {**_drafter_cfg(), "num_hidden_layers": 1})  # another drafter
    assert experiments.load_config(config).runs()[0]["key"] != key
    _write(tmp_path / "d", {**_drafter_cfg(), "vocab_size": 7})
    with pytest.raises(ConfigError, match=r"exp\.toml: grid point .*vocab_size 7"):
        experiments.load_config(config)


# --- a calibration record as the controller's belief ---------------------------------------------


def _record(
    tmp_path: Path,
    gpu: str = "h100-sxm",
    model: str = "qwen3-8b",
    name: str | None = None,
    compute_alpha: float = 1.2,
    **fields: Any,
) -> Path:
    """A calibration record as ``bastion calibrate`` writes one, for ``model`` on ``gpu``
    (recorded under ``name``: the real backend's ``DIRNAME-DIGEST``)."""
    from dataclasses import replace

    from bastion.cost.calibration import (
        Branch,
        CalibrationRecord,
        LinearCalibration,
        inputs_digest,
    )
    from bastion.cost.hardware import get_profile

    hw, spec = get_profile(gpu), get_model(model)
    spec = replace(spec, name=name or spec.name)
    record = CalibrationRecord(
        device=hw.name,
        model=spec.name,
        dtype="fp32",
        backend="torch-cpu",
        calibration=LinearCalibration(Branch(compute_alpha, 1e-4), Branch(1.1, 2e-4)),
        prep_s=3e-4,
        rmse_bare_s=0.125,
        rmse_calibrated_s=0.0625,
        inputs=inputs_digest(hw, spec),
    )
    path = tmp_path / "record.json"
    path.write_text(json.dumps({**record.to_dict(), **fields}))
    return path


def test_the_record_is_the_controllers_belief(tmp_path: Path) -> None:
    """With a record nothing is swept: the cost model is the record's, as the real backend
    builds it (its calibration and its T_aux), and the run reports the record's own fit."""
    from bastion.sim.gpu import SimulatedGPU
    from bastion.sim.simulate import calibrated_cost_model

    path = _record(tmp_path)
    spec = SimSpec(calibration_file=str(path), requests=1, output_len=8, policies=("chain",))
    stored = spec.stored_calibration()
    assert stored is not None and stored[1]  # fitted against exactly these inputs
    record = stored[0]
    hw, model = get_model("qwen3-8b"), spec.drafter()
    from bastion.cost.hardware import get_profile

    gpu = SimulatedGPU(get_profile("h100-sxm"), hw, model)
    cm, used = calibrated_cost_model(gpu, "static", 0, record)
    assert used is record and cm.calibration == record.calibration and cm.prep_s == 3e-4
    result = simulate(spec)
    assert (result.calibration_rmse_bare_s, result.calibration_rmse_calibrated_s) == (0.125, 0.0625)
    assert result.spec.to_dict()["calibration_file"] == str(path)


def test_a_pessimistic_record_makes_the_paper_controller_draft_less(tmp_path: Path) -> None:
    """The adaptive policy decides on the record's belief: a record that prices every extra
    token ×50 on the compute branch keeps the paper's controller's trees small."""
    base = SimSpec(policies=("bastion:paper",), requests=2, output_len=48, warmup_steps=0)
    sweep = simulate(base).row("bastion:paper")
    path = _record(tmp_path, compute_alpha=50.0)
    spec = SimSpec(**{**base.to_dict(), "policies": base.policies, "calibration_file": str(path)})
    believed = simulate(spec).row("bastion:paper")
    assert believed.mean_tree_size < 0.5 * sweep.mean_tree_size


def test_a_record_of_the_real_backends_target_matches_by_shape(tmp_path: Path) -> None:
    """The real backend records the demo target as ``target-DIGEST``; the simulator's
    ``--model bastion/demo/models/target`` is ``target``: matched by the shape digest."""
    digest = get_model(TARGET).shape_digest()
    path = _record(tmp_path, model=TARGET, name=f"target-{digest}")
    spec = SimSpec(model=TARGET, calibration_file=str(path))
    assert spec.stored_calibration() is not None
    other = _record(tmp_path, model=TARGET, name="target-00000000")
    with pytest.raises(ConfigError, match="fitted for model 'target-00000000'"):
        SimSpec(model=TARGET, calibration_file=str(other))


def test_the_real_backends_target_name_is_the_shape_digest() -> None:
    torch_calibrate = pytest.importorskip("bastion.backends.torch.calibrate")
    from bastion.backends.torch import load_target

    name = torch_calibrate.target_spec(load_target(TARGET, "cpu")).name
    assert name == f"target-{get_model(TARGET).shape_digest()}"


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda p: _record(p, gpu="a100-sxm-80gb"), "fitted on device 'a100-sxm-80gb'"),
        (lambda p: _record(p, model="qwen3-32b"), "fitted for model 'qwen3-32b'"),
        (lambda p: _record(p, compute={"alpha": float("nan"), "beta": 0.0}), "finite"),
        (lambda p: _record(p, memory={"alpha": -1.0, "beta": 0.0}), "positive"),
        (lambda p: _drop(_record(p), "device"), "not a calibration record"),
        (lambda p: _text(p, "[1, 2]"), "JSON object"),
        (lambda p: _text(p, '{"device": '), "not valid JSON"),
        (lambda p: p / "none.json", "not found"),
    ],
)
def test_a_wrong_record_is_refused_naming_the_file(tmp_path: Path, make: Any, named: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=named) as err:
        SimSpec(calibration_file=str(path))
    assert str(path) in str(err.value)


def _text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "record.json"
    path.write_text(text)
    return path


def _drop(path: Path, key: str) -> Path:
    data = json.loads(path.read_text())
    del data[key]
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("mode", ["bare", "ema"])
def test_a_record_needs_a_cost_mode_that_uses_one(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ConfigError, match=f"cost mode '{mode}' does not use one"):
        SimSpec(calibration_file=str(_record(tmp_path)), cost_mode=mode)
    assert SimSpec(calibration_file=str(_record(tmp_path)), cost_mode="ema+calib")


def test_a_record_of_other_inputs_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Same device and model names, but the record's inputs digest is another profile's
    contents (or another bastion version's): used, and said."""
    path = _record(tmp_path, inputs="0123456789ab")
    spec = SimSpec(calibration_file=str(path), requests=1, output_len=8, policies=("chain",))
    stored = spec.stored_calibration()
    assert stored is not None and not stored[1]
    with caplog.at_level("WARNING", logger="bastion.sim.simulate"):
        simulate(spec)
    assert f"calibration record {path}: fitted against other inputs" in caplog.text


# --- a probed (CPU) profile under the default truth ----------------------------------------------


def test_a_probed_profile_simulates_under_the_default_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bastion hw probe` writes a profile without an SM clock (a CPU has none); the default
    truth's kernel GEMM model is skipped for it (factor 1), so the demo pair simulates on it."""
    import bastion.sim.pass_pricing as pass_pricing
    from bastion.cli import main
    from bastion.cost.hardware import load_profile
    from bastion.sim.truth import DEFAULT_TRUTH, get_truth

    monkeypatch.setattr(pass_pricing, "_NO_KERNEL_MODEL", set())
    assert get_truth(DEFAULT_TRUTH).gemm_shape_model == "kernel"
    profile = tmp_path / "cpu.toml"
    assert main(["hw", "probe", "--quick", "--name", "cpu", "--out", str(profile)]) == 0
    hw = load_profile(profile)
    assert hw.sm_clock_hz is None and hw.max_threads_per_sm is None
    args = ["simulate", "--gpu", str(profile), "--model", TARGET, "--drafter-config", DRAFTER]
    args += ["--requests", "2", "--output-len", "12", "--policy", "chain,bastion", "--json"]
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    records = json.loads(capsys.readouterr().out)["records"]
    assert [r["policy"] for r in records] == ["ar", "chain", "bastion"]
    assert all(r["tpot_s"] > 0 and r["truth"] == DEFAULT_TRUTH for r in records)
