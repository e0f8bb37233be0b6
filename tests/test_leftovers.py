"""Temporary files of a killed writer are removed by the next run, never those of a live one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bastion import files
from bastion.files import TEMP_MARK, remove_leftovers, temp_prefix, write_text_atomic

CONFIG = """
name = "killed"
[grid]
policies = ["chain"]
seed = [0, 1]
requests = 1
output_len = 16
"""

# a sweep whose report phase stops, its temporary results.csv written, right before the rename
STOPS_IN_REPORT = textwrap.dedent(
    """
    import os, sys, time
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("results.csv"):
            print("REPORTING", flush=True)
            time.sleep(600)
        return real_replace(src, dst)

    os.replace = replace
    from bastion.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_a_dead_writers_temporary_file_is_removed_on_the_next_write(tmp_path: Path) -> None:
    dead = tmp_path / f".out.txt{TEMP_MARK}{files._HOST}.{_dead_pid()}.abc123"
    dead.write_text("half")
    dead_dir = tmp_path / f".model{TEMP_MARK}{files._HOST}.{_dead_pid()}.xyz"
    dead_dir.mkdir()
    live = tmp_path / (temp_prefix("other.txt") + "live")  # this process: still running
    live.write_text("in progress")
    foreign = tmp_path / f".x{TEMP_MARK}another-host.{_dead_pid()}.q"  # another host's writer
    foreign.write_text("theirs")
    mine = tmp_path / ".hidden"  # not ours at all
    mine.write_text("keep")
    write_text_atomic(tmp_path / "out.txt", "whole")
    assert not dead.exists() and not dead_dir.exists()
    assert live.exists() and foreign.exists() and mine.exists()
    assert (tmp_path / "out.txt").read_text() == "whole"
    assert remove_leftovers(tmp_path) == []  # nothing else to remove
    assert remove_leftovers(tmp_path / "missing") == []


def test_an_unmarked_directory_is_left_alone(tmp_path: Path) -> None:
    """Negative control: a name that only resembles the mark is not removed."""
    lookalike = tmp_path / f".out.txt.bastion-tmp-{files._HOST}-{_dead_pid()}.abc"
    lookalike.write_text("x")
    assert remove_leftovers(tmp_path) == []
    assert lookalike.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc semantics")
def test_kill_9_in_the_report_phase_leaves_nothing_after_the_next_run(tmp_path: Path) -> None:
    config = tmp_path / "killed.toml"
    config.write_text(CONFIG)
    out = tmp_path / "o"
    args = ["experiment", "--config", str(config), "--out", str(out), "--no-progress"]
    report = out / "killed"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-c", STOPS_IN_REPORT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the report phase is reached
        assert line.strip() == "REPORTING", proc.stderr.read() if proc.stderr else ""
        proc.kill()  # SIGKILL: no handler, no cleanup
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = [p.name for p in report.iterdir() if TEMP_MARK in p.name]
    assert left, "the killed report left no temporary file (the test did not kill mid-write)"
    assert not (report / "results.csv").exists()

    done = subprocess.run(
        [sys.executable, "-m", "bastion", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    hidden = sorted(p.name for p in report.rglob(".*"))
    assert hidden == [], f"temporary files stayed after the next run: {hidden}"
    # the header, then a row per policy (the AR baseline and chain) per seed: nothing lost
    assert (report / "results.csv").read_text().count("\n") == 1 + 2 * 2
