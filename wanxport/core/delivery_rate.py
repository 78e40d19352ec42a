"""Delivery-rate estimation for BBR-style congestion control.

Implements draft-cheng-iccrg-delivery-rate-estimation: every sent packet
remembers how much had been delivered when it left and when; when it is
acknowledged, the bytes delivered in between divided by the longer of the
send interval and the ack interval is a delivery-rate sample. Taking the
*longer* interval is what keeps ack compression and send bursts from
inflating the estimate.

Calls, per path:

* ``on_packet_sent(now, bytes_in_flight)`` for each packet, with the in-flight
  count *before* the packet is added; the returned :class:`PacketRateState`
  goes into the sent-packet record.
* ``on_packet_acked(state, size, now)`` for each newly acknowledged packet of
  an ack batch (each packet at most once; lost packets are simply never
  passed here).
* ``on_bytes_delivered(size, now)`` for the arrived part of a packet that is
  not wholly acknowledged (a segmented packet missing a datagram).
* ``generate_sample(now, min_rtt_s)`` once after the batch.
* ``on_app_limited(bytes_in_flight)`` when the sender has nothing to send
  although the congestion window would allow it, so samples taken while the
  pipe was not full are marked and cannot lower a max-filter estimate.

Time is an argument; nothing here reads a clock.
"""

from __future__ import annotations

_MIN_RTT_TOLERANCE = 1.0 - 1e-9


class PacketRateState:
    """Connection delivery state captured when one packet was sent."""

    __slots__ = ("delivered", "delivered_time", "first_sent_time", "is_app_limited", "sent_time")

    def __init__(
        self,
        delivered: int,
        delivered_time: float,
        first_sent_time: float,
        is_app_limited: bool,
        sent_time: float,
    ) -> None:
        self.delivered = delivered
        self.delivered_time = delivered_time
        self.first_sent_time = first_sent_time
        self.is_app_limited = is_app_limited
        self.sent_time = sent_time


class RateSample:
    """One delivery-rate sample, produced per ack batch."""

    __slots__ = (
        "delivery_rate_bps",
        "interval_s",
        "delivered_bytes",
        "prior_delivered",
        "is_app_limited",
        "rtt_s",
    )

    def __init__(
        self,
        delivery_rate_bps: float,
        interval_s: float,
        delivered_bytes: int,
        prior_delivered: int,
        is_app_limited: bool,
        rtt_s: float,
    ) -> None:
        #: Bits per second delivered over ``interval_s``.
        self.delivery_rate_bps = delivery_rate_bps
        self.interval_s = interval_s
        #: Bytes delivered over the interval.
        self.delivered_bytes = delivered_bytes
        #: Total delivered bytes when the newest acked packet was sent; with
        #: ``delivered_bytes`` this gives the running total, used to count rounds.
        self.prior_delivered = prior_delivered
        self.is_app_limited = is_app_limited
        #: Round trip of the most recently sent packet in the batch (ack delay included).
        self.rtt_s = rtt_s

    def __repr__(self) -> str:
        return (
            f"RateSample(rate={self.delivery_rate_bps:.6g}bps, interval={self.interval_s:.6g}s, "
            f"delivered={self.delivered_bytes}, prior={self.prior_delivered}, "
            f"app_limited={self.is_app_limited}, rtt={self.rtt_s:.6g}s)"
        )


class DeliveryRateEstimator:
    """Per-path delivery accounting that yields :class:`RateSample` objects."""

    __slots__ = (
        "delivered_bytes",
        "_delivered_time",
        "_first_sent_time",
        "_app_limited_until",
        "_has_data",
        "_prior_delivered",
        "_prior_time",
        "_sample_sent_time",
        "_send_elapsed",
        "_ack_elapsed",
        "_sample_app_limited",
    )

    def __init__(self) -> None:
        #: Total bytes acknowledged on this path.
        self.delivered_bytes = 0
        self._delivered_time = 0.0
        self._first_sent_time = 0.0
        # Delivered-byte count at which the current app-limited phase ends; 0 = not limited.
        self._app_limited_until = 0
        self._has_data = False
        self._prior_delivered = 0
        self._prior_time = 0.0
        self._sample_sent_time = 0.0
        self._send_elapsed = 0.0
        self._ack_elapsed = 0.0
        self._sample_app_limited = False

    @property
    def is_app_limited(self) -> bool:
        """True while packets sent now would produce app-limited samples."""
        return self._app_limited_until != 0

    def on_packet_sent(self, now: float, bytes_in_flight: int) -> PacketRateState:
        """Snapshot the delivery state for a packet sent at ``now``.

        ``bytes_in_flight`` excludes the packet itself. When nothing is in
        flight the send and ack clocks restart here, so an idle gap is not
        counted as a slow interval.
        """
        if bytes_in_flight <= 0:
            self._first_sent_time = now
            self._delivered_time = now
        return PacketRateState(
            self.delivered_bytes,
            self._delivered_time,
            self._first_sent_time,
            self._app_limited_until != 0,
            now,
        )

    def on_packet_acked(self, state: PacketRateState, size: int, now: float) -> None:
        """Account one newly acknowledged packet of the current ack batch."""
        self.delivered_bytes += size
        self._delivered_time = now
        # The sample describes the most recently sent packet of the batch: its
        # intervals are the freshest view of the path.
        if (
            not self._has_data
            or state.delivered > self._prior_delivered
            or (state.delivered == self._prior_delivered and state.sent_time > self._sample_sent_time)
        ):
            self._has_data = True
            self._prior_delivered = state.delivered
            self._prior_time = state.delivered_time
            self._sample_sent_time = state.sent_time
            self._sample_app_limited = state.is_app_limited
            self._send_elapsed = state.sent_time - state.first_sent_time
            self._ack_elapsed = now - state.delivered_time
            self._first_sent_time = state.sent_time

    def on_bytes_delivered(self, size: int, now: float) -> None:
        """Part of a packet that is not wholly acknowledged arrived (some datagrams of a
        segmented packet); pass the rest of it to ``on_packet_acked`` if it ever is.

        Without this a packet with one lost datagram in 16 counted as nothing
        delivered, and at 1 % datagram loss the estimate settled 15 % below the
        path's rate.
        """
        self.delivered_bytes += size
        self._delivered_time = now

    def generate_sample(self, now: float, min_rtt_s: float) -> RateSample | None:
        """Close the ack batch; return its rate sample or None if it has none.

        A batch whose interval is shorter than ``min_rtt_s`` is discarded: a
        packet cannot be delivered faster than one minimum round trip, so such
        an interval is an artefact (e.g. a spurious retransmission acked early)
        and would overestimate the rate.
        """
        if self._app_limited_until and self.delivered_bytes > self._app_limited_until:
            self._app_limited_until = 0
        if not self._has_data:
            return None
        self._has_data = False
        interval = max(self._send_elapsed, self._ack_elapsed)
        # (The tolerance keeps float noise from discarding intervals of exactly one min RTT.)
        if interval <= 0.0 or interval < min_rtt_s * _MIN_RTT_TOLERANCE:
            return None
        delivered = self.delivered_bytes - self._prior_delivered
        return RateSample(
            delivered * 8.0 / interval,
            interval,
            delivered,
            self._prior_delivered,
            self._sample_app_limited,
            now - self._sample_sent_time,
        )

    def on_app_limited(self, bytes_in_flight: int) -> None:
        """Mark the path application-limited until what is in flight now is delivered."""
        self._app_limited_until = max(self.delivered_bytes + bytes_in_flight, 1)
