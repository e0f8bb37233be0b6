"""``bastion twin`` end to end on the shipped small pair: real runs, a measured truth, the replay.

What must hold whatever the machine's speed: every policy decodes AR's tokens; at T = 0 every
fixed-size policy's replay commits, step by step and request by request, what it committed for
real (the dense traces are the real run's); the measured truth is fitted from the calibration
sessions only; the records and the written truth read back. Timing accuracy is not asserted here
(a shared CPU's speed is not a test's to promise): docs/sim-to-real.md reports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bastion.backends.torch import load_target  # noqa: E402
from bastion.backends.torch.calibrate import device_profile  # noqa: E402
from bastion.backends.torch.twin import run_twin  # noqa: E402
from bastion.cli import main  # noqa: E402
from bastion.cost.calibration import CalibrationCache  # noqa: E402
from bastion.demo import CALIBRATION_PROMPTS_FILE, DRAFTER_DIR, PROMPTS_FILE, TARGET_DIR  # noqa: E402
from bastion.sim.gpu import GroundTruth  # noqa: E402
from bastion.sim.truth import truth_from_dict  # noqa: E402

if not (TARGET_DIR / "config.json").exists():  # pragma: no cover - a packaging error
    pytest.skip("the demo models are not installed", allow_module_level=True)

POLICIES = ("ar", "chain", "fixed:8", "beam:2x4")
CALIBRATION = ("ar", "chain", "fixed:4", "fixed:16")


@pytest.fixture(scope="module")
def twin():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    target = load_target(TARGET_DIR, "cpu")
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    ids = [list(tok(t)["input_ids"]) for t in json.loads(PROMPTS_FILE.read_text())[:2]]
    cal = [list(tok(t)["input_ids"]) for t in json.loads(CALIBRATION_PROMPTS_FILE.read_text())]
    result = run_twin(
        target,
        DRAFTER_DIR,
        ids,
        cal[:2],
        policies=POLICIES,
        batch_sizes=(1, 2),
        max_new_tokens=12,
        repeats=1,
        warmup=0,
        hardware=device_profile(torch.device("cpu"), None, CalibrationCache()),
        unmeasured={"roofline": GroundTruth(name="builtin")},
        calibration_policies=CALIBRATION,
        calibration_tokens=8,
    )
    return result, ids


def test_the_twin_replays_exactly_what_ran(twin) -> None:  # type: ignore[no-untyped-def]
    result, ids = twin
    assert result.identical
    sources = {(r.source, r.batch_size) for r in result.rows}
    assert sources == {(s, b) for s in ("real", "sim", "roofline") for b in (1, 2)}
    for e in result.entries:
        # τ and every step's commitment come from the recorded run: exact at T = 0
        assert e["committed_exact"], (e["source"], e["policy"], e["batch_size"])
        assert e["tau_error"] == pytest.approx(0.0, abs=1e-12)
    real = [r for r in result.rows if r.source == "real"]
    assert all(len(r.committed) == len(ids) for r in real)
    assert all(r.tpot_p50_s > 0 and r.verify_s > 0 for r in real)


def test_the_truth_is_fitted_from_the_calibration_sessions_only(twin) -> None:  # type: ignore[no-untyped-def]
    result, ids = twin
    measured = result.truth.measured
    assert measured is not None
    # every sample is a calibration step: its tree sizes are the calibration policies'
    sizes = {max(s.sizes) for s in result.samples if s.kind == "tree"}
    assert sizes <= {4, 16}, sizes
    assert 8 not in sizes  # fixed:8 ran only on the predicted prompts
    assert measured.meta["steps"] == len(result.samples)
    lengths = {len(p) for p in ids}
    prefilled = {p.tokens for p in result.prefills}
    assert not lengths & prefilled - {16, 32, 64, 96, 128, 192, 256}  # no predicted prompt


def test_the_real_steps_record_the_drafters_intake(twin) -> None:  # type: ignore[no-untyped-def]
    """What the replay charges the drafter's intake by: a request's first drafted step takes
    its prompt's features, every later one the tokens the step before it committed."""
    result, ids = twin
    for policy in ("chain", "fixed:8"):
        samples = [s for s in result.real_samples[(policy, 1)] if s.run == 0]
        row = next(
            r for r in result.rows if (r.source, r.policy, r.batch_size) == ("real", policy, 1)
        )
        want = []
        for prompt, committed in zip(ids, row.committed, strict=True):
            want += [len(prompt), *committed[:-1]]
        assert [s.appended for s in samples] == want, policy
    assert all(s.appended == 0 for s in result.real_samples[("ar", 1)])


def test_the_comparison_is_the_records_error(twin) -> None:  # type: ignore[no-untyped-def]
    result, _ = twin
    rows = {(r.source, r.policy, r.batch_size): r for r in result.rows}
    for e in result.entries:
        real = rows[("real", e["policy"], e["batch_size"])]
        other = rows[(e["source"], e["policy"], e["batch_size"])]
        assert e["tpot_p50_s_error"] == pytest.approx(other.tpot_p50_s / real.tpot_p50_s - 1)
        assert e["speedup_real"] == pytest.approx(
            rows[("real", "ar", e["batch_size"])].tpot_p50_s / real.tpot_p50_s
        )
    data = result.to_json()
    assert {r["source"] for r in data["records"]} == {"real", "sim", "roofline"}


