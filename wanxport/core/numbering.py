"""Wire packet numbers for core packets that go out as several datagrams.

Why: the sans-IO core spends Python time per *packet* (scheduling, sent-packet
records, acknowledgement processing). It decides per burst — a core packet of
``k`` MTU-sized segments, ``SessionConfig.chunk_bytes = k * segment`` — and the
data path cuts the segments, the way a NIC does TSO. Each datagram is still a
real protocol packet with its own wire packet number (the nonce and the
replay window need that): the session numbers core packet ``P`` of a path
``[start(P), start(P + 1))`` on the wire (``Transmit.first_pn``, ``count``)
and translates the peer's ACK ranges back here: a core packet counts as
acknowledged only when *all* of its datagrams are, and the datagrams of a
partly acknowledged one are confirmed one by one. The receiver needs no
mapping — it acknowledges wire numbers — so the wire format is unchanged.

With ``k = 1`` the mapping is the identity and the core sees exactly what it
would see without this layer.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence

from wanxport.wire.frames import AckFrame

#: Keep at most this many core packets' mapping per path; older ones are no
#: longer outstanding (an ACK that names them translates to nothing).
MAX_TRACKED = 1 << 20
#: Spans below the oldest packet of interest are dropped in runs of at least this many.
FORGET_AT_LEAST = 1024


class WireNumbering:
    """Core packet number -> first wire packet number, for one path."""

    __slots__ = ("_starts", "_base", "next_wire", "_last_ranges")

    def __init__(self) -> None:
        # _starts[i] is the first wire pn of core packet _base + i; the last
        # element is next_wire (a sentinel), so packet P spans
        # [_starts[P - _base], _starts[P - _base + 1]).
        self._starts = array("q", [0])
        self._base = 0
        self.next_wire = 0
        self._last_ranges: frozenset[tuple[int, int]] = frozenset()

    def allocate(self, core_pn: int, count: int) -> int:
        """Reserve ``count`` wire numbers for ``core_pn``; return the first.

        Core packet numbers of a path are taken in order, each exactly once.
        """
        expected = self._base + len(self._starts) - 1
        if core_pn != expected:
            raise ValueError(f"core packet {core_pn} out of order (expected {expected})")
        first = self.next_wire
        self.next_wire += count
        self._starts.append(self.next_wire)
        if len(self._starts) > MAX_TRACKED:
            drop = MAX_TRACKED // 2
            del self._starts[:drop]
            self._base += drop
        return first

    def reserve(self, count: int) -> int:
        """Take ``count`` wire numbers that belong to no core packet; return the first.

        Only before the first core packet: later, the numbers would fall inside
        the previous packet's span and it could never be fully acknowledged.
        """
        if len(self._starts) != 1 or self._base != 0:
            raise ValueError("wire numbers can be reserved only before the first core packet")
        first = self.next_wire
        self.next_wire += count
        self._starts[0] = self.next_wire
        return first

    def cover(self, wire_ranges: tuple[tuple[int, int], ...]
              ) -> tuple[tuple[tuple[int, int], ...], list[tuple[int, int, int]]]:
        """What inclusive wire ranges cover: the inclusive core-pn ranges of the packets all
        of whose datagrams they cover, and the packets they cover only partly, each as
        ``(core_pn, first, last)`` (datagram indices within the packet); range order kept.

        Only a range's two ends can cut a packet, so this is two bisections a range
        (one pass for both answers: this runs for every ACK a sender gets).
        """
        starts, base = self._starts, self._base
        top = len(starts) - 2  # the newest packet's index; -1 before the first
        whole: list[tuple[int, int]] = []
        parts: list[tuple[int, int, int]] = []
        for lo, hi in wire_ranges:
            if top < 0 or hi < starts[0] or lo >= starts[-1]:
                continue
            i = max(bisect_right(starts, lo) - 1, 0)  # the packet lo falls in (or the first)
            j = min(bisect_right(starts, hi) - 1, top)  # the packet hi falls in (or the newest)
            begin = starts[i]
            end = starts[j + 1] - 1
            first = i if begin >= lo else i + 1
            last = j if end <= hi else j - 1
            if first <= last:
                whole.append((base + first, base + last))
            if i == j:
                if first > last:  # the one packet, cut at either end
                    parts.append((base + i, max(lo, begin) - begin, min(hi, end) - begin))
                continue
            if first > i:
                parts.append((base + i, lo - begin, starts[i + 1] - 1 - begin))
            if last < j:
                parts.append((base + j, 0, hi - starts[j]))
        return tuple(whole), parts

    def unseen(self, wire_ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        """The ranges that the previous ACK of this path did not carry exactly so (order kept).

        An ACK repeats up to 32 ranges so that a lost ACK loses nothing; on a
        lossy path most of them are the previous ACK's, unchanged. A range
        applied once has nothing more to say: wire numbers are never reused,
        so the packets it covers, wholly or partly, are the same ones, and a
        gap that closes late (reordering) changes the range. Only changed
        ranges are translated, which was most of a lossy sender's ACK work.
        """
        last = self._last_ranges
        self._last_ranges = frozenset(wire_ranges)
        return tuple(r for r in wire_ranges if r not in last)

    def first_wire(self, core_pn: int) -> int:
        """The first wire number of ``core_pn`` (0 below the tracked ones, next_wire above)."""
        index = core_pn - self._base
        if index < 0:
            return 0
        starts = self._starts
        return starts[index] if index < len(starts) else self.next_wire

    def __len__(self) -> int:
        """Core packets whose spans are kept (tests: the mapping stays bounded)."""
        return len(self._starts) - 1

    def forget_below(self, core_pn: int) -> None:
        """Drop the spans of core packets below ``core_pn`` (no ACK can tell about them
        any more), once they are most of the array: a session that lives for months
        keeps what is outstanding, not every packet up to ``MAX_TRACKED``. Amortised:
        each span is deleted once, in runs at least as long as what remains.

        Called for each batch of ACKs (``translate_fresh``) and for each packet nothing tracks
        (``Transmitter``): a receiver sends mostly acknowledgements, which are never
        acknowledged, so a path of its may see no ACK for hours."""
        drop = min(core_pn - self._base, len(self._starts) - 1)
        if drop >= FORGET_AT_LEAST and 2 * drop >= len(self._starts):
            del self._starts[:drop]
            self._base += drop

    def translate_fresh(self, frames: Sequence[AckFrame], oldest_core_pn: int
                        ) -> tuple[tuple[tuple[int, int], ...], list[tuple[int, int, int]], int]:
        """What this path's ACKs of one batch (wire numbers, arrival order) say that earlier
        ACKs did not, in core terms.

        Returns the inclusive core-pn ranges of the whole core packets they cover
        (empty: none), the partly covered ones (both as ``cover``) and the ACK delay
        (us) that goes with them: the newest ACK's, the one acknowledging the highest
        wire number (the last of equals). Ranges come
        highest first; those wholly below ``oldest_core_pn`` (the oldest packet an ACK
        can still tell the sender about) and those the previous ACK carried unchanged
        repeat what earlier ACKs said -- most of every ACK -- and are skipped.

        Why a batch: a sender drains several ACKs of a path at once (about 1.25 a
        drain on loopback), and each repeats most of the previous one's ranges. Their
        fresh ranges, merged, are translated once, and the loss detector, the rate
        sample and the controller then see one acknowledgement instead of one per ACK
        -- the same acknowledged set, as if only the newest ACK had arrived and carried
        everything the older ones did.
        """
        self.forget_below(oldest_core_pn)
        floor = self.first_wire(oldest_core_pn)
        fresh: list[tuple[int, int]] = []
        delay_us = 0
        top = -1
        for frame in frames:
            ranges = frame.ranges
            if ranges and ranges[0][1] >= top:
                top, delay_us = ranges[0][1], frame.ack_delay_us
            kept = 0
            while kept < len(ranges) and ranges[kept][1] >= floor:
                kept += 1
            fresh.extend(self.unseen(ranges[:kept]))
        if not fresh:
            return (), [], delay_us
        merged = tuple(fresh) if len(frames) == 1 else merge_ranges(fresh)
        whole, parts = self.cover(merged)
        return whole, parts, delay_us


def merge_ranges(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The union of inclusive ranges as disjoint, non-adjacent ranges, highest first
    (the order and shape of one ACK frame's ranges)."""
    ranges.sort()
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    out.reverse()
    return tuple(out)
