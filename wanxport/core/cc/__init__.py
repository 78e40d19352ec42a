"""Congestion controllers by name.

As in aioquic, controllers are pluggable: a factory is registered under a
name and sessions create one controller per path from the configured name.
Built in: "bbr" (the default; rate-based, tolerant of random loss), "cubic"
(RFC 9438, for comparison) and "fixed" (a provisioned rate).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from wanxport.core.cc.base import CongestionController
from wanxport.core.cc.bbr import BbrCongestionController
from wanxport.core.cc.cubic import CubicCongestionController
from wanxport.core.cc.fixed import FixedRateCongestionController

__all__ = [
    "DEFAULT_CONGESTION_CONTROL",
    "CongestionController",
    "available_congestion_controls",
    "create_congestion_control",
    "register_congestion_control",
]

#: Factory signature: keyword-only ``mss_bytes`` plus controller-specific options.
CongestionControlFactory = Callable[..., CongestionController]

DEFAULT_CONGESTION_CONTROL = "bbr"

_FACTORIES: dict[str, CongestionControlFactory] = {}


def register_congestion_control(name: str, factory: CongestionControlFactory) -> None:
    """Make ``factory`` available as ``name`` (re-registering a name replaces it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"congestion control name must be a non-empty string, got {name!r}")
    _FACTORIES[name] = factory


def available_congestion_controls() -> list[str]:
    """Registered names, sorted."""
    return sorted(_FACTORIES)


def create_congestion_control(name: str, *, mss_bytes: int, **options: Any) -> CongestionController:
    """Create the controller registered as ``name``.

    Unknown names and unknown options raise ValueError naming what is valid,
    because both usually come from a user's configuration file.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(
            f"unknown congestion control {name!r}; valid: {', '.join(available_congestion_controls())}"
        )
    _check_options(name, factory, options)
    try:
        return factory(mss_bytes=mss_bytes, **options)
    except TypeError as exc:  # a factory whose signature could not be read
        raise ValueError(f"bad options for congestion control {name!r}: {exc}") from None


def _check_options(name: str, factory: CongestionControlFactory, options: dict[str, Any]) -> None:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins without a signature: let the factory judge
        return
    if "mss_bytes" not in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # no usable signature (e.g. a compiled class): the factory judges
    valid = sorted(
        n
        for n, p in params.items()
        if n != "mss_bytes"
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )
    for key in options:
        if key not in valid:
            raise ValueError(
                f"unknown option {key!r} for congestion control {name!r}; "
                f"valid: {', '.join(valid) or '(none)'}"
            )


register_congestion_control("bbr", BbrCongestionController)
register_congestion_control("cubic", CubicCongestionController)
register_congestion_control("fixed", FixedRateCongestionController)
