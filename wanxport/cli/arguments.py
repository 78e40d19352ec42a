"""Argument types and shared options of the ``wanxport`` subcommands (and the emulation CLI)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from wanxport.units import parse_size
from wanxport.usage import USAGE_ERROR, UsageError


class UsageParser(argparse.ArgumentParser):
    """An argument parser whose mistakes exit with the usage status and one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def size_argument(text: str) -> int:
    """argparse type: a positive size such as 64MiB (shared by the emulation CLI)."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 bytes")
    return value


def site_pair_argument(text: str) -> tuple[str, str]:
    """argparse type: two site names, ``FROM,TO`` (shared by the emulation CLI)."""
    names = [name.strip() for name in text.split(",")]
    if len(names) != 2 or not all(names):
        raise argparse.ArgumentTypeError(f"expected two site names FROM,TO, e.g. east,west; got {text!r}")
    return (names[0], names[1])


def _number(convert: Callable[[str], Any], kind: str, accept: Callable[[Any], bool],
            bounds: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text (else "must be KIND"), then check it is in ``bounds``."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {bounds}")
        return value

    return parse


seed_argument = _number(int, "a whole number", lambda v: 0 <= v < 1 << 63, "between 0 and 2^63-1")
_steps = _number(int, "a whole number", lambda v: v >= 1, "at least 1")
_think_ms = _number(float, "a number of milliseconds", lambda v: 0.0 <= v < float("inf"),
                    "a finite number >= 0 (milliseconds)")


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """``--steps`` and ``--think-ms`` (shared by the emulation CLI)."""
    parser.add_argument("--steps", type=_steps, metavar="N",
                        help="exchange the size N times on one session, as training steps do "
                             "(default: the scenario's [transfer] steps)")
    parser.add_argument("--think-ms", type=_think_ms, metavar="MS",
                        help="compute time between learning a step verified and submitting the next "
                             "(default: the scenario's [transfer] think_ms)")


def apply_step_arguments(scenario: Any, args: argparse.Namespace) -> Any:
    """The scenario with ``--steps``/``--think-ms`` applied; UsageError (one line) if refused."""
    if args.steps is None and args.think_ms is None:
        return scenario
    try:
        return scenario.with_transfer(steps=args.steps, think_ms=args.think_ms)
    except ValueError as exc:
        raise UsageError(f"--steps/--think-ms: {exc}") from None
