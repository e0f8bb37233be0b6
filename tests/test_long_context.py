"""Long contexts: prompts of up to 128k tokens in the simulator, and the cost model's attention
and KV terms at those lengths (issue 36, item 3).

The cost model reads each request's KV once per pass, however many tree tokens query it
(FlashAttention-style: one query tile holds a whole tree; docs/simulator.md says where real
kernels differ), so the KV bytes a tree adds do not grow with the context; the attention FLOPs
do (every query meets every key)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main
from bastion.cost.hardware import get_profile
from bastion.cost.models import get_model
from bastion.cost.roofline import verify_pass
from bastion.errors import ConfigError
from bastion.sim.experiments.config import load_config
from bastion.sim.simulate import SimSpec, arrivals_of, request_source, simulate
from bastion.sim.workloads import get_workload

LONGEST = 131_072  # Llama-3.1's context


def _kv_and_flops(s: int, c: int) -> tuple[float, float]:
    """The KV bytes and attention FLOPs of one request's pass of s tokens at context c."""
    b = verify_pass(get_model("llama-3.1-8b"), get_profile("h100-sxm"), [(s, c)])
    attn = [op for op in b.operators if op.name in ("attn_scores", "attn_values")]
    kv = sum(float(op.kv_bytes) for op in b.operators)
    return kv, sum(float(op.flops) for op in attn)


def test_a_tree_reads_the_context_once_however_long() -> None:
    """The KV bytes a 64-token tree adds over a 1-token pass are the same at a 512-token and a
    128k-token context (one KV read per request per pass), while the attention FLOPs it adds grow
    with the context (64 queries × every key)."""
    m = get_model("llama-3.1-8b")
    per_token = 2 * m.layers * m.h_kv * 2  # K and V, every layer, bf16
    added = {}
    for c in (512, LONGEST - 64):
        kv1, f1 = _kv_and_flops(1, c)
        kv64, f64 = _kv_and_flops(64, c)
        # scores read K, values read V: (c + s)·per_token; the new tokens' K and V written once
        assert kv1 == pytest.approx((c + 1) * per_token + 1 * per_token)
        added[c] = (kv64 - kv1, f64 - f1)
    (kv_short, f_short), (kv_long, f_long) = added[512], added[LONGEST - 64]
    assert kv_short == pytest.approx(kv_long) == pytest.approx(63 * 2 * per_token)
    assert f_long > 100 * f_short  # the attention FLOPs do grow with the context


def test_prompt_len_sets_every_request_prompt() -> None:
    spec = SimSpec(workload="long", prompt_len=20_000, arrival_rate=5.0, requests=6)
    arrivals = arrivals_of(spec)
    assert arrivals is not None and {a.prompt_len for a in arrivals} == {20_000}
    source = request_source(spec)
    assert source.workload.prompt_len == 20_000  # type: ignore[attr-defined]
    assert source.workload.prompt_len_sigma == 0.0  # type: ignore[attr-defined]
    default = request_source(SimSpec(workload="long"))
    assert default.workload.prompt_len_sigma > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [0, -1, 1_000_001])
def test_a_bad_prompt_len_is_refused(bad: int) -> None:
    with pytest.raises(ConfigError, match="prompt_len"):
        SimSpec(prompt_len=bad)


def test_prompt_len_is_refused_with_requests_that_bring_their_own(tmp_path: Path) -> None:
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("0 100 20\n")
    with pytest.raises(ConfigError, match="brings its own prompt lengths"):
        SimSpec(prompt_len=512, arrivals=str(arrivals))
    with pytest.raises(ConfigError, match="brings its own prompt lengths"):
        SimSpec(prompt_len=512, workload=str(tmp_path))  # a trace directory


def test_the_cli_refuses_a_bad_prompt_len(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--prompt-len", "0", "--requests", "1"]) != 0
    assert "prompt_len must be an integer in 1" in capsys.readouterr().err


def test_an_experiment_grid_takes_prompt_len(tmp_path: Path) -> None:
    cfg = tmp_path / "e.toml"
    cfg.write_text(
        'name = "e"\n[grid]\nworkload = "long"\nprompt_len = [512, 16384]\nrequests = 1\n'
        'policies = ["chain"]\n'
    )
    runs = load_config(cfg).runs()
    assert [r["spec"]["prompt_len"] for r in runs] == [512, 16384]
    cfg.write_text('name = "e"\n[grid]\nprompt_len = 0\npolicies = ["chain"]\n')
    with pytest.raises(ConfigError, match="prompt_len"):
        load_config(cfg).runs()


def test_the_long_workload_runs_at_the_model_context() -> None:
    """A request whose prompt and output fill Llama-3.1's whole 128k context runs; what an AR
    step at 128k costs beyond one at 512 is reading the longer context's KV: no faster than the
    GPU's peak bandwidth allows, and within 1.5× of it."""
    tpot = {}
    for prompt in (512, LONGEST - 16):
        spec = SimSpec(
            model="llama-3.1-8b",
            workload="long",
            prompt_len=prompt,
            output_len=16,
            requests=1,
            prefill_chunk=0,
            policies=("chain",),
        )
        ar = simulate(spec).rows[0]
        assert ar.policy == "ar"
        tpot[prompt] = ar.tpot_s
    m, hw = get_model("llama-3.1-8b"), get_profile("h100-sxm")
    kv_s = (LONGEST - 16 - 512) * 2 * m.layers * m.h_kv * 2 / hw.memory_bandwidth
    assert np.isfinite(list(tpot.values())).all()
    assert kv_s <= tpot[LONGEST - 16] - tpot[512] <= 1.5 * kv_s


def test_the_long_workload_is_shipped_with_its_alias() -> None:
    w = get_workload("long")
    assert w.name == "llama-3.1-8b-long"
    assert w.prompt_len_max == LONGEST and w.prompt_len == 16_384
