"""Human-readable sizes and rates.

Sizes appear in scenario files, configs and CLI arguments ("1GiB", "512 MiB").
Parsing is strict and case-sensitive (``MB`` is 10^6 bytes, ``MiB`` is 2^20;
``mb`` is refused rather than guessed, because a wrong guess silently changes a
measurement by 8x or 1000x). Errors are one line listing the valid units.
"""

from __future__ import annotations

import math
import re

SIZE_UNITS: dict[str, int] = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}

_VALID = ", ".join(SIZE_UNITS)
_SIZE_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Return a byte count from an int or a string such as ``"1.5GiB"`` or ``"10 MB"``.

    A fractional result is refused unless it is a whole number of bytes, so
    "1.5B" is an error while "1.5KiB" (1536) is fine.
    """
    if isinstance(text, bool):
        raise ValueError(f"size must be an integer or a string like '1GiB', got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0 bytes, got {text}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size must be an integer or a string like '1GiB', got {text!r}")
    match = _SIZE_RE.match(text)
    if match is None:
        raise ValueError(f"cannot parse size {text!r}; expected a number and an optional unit ({_VALID})")
    unit = match.group("unit") or "B"
    if unit not in SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}; valid units: {_VALID}")
    num = match.group("num")
    multiplier = SIZE_UNITS[unit]
    if "." not in num:
        return int(num) * multiplier
    whole, _, frac = num.partition(".")
    # Exact decimal arithmetic: float would turn "1.1TB" into 1099999999999.9999.
    scale: int = 10 ** len(frac)
    numerator = int(whole or "0") * scale + int(frac or "0")
    value, rest = divmod(numerator * multiplier, scale)
    if rest:
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return value


def format_size(n: int | float) -> str:
    """Binary-prefixed size for people: ``1536 -> '1.50 KiB'``, ``100 -> '100 B'``."""
    if n < 0:
        return "-" + format_size(-n)
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n = n / 1024
        if n < 1024:
            return f"{n:.2f} {unit}"
    return f"{n / 1024:.2f} TiB"


def format_rate(bps: float) -> str:
    """Decimal-prefixed bit rate for people: ``2.5e8 -> '250.0 Mb/s'``."""
    if math.isinf(bps) or math.isnan(bps):
        return f"{bps} b/s"
    if bps < 0:
        return "-" + format_rate(-bps)
    for unit, scale in (("Tb/s", 1e12), ("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} b/s"
