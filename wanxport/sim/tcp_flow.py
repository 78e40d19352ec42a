"""A simulated competing TCP-like flow: one reliable byte stream driven by a core controller.

Why: "wanxport takes no more than its share" needs a neighbour to share
with, and the neighbour operators care about is a TCP flow running BBR or
CUBIC. This is a model of one, built from the core's own parts so that the
controller is exactly the one wanxport runs (``core.cc``: ``bbr``, ``cubic``,
or any registered name):

- one path; a bulk sender that always has data (or ``size_bytes`` of it),
  segments of ``mss_bytes`` payload plus 52 header bytes (IPv4 + TCP with
  timestamps) on the wire;
- sending is ACK-clocked and windowed: a segment leaves only while
  ``bytes_in_flight + segment <= cwnd``, paced at the controller's rate;
- the receiver acknowledges every segment at once (no delayed ACKs) with the
  16 highest ranges of what it holds, SACK-style, in 64-byte ACKs;
- loss recovery is the core's RFC 9002 ``LossDetector`` (packet and time
  thresholds, RACK-like, with spurious-loss adaptation); a lost segment's
  bytes are re-sent under a new packet number, before new data;
- a retransmission timeout (the detector's PTO) declares everything in
  flight lost and re-sends it.

What it is not: Linux TCP. There is no receive window or autotuning limit,
no delayed or stretched ACKs, no TSO bursts, no PRR, no cwnd reset to one
segment on RTO (the controller's loss reaction applies instead), no
handshake, and the controller is wanxport's BBR (BBRv1 with its loss
departures, see ``core.cc.bbr``) or RFC 9438 CUBIC, not the kernel's. It is
faithful where fairness is decided — the controller's reaction to the shared
queue, ACK clocking, loss recovery — and optimistic elsewhere (it is never
receive-window limited).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from wanxport.core.cc import CcConfig, CcContext
from wanxport.core.delivery_rate import DeliveryRateEstimator
from wanxport.core.ranges import RangeSet
from wanxport.core.recovery import LossDetector
from wanxport.core.rtt import RttEstimator
from wanxport.core.sent_packets import SentPacket
from wanxport.sim.eventloop import EventLoop
from wanxport.sim.network import LinksFactory

__all__ = ["TcpLikeFlow"]

HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12
ACK_BYTES = 64
ACK_RANGES = 16
INITIAL_WINDOW_SEGMENTS = 10


class _Segment:
    __slots__ = ("pn", "offset", "length")

    def __init__(self, pn: int, offset: int, length: int) -> None:
        self.pn = pn
        self.offset = offset
        self.length = length


class _Ack:
    __slots__ = ("ranges",)

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        self.ranges = ranges  # inclusive (low, high), highest first, as LossDetector.on_ack takes


class TcpLikeFlow:
    """Sender and receiver of one simulated TCP-like flow over ``links`` (one path)."""

    def __init__(self, loop: EventLoop, links: LinksFactory, cc: CcConfig, *, mss_bytes: int = 1448,
                 size_bytes: int | None = None,
                 on_data: Callable[[float, int], None] | None = None) -> None:
        """``on_data(now, payload_bytes)`` is told of every data segment reaching the receiver."""
        if mss_bytes <= 0:
            raise ValueError(f"mss_bytes must be positive, got {mss_bytes!r}")
        self._loop = loop
        self._links = links(loop, self._on_ack_arrival, self._on_segment_arrival)
        self._mss = mss_bytes
        self._size = size_bytes
        self._on_data = on_data
        self.rtt = RttEstimator()
        self.rate = DeliveryRateEstimator()
        self.cc = cc.build(CcContext(mss_bytes=mss_bytes + HEADER_BYTES,
                                     initial_window_packets=INITIAL_WINDOW_SEGMENTS))
        self.detector = LossDetector(self.rtt, self.rate, self.cc)
        self._next_offset = 0
        self._resend: deque[tuple[int, int]] = deque()
        self._next_send_at = 0.0
        self._timer_gen = 0
        self._timer_at = float("inf")
        self._received = RangeSet()  # receiver: packet numbers
        self._stream = RangeSet()  # receiver: stream bytes
        self.started_at: float | None = None
        self.completed_at: float | None = None
        self.retransmitted_bytes = 0

    # -- sender ---------------------------------------------------------------

    def start(self) -> None:
        """Begin sending at the loop's current time."""
        self.started_at = self._loop.now
        self._links.start()
        self._next_send_at = self._loop.now
        self._pump()

    def _has_data(self) -> bool:
        return bool(self._resend) or self._size is None or self._next_offset < self._size

    def _pump(self) -> None:
        now = self._loop.now
        detector = self.detector
        while self._has_data():
            if detector.bytes_in_flight + self._mss + HEADER_BYTES > self.cc.cwnd_bytes:
                break  # window-limited: the next ACK clocks the next segment out
            if self._next_send_at > now:
                self._arm(self._next_send_at)
                return
            if self._resend:
                offset, length = self._resend.popleft()
                self.retransmitted_bytes += length
            else:
                offset = self._next_offset
                length = self._mss if self._size is None else min(self._mss, self._size - offset)
                self._next_offset += length
            size = length + HEADER_BYTES
            pn = detector.take_pn()
            state = self.rate.on_packet_sent(now, detector.bytes_in_flight)
            detector.on_packet_sent(SentPacket(pn, now, size, [(0, offset, length)], None, True, True, state))
            self._links.forward[0].send(_Segment(pn, offset, length), size)
            self._next_send_at = max(self._next_send_at, now) + size * 8.0 / self.cc.pacing_rate_bps
        if not self._has_data():
            self.rate.on_app_limited(detector.bytes_in_flight)
        self._arm(None)

    def _arm(self, pace_at: float | None) -> None:
        """One timer for pacing, the loss deadline and the retransmission timeout, whichever is first."""
        candidates = [t for t in (pace_at, self.detector.loss_deadline(), self.detector.pto_deadline(0.0))
                      if t is not None]
        at = min(candidates, default=float("inf"))
        if at == self._timer_at or at == float("inf"):
            return
        self._timer_gen += 1  # a pending wake-up at another time is void
        self._timer_at = at
        self._loop.call_at(at, self._on_timer, self._timer_gen)

    def _on_timer(self, generation: int) -> None:
        if generation != self._timer_gen:
            return
        self._timer_at = float("inf")
        now = self._loop.now
        detector = self.detector
        loss_at = detector.loss_deadline()
        pto_at = detector.pto_deadline(0.0)
        if loss_at is not None and loss_at <= now:
            self._requeue(detector.detect_losses(now))
        elif pto_at is not None and pto_at <= now:
            detector.on_pto()
            self._requeue(detector.declare_all_lost(now))
        self._pump()

    def _requeue(self, lost: list[SentPacket]) -> None:
        for packet in lost:
            for _, offset, length in packet.chunks or ():
                self._resend.append((offset, length))

    def _on_ack_arrival(self, path_index: int, packet: object, now: float) -> None:
        assert isinstance(packet, _Ack)
        _, lost, _ = self.detector.on_ack(packet.ranges, 0.0, now)
        self._requeue(lost)
        self._pump()

    # -- receiver -------------------------------------------------------------

    def _on_segment_arrival(self, path_index: int, packet: object, now: float) -> None:
        assert isinstance(packet, _Segment)
        received = self._received
        received.add(packet.pn, packet.pn + 1)
        self._stream.add(packet.offset, packet.offset + packet.length)
        if self.completed_at is None and self._size is not None and self._stream.total >= self._size:
            self.completed_at = now
        if self._on_data is not None:
            self._on_data(now, packet.length)
        ranges = tuple((start, end - 1) for start, end in received.last(ACK_RANGES))
        if len(received) > 4 * ACK_RANGES:
            received.discard_below(ranges[-1][0])
        self._links.reverse[0].send(_Ack(ranges), ACK_BYTES)

    @property
    def srtt_s(self) -> float:
        """The sender's smoothed RTT."""
        return self.rtt.smoothed_s

    @property
    def delivered_bytes(self) -> int:
        """Distinct stream bytes the receiver holds."""
        return self._stream.total
