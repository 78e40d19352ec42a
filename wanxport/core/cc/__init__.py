"""Congestion controllers by name.

As in aioquic, controllers are pluggable and registered by name; as in
quinn-proto, what is registered is a config class, not a constructor. A name
and its options (from a file or a command line) become a validated config
object once, with :func:`cc_config`; the session then asks that object for
one controller per path (``config.build(context)``), the same way for every
controller. Built in: "bbr" (:class:`BbrConfig`, the default; rate-based,
tolerant of random loss), "cubic" (:class:`CubicConfig`, RFC 9438, for
comparison), "fixed" (:class:`FixedConfig`, a provisioned rate) and "ledbat"
(:class:`LedbatConfig`, a scavenger for background bulk that yields to queueing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wanxport.core.cc.base import CcConfig, CcContext, CongestionController, PathGroup
from wanxport.core.cc.bbr_config import BbrConfig
from wanxport.core.cc.cubic import CubicConfig
from wanxport.core.cc.fixed import FixedConfig
from wanxport.core.cc.ledbat import LedbatConfig

__all__ = [
    "DEFAULT_CONGESTION_CONTROL",
    "BbrConfig",
    "CcConfig",
    "CcContext",
    "CongestionController",
    "CubicConfig",
    "FixedConfig",
    "LedbatConfig",
    "PathGroup",
    "available_congestion_controls",
    "cc_config",
    "register_congestion_control",
]

DEFAULT_CONGESTION_CONTROL = "bbr"

_CONFIGS: dict[str, type[CcConfig]] = {}


def register_congestion_control(name: str, config_class: type[CcConfig]) -> None:
    """Make ``config_class`` available as ``name`` (re-registering a name replaces it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"congestion control name must be a non-empty string, got {name!r}")
    if not (isinstance(config_class, type) and issubclass(config_class, CcConfig)):
        raise ValueError(f"congestion control {name!r} must be registered with a CcConfig subclass, "
                         f"got {config_class!r}")
    _CONFIGS[name] = config_class


def available_congestion_controls() -> list[str]:
    """Registered names, sorted."""
    return sorted(_CONFIGS)


def cc_config(name: str, options: Mapping[str, Any] | None = None) -> CcConfig:
    """The validated config of the controller registered as ``name``.

    Unknown names, unknown or missing options and bad values raise ValueError
    naming what is valid, because all of them usually come from a user's file.
    """
    config_class = _CONFIGS.get(name)
    if config_class is None:
        raise ValueError(
            f"unknown congestion control {name!r}; valid: {', '.join(available_congestion_controls())}"
        )
    options = options or {}
    fields = {f.name: f for f in dataclasses.fields(config_class) if f.init}  # type: ignore[arg-type]
    for key, value in options.items():
        if key not in fields:
            raise ValueError(f"unknown option {key!r} for congestion control {name!r}; "
                             f"valid: {', '.join(sorted(fields)) or '(none)'}")
        _check_type(name, key, fields[key].type, value)
    for key, spec in fields.items():
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        if required and key not in options:
            raise ValueError(f"congestion control {name!r} needs option {key}")
    return config_class(**options)


#: What a file's value must be for a field of each simple type. Checked here, not only in
#: the configs' __post_init__, because a mypyc-compiled config converts or rejects a value
#: of the wrong type in its constructor, before __post_init__ could name the option.
_OPTION_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "bool": ((bool,), "true or false"),
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
}


def _check_type(name: str, key: str, annotation: object, value: object) -> None:
    type_name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    kind = _OPTION_KINDS.get(type_name)
    if kind is None:
        return  # another type: the config's own checks judge it
    types, description = kind
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ValueError(f"{name} option {key} must be {description}, got {value!r}")


register_congestion_control("bbr", BbrConfig)
register_congestion_control("cubic", CubicConfig)
register_congestion_control("fixed", FixedConfig)
register_congestion_control("ledbat", LedbatConfig)
