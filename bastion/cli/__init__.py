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
    "bastion.cli.demo_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bastion",
        description="Budget-aware tree speculative decoding: trees, cost models, simulation.",
    )
    parser.add_argument("--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
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
