"""The pure-Python reference of the native ``Receiver``: open, replay-check, place, fold.

Why it exists: the receive side of the data path places DATA bytes straight
into registered shard buffers and tells the core once per *run* of datagrams
(``Session.receive_data_run``), handing only the other datagrams to Python as
plaintext. The Python data path and the simulator run this reference so they
drive the core with exactly the calls the native path makes; tests hold the
two implementations to identical records, controls, counters and buffer bytes
(``tests/test_wire_receiver.py``).

The per-datagram order follows the C code (``ext/datapath/receiver.c``):
first the demultiplexing by first byte (a path's socket is shared with its
QUIC control channel: QUIC always sets the fixed bit 0x40, our marker never
does, so such a datagram is handed back untouched, with its index in the
batch, and counted ``passed_quic``), header checks, the replay check before
any crypto, open, then placement; a packet number is recorded in the replay
window only once its datagram authenticated and was accepted. Failures never
raise: they are counted under the native counter names.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wanxport.wire.frames import DATA, DATA_OVERHEAD, MAX_OFFSET
from wanxport.wire.header import HEADER_LEN, KEY_PHASE_BIT, MARKER, MAX_PACKET_NUMBER, is_quic
from wanxport.wire.protection import Protection
from wanxport.wire.replay import ReplayWindow

MAX_UDP_PAYLOAD = 65507  # the largest UDP payload over IPv4 (the C receiver's bound too)
_HEADER = struct.Struct(">BBHIQ")
_DATA = struct.Struct(">BIQH")

COUNTERS = ("rejected_short", "rejected_marker", "rejected_path", "rejected_conn", "rejected_key",
            "rejected_auth", "rejected_replay", "rejected_frame", "accepted_data", "accepted_control",
            "opened_phase0", "opened_phase1", "passed_quic")

#: One run of placed DATA datagrams: (path_id, first_pn, count, shard_id, offset, length).
Run = tuple[int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class Placed:
    """One DATA datagram whose bytes were written into its shard's buffer."""

    path_id: int
    pn: int
    shard_id: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class OpenedControl:
    """An authenticated datagram that is not a placeable DATA datagram: the caller parses it."""

    path_id: int
    packet_number: int
    plaintext: bytes


@dataclass(frozen=True, slots=True)
class Processed:
    """One batch's outcome (the native ``ProcessResult``'s three parts)."""

    placed: list[Placed]
    controls: list[OpenedControl]
    quic: list[tuple[int, bytes]]  # (index in the batch, datagram): the control channel's


class _Shard:
    __slots__ = ("buffer", "starts", "ends", "received", "frozen")

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.starts: list[int] = []  # sorted, disjoint, not touching ranges [start, end)
        self.ends: list[int] = []
        self.received = 0
        self.frozen = 0

    def add(self, a: int, b: int) -> None:
        """Merge ``[a, b)`` into the received ranges (the C ``ranges_add``)."""
        starts, ends = self.starts, self.ends
        if a >= b:
            return
        if ends and ends[-1] == a:  # in-order arrival: the common case
            ends[-1] = b
            self.received += b - a
            return
        i = bisect_left(ends, a)  # first range ending at or after a
        if i == len(ends) or starts[i] > b:
            starts.insert(i, a)
            ends.insert(i, b)
            self.received += b - a
            return
        new_start, new_end, covered = min(starts[i], a), b, 0
        j = i
        while j < len(ends) and starts[j] <= b:
            covered += ends[j] - starts[j]
            new_end = max(new_end, ends[j])
            j += 1
        self.received += (new_end - new_start) - covered
        starts[i:j] = [new_start]
        ends[i:j] = [new_end]


