"""What one transfer cost on its session: elapsed time, goodput, bytes per path.

A session's counters are cumulative (a warm session carries many transfers), so a
transfer's figures are the difference between a snapshot taken when it starts and
one taken when it ends. ``resent_bytes`` (retransmissions) and the per-path split
are what the results compare: a second transfer over a warm session against the
first, a resumed transfer's re-sent bytes against the unacknowledged ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from wanxport.gateway.session import GatewaySession


def _paths(session: GatewaySession) -> list[tuple[str, int, int]]:
    return [(p.name, p.payload_bytes, p.retransmitted_bytes) for p in session.stats().paths]


@dataclass
class Tally:
    session: GatewaySession
    started: float = field(default_factory=time.monotonic)
    _start: list[tuple[str, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._start = _paths(self.session)

    def finish(self, payload_bytes: int) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        end = {name: (sent, resent) for name, sent, resent in _paths(self.session)}
        rtts = {p.name: p.srtt_s for p in self.session.stats().paths}
        paths: list[dict[str, Any]] = []
        for name, sent0, resent0 in self._start:
            sent, resent = end.get(name, (sent0, resent0))
            paths.append({"name": name, "payload_bytes": sent - sent0,
                          "retransmitted_bytes": resent - resent0, "srtt_s": rtts.get(name)})
        return {"elapsed_s": round(elapsed, 4), "payload_bytes": payload_bytes,
                "goodput_bps": payload_bytes * 8 / elapsed if elapsed > 0 else 0.0,
                "sent_bytes": sum(p["payload_bytes"] for p in paths),
                "resent_bytes": sum(p["retransmitted_bytes"] for p in paths),
                "paths": paths}
