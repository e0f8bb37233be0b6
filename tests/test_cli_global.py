"""The ``bastion`` front end: --version, global options after the sub-command, defaults in help."""

from __future__ import annotations

import pytest

import bastion
from bastion.cli import build_parser, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"bastion {bastion.__version__}"


@pytest.mark.parametrize("argv", [["--verbose", "tree"], ["tree", "--verbose"], ["tree"]])
def test_verbose_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert getattr(args, "verbose", False) == ("--verbose" in argv)


def test_every_subcommand_help_shows_defaults() -> None:
    parser = build_parser()
    text = parser._subparsers._group_actions[0].choices["simulate"].format_help()  # type: ignore[union-attr]
    assert "(default: qwen3-8b)" in text and "(default: 8)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
