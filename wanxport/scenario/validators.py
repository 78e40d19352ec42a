"""Field validators for the scenario parser: each converts one TOML value or says why not.

The parser walks the TOML document with explicit field tables, so that every
key is known (unknown keys are errors naming their full path) and every error
carries the field path. A validator returns the converted value or raises
``Invalid(path, what is wrong, what would be valid)``; the parser turns that
into one ``ScenarioError`` line naming the file as well.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

Validator = Callable[[object, str], Any]
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


class Invalid(Exception):
    """One field is unusable: its dotted path, the problem, and what would be valid."""

    def __init__(self, path: str, problem: str, valid: str) -> None:
        super().__init__(path, problem, valid)
        self.path = path
        self.problem = problem
        self.valid = valid


def describe(value: object) -> str:
    """A short rendering of a bad value with its TOML kind, for error messages."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        type(value), "table" if isinstance(value, dict) else "array"
    )
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({kind})"


def number(lo: float, hi: float, lo_open: bool = False, unit: str = "") -> Validator:
    """A finite int-or-float in [lo, hi] (or (lo, hi] when ``lo_open``)."""
    bound = (
        f"{'>' if lo_open else '>='} {lo:g}"
        if hi == math.inf
        else (f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    )
    valid = f"a number {bound}{unit}"

    def check(value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(path, f"expected a number, got {describe(value)}", valid)
        result = float(value)
        too_low = result <= lo if lo_open else result < lo
        if not math.isfinite(result) or too_low or result > hi:
            raise Invalid(path, f"out of range: {value!r}", valid)
        return result

    return check


def integer(lo: int, hi: int) -> Validator:
    """An integer (not a boolean) in [lo, hi]."""
    valid = f"an integer in [{lo}, {hi}]"

    def check(value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(path, f"expected an integer, got {describe(value)}", valid)
        if not lo <= value <= hi:
            raise Invalid(path, f"out of range: {value!r}", valid)
        return value

    return check


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(path, f"expected a boolean, got {describe(value)}", "true or false")
    return value


def text(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise Invalid(path, f"expected a string, got {describe(value)}", "a quoted string")
    return value


def name(value: object, path: str) -> str:
    """A path name: short and safe to use in interface and namespace names."""
    result = text(value, path)
    if not _NAME_RE.match(result):
        raise Invalid(
            path,
            f"invalid name {result!r}",
            "1-32 characters of letters, digits, '_', '.', '-', starting with a letter or digit",
        )
    return result


def table(value: object, path: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise Invalid(path, f"expected a table, got {describe(value)}", "a TOML table")
    return value


def fields(
    raw: dict[str, object],
    path: str,
    spec: Mapping[str, Validator],
    required: tuple[str, ...] = (),
    hints: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Validate every key of ``raw`` against ``spec``; unknown or missing keys are errors.

    ``hints`` says, per required key, what a valid value looks like.
    """
    prefix = f"{path}." if path else ""
    for key in raw:
        if key not in spec:
            raise Invalid(f"{prefix}{key}", "unknown key", f"valid keys here: {', '.join(spec)}")
    for key in required:
        if key not in raw:
            raise Invalid(f"{prefix}{key}", "missing required field", (hints or {}).get(key, key))
    return {key: spec[key](value, f"{prefix}{key}") for key, value in raw.items()}
