"""The ``wanxport`` command.

Every subcommand lives in a module of this package with one entry point,
``register(subparsers)``: it adds its parser(s) with ``set_defaults(func=...)``,
where ``func(args)`` returns the exit status and raises ``UsageError`` for
mistakes the user can fix. Usage errors (bad arguments, a bad scenario file)
print one line and exit 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from wanxport import __version__
from wanxport.usage import USAGE_ERROR, UsageError

from . import bench, daemon, gateway, sim
from .arguments import (
    UsageParser,
    add_step_arguments,
    apply_step_arguments,
    site_pair_argument,
    size_argument,
)

__all__ = ["add_step_arguments", "apply_step_arguments", "build_parser", "main", "site_pair_argument",
           "size_argument"]

#: In the order ``wanxport --help`` lists them.
SUBCOMMANDS = (sim, bench, gateway, daemon)


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="wanxport", description="Multipath WAN transport for training shards.")
    parser.add_argument("--version", action="version", version=f"wanxport {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=UsageParser)
    sub.required = True
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except UsageError as exc:
        print(f"wanxport {args.command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("wanxport: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
