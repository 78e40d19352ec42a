"""The pure-Python reference data path: packets <-> datagrams.

The native extension (``wanxport._native``) implements the same contract over
batches; tests hold the two to identical bytes. Receive-side failures never
raise: they return None and count the reason in ``drops``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from wanxport.wire.errors import WireError
from wanxport.wire.frames import Frame, decode_frames, encode_frames
from wanxport.wire.header import HEADER_LEN, Header, decode_header, encode_header
from wanxport.wire.protection import Protection
from wanxport.wire.replay import ReplayWindow


@dataclass(slots=True)
class OpenedPacket:
    header: Header
    frames: list[Frame]


class PacketSealer:
    """Builds sealed datagrams for one direction of a session."""

    def __init__(self, conn_id: int, keys: dict[int, Protection], key_phase: int = 0) -> None:
        self.conn_id = conn_id
        self.keys = keys
        self.key_phase = key_phase

    def seal(self, path_id: int, packet_number: int, frames: list[Frame]) -> bytes:
        header = encode_header(path_id, self.conn_id, packet_number, self.key_phase)
        sealed = self.keys[self.key_phase].seal(header, path_id, packet_number, encode_frames(frames))
        return header + sealed


class PacketOpener:
    """Opens, authenticates and de-duplicates datagrams for one direction of a session."""

    def __init__(self, conn_id: int, path_count: int, keys: dict[int, Protection]) -> None:
        self.conn_id = conn_id
        self.keys = keys
        self.windows = [ReplayWindow() for _ in range(path_count)]
        self.drops: Counter[str] = Counter()

    def open(self, datagram: bytes | memoryview) -> OpenedPacket | None:
        try:
            header = decode_header(datagram)
        except WireError as exc:
            self.drops[exc.reason] += 1
            return None
        if header.conn_id != self.conn_id:
            self.drops["conn"] += 1
            return None
        if header.path_id >= len(self.windows):
            self.drops["path"] += 1
            return None
        key = self.keys.get(header.key_phase)
        if key is None or len(datagram) < HEADER_LEN + key.overhead:
            self.drops["short" if key else "key_phase"] += 1
            return None
        window = self.windows[header.path_id]
        if not window.check(header.packet_number):
            self.drops["replay"] += 1
            return None
        view = memoryview(datagram)
        plaintext = key.open(view[:HEADER_LEN], header.path_id, header.packet_number, view[HEADER_LEN:])
        if plaintext is None:
            self.drops["auth"] += 1
            return None
        try:
            frames = decode_frames(plaintext)
        except WireError as exc:
            self.drops[exc.reason] += 1
            return None
        window.record(header.packet_number)
        return OpenedPacket(header, frames)

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())
