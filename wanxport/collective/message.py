"""The header every collective and point-to-point message carries: the call's full signature.

Each message is one wanxport shard: a 128-byte header, then the body (raw array
bytes or a codec's bytes). The header carries the call's signature — group id,
sequence number, op, element count, dtype, shape, compression, reduction, root,
peer, tag, and for an all-reduce among more than two sites the schedule and the
plan it was chosen from (bytes that older peers leave zero: "direct", plan 0) —
and which part of the call this message is (phase, element offset
and count). A site compares every arriving header with its own call before it
reads a byte of the body: any difference is a ``CollectiveError`` naming the field
and both values, at every site (each site hears every peer's header in every
phase), instead of a wrong sum or a wait that never ends.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import CollectiveError
from .schedule import SCHEDULES

MAGIC = b"WXC2"
SHAPE_SLOTS = 6  # dimensions carried as given; more are folded into the last slot (their product)
HEADER = struct.Struct("<4sBBBB8sQQQQiiIqBBI2x6Q4x")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 128

# "send" is a point-to-point message's data, "recv" the receiver's answer (its own
# signature), "ping" a liveness heartbeat; an "abort*" says a call was refused at its
# site and carries the reason: for a collective, for a send (to the receiver), for a
# receive (to the sender). A "report" carries a site's measurements of its sessions to
# the group's decider and a "plan" the decider's mesh to every site (``planning``).
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "abort",
       "send", "recv", "abort_send", "abort_recv", "ping", "report", "plan")
COMPRESS = (None, "bf16", "int8", "int4")  # index on the wire: append only
REDUCE = ("sum", "mean", "none")

#: Which of a group's sequences a message belongs to: the collectives' one sequence,
#: or the data or answers of one (peer, tag) point-to-point channel; ``PLANNING``
#: messages belong to no sequence (the group's planner takes them).
COLLECTIVE, P2P_DATA, P2P_REPLY, PLANNING = 0, 1, 2, 3
KIND = {"send": P2P_DATA, "abort_send": P2P_DATA, "recv": P2P_REPLY, "abort_recv": P2P_REPLY,
        "report": PLANNING, "plan": PLANNING}
ABORTS = ("abort", "abort_send", "abort_recv")


def wire_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` as the header carries it: dimensions past the sixth folded into the sixth."""
    if len(shape) <= SHAPE_SLOTS:
        return tuple(int(d) for d in shape)
    return (*(int(d) for d in shape[:SHAPE_SLOTS - 1]), math.prod(int(d) for d in shape[SHAPE_SLOTS - 1:]))


@dataclass(frozen=True)
class Call:
    """What a call is, identically at every site that takes part (its signature)."""

    seq: int
    op: str
    count: int  # elements of the whole array
    dtype: str  # numpy dtype.str, e.g. "<f4"
    compress: str | None = None
    reduce: str = "none"
    root: int = -1  # broadcast: the root's rank in the group
    group: int = 0  # the group's id (``world.group_id``)
    tag: int = 0  # point-to-point: the tag
    peer: int = -1  # point-to-point: the destination's rank (send) or the source's (recv)
    shape: tuple[int, ...] = ()  # ``wire_shape`` of the array
    ndim: int = 0
    schedule: str = "direct"  # all-reduce among n sites: the schedule it runs (``schedule.SCHEDULES``)
    plan: int = 0  # ... and the first call of the decider's plan it was chosen from

    @property
    def kind(self) -> int:
        return KIND.get(self.op, COLLECTIVE)


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


def text_payload(text: str, limit: int = 1024) -> npt.NDArray[np.uint8]:
    """A message buffer whose body is ``text`` (UTF-8, cut at ``limit`` bytes): a refusal's reason."""
    raw = text.encode()[:limit]
    payload = new_payload(len(raw))
    body_of(payload)[:] = np.frombuffer(raw, dtype=np.uint8)
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
    shape = list(c.shape) + [0] * (SHAPE_SLOTS - len(c.shape))
    return HEADER.pack(MAGIC, OPS.index(c.op), COMPRESS.index(c.compress), REDUCE.index(c.reduce),
                       header.phase, c.dtype.encode("ascii"), c.seq, c.count, header.offset,
                       header.elements, c.root, c.peer, c.group, c.tag, c.ndim, SCHEDULES.index(c.schedule),
                       c.plan, *shape)


def unpack(data: bytes | memoryview, site: str) -> Header:
    """The header at the start of ``data``; CollectiveError naming ``site`` if malformed."""
    if len(data) < HEADER_BYTES:
        raise CollectiveError(f"site {site}: a collective message of {len(data)} bytes has no header", site)
    (magic, op, compress, reduce, phase, dtype, seq, count, offset, elements, root, peer, group, tag, ndim,
     schedule, plan, *shape) = HEADER.unpack_from(data)
    if (magic != MAGIC or op >= len(OPS) or compress >= len(COMPRESS) or reduce >= len(REDUCE)
            or schedule >= len(SCHEDULES)):
        raise CollectiveError(f"site {site}: not a collective message header", site)
    call = Call(seq, OPS[op], count, dtype.rstrip(b"\0").decode("ascii", "replace"), COMPRESS[compress],
                REDUCE[reduce], root, group, tag, peer, tuple(shape[:min(ndim, SHAPE_SLOTS)]), ndim,
                SCHEDULES[schedule], plan)
    return Header(call, phase, offset, elements)


SIGNATURE = ("op", "count", "dtype", "ndim", "shape", "compress", "reduce", "root", "schedule", "plan")
P2P_SIGNATURE = ("count", "dtype", "ndim", "shape")


def mismatch(mine: Call, theirs: Call) -> str | None:
    """The first field on which two sites' calls differ, as ``field mine here vs theirs``.
    A send and its receive agree on the array (the op, peer and tag match by routing)."""
    fields = P2P_SIGNATURE if mine.kind != COLLECTIVE else SIGNATURE
    for name in fields:
        a, b = getattr(mine, name), getattr(theirs, name)
        if a != b:
            return f"{name} {a!r} here vs {b!r}"
    return None
