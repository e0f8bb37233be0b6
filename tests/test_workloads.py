"""Workload files, the shipped presets' fitted acceptance, and fitting workloads to traces."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bastion.cli import main as cli_main
from bastion.errors import BastionError, ConfigError
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workload_fit import fit_traces, replay_tau, synthetic_tau
from bastion.sim.workloads import (
    PRESETS,
    WORKLOAD_DIR_ENV,
    Workload,
    get_workload,
    known_workloads,
    read_workload_file,
    write_workload,
)
from bastion.trace import Trace, read_trace, write_trace
from bastion.tree import DraftMarginals

SHIPPED = sorted(
    {wf.path for wf in known_workloads().values() if wf.path.parent.name == "workloads"}
)


# -- the presets keep their fitted τ ---------------------------------------------------------------


def check_errors(w: Workload, checks: list[dict[str, object]]) -> list[float]:
    """Relative error of the workload's τ against every recorded check (same draws as the fit:
    2048 requests × 32 steps, seed 0)."""
    sizes = [c["n"] for c in checks]
    got = synthetic_tau(w, sizes, requests=2048, steps=32, seed=0)  # type: ignore[arg-type]
    return [got[c["n"]] / float(c["tau"]) - 1 for c in checks]  # type: ignore[index,arg-type]


TOL = 0.002  # the checks are recomputed on the same draws: only a changed model moves them


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_preset_keeps_its_fitted_tau(path: Path) -> None:
    """Each preset's τ at its recorded sizes equals the value recorded when it was fitted (to
    0.2 %), and every number it was fitted on lies within 4 % of the paper's (the MoE coder's
    three-number fit leaves residuals of up to 3.4 %; docs/workloads.md)."""
    wf = read_workload_file(path)
    checks = wf.fit["check"]
    assert max(abs(e) for e in check_errors(wf.workload, checks)) < TOL
    for c in checks:
        if c["role"] == "fitted":
            assert abs(c["tau"] / c["paper_tau"] - 1) < 0.04, c


@pytest.mark.parametrize(
    "change",
    [{"top1_shift": 0.1}, {"fork_rate_scale": 0.85}, {"alignment": 1.15}],
    ids=["level", "forks", "alignment"],
)
def test_a_perturbed_preset_fails_the_check(change: dict[str, float]) -> None:
    """Negative control: a small change of one fitted or assumed parameter moves τ out of the
    tolerance the preset test uses."""
    wf = read_workload_file(next(p for p in SHIPPED if p.stem == "qwen3-coder-30b-a3b-code"))
    w = wf.workload
    if "top1_shift" in change:
        logit = math.log(w.top1 / (1 - w.top1)) + change["top1_shift"]
        w = w.with_(top1=1 / (1 + math.exp(-logit)))
    elif "fork_rate_scale" in change:
        w = w.with_(fork_rate=w.fork_rate * change["fork_rate_scale"])
    else:
        w = w.with_(alignment=change["alignment"])
    checks = [c for c in wf.fit["check"] if c["n"] != 1025]
    assert max(abs(e) for e in check_errors(w, checks)) > TOL


def test_seeds_agree_within_sampling_error() -> None:
    """A different seed gives the recorded τ to within 3 % (sampling error), so the recorded
    values describe the model, not one draw."""
    wf = read_workload_file(next(p for p in SHIPPED if p.stem == "qwen3-8b-math"))
    checks = wf.fit["check"]
    got = synthetic_tau(wf.workload, [c["n"] for c in checks], requests=1024, steps=32, seed=7)
    for c in checks:
        assert abs(got[c["n"]] / c["tau"] - 1) < 0.03


# -- files and lookup ------------------------------------------------------------------------------


def test_default_names_still_work() -> None:
    assert get_workload("math").name == "qwen3-8b-math"
    assert get_workload("code").name == "qwen3-8b-code"
    assert get_workload("chat").name == "qwen3-8b-chat"
    assert {"math", "code", "chat", "qwen3-coder-30b-a3b-code"} <= set(PRESETS)


def test_round_trip_and_lookup_by_path_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = get_workload("math").with_(name="mine", step_sd=0.3, top1_by_depth=tuple([0.9] * 15))
    path = tmp_path / "mine.toml"
    write_workload(path, w, ("m2",), {"source": "test", "check": [{"n": 16, "tau": 1.0}]})
    assert get_workload(str(path)) == w
    with pytest.raises(BastionError, match="mine"):
        get_workload("mine")
    monkeypatch.setenv(WORKLOAD_DIR_ENV, str(tmp_path))
    assert get_workload("mine") == w and get_workload("m2") == w
    monkeypatch.setenv(WORKLOAD_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=WORKLOAD_DIR_ENV):
        get_workload("mine")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('name = "bad"\n[drafter]\ntop1 = 0.9\n', r"bad\.toml: missing key\(s\) decay"),
        (
            'name = "bad"\ncolour = 1\n[drafter]\ntop1 = 0.9\n',
            r"bad\.toml: unknown key\(s\) colour; accepted",
        ),
        (
            'name = "bad"\n[drafter]\ntop1 = 0.9\ndecay = 1\nconcentration = 1\nflavour = 2\n'
            "[target]\nalignment = 1\n",
            r"bad\.toml: unknown key\(s\) in \[drafter\]: flavour; accepted",
        ),
        (
            'name = "bad"\n[drafter]\ntop1 = 1.5\ndecay = 1\nconcentration = 1\n'
            "[target]\nalignment = 1\n",
            r"bad\.toml: .*top1=1\.5 \(accepted: 0 < top1 < 1\)",
        ),
        (
            'name = "bad"\n[drafter]\ntop1 = 0.5\ndecay = 1\nconcentration = 1\n'
            "top1_by_depth = [0.5]\n[target]\nalignment = 1\n",
            r"bad\.toml: .*top1_by_depth.*15 numbers",
        ),
        ("name = [", r"bad\.toml is not valid TOML"),
    ],
)
def test_bad_files_name_the_file_and_key(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        get_workload(str(path))


def test_a_name_claimed_twice_in_one_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = get_workload("math")
    write_workload(tmp_path / "a.toml", w.with_(name="a"), ("x",))
    write_workload(tmp_path / "b.toml", w.with_(name="b"), ("x",))
    monkeypatch.setenv(WORKLOAD_DIR_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="'x' is also claimed"):
        get_workload("a")


def test_one_directory_holds_profiles_and_workloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$BASTION_WORKLOADS`` and ``$BASTION_HWPROFILES`` naming one directory: each lookup
    skips the other kind's files (by their ``[peak]`` table, or an explicit ``kind`` key)."""
    from bastion.cost.hardware import PROFILE_DIR_ENV, get_profile, known_profiles

    shipped = Path(__file__).resolve().parents[1] / "hwprofiles" / "h100-sxm.toml"
    (tmp_path / "mygpu.toml").write_text(shipped.read_text().replace('"h100-sxm"', '"mygpu"'))
    write_workload(tmp_path / "mine.toml", get_workload("math").with_(name="mine"))
    labelled = (tmp_path / "mine.toml").read_text()
    (tmp_path / "tagged.toml").write_text(
        'kind = "workload"\n' + labelled.replace('name = "mine"', 'name = "tagged"')
    )
    monkeypatch.setenv(WORKLOAD_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    assert get_workload("mine").name == "mine" and get_workload("tagged").name == "tagged"
    assert "mygpu" not in known_workloads()
    assert get_profile("mygpu").name == "mygpu"
    assert "mine" not in known_profiles() and "tagged" not in known_profiles()
    assert cli_main(["hw", "list"]) == 0 and cli_main(["workload", "list"]) == 0
    # an explicit kind must be a known one, and a file of the other kind is refused by path
    (tmp_path / "odd.toml").write_text('kind = "recipe"\n' + labelled)
    with pytest.raises(ConfigError, match="key 'kind' is 'recipe'"):
        get_workload("mine")
    (tmp_path / "odd.toml").unlink()
    with pytest.raises(ConfigError, match="is a hardware profile"):
        get_workload(str(tmp_path / "mygpu.toml"))
    with pytest.raises(ConfigError, match="is a workload"):
        get_profile(str(tmp_path / "mine.toml"))


# -- the structured model --------------------------------------------------------------------------


def test_new_structure_raises_tree_gain_over_the_chain() -> None:
    """Forks are what a tree catches: with them the N = 16 tree gains over the chain; without
    them (the negative control) it gains far less."""
    w = get_workload("qwen3-coder-30b-a3b-code")
    with_forks = synthetic_tau(w, ("chain", 16), requests=512, steps=32)
    without = synthetic_tau(
        w.with_(fork_rate=0.0, branch_rate=0.0), ("chain", 16), requests=512, steps=32
    )
    assert with_forks[16] / with_forks["chain"] > 1.03
    assert without[16] / without["chain"] < 1.01


def test_temperature_lowers_the_chain_and_spreads_to_runners_up() -> None:
    """At T = 1 the chain accepts less than at T = 0; the spread knob moves acceptance to the
    runners-up, which only a tree catches: with it the tree's τ is higher than without (the
    control), the chain's unchanged."""
    w = get_workload("chat")
    cold = synthetic_tau(w, ("chain", 64), requests=256, steps=32)
    hot = synthetic_tau(w, ("chain", 64), requests=256, steps=32, temperature=1.0)
    flat = synthetic_tau(
        w.with_(temperature_spread=0.0), ("chain", 64), requests=256, steps=32, temperature=1.0
    )
    assert hot["chain"] < cold["chain"] - 0.5
    assert hot[64] > flat[64] + 0.1
    assert abs(hot["chain"] - flat["chain"]) < 0.02 * flat["chain"]


# -- fitting to dense traces -----------------------------------------------------------------------


def synthetic_traces(w: Workload, n: int, tokens: int, seed: int) -> list[Trace]:
    """Dense traces whose drafter rows and target tokens follow ``w`` (ids: the target's token
    at its drawn rank, other ranks distinct other ids)."""
    rng = np.random.default_rng(seed)
    vocab = 4 * w.k
    traces = []
    for i in range(n):
        src = SyntheticSource(w, seed, block_steps=tokens)
        src.admit(0, i)
        prompt = tuple(int(x) for x in rng.integers(0, vocab, 8))
        seq = list(prompt) + [int(x) for x in rng.integers(0, vocab, tokens + w.depth + 1)]
        dense = {}
        for p in range(len(prompt), len(prompt) + tokens):
            m, target = src.draft(np.zeros(1, np.int64), np.zeros(1, np.int64))
            ids = np.empty((w.depth, w.k), np.int64)
            for k in range(w.depth):
                tok = seq[p + 1 + k]
                others = [t for t in rng.permutation(vocab).tolist() if t != tok][: w.k]
                r = int(target[0, k])
                row = others[: w.k]
                if r < w.k:
                    row[r] = tok
                ids[k] = row
            dense[p] = DraftMarginals(ids, m.probs[0].copy())
        out = tuple(seq[len(prompt) : len(prompt) + tokens])
        traces.append(Trace(prompt, out, (), {"temperature": 0.0, "vocab_size": vocab}, dense))
    return traces


SMALL = Workload(
    "small", top1=0.7, decay=0.95, concentration=0.3, alignment=0.9, depth=6, k=6,
    step_sd=0.8, position_sd=0.3, fork_rate=0.15, branch_rate=0.2, difficulty_sd=0.3,
)  # fmt: skip
OTHER = SMALL.with_(name="other", top1=0.45, fork_rate=0.02, branch_rate=0.0, alignment=0.7)
SIZES = ("chain", 8, 16, 32)


def test_fit_recovers_the_generating_model_and_not_another() -> None:
    """A workload fitted to 10 traces drawn from a known model gives that model's τ(N) within
    4 % at every size; the τ(N) of another model (the negative control) is off by more than
    15 %. (Compared with the models themselves, not with 10 more traces: those differ from
    their own model by up to 9 % here, which is sampling error of the traces.)"""
    fitted, report = fit_traces(synthetic_traces(SMALL, 10, 160, seed=1), sizes=SIZES, requests=128)
    predicted = synthetic_tau(fitted, SIZES, requests=1024, steps=32, seed=3)
    truth = synthetic_tau(SMALL, SIZES, requests=1024, steps=32, seed=3)
    other = synthetic_tau(OTHER, SIZES, requests=1024, steps=32, seed=3)
    assert max(abs(predicted[n] / truth[n] - 1) for n in SIZES) < 0.04
    assert max(abs(predicted[n] / other[n] - 1) for n in SIZES) > 0.15
    assert report["refined"] is True


def test_cli_fit_writes_a_loadable_workload(tmp_path: Path) -> None:
    for i, t in enumerate(synthetic_traces(SMALL, 3, 60, seed=4)):
        write_trace(tmp_path / f"t{i}.json", t)
    out = tmp_path / "fitted.toml"
    assert cli_main(["workload", "fit", str(tmp_path), "--out", str(out), "--no-refine"]) == 0
    w = get_workload(str(out))
    assert w.name == "fitted" and w.depth == SMALL.depth and w.k == SMALL.k
    assert read_trace(tmp_path / "t0.json").dense  # the traces were dense
    assert cli_main(["workload", "fit", str(tmp_path), "--out", str(tmp_path / "x.txt")]) == 2


def test_fit_refuses_sparse_traces(tmp_path: Path) -> None:
    t = synthetic_traces(SMALL, 1, 20, seed=5)[0]
    sparse = Trace(t.prompt_ids, t.output_ids, (), dict(t.metadata), {})
    with pytest.raises(ConfigError, match="dense"):
        fit_traces([sparse])


def test_replay_tau_is_what_simulate_replays(tmp_path: Path) -> None:
    """The fitter's fast replay gives exactly the τ of `bastion simulate --trace` (the serving
    loop) for the same traces and policies."""
    from bastion.sim.simulate import SimSpec, simulate

    traces = synthetic_traces(SMALL, 4, 60, seed=9)
    for i, t in enumerate(traces):
        write_trace(tmp_path / f"t{i}.json", t)
    served = simulate(SimSpec(workload=str(tmp_path), policies=("chain", "fixed:8"), requests=4))
    fast = replay_tau(traces, ("chain", 8))
    assert served.row("chain").tau == pytest.approx(fast["chain"], rel=1e-12)
    assert served.row("fixed:8").tau == pytest.approx(fast[8], rel=1e-12)
    assert fast[8] > fast["chain"]  # the two policies differ, so the equality is not vacuous
