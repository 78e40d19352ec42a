"""Frames: the plaintext content of a packet (docs/wire-format.md).

``encode_frames`` and ``decode_frames`` are the pure-Python reference codec.
A DATA frame may carry ``data=None``: the core describes *which* bytes to send
(shard, offset, length) and the data path fills them in from the shard buffer,
so the same decisions drive the reference codec, the native one and the
simulator's byte-free mode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain

from wanxport.wire.errors import WireError

PADDING, DATA, ACK, SHARD_ACK, SHARD_OPEN, SHARD_DONE, PROBE, PROBE_ACK, CLOSE, CREDIT, REPAIR = range(11)
SHARD_OPEN_UNHASHED, SHARD_DIGEST = 11, 12  # a shard opened before its digest is known; the digest

MAX_OFFSET = 1 << 62
MAX_ACK_RANGES = 256
MAX_SHARD_RANGES = 256
DIGEST_LEN = 32

DATA_OVERHEAD = 1 + 4 + 8 + 2
# No larger than DATA's, so a repair symbol as large as a full datagram's payload fits the MTU.
REPAIR_OVERHEAD = 1 + 4 + 6 + 1 + 1 + 1
MAX_FIRST_SYMBOL = (1 << 48) - 1
MAX_BLOCK_SYMBOLS = 255  # k + m of a Reed-Solomon block over GF(2^8)
STATUS_VERIFIED, STATUS_INTEGRITY_FAILURE, STATUS_ABORTED = 0, 1, 2

_DATA = struct.Struct(">BIQH")
_ACK = struct.Struct(">BHIH")
_RANGE = struct.Struct(">QQ")
_RANGES: dict[int, struct.Struct] = {}  # count -> that many ranges in one struct (_ranges_struct)
_SHARD_ACK = struct.Struct(">BIH")
_SHARD_OPEN = struct.Struct(">BIQ32sH")
_SHARD_OPEN_UNHASHED = struct.Struct(">BIQH")
_SHARD_DIGEST = struct.Struct(">BI32s")
_SHARD_DONE = struct.Struct(">BIB")
_TOKEN = struct.Struct(">BQ")
_CLOSE = struct.Struct(">BHH")
_CREDIT = struct.Struct(">BQ")
_REPAIR = struct.Struct(">BIHIBBB")  # first_symbol as 16 high + 32 low bits

Ranges = tuple[tuple[int, int], ...]


@dataclass(slots=True)
class DataFrame:
    shard_id: int
    offset: int
    length: int
    data: bytes | memoryview | None = None

    @property
    def wire_size(self) -> int:
        return DATA_OVERHEAD + self.length


@dataclass(frozen=True, slots=True)
class AckFrame:
    """Acknowledges packet numbers of ``path_id``; ranges inclusive, highest first."""

    path_id: int
    ack_delay_us: int
    ranges: Ranges

    @property
    def wire_size(self) -> int:
        return _ACK.size + _RANGE.size * len(self.ranges)


@dataclass(frozen=True, slots=True)
class ShardAckFrame:
    """Byte ranges [start, end) of a shard that the receiver holds, ascending."""

    shard_id: int
    ranges: Ranges

    @property
    def wire_size(self) -> int:
        return _SHARD_ACK.size + _RANGE.size * len(self.ranges)


@dataclass(frozen=True, slots=True)
class ShardOpenFrame:
    """``digest`` None: the shard's first datagrams leave while it is still being hashed
    (SHARD_OPEN_UNHASHED); its digest follows in a SHARD_DIGEST frame."""

    shard_id: int
    size: int
    digest: bytes | None
    meta: bytes = b""

    @property
    def wire_size(self) -> int:
        return (_SHARD_OPEN if self.digest is not None else _SHARD_OPEN_UNHASHED).size + len(self.meta)


@dataclass(frozen=True, slots=True)
class ShardDigestFrame:
    """The digest of a shard opened unhashed."""

    shard_id: int
    digest: bytes

    @property
    def wire_size(self) -> int:
        return _SHARD_DIGEST.size


@dataclass(frozen=True, slots=True)
class ShardDoneFrame:
    shard_id: int
    status: int

    @property
    def wire_size(self) -> int:
        return _SHARD_DONE.size


@dataclass(frozen=True, slots=True)
class ProbeFrame:
    token: int

    @property
    def wire_size(self) -> int:
        return _TOKEN.size


@dataclass(frozen=True, slots=True)
class ProbeAckFrame:
    token: int

    @property
    def wire_size(self) -> int:
        return _TOKEN.size


@dataclass(frozen=True, slots=True)
class CloseFrame:
    code: int
    reason: str = ""

    @property
    def wire_size(self) -> int:
        return _CLOSE.size + len(self.reason.encode())


@dataclass(frozen=True, slots=True)
class CreditFrame:
    """Cumulative bytes of shard payload the sender may have opened."""

    max_bytes: int

    @property
    def wire_size(self) -> int:
        return _CREDIT.size


@dataclass(frozen=True, slots=True)
class RepairFrame:
    """Repair symbol ``index`` (0..m-1) of an erasure-coded block of a shard.

    The block is the shard's ``k`` data symbols of ``symbol`` bytes from symbol
    ``first_symbol`` on: bytes ``[first_symbol * symbol, (first_symbol + k) * symbol)``,
    clipped to the shard's end (the last symbol zero-padded), so a data datagram
    of a full payload is exactly one symbol. Any ``k`` of the ``k + m`` symbols
    rebuild the block (``wanxport.core.fec_code``). A REPAIR frame fills the rest
    of its packet: ``symbol`` is what remains after its header. ``data`` is None
    in the simulator's byte-free mode.
    """

    shard_id: int
    first_symbol: int
    k: int
    m: int
    index: int
    symbol: int
    data: bytes | memoryview | None = None

    @property
    def wire_size(self) -> int:
        return REPAIR_OVERHEAD + self.symbol

    @property
    def offset(self) -> int:
        return self.first_symbol * self.symbol

    def covered(self, shard_size: int) -> int:
        """Bytes the block covers in a shard of ``shard_size``; 0 if it does not fit the shard."""
        length = min(self.k * self.symbol, shard_size - self.offset)
        return length if length > (self.k - 1) * self.symbol else 0


@dataclass(frozen=True, slots=True)
class PaddingFrame:
    length: int

    @property
    def wire_size(self) -> int:
        return self.length


Frame = (
    DataFrame
    | AckFrame
    | ShardAckFrame
    | ShardOpenFrame
    | ShardDigestFrame
    | ShardDoneFrame
    | ProbeFrame
    | ProbeAckFrame
    | CloseFrame
    | CreditFrame
    | RepairFrame
    | PaddingFrame
)


def _check_ranges(ranges: Ranges, descending: bool, limit: int, minimum: int) -> None:
    if not minimum <= len(ranges) <= limit:
        raise WireError("ranges", f"{len(ranges)} ranges, valid {minimum}..{limit}")
    if descending:
        floor = MAX_OFFSET + 1  # above every valid range; then the previous range's low end
        for lo, hi in ranges:
            if lo > hi or hi >= MAX_OFFSET:
                raise WireError("ranges", f"bad range {lo}..{hi}")
            if hi + 1 >= floor:
                raise WireError("ranges", "not descending and disjoint")
            floor = lo
        return
    prev: tuple[int, int] | None = None
    for lo, hi in ranges:
        if lo >= hi or hi > MAX_OFFSET:
            raise WireError("ranges", f"bad range [{lo}, {hi})")
        if prev is not None and lo <= prev[1]:
            raise WireError("ranges", "not ascending and disjoint")
        prev = (lo, hi)


def encode_frame(frame: Frame, out: bytearray) -> None:
    """Append one frame's bytes to ``out`` (a DATA frame must carry its data)."""
    if isinstance(frame, DataFrame):
        if frame.data is None or len(frame.data) != frame.length:
            raise ValueError("DATA frame without matching data")
        out += _DATA.pack(DATA, frame.shard_id, frame.offset, frame.length)
        out += frame.data
    elif isinstance(frame, AckFrame):
        out += _ACK.pack(ACK, frame.path_id, frame.ack_delay_us, len(frame.ranges))
        out += _ranges_struct(len(frame.ranges)).pack(*chain.from_iterable(frame.ranges))
    elif isinstance(frame, ShardAckFrame):
        out += _SHARD_ACK.pack(SHARD_ACK, frame.shard_id, len(frame.ranges))
        out += _ranges_struct(len(frame.ranges)).pack(*chain.from_iterable(frame.ranges))
    elif isinstance(frame, ShardOpenFrame):
        if frame.digest is None:
            out += _SHARD_OPEN_UNHASHED.pack(SHARD_OPEN_UNHASHED, frame.shard_id, frame.size, len(frame.meta))
        else:
            out += _SHARD_OPEN.pack(SHARD_OPEN, frame.shard_id, frame.size, frame.digest, len(frame.meta))
        out += frame.meta
    elif isinstance(frame, ShardDigestFrame):
        out += _SHARD_DIGEST.pack(SHARD_DIGEST, frame.shard_id, frame.digest)
    elif isinstance(frame, ShardDoneFrame):
        out += _SHARD_DONE.pack(SHARD_DONE, frame.shard_id, frame.status)
    elif isinstance(frame, ProbeFrame):
        out += _TOKEN.pack(PROBE, frame.token)
    elif isinstance(frame, ProbeAckFrame):
        out += _TOKEN.pack(PROBE_ACK, frame.token)
    elif isinstance(frame, CloseFrame):
        reason = frame.reason.encode()
        out += _CLOSE.pack(CLOSE, frame.code, len(reason))
        out += reason
    elif isinstance(frame, CreditFrame):
        out += _CREDIT.pack(CREDIT, frame.max_bytes)
    elif isinstance(frame, RepairFrame):
        if frame.data is None or len(frame.data) != frame.symbol:
            raise ValueError("REPAIR frame without matching data")
        out += _REPAIR.pack(REPAIR, frame.shard_id, frame.first_symbol >> 32, frame.first_symbol & 0xFFFFFFFF,
                            frame.k, frame.m, frame.index)
        out += frame.data
    else:
        out += bytes(frame.length)


