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
