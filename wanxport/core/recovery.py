"""Per-path acknowledgement processing and loss detection (RFC 9002 style).

Losses are detected per path with a packet threshold and a time threshold,
both of which widen when a loss turns out to be spurious (the packet was only
reordered), so paths with jitter-induced reordering do not retransmit in
vain. What was lost is handed back to the session, which re-sends it on
whichever path delivers first.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from wanxport.core.paths import Path
from wanxport.core.sent_packets import SentPacket

GRANULARITY_S = 0.001
MAX_REORDER_THRESHOLD = 1024
SPURIOUS_MEMORY_S = 0.25  # remember losses at least this long (and 3 smoothed RTTs)


def on_packet_sent(path: Path, packet: SentPacket) -> None:
    path.sent[packet.pn] = packet
    if packet.in_flight:
        path.cc.on_packet_sent(packet.sent_at, packet.size, path.bytes_in_flight)
        path.bytes_in_flight += packet.size
    path.stats.packets_sent += 1
    path.stats.bytes_sent += packet.size


def on_ack(path: Path, ranges: tuple[tuple[int, int], ...], ack_delay_s: float, now: float
           ) -> tuple[list[SentPacket], list[SentPacket]]:
    """Apply an ACK frame's ranges; return (newly acknowledged, newly lost) packets."""
    sent = path.sent
    acked: list[SentPacket] = []
    lowest = next(iter(sent), path.next_pn)
    top = path.next_pn - 1
    for lo, hi in ranges:
        hi = min(hi, top)
        if hi < lowest:
            break  # ranges are highest first: nothing below can be outstanding
        for pn in range(max(lo, lowest), hi + 1):
            packet = sent.pop(pn, None)
            if packet is not None:
                acked.append(packet)
    if path.recently_lost:
        _forget_old_losses(path, now)  # without new losses nothing else would prune them
        if path.recently_lost:
            _check_spurious(path, ranges)
    if not acked:
        return acked, []
    acked.reverse()  # ascending packet numbers
    largest = acked[-1]
    path.last_ack_at = now
    path.pto_count = 0
    if largest.pn > path.largest_acked:
        path.largest_acked = largest.pn
        if largest.ack_eliciting:
            path.rtt.update(now - largest.sent_at, ack_delay_s, now)
    acked_bytes = 0
    rate = path.rate
    for packet in acked:
        if packet.in_flight:
            path.bytes_in_flight -= packet.size
            acked_bytes += packet.size
            if packet.rate_state is not None:
                rate.on_packet_acked(packet.rate_state, packet.size - packet.credited, now)
    sample = rate.generate_sample(now, path.rtt.min_s)
    if sample is not None and not sample.is_app_limited:
        path.note_bandwidth(sample.delivery_rate_bps, now)
    elif sample is not None and sample.delivery_rate_bps > path.bandwidth_bps:
        path.note_bandwidth(sample.delivery_rate_bps, now)
    path.cc.on_ack(now, acked_bytes, path.rtt, sample, path.bytes_in_flight)
    lost = detect_losses(path, now)
    return acked, lost


def _check_spurious(path: Path, ranges: tuple[tuple[int, int], ...]) -> None:
    """A packet we declared lost was delivered after all (reordering): widen both thresholds.

    The remembered losses are also kept sorted by packet number, so each ACK
    range finds the ones it covers by bisection instead of every remembered
    loss being tested against every ACK.
    """
    pns = path.recently_lost_pns
    delivered: list[int] = []
    for lo, hi in ranges:
        i = bisect_left(pns, lo)
        while i < len(pns) and pns[i] <= hi:
            delivered.append(pns[i])
            i += 1
    for pn in delivered:
        _forget_loss(path, pn)
        path.stats.spurious_losses += 1
        gap = path.largest_acked - pn + 1
        path.reorder_threshold = min(max(path.reorder_threshold, gap), MAX_REORDER_THRESHOLD)
        path.time_threshold = min(path.time_threshold * 1.25, 4.0)


def _forget_loss(path: Path, pn: int) -> None:
    del path.recently_lost[pn]
    pns = path.recently_lost_pns
    del pns[bisect_left(pns, pn)]


def loss_delay_s(path: Path) -> float:
    return max(path.time_threshold * max(path.rtt.smoothed_s, path.rtt.latest_s), GRANULARITY_S)


def detect_losses(path: Path, now: float) -> list[SentPacket]:
    """Declare lost every packet below the largest acknowledged that is too old or too far behind."""
    largest = path.largest_acked
    if largest < 0:
        return []
    delay = loss_delay_s(path)
    cutoff_pn = largest - path.reorder_threshold
    lost: list[SentPacket] = []
    for pn, packet in path.sent.items():
        if pn >= largest:
            break
        # Same expression as loss_deadline(), so a timer firing at that deadline always
        # finds the packet lost (now - delay could round the other way).
        if pn <= cutoff_pn or packet.sent_at + delay <= now:
            lost.append(packet)
        else:
            break  # later packets are newer and closer to the largest acknowledged
    if lost:
        _remove_lost(path, lost, now)
    return lost


def loss_deadline(path: Path) -> float | None:
    """When the oldest outstanding packet below the largest acknowledged would time out."""
    for pn, packet in path.sent.items():
        if pn >= path.largest_acked:
            return None
        return packet.sent_at + loss_delay_s(path)
    return None


def declare_all_lost(path: Path, now: float) -> list[SentPacket]:
    """The path is suspected dead: everything in flight goes back to the session.

    Probes (not in flight, nothing to re-send) stay: the session keeps the last
    few, and an answer to any of them readmits the path.
    """
    lost = [packet for packet in path.sent.values() if packet.in_flight]
    if lost:
        _remove_lost(path, lost, now)
    return lost


def _remove_lost(path: Path, lost: list[SentPacket], now: float) -> None:
    lost_bytes = 0
    newest_sent = 0.0
    for packet in lost:
        del path.sent[packet.pn]
        if packet.in_flight:
            path.bytes_in_flight -= packet.size
            lost_bytes += packet.size
        newest_sent = max(newest_sent, packet.sent_at)
        if packet.pn not in path.recently_lost:
            insort(path.recently_lost_pns, packet.pn)
        path.recently_lost[packet.pn] = now
    path.stats.packets_lost += len(lost)
    _forget_old_losses(path, now)
    if lost_bytes:
        path.cc.on_loss(now, lost_bytes, path.bytes_in_flight, newest_sent, path.rtt)


def _forget_old_losses(path: Path, now: float) -> None:
    horizon = now - max(SPURIOUS_MEMORY_S, 3 * path.rtt.smoothed_s)
    stale: list[int] = []
    for pn, at in path.recently_lost.items():  # insertion order is time order
        if at >= horizon and len(path.recently_lost) - len(stale) <= 4096:
            break
        stale.append(pn)
    for pn in stale:
        _forget_loss(path, pn)
