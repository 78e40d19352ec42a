"""A collective running at a site, as a watcher (a metrics scrape) sees it."""

from __future__ import annotations

from dataclasses import dataclass

from .message import Call


@dataclass(frozen=True)
class InFlight:
    """A collective running at this site: its call, its start (monotonic clock), the bytes it
    has sent and received so far (whole messages) and the members it still waits for."""

    call: Call
    started_s: float
    sent_bytes: int
    received_bytes: int
    waiting_for: tuple[int, ...]  # member ranks
