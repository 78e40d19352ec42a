"""SIGHUP (or ``POST /v1/reload``): apply what changed in the config file, keep everything else running.

As ``wg syncconf`` does for WireGuard peers: the new file is validated whole
first (a bad one changes nothing and is reported in one log line), then only the
differences are applied. Rate caps (``[limits] rate_mbps``, a peer's ``rate_mbps``)
are set on the running sessions at once (``service._apply_rates``); peers and their
paths, the receive budget, key rotation, cipher, controller and DSCP are read by each
new session, so replacing the config object applies them (a peer whose paths or
ports changed gets a new session after its current transfer); paths of our own, and
the peers' data ports (``ports.py``), are bound or retired live (a running session
keeps the sockets it has; what a reload adds is bound before the new config is
taken, or the reload is refused); a renewed certificate is loaded for new sessions.
What is bound or sized once per process (site name, data directory, API socket and
clients, metrics address, the CA, the number of concurrent transfers) waits for a
restart.

The log gets ONE line with what changed, old -> new, and what waits for a restart
("reload: limits.rate_mbps 150 -> 40; peer gw-b rate_mbps 60 -> 30"), and the
API's answer carries the same list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from wanxport.gateway.config import Address, GatewayOptions, format_endpoint

from .config import ConfigError, DaemonConfig, PeerConfig, check_receive_group, load_config
from .listener import ListenChangeRefused

log = logging.getLogger(__name__)

AT_RESTART = ("site", "data_dir", "api_socket", "api_tcp", "api_clients", "metrics", "ca")
AT_RESTART_LIMITS = ("concurrent_transfers",)  # the daemon's slots are sized at start


@dataclass
class ReloadResult:
    """What a reload did: taken or refused (``error``), the changes, what waits for a restart."""

    taken: bool
    changes: list[str] = field(default_factory=list)
    at_restart: list[str] = field(default_factory=list)
    error: str | None = None


def certificate_digest(identity: Path) -> str | None:
    """The identity certificate's SHA-256 (None: unreadable), to tell a renewed one."""
    try:
        return hashlib.sha256(identity.with_name(identity.name + ".pem").read_bytes()).hexdigest()
    except OSError:
        return None


class ReloadableListener(Protocol):
    """What a reload changes on the listener: its ports and paths, its options, its identity."""

    options: GatewayOptions

    def change_listen(self, peers: Sequence[PeerConfig], listens: Sequence[Address]) -> None: ...

    def reload_identity(self, identity: Path) -> None: ...


class Reloadable(Protocol):
    """What a reload reads and replaces of the daemon."""

    config: DaemonConfig
    identity_digest: str | None

    @property
    def listener(self) -> ReloadableListener | None: ...


def reload(daemon: Reloadable) -> ReloadResult:
    """Re-read ``daemon.config.source`` and take what can be taken live."""
    old = daemon.config
    if old.source is None:
        return ReloadResult(False, error="the config was not read from a file")
    try:
        new = load_config(old.source)
        check_receive_group(new)
    except ConfigError as exc:
        log.error("reload refused, the running config stays: %s", exc)
        return ReloadResult(False, error=str(exc))
    later = [name for name in AT_RESTART if getattr(new, name) != getattr(old, name)]
    later += [f"limits.{name}" for name in AT_RESTART_LIMITS
              if getattr(new.limits, name) != getattr(old.limits, name)]
    new = dataclasses.replace(new, **{name: getattr(old, name) for name in later if "." not in name})
    if any(name.startswith("limits.") for name in later):
        new = dataclasses.replace(new, limits=dataclasses.replace(
            new.limits, **{name: getattr(old.limits, name) for name in AT_RESTART_LIMITS}))
    listener = daemon.listener
    renewed = False
    if listener is not None:
        try:
            listener.change_listen(new.peers, new.listen)
        except ListenChangeRefused as exc:
            log.error("reload refused, the running config stays: %s", exc)
            return ReloadResult(False, error=str(exc))
        listener.options = new.gateway_options()  # what sessions the peers dial get from now on
        digest = certificate_digest(new.identity)
        try:
            listener.reload_identity(new.identity)
            renewed = digest != daemon.identity_digest
            daemon.identity_digest = digest
        except (ValueError, OSError) as exc:
            log.error("reload keeps the running certificate: %s", exc)
            new = dataclasses.replace(new, identity=old.identity)
    changes = differences(old, new, renewed)
    result = ReloadResult(True, changes, [f"{name} (needs a restart)" for name in later])
    line = "; ".join(changes + result.at_restart) or "no change"
    (log.warning if later else log.info)("reload: %s", line)
    daemon.config = new
    return result


def differences(old: DaemonConfig, new: DaemonConfig, renewed: bool = False) -> list[str]:
    """What changed from ``old`` to ``new``, one "key old -> new" (or "peer X added") each."""
    before, after = _settings(old), _settings(new)
    changes = [f"{key} {before[key]} -> {after[key]}" for key in before
               if key in after and before[key] != after[key]]
    old_peers, new_peers = {p.name for p in old.peers}, {p.name for p in new.peers}
    changes += [f"peer {name} added" for name in sorted(new_peers - old_peers)]
    changes += [f"peer {name} removed" for name in sorted(old_peers - new_peers)]
    if renewed:
        changes.append("identity certificate renewed (new sessions)")
    return changes


def _mbps(caps: float | tuple[float, ...] | None) -> str:
    if caps is None:
        return "none"
    if isinstance(caps, tuple):
        return _mbps(caps[0]) if len(set(caps)) == 1 else "[" + ", ".join(_mbps(c) for c in caps) + "]"
    return f"{caps / 1e6:g}"


def _settings(config: DaemonConfig) -> dict[str, str]:
    """Every setting a reload may change, by the name the config file gives it."""
    out = {"listen": ", ".join(format_endpoint(a) for a in config.listen),
           "limits.rate_mbps": _mbps(config.limits.rate_cap_bps),
           "limits.memory_budget": str(config.limits.memory_bytes),
           "transfer.checkpoint_bytes": str(config.piece_bytes),
           "transfer.drain_seconds": f"{config.drain_s:g}",
           "transfer.warm_seconds": f"{config.warm_s:g}",
           "transfer.stall_seconds": f"{config.stall_s:g}",
           "transfer.cipher": config.cipher,
           "keys.rotate_bytes": str(config.rotation.bytes),
           "keys.rotate_seconds": f"{config.rotation.seconds:g}",
           "congestion.controller": config.congestion_control,
           "network.dscp": str(config.dscp),
           "receive.umask": f"{config.receive.umask:04o}",
           "receive.recv_group": str(config.receive.group),
           "identity": str(config.identity)}
    for peer in config.peers:
        out.update(_peer_settings(peer))
    return out


def _peer_settings(peer: PeerConfig) -> dict[str, str]:
    prefix = f"peer {peer.name}"
    return {f"{prefix} paths": ", ".join(format_endpoint(a) for a in peer.paths),
            f"{prefix} rate_mbps": _mbps(peer.rate_caps_bps),
            f"{prefix} dscp": str(peer.dscp),
            f"{prefix} data_ports": str(list(peer.data_ports or ())) if peer.data_ports else "auto"}
