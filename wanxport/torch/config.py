"""Where a site's wanxport endpoint lives: the named config of the ``"wanxport"`` process group.

``init_process_group("wanxport", store=..., rank=site, world_size=n_sites)`` only
carries a store, a rank and a size, so this site's identity, CA and path addresses
come from a small TOML file, named by ``pg_options=SiteConfig.load(path)`` or, for
launchers that cannot pass options (torchrun), by the ``WANXPORT_TORCH_CONFIG``
environment variable::

    identity = "pki/site-a"                          # cert + key prefix (wanxport certs)
    ca = "pki/ca.pem"
    paths = ["10.0.0.1:7500", "10.0.1.1:7500"]     # this site's endpoint, one HOST:PORT per path

Relative file names are taken from the config file's directory, so a config and its
PKI can move together. What the sites must know of each other (identity names and
path addresses) they exchange through the c10d store, so no file lists the peers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wanxport.tomltext import TOMLDecodeError, loads_toml

__all__ = ["CONFIG_ENV", "ConfigError", "SiteConfig"]

CONFIG_ENV = "WANXPORT_TORCH_CONFIG"


class ConfigError(ValueError):
    """A site config that is missing, unreadable or malformed (the message names the file and key)."""


def _check_path(spec: object, where: str) -> str:
    if not isinstance(spec, str):
        raise ConfigError(f"{where}: expected 'HOST:PORT', got {spec!r}")
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: expected 'HOST:PORT' with a port 1-65535, got {spec!r}")
    return spec


@dataclass(frozen=True)
class SiteConfig:
    """This site's wanxport endpoint: identity prefix, CA file and one ``HOST:PORT`` per path."""

    identity: Path
    ca: Path
    paths: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.paths:
            raise ConfigError("paths: a site needs at least one path")
        for i, spec in enumerate(self.paths):
            _check_path(spec, f"paths[{i}]")

    @classmethod
    def make(cls, identity: str | os.PathLike[str], ca: str | os.PathLike[str],
             paths: Sequence[str]) -> SiteConfig:
        return cls(Path(identity), Path(ca), tuple(paths))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SiteConfig:
        """Read a site config file (see the module docstring); ``ConfigError`` names what is wrong."""
        file = Path(path)
        try:
            data = loads_toml(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read the wanxport site config: {exc.strerror}") from exc
        except TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        unknown = sorted(set(data) - {"identity", "ca", "paths"})
        if unknown:
            raise ConfigError(f"{file}: unknown key(s) {', '.join(unknown)}; expected identity, ca, paths")
        for key in ("identity", "ca", "paths"):
            if key not in data:
                raise ConfigError(f"{file}: missing key {key!r}")
        if not isinstance(data["identity"], str) or not isinstance(data["ca"], str):
            raise ConfigError(f"{file}: identity and ca must be strings (file names)")
        if not isinstance(data["paths"], list):
            raise ConfigError(f"{file}: paths must be a list of 'HOST:PORT' strings")
        base = file.parent
        try:
            return cls(base / data["identity"], base / data["ca"], tuple(data["paths"]))
        except ConfigError as exc:
            raise ConfigError(f"{file}: {exc}") from None

    @classmethod
    def from_env(cls) -> SiteConfig:
        """The config named by ``WANXPORT_TORCH_CONFIG``."""
        name = os.environ.get(CONFIG_ENV)
        if not name:
            raise ConfigError(f"the 'wanxport' process group needs a site config: pass "
                              f"pg_options=SiteConfig.load(FILE) or set {CONFIG_ENV}=FILE")
        return cls.load(name)
