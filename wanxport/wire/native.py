"""Typed wrapper of the pure half of the native data path, ``wanxport._native``.

Why a wrapper: the C module works on raw buffers and packed descriptor arrays
so that no Python object is created per datagram; this module gives those
buffers names, types and numpy views, and lets callers check
``NATIVE_AVAILABLE`` (and print ``import_error``, one line) instead of
failing on import when the extension was not built.

Only the bytes-in, bytes-out pieces live here (sealing, segmentation, opening
and placing a batch, folding placed records into runs), because wire is the
pure layer. The same extension's socket I/O and pacer thread are wrapped in
``wanxport/aio/native_io.py``.

The contract is the same as the pure-Python reference in
``wanxport/wire/datapath.py``; ``tests/test_native_cross.py`` holds the two to
identical bytes. The wire constants are defined once, in the Python wire
modules; the C module exports the values it was compiled with, and an
extension whose values differ (a stale build) is refused here with one line
rather than trusted to parse a format it does not share.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wanxport.wire.ack_record import ACK_FRAME_RANGES, ACK_RANGES_KEPT, PacketRecord
from wanxport.wire.frames import DATA, DATA_OVERHEAD, MAX_OFFSET
from wanxport.wire.header import HEADER_LEN, KEY_PHASE_BIT, MARKER, MAX_PACKET_NUMBER, QUIC_FIXED_BIT
from wanxport.wire.protection import IV_LEN, KEY_LEN, TAG_LEN
from wanxport.wire.replay import WINDOW

BUILD_HINT = "WANXPORT_ONLY_EXT=wanxport._native python setup.py build_ext --inplace"

#: One placed DATA datagram (Receiver.process records), native byte order.
RECORD_DTYPE = np.dtype(
    [
        ("pn", "=u8"),
        ("offset", "=u8"),
        ("rx_time_ns", "=i8"),
        ("shard_id", "=u4"),
        ("path_id", "=u2"),
        ("length", "=u2"),
    ]
)
#: One datagram inside a batch buffer (recv_batch output, Receiver.process input).
DESC_DTYPE = np.dtype([("offset", "=i8"), ("length", "=i8"), ("rx_time_ns", "=i8")])

#: What the C code must have been compiled with: the name it exports -> the Python value.
WIRE_CONSTANTS: dict[str, int] = {
    "HEADER_LEN": HEADER_LEN,
    "MARKER": MARKER,
    "QUIC_FIXED_BIT": QUIC_FIXED_BIT,
    "KEY_PHASE_BIT": KEY_PHASE_BIT,
    "MAX_PACKET_NUMBER": MAX_PACKET_NUMBER,
    "TAG_LEN": TAG_LEN,
    "KEY_LEN": KEY_LEN,
    "IV_LEN": IV_LEN,
    "FRAME_DATA": DATA,
    "DATA_FRAME_HEADER_LEN": DATA_OVERHEAD,
    "MAX_OFFSET": MAX_OFFSET,
    "REPLAY_WINDOW": WINDOW,
    "RECORD_SIZE": RECORD_DTYPE.itemsize,
    "DESC_SIZE": DESC_DTYPE.itemsize,
    "ACK_RANGES_KEPT": ACK_RANGES_KEPT,
    "ACK_FRAME_RANGES": ACK_FRAME_RANGES,
}


def constant_mismatches(ext: Any) -> list[str]:
    """Each WIRE_CONSTANTS entry the extension ``ext`` disagrees with, as "NAME c (Python p)"."""
    return [
        f"{name} {getattr(ext, name, 'missing')} (Python: {value})"
        for name, value in WIRE_CONSTANTS.items()
        if getattr(ext, name, None) != value
    ]


def _load() -> tuple[Any, str | None]:
    try:
        ext = importlib.import_module("wanxport._native")
    except ImportError as exc:  # the extension is optional at import time
        return None, f"native data path unavailable ({exc}); build it with: {BUILD_HINT}"
    if mismatches := constant_mismatches(ext):
        return None, (
            f"native data path unavailable (built for another wire format: {', '.join(mismatches)}); "
            f"rebuild it with: {BUILD_HINT}"
        )
    return ext, None


_native: Any
import_error: str | None
_native, import_error = _load()
NATIVE_AVAILABLE = _native is not None

Buffer = bytes | bytearray | memoryview


def require() -> Any:
    """The extension module, or RuntimeError carrying ``import_error``."""
    if _native is None:
        raise RuntimeError(import_error)
    return _native


class Protector:
    """One AEAD key + IV (one direction, one key phase); OpenSSL state kept per key.

    ``cipher`` is "aes-256-gcm", "chacha20-poly1305" or "none" (no tag, tests
    and simulator only).
    """

    __slots__ = ("_c",)

    def __init__(self, cipher: str, key: bytes, iv: bytes) -> None:
        self._c = require().Protector(cipher, key, iv)

    @property
    def cipher(self) -> str:
        return str(self._c.cipher)

    @property
    def tag_len(self) -> int:
        return int(self._c.tag_len)

    def seal(self, header: Buffer, plaintext: Buffer) -> bytes:
        """The whole datagram: header || ciphertext || tag."""
        return bytes(_native.seal_packet(self._c, header, plaintext))

    def open(self, datagram: Buffer) -> bytes | None:
        """The plaintext payload, or None when the datagram does not authenticate."""
        out: bytes | None = _native.open_packet(self._c, datagram)
        return out

    def seal_batch(self, packets: Sequence[tuple[Buffer, Buffer]]) -> list[bytes]:
        out: list[bytes] = _native.seal_batch(self._c, packets)
        return out

    def open_batch(self, datagrams: Sequence[Buffer]) -> list[bytes | None]:
        out: list[bytes | None] = _native.open_batch(self._c, datagrams)
        return out


@dataclass(frozen=True, slots=True)
class DataBurst:
    """Sealed DATA datagrams laid out at a fixed ``stride`` in one buffer.

    Datagram i starts at ``i * stride``, carries packet number ``first_pn + i``
    and shard bytes ``[offset + i * max_payload, ...)``; all are ``stride``
    bytes long except the last, which may be shorter. That is exactly the
    layout of one UDP GSO send, so the pacer takes it without re-packing.
    """

    buffer: bytearray
    stride: int
    count: int
    first_pn: int
    shard_id: int
    offset: int
    length: int
    max_payload: int

    def datagram(self, i: int) -> memoryview:
        if not 0 <= i < self.count:
            raise IndexError(f"datagram index {i} outside [0, {self.count})")
        return memoryview(self.buffer)[i * self.stride : min((i + 1) * self.stride, len(self.buffer))]

    def chunk(self, i: int) -> tuple[int, int, int]:
        """(packet_number, shard offset, data length) of datagram i."""
        start = i * self.max_payload
        return self.first_pn + i, self.offset + start, min(self.max_payload, self.length - start)

    def lengths(self) -> list[int]:
        return [len(self.datagram(i)) for i in range(self.count)]


def build_data_datagrams(
    protector: Protector,
    conn_id: int,
    path_id: int,
    first_pn: int,
    key_phase: int,
    shard_id: int,
    shard_buffer: Buffer | npt.NDArray[Any],
    offset: int,
    length: int,
    max_payload: int,
) -> DataBurst:
    """Cut ``shard_buffer[offset:offset+length]`` into sealed DATA datagrams."""
    buf, stride, count = require().build_data_datagrams(
        protector._c,
        conn_id,
        path_id,
        first_pn,
        key_phase,
        shard_id,
        shard_buffer,
        offset,
        length,
        max_payload,
    )
    return DataBurst(buf, stride, count, first_pn, shard_id, offset, length, max_payload)


def seal_packet(protector: Protector, header: Buffer, plaintext: Buffer) -> bytes:
    """Seal one control datagram (header as associated data)."""
    return protector.seal(header, plaintext)


def open_packet(protector: Protector, datagram: Buffer) -> bytes | None:
    """Open one control datagram; None if it is too short or not authentic."""
    return protector.open(datagram)


@dataclass(frozen=True, slots=True)
class DatagramBatch:
    """Datagrams inside one buffer, each described by (offset, length, rx_time_ns)."""

    buffer: Buffer
    descriptors: bytes
    count: int
    addrs: list[tuple[str, int] | None] | None = None
    truncated: int = 0
    rxq_overflow: int = -1  # the socket's SO_RXQ_OVFL drop count on the newest message; -1: none

    @property
    def table(self) -> npt.NDArray[Any]:
        return np.frombuffer(self.descriptors, dtype=DESC_DTYPE, count=self.count)

    def datagram(self, i: int) -> memoryview:
        row = self.table[i]
        start = int(row["offset"])
        return memoryview(self.buffer)[start : start + int(row["length"])]

    @classmethod
    def from_datagrams(cls, datagrams: Sequence[Buffer], rx_time_ns: int = 0) -> DatagramBatch:
        """Pack datagrams back to back (for tests and for Python-side receive loops)."""
        table = np.zeros(len(datagrams), dtype=DESC_DTYPE)
        lengths = np.fromiter((len(d) for d in datagrams), dtype=np.int64, count=len(datagrams))
        table["length"] = lengths
        if len(datagrams):
            table["offset"][1:] = np.cumsum(lengths)[:-1]
        table["rx_time_ns"] = rx_time_ns
        return cls(b"".join(datagrams), table.tobytes(), len(datagrams))


#: One run of placed DATA datagrams: (path_id, first_pn, count, shard_id, offset, length).
Run = tuple[int, int, int, int, int, int]


def fold_runs(records: npt.NDArray[Any]) -> list[Run]:
    """Fold placed records (RECORD_DTYPE) into runs: same path and shard, consecutive
    packet numbers, contiguous bytes; in record order."""
    if records.dtype != RECORD_DTYPE:
        raise TypeError(f"records: dtype {records.dtype} is not RECORD_DTYPE")
    runs: list[Run] = require().fold_runs(np.ascontiguousarray(records))
    return runs


@dataclass(frozen=True, slots=True)
class ControlDatagram:
    """An authenticated datagram that is not a placeable DATA datagram: Python parses it."""

    path_id: int
    packet_number: int
    plaintext: bytes
    rx_time_ns: int


@dataclass(frozen=True, slots=True)
class ProcessResult:
    records: npt.NDArray[Any]  # RECORD_DTYPE, one row per placed DATA datagram
    controls: list[ControlDatagram]
    # QUIC-looking datagrams (first byte & 0x40), untouched, with their index in the
    # batch: they belong to the control channel sharing the socket (aioquic).
    quic: list[tuple[int, bytes]]


def ack_record() -> PacketRecord:
    """A path's received packet numbers kept in C: ``wire.ack_record.AckRecord``'s twin."""
    record: PacketRecord = require().AckRecord()
    return record


class Receiver:
    """Opens, replay-checks and places batches of datagrams of one session direction."""

    __slots__ = ("_c",)

    def __init__(self, conn_id: int, n_paths: int) -> None:
        self._c = require().Receiver(conn_id, n_paths)

    def set_key(self, phase: int, protector: Protector | None) -> None:
        self._c.set_key(phase, None if protector is None else protector._c)

    def own_paths(self, path_ids: Sequence[int]) -> None:
        """Accept only these paths' datagrams: a data-path worker's receiver has its own
        replay windows, so another worker's paths must not get a second chance here."""
        self._c.own_paths(list(path_ids))

    def add_shard(self, shard_id: int, buffer: bytearray | memoryview | npt.NDArray[Any]) -> None:
        """Place DATA for ``shard_id`` into ``buffer`` (held until remove_shard)."""
        self._c.add_shard(shard_id, buffer)

    def remove_shard(self, shard_id: int) -> None:
        self._c.remove_shard(shard_id)

    def freeze(self, shard_id: int, upto: int) -> None:
        """Never write below ``upto`` again (a duplicate is acknowledged, not copied).

        For bytes the caller knows are all in: another thread may then hash them
        while the rest of the shard arrives.
        """
        self._c.freeze(shard_id, upto)

    def ranges(self, shard_id: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = self._c.ranges(shard_id)
        return out

    def received_bytes(self, shard_id: int) -> int:
        return int(self._c.received_bytes(shard_id))

    def is_complete(self, shard_id: int) -> bool:
        return bool(self._c.is_complete(shard_id))

    def highest_pn(self, path_id: int) -> int | None:
        out: int | None = self._c.highest_pn(path_id)
        return out

    @property
    def counters(self) -> dict[str, int]:
        out: dict[str, int] = self._c.counters
        return out

    def process(self, batch: DatagramBatch) -> ProcessResult:
        records, controls, quic = self._c.process(batch.buffer, batch.descriptors)
        return ProcessResult(
            np.frombuffer(records, dtype=RECORD_DTYPE),
            [ControlDatagram(*c) for c in controls],
            quic,
        )
