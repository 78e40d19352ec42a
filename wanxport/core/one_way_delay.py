"""Forward queueing delay of a path, from the receiver's arrival timestamps.

A round trip carries two queues: the forward one, which this path's own
sending builds, and the one its acknowledgements wait in on the way back —
with traffic flowing both ways, the *other* direction's data. RTT alone cannot
tell them apart, so a sender whose acks queue behind the peer's bulk data
sees a "standing queue" it did not build, counts random losses as congestion
and backs off for nothing. The receiver reports when the largest packet it
acknowledges arrived, on its own clock (RECEIVE_TIME frame). Arrival minus
departure is the one-way delay plus an unknown but constant clock offset, so
its rise above its windowed minimum is the forward queue alone; what the RTT
holds beyond that and the minimum RTT is the way back (LEDBAT, RFC 6817, uses
the same difference for the same reason).

Clock drift between the gateways (tens of ppm) moves the offset by well under
a millisecond per 10 s window, far below the queue thresholds that read this.
"""

from __future__ import annotations

import math

#: Window of the minimum one-way delay; the same as the minimum RTT's.
BASE_WINDOW_S = 10.0


class OneWayDelay:
    """Forward queueing delay (``queue_s``) and the return path's excess (``return_s``)."""

    __slots__ = ("has_sample", "queue_s", "return_s", "_base_s", "_base_at", "_next_base_s",
                 "_next_base_at")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (the path was re-established, maybe over another route)."""
        self.has_sample = False
        self.queue_s = 0.0  # latest one-way delay above its minimum
        self.return_s = 0.0  # latest RTT beyond the minimum RTT and the forward queue
        self._base_s = math.inf
        self._base_at = 0.0
        # The minimum since the last half-window: it takes over when the base ages
        # out, so a route that got longer is followed within about one window.
        self._next_base_s = math.inf
        self._next_base_at = 0.0

    def update(self, sent_at: float, received_at_peer: float, min_rtt_s: float, now: float) -> None:
        """One sample: a packet we sent at ``sent_at`` arrived at ``received_at_peer`` (the
        peer's clock), and its acknowledgement is here at ``now``."""
        raw = received_at_peer - sent_at
        if now - self._base_at > BASE_WINDOW_S:
            self._base_s, self._base_at = self._next_base_s, self._next_base_at
            self._next_base_s = math.inf
        if raw <= self._base_s:
            self._base_s, self._base_at = raw, now
            self._next_base_s = math.inf
        if raw <= self._next_base_s or now - self._next_base_at > BASE_WINDOW_S / 2:
            self._next_base_s, self._next_base_at = raw, now
        self.has_sample = True
        self.queue_s = raw - self._base_s
        self.return_s = max(0.0, now - sent_at - min_rtt_s - self.queue_s)