def test_twin_cli_writes_records_truth_traces_and_plot(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["def f(x):\n    return", "class A:\n    def"]))
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps(["import os\nimport sys\n", "def main():\n    parser ="]))
    out = tmp_path / "out"
    argv = ["twin", "--prompts", str(prompts), "--calibration-prompts", str(cal)]
    argv += ["--policy", "ar,chain,fixed:4", "--batch-size", "1", "--max-new-tokens", "8"]
    argv += ["--repeats", "1", "--warmup", "0", "--json", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(r["source"], r["policy"]) for r in data["records"]} >= {
        ("real", "chain"),
        ("sim", "chain"),
    }
    assert data["dtype"] == "float32"  # the CPU's default
    for name in ("twin.json", "comparison.txt", "truth.toml", "twin-tpot.png"):
        assert (out / name).is_file(), name
    truth = truth_from_dict(tomllib.loads((out / "truth.toml").read_text()), "truth.toml")
    assert truth.measured is not None
    assert len(list((out / "traces").glob("*.json"))) == 2
    # the written truth drives the twin instead of a new timing
    argv2 = [*[a for a in argv if a != "--json"][:-2], "--truth", str(out / "truth.toml")]
    assert main(argv2) == 0
    printed = capsys.readouterr().out
    assert "replayed step-exactly: 2 of 2" in printed  # chain, fixed:4
    assert "decision mix within 0 points;" in printed  # every policy's mix, fixed ones too


