"""The header every collective message carries, and the check that two sites agree.

Each message is one wanxport shard: a 64-byte header, then the body (raw array
bytes or a codec's bytes). The header says which collective it belongs to
(sequence number, op, element count, dtype, compression, reduction, root) and
which part of it this is (phase, element offset and count). A site compares
every arriving header with its own call: any difference is a ``CollectiveError``
naming the field and both values, at every site (each site hears every peer's
header in every phase), instead of a wrong sum or a wait that never ends.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import CollectiveError

MAGIC = b"WXC1"
HEADER = struct.Struct("<4sBBBB8sQQQQi12x")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 64

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "abort")
COMPRESS = (None, "bf16", "int8")
REDUCE = ("sum", "mean", "none")


@dataclass(frozen=True)
class Call:
    """What a collective is, identically at every site that takes part."""

    seq: int
    op: str
    count: int  # elements of the whole array
    dtype: str  # numpy dtype.str, e.g. "<f4"
    compress: str | None = None
    reduce: str = "none"
    root: int = -1


@dataclass(frozen=True)
class Header:
    call: Call
    phase: int
    offset: int  # first element this message carries
    elements: int  # elements it carries (0: a header-only message)


def new_payload(body_bytes: int) -> npt.NDArray[np.uint8]:
    """A message buffer: ``HEADER_BYTES`` for the header, then room for the body (``body_of``)."""
    return np.empty(HEADER_BYTES + body_bytes, dtype=np.uint8)


def body_of(payload: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    return payload[HEADER_BYTES:]


def payload_of(body: npt.NDArray[Any] | None) -> npt.NDArray[np.uint8]:
    """A message buffer holding a copy of ``body`` (an empty body when None)."""
    if body is None:
        return new_payload(0)
    raw = body.reshape(-1).view(np.uint8)
    payload = new_payload(raw.nbytes)
    payload[HEADER_BYTES:] = raw
    return payload


def fill_payload(buffer: npt.NDArray[np.uint8], body: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """``buffer`` (a message buffer of exactly the right size) with a copy of ``body``."""
    raw = body.reshape(-1).view(np.uint8)
    if buffer.nbytes != HEADER_BYTES + raw.nbytes:
        raise ValueError(f"message buffer of {buffer.nbytes} bytes for a {raw.nbytes}-byte body")
    buffer[HEADER_BYTES:] = raw
    return buffer


def pack(header: Header) -> bytes:
    c = header.call
    return HEADER.pack(MAGIC, OPS.index(c.op), COMPRESS.index(c.compress), REDUCE.index(c.reduce),
                       header.phase, c.dtype.encode("ascii"), c.seq, c.count, header.offset,
                       header.elements, c.root)


def unpack(data: bytes | memoryview, site: str) -> Header:
    """The header at the start of ``data``; CollectiveError naming ``site`` if malformed."""
    if len(data) < HEADER_BYTES:
        raise CollectiveError(f"site {site}: a collective message of {len(data)} bytes has no header", site)
    magic, op, compress, reduce, phase, dtype, seq, count, offset, elements, root = HEADER.unpack_from(data)
    if magic != MAGIC or op >= len(OPS) or compress >= len(COMPRESS) or reduce >= len(REDUCE):
        raise CollectiveError(f"site {site}: not a collective message header", site)
    call = Call(seq, OPS[op], count, dtype.rstrip(b"\0").decode("ascii", "replace"), COMPRESS[compress],
                REDUCE[reduce], root)
    return Header(call, phase, offset, elements)


def mismatch(mine: Call, theirs: Call) -> str | None:
    """The first field on which two sites' calls differ, as ``field mine vs theirs``."""
    for name in ("op", "count", "dtype", "compress", "reduce", "root"):
        a, b = getattr(mine, name), getattr(theirs, name)
        if a != b:
            return f"{name} {a!r} here vs {b!r}"
    return None
