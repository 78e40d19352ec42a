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
half the saved rate. ``resume_plan`` decides that per path. Applying it needs an
entry point on the core session (code outside the core may not touch a path's
controller, ``tests/test_core_stats.py``), which the core does not offer yet: until
it does, the daemon writes the cache and a new session's paths start with Startup
(docs/operations.md).
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
        for stats, address in zip(session.endpoint.session.stats().paths, paths, strict=False):
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

    def resume_plan(self, peer: str, paths: tuple[Address, ...], rtt_samples: list[float | None],
                    now: float | None = None) -> list[float]:
        """Per path, the rate its first round may use (0: search from scratch), given each
        path's first RTT sample in the new session."""
        now = time.time() if now is None else now
        known = self.entries.get(peer, {})
        plan = []
        for address, sample in zip(paths, rtt_samples, strict=True):
            entry = known.get(format_endpoint(address))
            plan.append(entry.resume_rate_bps()
                        if entry is not None and sample is not None and entry.usable(sample, now) else 0.0)
        return plan