class ReferenceReceiver:
    """Opens, replay-checks and places datagrams of one session direction."""

    def __init__(self, conn_id: int, n_paths: int) -> None:
        self.conn_id = conn_id
        self.keys: dict[int, Protection] = {}
        self._windows = [ReplayWindow() for _ in range(n_paths)]
        self._shards: dict[int, _Shard] = {}
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def set_key(self, phase: int, protection: Protection | None) -> None:
        if protection is None:
            self.keys.pop(phase & 1, None)
        else:
            self.keys[phase & 1] = protection

    def add_shard(self, shard_id: int, buffer: bytearray | memoryview) -> None:
        """Place DATA for ``shard_id`` into ``buffer`` (held until remove_shard)."""
        if shard_id in self._shards:
            raise ValueError(f"shard_id: {shard_id} is already registered")
        self._shards[shard_id] = _Shard(memoryview(buffer).cast("B"))

    def remove_shard(self, shard_id: int) -> None:
        del self._shards[shard_id]

    def freeze(self, shard_id: int, upto: int) -> None:
        """Never write below ``upto`` again (a duplicate is acknowledged, not copied)."""
        shard = self._shards[shard_id]
        if not 0 <= upto <= len(shard.buffer):
            raise ValueError(f"upto: {upto} outside [0, {len(shard.buffer)}]")
        shard.frozen = max(shard.frozen, upto)

    def ranges(self, shard_id: int) -> list[tuple[int, int]]:
        shard = self._shards[shard_id]
        return list(zip(shard.starts, shard.ends, strict=True))

    def received_bytes(self, shard_id: int) -> int:
        return self._shards[shard_id].received

    def process(self, datagrams: Iterable[bytes | memoryview]) -> Processed:
        """Every datagram of a batch, in order: the placed DATA ones, the opened others, and
        the QUIC-looking ones (index in the batch, bytes) for the control channel."""
        placed: list[Placed] = []
        controls: list[OpenedControl] = []
        quic: list[tuple[int, bytes]] = []
        for index, datagram in enumerate(datagrams):
            d = memoryview(datagram)
            if is_quic(d):
                self.counters["passed_quic"] += 1
                quic.append((index, bytes(d)))
            else:
                self._one(d, placed, controls)
        return Processed(placed, controls, quic)

    def _one(self, d: memoryview, placed: list[Placed], controls: list[OpenedControl]) -> None:
        counters = self.counters
        if not HEADER_LEN <= len(d) <= MAX_UDP_PAYLOAD:
            counters["rejected_short"] += 1
            return
        marker, flags, path_id, conn_id, pn = _HEADER.unpack_from(d, 0)
        if marker != MARKER or flags & ~KEY_PHASE_BIT or pn > MAX_PACKET_NUMBER:
            counters["rejected_marker"] += 1
            return
        if conn_id != self.conn_id:
            counters["rejected_conn"] += 1
            return
        if path_id >= len(self._windows):
            counters["rejected_path"] += 1
            return
        phase = flags & KEY_PHASE_BIT
        key = self.keys.get(phase)
        if key is None:
            counters["rejected_key"] += 1
            return
        if len(d) < HEADER_LEN + key.overhead:
            counters["rejected_short"] += 1
            return
        window = self._windows[path_id]
        if not window.check(pn):
            counters["rejected_replay"] += 1
            return
        plaintext = key.open(d[:HEADER_LEN], path_id, pn, d[HEADER_LEN:])
        if plaintext is None:
            counters["rejected_auth"] += 1
            return
        counters["opened_phase1" if phase else "opened_phase0"] += 1
        if len(plaintext) >= DATA_OVERHEAD and plaintext[0] == DATA:
            _, shard_id, offset, length = _DATA.unpack_from(plaintext, 0)
            if DATA_OVERHEAD + length > len(plaintext) or offset > MAX_OFFSET or length > MAX_OFFSET - offset:
                counters["rejected_frame"] += 1
                return
            shard = self._shards.get(shard_id) if DATA_OVERHEAD + length == len(plaintext) else None
            if shard is not None:
                if offset + length > len(shard.buffer):
                    counters["rejected_frame"] += 1
                    return
                shard.add(offset, offset + length)
                window.record(pn)
                end = offset + length
                if end > shard.frozen:  # below it: a duplicate of bytes already hashed
                    start = max(offset, shard.frozen)
                    skip = start - offset
                    shard.buffer[start:end] = plaintext[DATA_OVERHEAD + skip:DATA_OVERHEAD + length]
                placed.append(Placed(path_id, pn, shard_id, offset, length))
                counters["accepted_data"] += 1
                return
        window.record(pn)
        controls.append(OpenedControl(path_id, pn, bytes(plaintext)))
        counters["accepted_control"] += 1


def fold_runs(records: Sequence[Placed]) -> list[Run]:
    """Fold placed records into runs: same path and shard, consecutive packet numbers,
    contiguous bytes; in record order (the reference of ``native.fold_runs``)."""
    runs: list[Run] = []
    i, n = 0, len(records)
    while i < n:
        first = prev = records[i]
        total = first.length
        j = i + 1
        while j < n:
            cur = records[j]
            if (cur.path_id != prev.path_id or cur.shard_id != prev.shard_id or cur.pn != prev.pn + 1
                    or cur.offset != prev.offset + prev.length):
                break
            total += cur.length
            prev = cur
            j += 1
        runs.append((first.path_id, first.pn, j - i, first.shard_id, first.offset, total))
        i = j
    return runs
