"""What the session hands its driver to send: datagrams with their wire packet numbers.

Kept apart from the session so that drivers (``aio.plan``, ``sim.wire``) depend
on the shape of a send, not on the session's internals: a DATA transmit names
the bytes it sends (``DataSource``), so a driver never looks a shard up in the
session's tables to find them.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanxport.core.numbering import WireNumbering
from wanxport.wire.frames import DATA_OVERHEAD, Frame


@dataclass(frozen=True, slots=True)
class DataSource:
    """The bytes a DATA transmit carries: ``buffer[offset:offset + length]`` of shard ``shard_id``.

    ``buffer`` is the whole shard (the application's own memory, never a copy), so a
    driver that merges consecutive transmits of one shard hands one buffer and one range
    to its sealer; None for a virtual shard (the simulator's: sizes tracked, no bytes).
    """

    shard_id: int
    buffer: memoryview | None
    offset: int
    length: int


@dataclass(slots=True)
class Transmit:
    """Datagrams to send on ``path_id`` no earlier than ``not_before`` (the pacing schedule).

    Like quinn-proto's ``Transmit { segment_size }``, every datagram is a real
    protocol packet: they are numbered ``first_pn .. first_pn + count - 1`` on the
    wire. A DATA transmit (``frames`` is one ``DataFrame``) is ``count`` datagrams
    each carrying the next ``segment_size`` bytes of the frame's range (the last
    may be shorter), each with its own DATA frame header; any other transmit is
    one datagram carrying ``frames``; ``source`` names a DATA transmit's bytes
    (None for any other).
    """

    path_id: int
    first_pn: int
    count: int
    segment_size: int
    frames: list[Frame]
    size: int  # bytes of all its datagrams: headers + frames + tags (no IP/UDP)
    not_before: float
    source: DataSource | None = None


def number_datagrams(numbering: WireNumbering, path_id: int, core_pn: int, frames: list[Frame],
                     source: DataSource | None, segment: int, overhead: int, not_before: float) -> Transmit:
    """The Transmit of core packet ``core_pn``: DATA (``source``) cut into ``segment``-byte
    datagrams, or one control datagram; wire numbers taken from ``numbering``."""
    if source is not None:
        count = -(-source.length // segment)
        size = count * (overhead + DATA_OVERHEAD) + source.length
    else:
        count, size = 1, overhead + sum(f.wire_size for f in frames)
    first = numbering.allocate(core_pn, count)
    return Transmit(path_id, first, count, segment, frames, size, not_before, source)
