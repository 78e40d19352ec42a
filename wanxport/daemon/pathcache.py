"""What each path to each peer has learned, kept on disk across restarts (like tcp_metrics).

``DATA_DIR/path-cache.json`` (a ``durable`` state file) holds, per peer and per the
peer's path address, the last *validated* figures of that path: delivery rate,
min RTT, smoothed RTT and when they were measured (wall-clock seconds, since the
file outlives the process). An estimate taken while the controller was still in
Startup is a search in progress, not a measurement, and is not saved. Nothing
about keys or packet numbers is ever written (a restarted session has new keys).

The reuse policy is the training-steps careful resume: an entry is used only when
younger than an hour and when the new session's first RTT sample on that path is
within 20 % of the saved round trip (another route otherwise), and then at no
more than half the saved rate. ``resume_plan`` decides that per path; applying it
to the path's controller is the core's ``on_path_resume`` of the ``steps`` branch
(``core/warm.py``), which main does not have yet: until it lands, the daemon logs
the plan and the controller starts from scratch (docs/operations.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanxport.gateway.config import Address, format_endpoint
from wanxport.gateway.session import GatewaySession

from .durable import StateCorrupt, read_state, write_state

log = logging.getLogger(__name__)

MAX_AGE_S = 3600.0
RTT_TOLERANCE = 0.20
RESUME_SHARE = 0.5
# Controller states (``PathStats.cc_state``) that are a search, not a measurement: BBR's
# Startup, CUBIC's slow start.
SEARCHING = frozenset({"startup", "slow_start"})


@dataclass(frozen=True)
class PathEntry:
    rate_bps: float
    min_rtt_s: float
    srtt_s: float
    saved_at: float  # time.time()

    def usable(self, rtt_sample_s: float, now: float) -> bool:
        low = (1 - RTT_TOLERANCE) * self.min_rtt_s
        high = (1 + RTT_TOLERANCE) * max(self.srtt_s, self.min_rtt_s)
        return now - self.saved_at <= MAX_AGE_S and low <= rtt_sample_s <= high


class PathCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, PathEntry]] = {}
        try:
            body = read_state(path) or {}
            self.entries = {peer: {addr: PathEntry(**fields) for addr, fields in paths.items()}
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
                continue
            self.entries.setdefault(peer, {})[format_endpoint(address)] = PathEntry(
                stats.bandwidth_bps, stats.min_rtt_s, stats.srtt_s, now)
            saved += 1
        if saved:
            body: dict[str, Any] = {p: {a: vars(e) for a, e in paths_.items()}
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
            plan.append(RESUME_SHARE * entry.rate_bps
                        if entry is not None and sample is not None and entry.usable(sample, now) else 0.0)
        return plan
