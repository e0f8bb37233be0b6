"""The ``bastion`` command: a thin argparse front end over the library.

Each command group lives in its own module of this package and exposes
``register(subparsers) -> None``, which adds its sub-command(s) with ``set_defaults(func=...)``;
``func(args) -> int`` returns the exit status. Library errors (:class:`BastionError`) are
printed as one line on stderr with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from bastion.errors import BastionError

# Modules that contribute sub-commands, in help order.
COMMAND_MODULES: tuple[str, ...] = (
    "bastion.cli.tree_cmd",
    "bastion.cli.hw_cmd",
    "bastion.cli.cost_cmd",
    "bastion.cli.validate_cmd",
    "bastion.cli.generate_cmd",
    "bastion.cli.sim_cmd",
    "bastion.cli.workload_cmd",
    "bastion.cli.demo_cmd",
    "bastion.cli.twin_cmd",
)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default in ``--help`` (unless it is None or False, or already said)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default == []
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or text == argparse.SUPPRESS
        ):
            return action.help
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _version() -> str:
    from importlib import metadata

    import bastion

    try:
        return metadata.version("bastion")
    except metadata.PackageNotFoundError:  # running from a source tree without an install
        return bastion.__version__


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser`` (sub-commands and their actions), depth first."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases share a parser
                found += [child, *_subparsers(child)]
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bastion",
        description="Budget-aware tree speculative decoding: trees, cost models, simulation.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"bastion {_version()}")
    parser.add_argument("--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for child in _subparsers(parser):
        child.formatter_class = _HelpFormatter
        # global options are accepted after the sub-command too (`bastion simulate --verbose`)
        if "--verbose" not in child._option_string_actions:
            child.add_argument(
                "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except BastionError as exc:
        print(f"bastion: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `bastion … | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
