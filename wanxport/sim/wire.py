"""The simulator's data path: a Transmit cut into the datagrams the sockets would send.

Why: the links must carry what the network carries — one datagram per wire
packet number, each lost or delayed on its own — or the simulator tests
another transport. ``DatagramCutter`` turns a core ``Transmit`` into its
datagrams: sealed bytes by the reference sealer (bytes mode), or
``VirtualDatagram`` descriptors of the same numbers, ranges and sizes
(virtual mode). ``VirtualReceiver`` is the virtual counterpart of the
reference receiver (``wire.receiver``): replay check, "placement" of DATA for
the shards the session opened, everything else handed over as control.
"""

from __future__ import annotations

from wanxport.core.config import SessionConfig
from wanxport.core.transmit import Transmit
from wanxport.sim.driver import Control, Run
from wanxport.wire.datapath import PacketSealer
from wanxport.wire.frames import DATA_OVERHEAD, DataFrame, Frame
from wanxport.wire.replay import ReplayWindow


class VirtualDatagram:
    """A datagram without bytes: DATA (``frames`` None) or a control datagram."""

    __slots__ = ("path_id", "pn", "shard_id", "offset", "length", "frames")

    def __init__(self, path_id: int, pn: int, shard_id: int, offset: int, length: int,
                 frames: list[Frame] | None) -> None:
        self.path_id = path_id
        self.pn = pn
        self.shard_id = shard_id
        self.offset = offset
        self.length = length
        self.frames = frames


class DatagramCutter:
    """Cuts Transmits into datagrams (sealed when a sealer is given) with their sizes."""

    __slots__ = ("_sealer", "_overhead")

    def __init__(self, sealer: PacketSealer | None, config: SessionConfig) -> None:
        self._sealer = sealer
        self._overhead = config.packet_overhead()

    def cut(self, tx: Transmit) -> list[tuple[object, int]]:
        """``(datagram, size_bytes)`` in wire-number order; sizes without IP/UDP headers."""
        frame = tx.frames[0]
        sealer = self._sealer
        if not isinstance(frame, DataFrame) or len(tx.frames) != 1:
            if sealer is None:
                return [(VirtualDatagram(tx.path_id, tx.first_pn, 0, 0, 0, tx.frames), tx.size)]
            sealed = sealer.seal(tx.path_id, tx.first_pn, tx.frames)
            return [(sealed, len(sealed))]
        out: list[tuple[object, int]] = []
        segment, end = tx.segment_size, frame.offset + frame.length
        per_datagram = self._overhead + DATA_OVERHEAD
        data, base = frame.data, frame.offset
        for i in range(tx.count):
            start = frame.offset + i * segment
            length = min(segment, end - start)
            pn = tx.first_pn + i
            if sealer is None:
                out.append((VirtualDatagram(tx.path_id, pn, frame.shard_id, start, length, None),
                            per_datagram + length))
            else:
                assert data is not None  # bytes mode submits real buffers
                piece = DataFrame(frame.shard_id, start, length, data[start - base:start - base + length])
                sealed = sealer.seal(tx.path_id, pn, [piece])
                out.append((sealed, len(sealed)))
        return out


class VirtualReceiver:
    """Replay check and placement bookkeeping for virtual datagrams (counters as the native)."""

    __slots__ = ("_windows", "_shards", "counters")

    def __init__(self, n_paths: int) -> None:
        self._windows = [ReplayWindow() for _ in range(n_paths)]
        self._shards: set[int] = set()
        self.counters: dict[str, int] = {"rejected_path": 0, "rejected_replay": 0,
                                         "accepted_data": 0, "accepted_control": 0}

    def add_shard(self, shard_id: int) -> None:
        self._shards.add(shard_id)

    def remove_shard(self, shard_id: int) -> None:
        self._shards.discard(shard_id)

    def process(self, datagram: VirtualDatagram, runs: list[Run], controls: list[Control]) -> None:
        window = self._windows[datagram.path_id]
        if not window.check(datagram.pn):
            self.counters["rejected_replay"] += 1
            return
        window.record(datagram.pn)
        if datagram.frames is not None:
            self.counters["accepted_control"] += 1
            controls.append((datagram.path_id, datagram.pn, datagram.frames))
        elif datagram.shard_id in self._shards:
            self.counters["accepted_data"] += 1
            runs.append((datagram.path_id, datagram.pn, 1, datagram.shard_id, datagram.offset,
                         datagram.length))
        else:  # not (or no longer) placeable: the core sees the DATA frame as a packet
            self.counters["accepted_control"] += 1
            controls.append((datagram.path_id, datagram.pn,
                             [DataFrame(datagram.shard_id, datagram.offset, datagram.length, None)]))
