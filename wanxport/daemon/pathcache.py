"""What each path to each peer has learned, kept on disk across restarts (like tcp_metrics).

``DATA_DIR/path-cache.json`` (a ``durable`` state file) holds, per peer and per the
peer's path address, the last *validated* figures of that path: delivery rate,
min RTT, smoothed RTT and when they were measured (wall-clock seconds, since the
file outlives the process). An estimate taken while the controller was still in
Startup is a search in progress, not a measurement, and is not saved. Nothing
about keys or packet numbers is ever written (a restarted session has new keys).

The reuse policy is the training steps' careful resume, ``core.warm`` (one policy for
steps, failover and restarts): an entry is a ``PathMemory``, used only when younger
than an hour and when the new session's first RTT sample on that path is within
20 % of the saved round trip (another route otherwise), and then at no more than
half the saved rate. ``resume`` hands each path's entry to the new session
(``core.session.Session.resume_path``), which applies or drops it at the path's
first acknowledgement: code outside the core never touches a controller
(``tests/test_core_stats.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from wanxport.core.warm import PathMemory
from wanxport.gateway.config import Address, format_endpoint
from wanxport.gateway.session import GatewaySession

from .durable import StateCorrupt, read_state, write_state

log = logging.getLogger(__name__)

# Controller states (``PathStats.cc_state``) that are a search, not a measurement: BBR's
# Startup, CUBIC's slow start.
SEARCHING = frozenset({"startup", "slow_start"})


class PathCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, PathMemory]] = {}
        try:
            body = read_state(path) or {}
            self.entries = {peer: {addr: PathMemory(**fields) for addr, fields in paths.items()}
                            for peer, paths in body.items()}
        except (StateCorrupt, TypeError, AttributeError) as exc:
            log.warning("path cache %s not used (%s): paths start from scratch", path, exc)

    def save(self, peer: str, paths: tuple[Address, ...], session: GatewaySession) -> int:
        """Record the session's validated paths; returns how many were saved."""
        now = time.time()
        saved = 0
        for stats, address in zip(session.stats().paths, paths, strict=False):
            if stats.cc_state in SEARCHING or stats.min_rtt_s is None or stats.srtt_s is None or \
                    not stats.bandwidth_bps > 0:
                log.debug("path %s to %s not saved: %s, min RTT %s, rate %s", stats.name, peer,
                          stats.cc_state, stats.min_rtt_s, stats.bandwidth_bps)
                continue
            self.entries.setdefault(peer, {})[format_endpoint(address)] = PathMemory(
                stats.bandwidth_bps, stats.min_rtt_s, stats.srtt_s, now)
            saved += 1
        if saved:
            body: dict[str, Any] = {p: {a: dataclasses.asdict(e) for a, e in paths_.items()}
                                    for p, paths_ in self.entries.items()}
            write_state(self.path, body)
        return saved

    def resume(self, peer: str, paths: tuple[Address, ...], session: GatewaySession) -> int:
        """Offer each path of a new session to ``peer`` its saved state; returns how many
        were offered (the core then resumes or drops each at its first acknowledgement)."""
        known = self.entries.get(peer, {})
        # Saved times are wall-clock (the file outlives the process); the session runs on its
        # driver's clock: carry each entry's age over.
        now_wall, now_session = time.time(), session.endpoint.clock()
        offered = 0
        for path_id, address in enumerate(paths):  # the session may have agreed to fewer
            entry = known.get(format_endpoint(address))
            if entry is None:
                continue
            on_session_clock = dataclasses.replace(entry, saved_at=entry.saved_at - now_wall + now_session)
            if session.resume_path(path_id, on_session_clock):
                offered += 1
        if offered:
            log.info("session to %s: %d paths resume carefully from the path cache", peer, offered)
        return offered