def test_twin_in_bfloat16_replays_what_ran_in_bfloat16(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--dtype bfloat16 loads both models in bf16 (the drafter follows the target), times and
    replays that run; outputs that differ from AR's are the precision's, reported, not a
    failure."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["def f(x):\n    return"]))
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps(["import os\nimport sys\n"]))
    argv = ["twin", "--prompts", str(prompts), "--calibration-prompts", str(cal)]
    argv += ["--policy", "ar,fixed:4", "--batch-size", "1", "--max-new-tokens", "8"]
    argv += ["--repeats", "1", "--warmup", "0", "--dtype", "bfloat16", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "on cpu in bfloat16" in printed
    assert "replayed step-exactly: 1 of 1" in printed
    assert json.loads((tmp_path / "o" / "twin.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["twin", "--policy", "nope"], "unknown policy"),
        (["twin", "--batch-size", "0"], "--batch-size"),
        (["twin", "--repeats", "0"], "--repeats"),
        (["twin", "--max-new-tokens", "1"], "--max-new-tokens"),
        (["twin", "--truth", "/nonexistent/t.toml"], "t.toml"),
        (["twin", "--device", "cuda", "--policy", "ar"], "cuda"),
        (["truth", "measure", "--out", "/proc/nope/t.toml"], "--out"),
    ],
)
def test_twin_flags_are_validated(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_twin_refuses_a_precision_it_does_not_run(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:  # argparse's choices: exit status 2
        main(["twin", "--dtype", "float16"])
    assert exc.value.code == 2 and "--dtype" in capsys.readouterr().err


def test_prompts_that_are_also_calibration_prompts_are_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    same = tmp_path / "p.json"
    same.write_text(json.dumps(["def f(x):\n    return"]))
    argv = ["twin", "--prompts", str(same), "--calibration-prompts", str(same), "--policy", "ar"]
    assert main(argv) == 2
    assert "disjoint" in capsys.readouterr().err


def test_every_timing_of_the_twin_is_the_targets_device_clock(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On CUDA the stages must be the device's: the twin, its sessions and its prefill sweep
    take their clock from ``device_clock(the target's device)`` (which synchronises CUDA). Here,
    without a GPU, a recording clock stands in for it and must be the one that times."""
    import time

    from bastion.backends.torch import twin as twin_module

    asked: list[str] = []
    ticks = [0]

    def fake_device_clock(device):  # type: ignore[no-untyped-def]
        asked.append(str(device))

        def clock() -> float:
            ticks[0] += 1
            return time.perf_counter()

        return clock

    monkeypatch.setattr(twin_module, "device_clock", fake_device_clock)
    target = load_target(TARGET_DIR, "cpu")
    ids = [[5, 17, 3, 44, 9, 2], [70, 1, 30, 8]]
    result = run_twin(
        target,
        DRAFTER_DIR,
        ids[:1],
        ids[1:],
        policies=("ar", "chain"),
        batch_sizes=(1,),
        max_new_tokens=6,
        repeats=1,
        warmup=0,
        hardware=device_profile(torch.device("cpu"), None, CalibrationCache()),
        calibration_policies=("ar", "chain", "fixed:4"),
        calibration_tokens=6,
    )
    assert asked and set(asked) == {"cpu"}
    # every step of every session read it at least twice (its own turn clock runs on it)
    steps = sum(len(v) for v in result.real_samples.values()) + len(result.samples)
    assert ticks[0] >= 2 * steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_twin_on_cuda(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """What a user with a GPU runs (docs/sim-to-real.md), on the demo pair and a GPU profile."""
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["def f(x):\n    return", "class A:\n    def"]))
    argv = ["twin", "--device", "cuda", "--gpu", "h100-sxm", "--prompts", str(prompts)]
    argv += ["--policy", "ar,chain,fixed:8", "--batch-size", "1,2", "--max-new-tokens", "12"]
    argv += ["--repeats", "1", "--warmup", "1", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(e["committed_exact"] for e in data["comparison"] if e["source"] == "sim")


def test_a_run_of_skipped_steps_counts_all_its_tokens() -> None:
    """The intake of a drafted step after AR steps: every skipped step's features (counted in
    O(1) from the run's ends, which FeedbackRun keeps contiguous)."""
    from bastion.backends.torch.decode import _feature_tokens
    from bastion.backends.torch.verifier import TargetFeedback

    run = TargetFeedback(torch.zeros(5, 4), 10).then(TargetFeedback(torch.zeros(1, 4), 15))
    run = run.then(TargetFeedback(torch.zeros(2, 4), 16))  # type: ignore[attr-defined]
    assert _feature_tokens(run) == 8
    assert _feature_tokens(TargetFeedback(torch.zeros(3, 4), 0)) == 3
    assert _feature_tokens(None) == 0


def test_a_requests_decode_time_is_the_sum_of_its_steps() -> None:
    """Every second of a request's decode time (what its TPOT divides) lies in some step's
    cycle — the loop's bookkeeping between steps included — so a truth fitted on the steps can
    price the TPOT. On a clock that ticks a second per reading, every reading is visible: a
    step's recording and the loop's head between steps were once in no step (≈ 25 µs a step,
    1 % of AR's TPOT on the demo pair)."""
    from transformers import AutoTokenizer

    from bastion.backends.torch.decode import _finish
    from bastion.backends.torch.runner import _session

    ticks = iter(range(1, 1 << 30))
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    ids = [list(tok(t)["input_ids"]) for t in json.loads(PROMPTS_FILE.read_text())[:2]]
    report = _finish(
        _session(
            load_target(TARGET_DIR, "cpu"),
            None,
            "ar",
            ids,
            batch_size=1,
            max_new_tokens=6,
            sampling=None,
            seed=0,
            eos_token_id=None,
            cost_model=None,
            record_traces=None,
            trace_metadata=None,
            dense_trace=False,
            verifier=None,
            repeats=1,
            warmup=0,
            predict_cycles=None,
            policy_spec=None,
            clock=lambda: float(next(ticks)),
        )
    )
    steps = report.samples
    assert len(steps) == 2 * 5  # AR at B = 1: one step per token after the first
    for i, record in enumerate(report.records):
        decode = record.tpot_s * (record.output_len - 1)
        cycles = sum(s.cycle_s for s in steps[5 * i : 5 * (i + 1)])
        # ≥: nothing outside the steps; ≤ a few readings: the last step's own tail, after the
        # request's last token, is the step's but not the request's
        assert decode <= cycles <= decode + 4, (i, decode, cycles)


def test_measure_truth_times_the_calibration_sessions_into_a_truth() -> None:
    """``bastion truth measure``'s timing alone: the calibration sessions in lockstep, fitted as
    the twin fits them, into a truth whose every step kind the simulator can price."""
    from transformers import AutoTokenizer

    from bastion.backends.torch.twin import measure_truth

    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    cal = [list(tok(t)["input_ids"]) for t in json.loads(CALIBRATION_PROMPTS_FILE.read_text())]
    measured = measure_truth(
        load_target(TARGET_DIR, "cpu"),
        DRAFTER_DIR,
        cal[:2],
        batch_sizes=(1,),
        repeats=1,
        max_new_tokens=8,
        policies=CALIBRATION,
    )
    assert {"ar", "chain", "tree"} <= set(measured.verify), set(measured.verify)
    assert measured.meta["steps"] > 0 and measured.meta["device"] == "cpu"
    for kind, n in (("ar", 1), ("chain", 16), ("tree", 16)):
        assert 0 < measured.verify_s(kind, [n], [60]) < 1.0


@pytest.mark.parametrize("target", [None, "model", object()])
def test_a_target_that_is_not_a_model_is_refused_by_name(target: object) -> None:
    """The fuzzer found measure_truth(None, …) raising AttributeError from inside; the twin's,
    the dense recorder's and the cost model resolver's targets are checked as generate's are."""
    from bastion.backends.torch.prepare import resolve_cost_model
    from bastion.backends.torch.record import dense_marginals
    from bastion.backends.torch.twin import measure_truth
    from bastion.errors import ArgumentError

    calls = [
        lambda: measure_truth(target, Path(DRAFTER_DIR), [[1, 2, 3]]),
        lambda: run_twin(target, Path(DRAFTER_DIR), [[1, 2, 3]], [[4, 5, 6]]),
        lambda: dense_marginals(target, None, [1, 2, 3], 1),
        lambda: resolve_cost_model(target, None, None, None, 8),
    ]
    for call in calls:
        with pytest.raises(ArgumentError, match="target"):
            call()
