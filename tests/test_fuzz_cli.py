"""Hypothesis over command lines: any argv ends in exit 0 or 2, never in another exception.

For each sub-command an argv is drawn from the sub-command's own option names (read from the
parser) and a small alphabet of hostile values: negative, zero, huge, NaN and infinite numbers,
empty and comma-only lists, malformed policy specs, and paths that are a directory, a binary
file, a path under a regular file or missing. It runs in-process through
:func:`bastion.cli.main` under an alarm that turns a hang into a failure. The only exceptions
allowed out are ``SystemExit`` from argparse (status 2, or 0 for ``--help``); a
:class:`BastionError` must come back as status 2 with one ``bastion: error:`` line.

The expensive work behind a command line that passes every check (probing the machine,
calibrating, training, loading a model, the demo, a simulation, an experiment, a workload
fit) is replaced by a stub that stops the run:
reaching it counts as "accepted", which is what the fuzzer asks about. Examples per sub-command:
100 by default, 300 with ``CI`` set.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.cli import build_parser, main
from bastion.errors import BastionError
from tests.guards import HANG_GUARD_S, hang_guard

EXAMPLES = 300 if os.environ.get("CI") else 100


class _ReachedWork(Exception):
    """Raised by the stubs: the command line passed every check and the work would start."""


def _stop(*args: object, **kwargs: object) -> None:
    raise _ReachedWork


# modules whose heavy entry points the stubs replace (module path, attribute)
_STUBS = (
    ("bastion.cost.probe", "probe_profile"),
    ("bastion.cost.calibration", "calibrate_or_load"),
    ("bastion.demo.train", "train_target"),
    ("bastion.demo.train", "train_drafter"),
    ("bastion.demo.run", "run_demo"),
    ("bastion.backends.torch", "load_target"),
    ("bastion.sim.simulate", "simulate"),
    ("bastion.sim.experiments", "run_experiment"),
    ("bastion.sim.workload_fit", "fit_traces"),
)

SUBCOMMANDS = (
    ("tree",),
    ("hw", "list"),
    ("hw", "show"),
    ("hw", "probe"),
    ("cost",),
    ("calibrate",),
    ("validate",),
    ("generate",),
    ("demo",),
    ("train",),
    ("simulate",),
    ("experiment",),
    ("workload", "list"),
    ("workload", "show"),
    ("workload", "fit"),
)


def _parser_for(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


INTEGERS = ["-1", "0", "1", "2", "3", "64", str(10**12), str(-(2**70))]
NUMBERS = ["-1", "0", "1", "2", "3", "64", str(10**12), "nan", "inf", "-inf", "1e30", "0.5", "-0.5"]
WORDS = ["", "abc", ",,,", "1,2", "1,,x", "chain:-1", "chain:0", "fixed:3", "ar", "chain", "target"]
NAMES = ["qwen3-8b", "h100-sxm", "vidur", "synthetic", "cpu", "drafter", "budget-sweep", "math"]
PATHS = ["{dir}", "{bin}", "{under_file}", "{missing}", "{csv}", "{target}", "{fresh}"]
VALUES = st.sampled_from(NUMBERS + WORDS + NAMES + PATHS)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from bastion.demo import TARGET_DIR

    root = tmp_path_factory.mktemp("fuzz")
    (root / "bin").write_bytes(b"\x00\xff\xfe binary")
    (root / "csv").write_text("num_tokens,attn_pre_proj\n1,0.1\n2,0.2\n")
    (root / "dir").mkdir()
    return {
        "dir": str(root / "dir"),
        "bin": str(root / "bin"),
        "under_file": str(root / "bin" / "x.toml"),
        "missing": str(root / "missing" / "x.json"),
        "csv": str(root / "csv"),
        "target": str(TARGET_DIR),
        "fresh": str(root / "fresh"),
    }


def _guarded() -> contextlib.AbstractContextManager[None]:
    return hang_guard(HANG_GUARD_S, "a command line")


@st.composite
def _values(draw: st.DrawFn, action: argparse.Action) -> str:
    """A hostile value that fits the option's kind (nine times in ten), or any junk at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(VALUES)
    if action.type is int:
        return draw(st.sampled_from(INTEGERS))
    if action.type is float:
        return draw(st.sampled_from(NUMBERS))
    if action.choices:
        return draw(st.sampled_from([str(c) for c in action.choices] + ["nope"]))
    return draw(st.sampled_from(WORDS + NAMES + PATHS))


@st.composite
def argvs(draw: st.DrawFn, path: tuple[str, ...]) -> list[str]:
    parser = _parser_for(path)
    options = [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and a.dest != "verbose"
    ]
    argv = list(path)
    for a in parser._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            argv.append(draw(_values(a)))  # a positional: hw show NAME, train WHAT
    for action in draw(st.lists(st.sampled_from(options), max_size=5)) if options else []:
        argv.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0 and draw(st.integers(0, 9)):  # now and then a missing value
            argv.append(draw(_values(action)))
    return argv


@pytest.mark.parametrize("path", SUBCOMMANDS, ids=" ".join)
def test_cli_fuzz(path: tuple[str, ...], paths: dict[str, str]) -> None:
    import importlib

    if path[0] == "generate":
        pytest.importorskip("torch")
    with pytest.MonkeyPatch.context() as mp:
        for module, name in _STUBS:
            with contextlib.suppress(ImportError):  # no torch: those commands stop earlier
                mp.setattr(importlib.import_module(module), name, _stop)
        mp.setenv("BASTION_CALIBRATION_DIR", str(Path(paths["dir"]) / "cal"))

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            database=None,
        )
        @given(argvs(path))
        def run(argv: list[str]) -> None:
            args = [a.format(**paths) for a in argv]
            err = io.StringIO()
            rc: int | None = None
            with (
                _guarded(),
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(io.StringIO()),
            ):
                try:
                    rc = main(args)
                except SystemExit as exc:  # argparse: bad syntax (2) or --help (0)
                    assert exc.code in (0, 2), (args, exc.code)
                    return
                except _ReachedWork:
                    return
                except BastionError as exc:  # main must have caught it
                    raise AssertionError(f"{args}: BastionError escaped main: {exc}") from exc
            assert rc in (0, 2), (args, rc)
            if rc == 2:
                lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
                assert lines and lines[-1].startswith("bastion: error: "), (args, err.getvalue())

        run()
