"""Bad command lines: every one is refused with exit status 2 and one ``bastion: error:`` line.

A table of hostile inputs per sub-command (negative seeds and counts, NaN and infinite floats,
sizes that would allocate terabytes, config files that are binary, nested thousands deep, a
directory, truncated; output paths that are a directory, under a regular file or unwritable).
Each runs in-process through :func:`bastion.cli.main` under an alarm that turns a hang into a
failure; the checks that refuse them run before any model is loaded or any work starts, so the
cases are fast. ``{name}`` placeholders are files made by the ``paths`` fixture.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.cli import main
from bastion.demo import DRAFTER_DIR, TARGET_DIR
from tests.guards import HANG_GUARD_S
from tests.guards import hang_guard as guarded

_BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def _config(**fields: object) -> str:
    return json.dumps({**_BASE, **fields})


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    files = {
        "bin": b"\x00\x01\xff\xfe\x80binary",
        "trunc": b'{"hidden_size": 64, "num_hidden',
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "deeptoml": b"a = " + b"[" * 100_000 + b"]" * 100_000,
        "list": b"[1, 2, 3]",
        "neg": _config(hidden_size=-4).encode(),
        "kv0": _config(num_key_value_heads=0).encode(),
        "kvstr": _config(num_key_value_heads="4").encode(),
        "experts_neg": _config(model_type="qwen3_moe", **{**_MOE, "num_experts": -1}).encode(),
        "experts_neg_dense": _config(num_experts=-1).encode(),
        "moe_size_neg": _config(**{**_MOE, "moe_intermediate_size": -8}).encode(),
        "moe_k_neg": _config(**{**_MOE, "num_experts_per_tok": -2}).encode(),
        "huge": _config(hidden_size=10**30).encode(),
        "sparse_str": _config(**_MOE, decoder_sparse_step="x").encode(),
        "tied_str": _config(tie_word_embeddings="yes").encode(),
        "csv": b"num_tokens,attn_pre_proj\n1,0.1\n",
    }
    out = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out[name] = str(tmp_path / name)
    (tmp_path / "adir.json").mkdir()
    (tmp_path / "adir.toml").mkdir()
    (tmp_path / "adir").mkdir()
    out.update(
        adir=str(tmp_path / "adir"),
        adir_json=str(tmp_path / "adir.json"),
        adir_toml=str(tmp_path / "adir.toml"),
        under_file=str(tmp_path / "bin" / "x.toml"),
        under_file_dir=str(tmp_path / "bin" / "sub"),
        unwritable=("/proc/bastion-cannot-write/x.toml"),
        unwritable_dir="/proc/bastion-cannot-write",
        target=str(TARGET_DIR),
        drafter=str(DRAFTER_DIR),
        fresh=str(tmp_path / "fresh"),
    )
    return out


@pytest.fixture
def hang_guard() -> Iterator[None]:
    with guarded(HANG_GUARD_S, "a bad input"):
        yield


_M = ["--model", "qwen3-8b", "--gpu", "h100-sxm"]
_G = ["generate", "--target", "{target}", "--drafter", "{drafter}", "--prompt-ids", "1,2"]
_V = ["validate", "--format", "vidur", *_M]

# (argv, a fragment the one-line message must contain)
CASES: list[tuple[list[str], str]] = [
    # tree
    (["tree", "--seed", "-1"], "--seed"),
    (["tree", "--show", "-1"], "--show"),
    (["tree", "--depth", "100000"], "--depth"),
    (["tree", "--depth", "0"], "--depth"),
    (["tree", "--k", "0"], "--k"),
    (["tree", "--k", "1000000"], "--k"),
    (["tree", "--budget", "0"], "--budget"),
    (["tree", "--budget", str(10**11)], "--budget"),
    (["tree", "--n-max", str(10**12)], "--n-max"),
    (["tree", "--n-max", "0"], "--n-max"),
    (["tree", "--top1", "nan"], "--top1"),
    (["tree", "--top1", "2"], "--top1"),
    (["tree", "--decay", "inf"], "--decay"),
    (["tree", "--decay", "-1"], "--decay"),
    (["tree", "--fixed-ms", "nan"], "--fixed-ms"),
    (["tree", "--fixed-ms", "0"], "--fixed-ms"),
    (["tree", "--node-us", "inf"], "--node-us"),
    (["tree", "--node-us", "-1"], "--node-us"),
    # hw
    (["hw", "show", "{bin}"], "UTF-8"),
    (["hw", "show", "{adir}/nope.toml"], "not found"),
    (["hw", "show", "{trunc}"], "not valid TOML"),
    (["hw", "show", "{adir_toml}"], "directory"),
    (["hw", "show", "{deeptoml}"], "nested too deeply"),
    (["hw", "show", "nope"], "unknown hardware profile"),
    (["hw", "probe", "--quick", "--output", "{adir}"], "directory"),
    (["hw", "probe", "--quick", "--output", "{under_file}"], "not a directory"),
    (["hw", "probe", "--quick", "--output", "{unwritable}"], "cannot write"),
    (["hw", "probe", "--quick", "--name", "../x"], "--name"),
    (["hw", "probe", "--quick", "--name", ""], "--name"),
    # cost
    (["cost", *_M, "--batch", "100000000"], "--batch"),
    (["cost", *_M, "--batch", "0"], "--batch"),
    (["cost", *_M, "--context", "-1"], "--context"),
    (["cost", *_M, "--context", str(10**20)], "--context"),
    (["cost", "--model", "{bin}", "--gpu", "h100-sxm"], "UTF-8"),
    (["cost", "--model", "{adir_json}", "--gpu", "h100-sxm"], "not found"),
    (["cost", "--model", "{deep}", "--gpu", "h100-sxm"], "nested too deeply"),
    (["cost", "--model", "{trunc}", "--gpu", "h100-sxm"], "not valid JSON"),
    (["cost", "--model", "{list}", "--gpu", "h100-sxm"], "JSON object"),
    (["cost", "--model", "{neg}", "--gpu", "h100-sxm"], "'hidden_size'"),
    (["cost", "--model", "{kv0}", "--gpu", "h100-sxm"], "'num_key_value_heads'"),
    (["cost", "--model", "{kvstr}", "--gpu", "h100-sxm"], "'num_key_value_heads'"),
    (["cost", "--model", "{experts_neg}", "--gpu", "h100-sxm"], "'num_experts'"),
    (["cost", "--model", "{experts_neg_dense}", "--gpu", "h100-sxm"], "'num_experts'"),
    (["cost", "--model", "{moe_size_neg}", "--gpu", "h100-sxm"], "'moe_intermediate_size'"),
    (["cost", "--model", "{moe_k_neg}", "--gpu", "h100-sxm"], "'num_experts_per_tok'"),
    (["cost", "--model", "{huge}", "--gpu", "h100-sxm"], "'hidden_size'"),
    (["cost", "--model", "{sparse_str}", "--gpu", "h100-sxm"], "'decoder_sparse_step'"),
    (["cost", "--model", "{tied_str}", "--gpu", "h100-sxm"], "'tie_word_embeddings'"),
    (["cost", "--model", "qwen3-8b", "--gpu", "{adir_toml}"], "directory"),
    (["cost", "--model", "qwen3-8b", "--gpu", "{adir}/x.toml"], "not found"),
    # calibrate
    (["calibrate", *_M, "--seed", "-1"], "--seed"),
    (["calibrate", *_M, "--repeats", "0"], "repeats"),
    (["calibrate", *_M, "--repeats", "100000000"], "--repeats"),
    (["calibrate", *_M, "--cache-dir", "{bin}"], "not a directory"),
    (["calibrate", *_M, "--cache-dir", "{unwritable_dir}"], "cannot write"),
    (["calibrate", *_M, "--backend", "nope"], "unknown backend"),
    (["calibrate", "--target", "{adir}"], "lacks config.json"),
    (["calibrate", "--model", "qwen3-8b"], "--gpu"),
    # validate
    ([*_V, "--measured", "{adir}"], "directory"),
    ([*_V, "--measured", "{bin}"], "readable CSV"),
    ([*_V, "--measured", "{csv}", "--max-tokens", "-1"], "--max-tokens"),
    ([*_V, "--measured", "{adir}/nope.csv"], "not found"),
    # generate: every flag is checked before a model loads
    ([*_G, "--temperature", "inf"], "--temperature"),
    ([*_G, "--temperature", "nan"], "--temperature"),
    ([*_G, "--temperature", "-1"], "--temperature"),
    ([*_G, "--top-p", "nan"], "--top-p"),
    ([*_G, "--top-p", "0"], "--top-p"),
    ([*_G, "--seed", "-1"], "--seed"),
    ([*_G, "--max-new-tokens", str(10**12)], "--max-new-tokens"),
    ([*_G, "--max-new-tokens", "0"], "--max-new-tokens"),
    ([*_G, "--batch-size", "0"], "--batch-size"),
    ([*_G, "--repeats", "0"], "--repeats"),
    ([*_G, "--warmup", "-1"], "--warmup"),
    ([*_G, "--draft-top-k", "0"], "--draft-top-k"),
    ([*_G, "--top-k", "-1"], "--top-k"),
    ([*_G, "--policy", "chain:0"], "chain:0"),
    ([*_G, "--policy", "chain:-1"], "chain:-1"),
    ([*_G, "--policy", ",,,"], ",,,"),
    ([*_G, "--record-trace", "{adir}"], "directory"),
    ([*_G, "--record-trace", "{under_file}"], "not a directory"),
    ([*_G, "--record-trace", "{unwritable}"], "cannot write"),
    ([*_G, "--record-trace", "{fresh}/a.json", "--record-trace", "{fresh}/b.json"], "2"),
    ([*_G, "--dense-trace"], "--record-trace"),
    (["generate", "--target", "{target}", "--prompt-ids", "99999999999999999999"], "2**63"),
    (["generate", "--target", "{target}", "--prompt-ids", "-1"], "2**63"),
    (["generate", "--target", "{target}", "--prompt-ids", "a,b"], "integers"),
    (["generate", "--target", "{adir}", "--prompt-ids", "1", "--policy", "ar"], "config.json"),
    # demo
    (["demo", "--num-prompts", "-1"], "--num-prompts"),
    (["demo", "--prompts", "0"], "--num-prompts"),
    (["demo", "--max-new-tokens", "-1"], "--max-new-tokens"),
    (["demo", "--repeats", "0"], "--repeats"),
    (["demo", "--warmup", "-1"], "--warmup"),
    (["demo", "--batch-size", "-1"], "--batch-size"),
    (["demo", "--batch-size", ",,,"], "--batch-size"),
    (["demo", "--batch-size", "100000000"], "--batch-size"),
    (["demo", "--policy", ",,,"], "--policy"),
    (["demo", "--policy", "chain:-1"], "chain:-1"),
    (["demo", "--record-trace", "{bin}"], "not a directory"),
    (["demo", "--record-traces", "{under_file_dir}"], "not a directory"),
    (["demo", "--record-traces", "{unwritable_dir}"], "cannot write"),
    # simulate, experiment, workload (the simulator's own checks)
    (["simulate", "--requests", "0"], "requests"),
    (["simulate", "--requests", "1", "--temperature", "inf"], "temperature"),
    (["simulate", "--requests", "1", "--temperature", "nan"], "temperature"),
    (["simulate", "--requests", "1", "--concurrency", "0"], "concurrency"),
    (["simulate", "--requests", "1", "--prefill-chunk", "-1"], "prefill_chunk"),
    (["simulate", "--requests", "1", "--arrival-rate", "nan"], "arrival_rate"),
    (["simulate", "--requests", "1", "--policy", "chain:-1"], "chain:-1"),
    (["simulate", "--requests", "1", "--out", "{bin}"], "not a directory"),
    (["simulate", "--requests", "1", "--out", "{under_file_dir}"], "not a directory"),
    (["simulate", "--requests", "1", "--model", "{bin}"], "UTF-8"),
    (["simulate", "--requests", "1", "--gpu", "{adir_toml}"], "directory"),
    (["simulate", "--requests", "1", "--trace", "{deep}"], "deep"),
    (["simulate", "--requests", "1", "--workload", "nope"], "nope"),
    (["simulate", "--requests", "1", "--seed", "-1"], "seed"),
    (["simulate", "--requests", "1", "--n-max", "1000000000000"], "n_max"),
    (["simulate", "--requests", "1", "--n-max", "0"], "n_max"),
    (["simulate", "--requests", "1", "--policy", ",,,"], "names no policy"),
    (["simulate", "--requests", "1", "--truth", "{bin}"], "UTF-8"),
    (["simulate", "--requests", "1", "--workload", "{bin}"], "UTF-8"),
    (["simulate", "--requests", "1", "--cost-model", "profiled:{fresh}/none.csv"], "no measured"),
    (["simulate", "--requests", "1", "--drafter-config", "{bin}"], "UTF-8"),
    (["simulate", "--requests", "1", "--calibration", "{bin}"], "UTF-8"),
    (["simulate", "--requests", "1", "--calibration", "{list}"], "JSON object"),
    (["simulate", "--requests", "1", "--calibration", "{trunc}"], "not valid JSON"),
    (["simulate", "--requests", "1", "--calibration", "{adir}/none.json"], "not found"),
    (["simulate", "--requests", "1", "--drafter-config", "{adir}/nope.json"], "not found"),
    (["simulate", "--requests", "1", "--drafter-config", "{drafter}"], "vocab_size 2048"),
    (
        ["simulate", "--requests", "1", "--model", "{target}", "--drafter-config", "{target}"],
        "not a DFlash drafter config: missing block_size",
    ),
    (["workload", "show", "{bin}"], "UTF-8"),
    (["experiment", "--config", "{bin}", "--out", "{fresh}"], "UTF-8"),
    (["experiment", "budget-sweep", "--workers", "-1", "--out", "{fresh}"], "--workers"),
    (["experiment", "budget-sweep", "--workers", "0", "--out", "{fresh}"], "--workers"),
    (["experiment", "nope", "--out", "{fresh}"], "nope"),
    (["experiment", "budget-sweep", "--out", "{bin}"], "not a directory"),
    (["workload", "show", "nope"], "nope"),
    (["workload", "fit", "{bin}", "--out", "{fresh}/w.toml"], "UTF-8"),
    (["workload", "fit", "{deep}", "--out", "{fresh}/w.toml"], "nested too deeply"),
    # train
    (["train", "target", "--steps", "-1", "--out", "{fresh}"], "--steps"),
    (["train", "target", "--steps", "0", "--out", "{fresh}"], "--steps"),
    (["train", "drafter", "--steps", "0", "--out", "{fresh}"], "--steps"),
    (["train", "target", "--seed", "-1", "--out", "{fresh}"], "--seed"),
    (["train", "target", "--out", "{bin}"], "not a directory"),
    (["train", "target", "--out", "{under_file_dir}"], "not a directory"),
    (["train", "target", "--out", "{unwritable_dir}"], "cannot write"),
    (["train", "target", "--out", "{target}"], "not empty"),
    (["train", "drafter", "--target", "{adir}", "--out", "{fresh}"], "config.json"),
]


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    ids = []
    for argv, _ in CASES:
        key = " ".join(argv).replace("{", "").replace("}", "")[:70]
        seen[key] = seen.get(key, 0) + 1
        ids.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return ids


@pytest.mark.parametrize(("argv", "fragment"), CASES, ids=_ids())
def test_bad_input_is_one_line_exit_2(
    argv: list[str],
    fragment: str,
    paths: dict[str, str],
    hang_guard: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if any("{unwritable" in a for a in argv) and not Path("/proc/self").is_dir():
        pytest.skip("needs a read-only /proc to stand for an unwritable folder")
    if argv[0] in ("demo", "train", "generate") and sys.platform == "win32":  # pragma: no cover
        pytest.skip("POSIX paths")
    args = [a.format(**paths) for a in argv]
    rc = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (args, err)
    assert len(lines) == 1 and lines[0].startswith("bastion: error: "), err
    assert "Traceback" not in err
    assert fragment in lines[0], (fragment, lines[0])


def test_output_paths_are_checked_before_the_work(
    paths: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """hw probe refuses a bad --out before measuring anything."""
    import bastion.cost.probe as probe

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("probed before checking --output")

    monkeypatch.setattr(probe, "probe_profile", never)
    assert main(["hw", "probe", "--output", paths["adir"]]) == 2


def test_train_steps_zero_is_not_the_default(paths: dict[str, str]) -> None:
    """--steps 0 used to mean the default 3000 steps; now it is refused, and nothing is made."""
    assert main(["train", "target", "--steps", "0", "--out", paths["fresh"]]) == 2
    assert not os.path.exists(paths["fresh"])
