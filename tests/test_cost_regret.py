"""Decision regret of cost models on measured tables (bastion.cost.regret, validate --regret)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bastion.cli import main
from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.regret import decision_regret, measured_sizes, pass_times
from bastion.cost.validation import FORMATS, MeasuredTable, operator_features
from bastion.errors import ConfigError

MODEL = get_model("llama-3.1-8b")
HW = get_profile("h100-sxm")


def stepped_table(step_at: int = 72, jump: float = 1.6) -> MeasuredTable:
    """A table written here: the bare roofline of every vidur column at 1 … 512 tokens, every
    time × ``jump`` from ``step_at`` tokens on (a kernel step the roofline does not know)."""
    tokens = np.arange(1, 513, dtype=np.float64)
    columns = {}
    for column, spec in FORMATS["vidur"].items():
        bare = operator_features(spec, MODEL, HW, tokens).bare
        columns[column] = bare * np.where(tokens >= step_at, jump, 1.0)
    return MeasuredTable("written-here.csv", "vidur", tokens, columns, ())


def curves() -> dict[str, np.ndarray]:
    n = np.arange(1, 513, dtype=np.float64)
    return {
        "steep": 1 + 9 * (1 - np.exp(-n / 30.0)),  # concave, saturating near 10 tokens
        "flat": 1 + 4 * (1 - np.exp(-n / 8.0)),
    }


def test_deciding_on_measured_sizes_avoids_the_step_the_roofline_misses() -> None:
    records = {r.mode: r for r in decision_regret(stepped_table(), MODEL, HW, curves())}
    # below the step the table is smooth, and a smooth optimum can fall between lattice sizes:
    # the lattice's spacing costs up to 2 % here (on the shipped tables, whose steps put the
    # optimum on the lattice, 0 %)
    assert records["measured"].worst_regret <= 0.03
    assert records["measured"].n_measured <= 32
    assert all(n <= 64 for n in records["measured"].chosen.values())  # in front of the step
    # negative control: the bare roofline, blind to the step, chooses past it and pays
    assert records["bare"].worst_regret > 0.05
    assert any(n >= 72 for n in records["bare"].chosen.values())


def test_without_a_step_every_mode_agrees() -> None:
    records = decision_regret(stepped_table(jump=1.0), MODEL, HW, curves())
    assert all(r.worst_regret < 0.02 for r in records)


def test_measured_sizes_follow_the_lattice() -> None:
    tokens = np.arange(1, 1025)
    picked = tokens[measured_sizes(tokens, 32)]
    assert picked.size == 32 and picked[0] == 1
    assert set(picked[8:].tolist()) <= set(range(8, 257, 8))


def test_bad_inputs() -> None:
    table = stepped_table()
    with pytest.raises(ConfigError, match="at least one"):
        decision_regret(table, MODEL, HW, {})
    with pytest.raises(ConfigError, match="sizes"):
        decision_regret(table, MODEL, HW, {"short": np.ones(10)})
    with pytest.raises(ConfigError, match="max_measured"):
        decision_regret(table, MODEL, HW, curves(), max_measured=1)
    no_one = MeasuredTable(
        "x.csv", "vidur", table.tokens[1:], {k: v[1:] for k, v in table.columns.items()}, ()
    )
    with pytest.raises(ConfigError, match="1 token"):
        decision_regret(no_one, MODEL, HW, curves())
    tokens, times = pass_times(table, MODEL, HW)
    assert tokens.size == 512 and set(times) == {"measured", "bare", "calibrated"}


def test_cli_validate_regret_json(capsys: pytest.CaptureFixture[str]) -> None:
    from bastion.cost.validation import bundled_measured

    data = bundled_measured()
    if "a40_llama-2-7b_per-layer-ops" not in data:
        pytest.skip("the measured tables ship in the checkout only")
    code = main(
        [
            "validate",
            "--measured",
            str(data["a40_llama-2-7b_per-layer-ops"]),
            "--format",
            "vidur",
            "--model",
            str(data["a40_llama-2-7b_per-layer-ops"].parent / "llama-2-7b_config.json"),
            "--gpu",
            "a40",
            "--regret",
            "--json",
        ]
    )
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in records] == ["bare", "calibrated", "measured"]
    assert {"mode", "worst_regret", "median_regret", "n_measured"} <= records[0].keys()
    assert records[2]["worst_regret"] <= 0.01


def test_transfer_mode_decides_on_the_kernel_model_with_the_given_parameters() -> None:
    """``transfer``: the kernel model's pass with parameters fitted elsewhere. On a table
    written here from the kernel model itself (default parameters), that mode with the same
    parameters has no regret; with parameters that make every tile dearer it decides
    differently (negative control: the parameters are really used)."""
    from dataclasses import replace

    from bastion.cost.kernels import KernelParams
    from bastion.cost.transfer import column_predictor
    from bastion.cost.validation import MEASURED_OPTIONS

    tokens = np.arange(1, 513, dtype=np.float64)
    params = KernelParams()
    columns = {
        column: column_predictor(spec, MODEL, HW, tokens, MEASURED_OPTIONS)(params)
        for column, spec in FORMATS["vidur"].items()
    }
    table = MeasuredTable("kernel-model.csv", "vidur", tokens, columns, ())
    plain = [r.mode for r in decision_regret(table, MODEL, HW, curves())]
    assert plain == ["bare", "calibrated", "measured"]  # no transfer without parameters
    records = {r.mode: r for r in decision_regret(table, MODEL, HW, curves(), transfer=params)}
    assert list(records) == ["bare", "transfer", "calibrated", "measured"]
    assert records["transfer"].worst_regret == 0.0
    dear = replace(params, tile_cycles=params.tile_cycles * 20, kernel_s=params.kernel_s * 20)
    other = {r.mode: r for r in decision_regret(table, MODEL, HW, curves(), transfer=dear)}
    assert other["transfer"].chosen != records["transfer"].chosen


def test_cli_validate_regret_with_transfer(capsys: pytest.CaptureFixture[str]) -> None:
    from bastion.cost.validation import bundled_measured

    data = bundled_measured()
    names = (
        "a40_llama-2-7b_per-layer-ops",
        "a100-80gb_llama-3-8b_per-layer-ops",
        "h100_llama-2-7b_per-layer-ops",
    )
    if not all(n in data for n in names):
        pytest.skip("the measured tables ship in the checkout only")
    held, *others = (data[n] for n in names)
    code = main(
        [
            "validate",
            "--measured",
            str(held),
            "--format",
            "vidur",
            "--model",
            str(held.parent / "llama-2-7b_config.json"),
            "--gpu",
            "a40",
            "--transfer-from",
            ",".join(str(p) for p in others),
            "--regret",
            "--json",
        ]
    )
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in records] == ["bare", "transfer", "calibrated", "measured"]
    assert 0.0 <= records[1]["worst_regret"] < 1.0
