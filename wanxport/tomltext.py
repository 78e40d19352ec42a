"""TOML text to a table, with every way the parser can fail reported as one error type.

Scenario files, the daemon's config and the torch site config are read from
files a user (or an attacker) wrote. ``tomllib`` recurses once per nesting
level, so ``[[[[...`` a thousand deep raises ``RecursionError`` rather than
``TOMLDecodeError``; the callers catch one exception and name their file.
"""

from __future__ import annotations

import tomllib
from typing import Any

TOMLDecodeError = tomllib.TOMLDecodeError


def loads_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``, raising ``TOMLDecodeError`` for nesting too deep to parse as well."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise TOMLDecodeError("arrays or tables nested too deeply") from None
