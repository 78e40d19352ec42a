"""SIGHUP: apply what changed in the config file, keep everything else running.

As ``wg syncconf`` does for WireGuard peers: the new file is validated whole
first (a bad one changes nothing and is reported in one log line), then only the
differences are applied. Peers and their paths, limits, key rotation, cipher and
controller are read by each new session, so replacing the config object applies
them; paths of our own, and the peers' data ports (``ports.py``), are bound or
retired live (a running session keeps the sockets it has; what a reload adds is
bound before the new config is taken, or the reload is refused); a renewed
certificate is loaded for new sessions. What is bound once per process (data directory, API socket, metrics
address, the CA) waits for a restart, and the log says so.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from .config import ConfigError, DaemonConfig, check_receive_group, describe, load_config

if TYPE_CHECKING:
    from .service import GatewayDaemon

log = logging.getLogger(__name__)

AT_RESTART = ("data_dir", "api_socket", "api_tcp", "api_clients", "metrics", "ca")


def reload(daemon: GatewayDaemon) -> bool:
    """Re-read ``daemon.config.source``; True when the new config was taken."""
    old = daemon.config
    if old.source is None:
        return False
    try:
        new = load_config(old.source)
        check_receive_group(new)
    except ConfigError as exc:
        log.error("reload refused, the running config stays: %s", exc)
        return False
    later = [name for name in AT_RESTART if getattr(new, name) != getattr(old, name)]
    if later:
        log.warning("reload: %s changed; taken at the next restart", ", ".join(later))
        new = dataclasses.replace(new, **{name: getattr(old, name) for name in later})
    listener = daemon.listener
    if listener is not None:
        try:
            plan = listener.peer_ports.prepare(new.peers, new.listen)
        except OSError as exc:
            log.error("reload refused, the running config stays: peers' data ports: %s", exc)
            return False
        try:
            listener.change_paths(new.listen)
        except OSError as exc:
            listener.peer_ports.abort(plan)
            log.error("reload refused, the running config stays: listen: %s", exc)
            return False
        listener.peer_ports.commit(plan)
        try:
            listener.reload_identity(new.identity)
        except (ValueError, OSError) as exc:
            log.error("reload: the certificate stays: %s", exc)
            new = dataclasses.replace(new, identity=old.identity)
    _log_peers(old, new)
    daemon.config = new
    return True


def _log_peers(old: DaemonConfig, new: DaemonConfig) -> None:
    before = {p.name: p for p in old.peers}
    after = {p.name: p for p in new.peers}
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    moved = sorted(n for n in after.keys() & before.keys() if after[n] != before[n])
    log.info("reloaded: %s (peers added: %s, removed: %s, paths changed: %s)", describe(new),
             ", ".join(added) or "none", ", ".join(removed) or "none", ", ".join(moved) or "none")