def encode_frames(frames: list[Frame]) -> bytes:
    out = bytearray()
    for frame in frames:
        encode_frame(frame, out)
    return bytes(out)


def _need(buf: memoryview, pos: int, size: int) -> None:
    if pos + size > len(buf):
        raise WireError("truncated", f"frame needs {size} bytes at {pos}, have {len(buf) - pos}")


def _ranges_struct(count: int) -> struct.Struct:
    """``count`` ranges as one struct: a sender decodes an ACK of up to 32 ranges every
    few hundred microseconds, and one unpack for all of them costs a third of one each
    (a receiver encodes them with one pack, likewise).
    Kept for the counts a valid frame may have; a larger one is refused right after."""
    layout = _RANGES.get(count)
    if layout is None:
        layout = struct.Struct(f">{2 * count}Q")
        if count <= max(MAX_ACK_RANGES, MAX_SHARD_RANGES):
            _RANGES[count] = layout
    return layout


def _read_ranges(buf: memoryview, pos: int, count: int) -> tuple[Ranges, int]:
    _need(buf, pos, count * _RANGE.size)
    layout = _ranges_struct(count)
    values = layout.unpack_from(buf, pos)
    return tuple(zip(values[0::2], values[1::2], strict=True)), pos + layout.size


def decode_frames(payload: bytes | memoryview) -> list[Frame]:
    """Parse and validate every frame; raises WireError for anything malformed."""
    buf = memoryview(payload)
    frames: list[Frame] = []
    pos = 0
    end = len(buf)
    if end == 0:
        raise WireError("empty", "packet has no frames")
    while pos < end:
        kind = buf[pos]
        if kind == DATA:
            _need(buf, pos, _DATA.size)
            _, shard_id, offset, length = _DATA.unpack_from(buf, pos)
            pos += _DATA.size
            _need(buf, pos, length)
            if offset + length > MAX_OFFSET:
                raise WireError("offset", f"{offset}+{length}")
            frames.append(DataFrame(shard_id, offset, length, buf[pos : pos + length]))
            pos += length
        elif kind == ACK:
            _need(buf, pos, _ACK.size)
            _, path_id, delay, count = _ACK.unpack_from(buf, pos)
            ranges, pos = _read_ranges(buf, pos + _ACK.size, count)
            _check_ranges(ranges, True, MAX_ACK_RANGES, 1)
            frames.append(AckFrame(path_id, delay, ranges))
        elif kind == SHARD_ACK:
            _need(buf, pos, _SHARD_ACK.size)
            _, shard_id, count = _SHARD_ACK.unpack_from(buf, pos)
            ranges, pos = _read_ranges(buf, pos + _SHARD_ACK.size, count)
            _check_ranges(ranges, False, MAX_SHARD_RANGES, 0)
            frames.append(ShardAckFrame(shard_id, ranges))
        elif kind in (SHARD_OPEN, SHARD_OPEN_UNHASHED):
            layout = _SHARD_OPEN if kind == SHARD_OPEN else _SHARD_OPEN_UNHASHED
            _need(buf, pos, layout.size)
            if kind == SHARD_OPEN:
                _, shard_id, size, digest, meta_len = layout.unpack_from(buf, pos)
            else:
                (_, shard_id, size, meta_len), digest = layout.unpack_from(buf, pos), None
            pos += layout.size
            _need(buf, pos, meta_len)
            if size > MAX_OFFSET:
                raise WireError("offset", f"shard size {size}")
            try:
                bytes(buf[pos : pos + meta_len]).decode()
            except UnicodeDecodeError as exc:
                raise WireError("utf8", "SHARD_OPEN metadata") from exc
            frames.append(ShardOpenFrame(shard_id, size, None if digest is None else bytes(digest),
                                         bytes(buf[pos : pos + meta_len])))
            pos += meta_len
        elif kind == SHARD_DIGEST:
            _need(buf, pos, _SHARD_DIGEST.size)
            _, shard_id, digest = _SHARD_DIGEST.unpack_from(buf, pos)
            frames.append(ShardDigestFrame(shard_id, bytes(digest)))
            pos += _SHARD_DIGEST.size
        elif kind == SHARD_DONE:
            _need(buf, pos, _SHARD_DONE.size)
            _, shard_id, status = _SHARD_DONE.unpack_from(buf, pos)
            if status > STATUS_ABORTED:
                raise WireError("status", str(status))
            frames.append(ShardDoneFrame(shard_id, status))
            pos += _SHARD_DONE.size
        elif kind in (PROBE, PROBE_ACK):
            _need(buf, pos, _TOKEN.size)
            _, token = _TOKEN.unpack_from(buf, pos)
            frames.append(ProbeFrame(token) if kind == PROBE else ProbeAckFrame(token))
            pos += _TOKEN.size
        elif kind == CLOSE:
            _need(buf, pos, _CLOSE.size)
            _, code, reason_len = _CLOSE.unpack_from(buf, pos)
            pos += _CLOSE.size
            _need(buf, pos, reason_len)
            try:
                reason = bytes(buf[pos : pos + reason_len]).decode()
            except UnicodeDecodeError as exc:
                raise WireError("utf8", "CLOSE reason") from exc
            frames.append(CloseFrame(code, reason))
            pos += reason_len
        elif kind == CREDIT:
            _need(buf, pos, _CREDIT.size)
            _, max_bytes = _CREDIT.unpack_from(buf, pos)
            frames.append(CreditFrame(max_bytes))
            pos += _CREDIT.size
        elif kind == REPAIR:
            _need(buf, pos, _REPAIR.size + 1)
            _, shard_id, high, low, k, m, index = _REPAIR.unpack_from(buf, pos)
            pos += _REPAIR.size
            symbol = end - pos
            if not (1 <= k and 1 <= m and k + m <= MAX_BLOCK_SYMBOLS and index < m):
                raise WireError("repair", f"block k={k} m={m} index={index}")
            first = high << 32 | low
            if (first + k) * symbol > MAX_OFFSET:
                raise WireError("offset", f"repair block at symbol {first} of {symbol} bytes")
            frames.append(RepairFrame(shard_id, first, k, m, index, symbol, buf[pos:end]))
            pos = end
        elif kind == PADDING:
            if any(buf[pos:end]):
                raise WireError("padding", "non-zero padding")
            frames.append(PaddingFrame(end - pos))
            pos = end
        else:
            raise WireError("frame_type", f"0x{kind:02x}")
    return frames
