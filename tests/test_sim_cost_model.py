"""The simulator's controller can run on a measured per-operator table (--cost-model profiled:…)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.cli import main
from bastion.errors import ConfigError
from bastion.sim.experiments import load_config
from bastion.sim.simulate import SimSpec, simulate

TABLE = (
    Path(__file__).resolve().parent.parent
    / "docs"
    / "data"
    / "a100-80gb_llama-3-8b_per-layer-ops.csv"
)


def test_profiled_cost_model_drives_the_adaptive_policy() -> None:
    base = dict(model="llama-3.1-8b", gpu="a100-sxm-80gb", policies=("bastion",), requests=1)
    base["output_len"] = 48
    profiled = simulate(SimSpec(cost_mode=f"profiled:vidur:{TABLE}", **base))
    static = simulate(SimSpec(cost_mode="static", **base))
    assert profiled.row("bastion").speedup > 1.0
    # the same requests and truth: only the controller's belief differs, so AR is identical
    assert profiled.row("ar").tpot_s == static.row("ar").tpot_s


@pytest.mark.parametrize("mode", ["profiled:", "profiled:missing.csv", "roofline", ""])
def test_bad_cost_models_are_refused(mode: str) -> None:
    with pytest.raises(ConfigError, match="cost model"):
        SimSpec(cost_mode=mode)


def test_cli_and_config_take_a_profiled_table(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "t.csv").write_bytes(TABLE.read_bytes())
    config = tmp_path / "exp.toml"
    config.write_text(
        'name = "p"\n[grid]\nmodel = "llama-3.1-8b"\ngpu = "a100-sxm-80gb"\n'
        'cost_mode = "profiled:t.csv"\npolicies = ["bastion"]\nrequests = 1\noutput_len = 32\n'
    )
    loaded = load_config(config)
    assert loaded.runs()[0]["spec"]["cost_mode"] == f"profiled:{(tmp_path / 't.csv').resolve()}"
    assert (
        main(
            [
                "simulate",
                "--requests",
                "1",
                "--output-len",
                "32",
                "--policy",
                "bastion",
                "--cost-model",
                "profiled:missing.csv",
            ]
        )
        == 2
    )
    assert "no measured table" in capsys.readouterr().err
