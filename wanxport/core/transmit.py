"""What the session hands its driver to send: datagrams with their wire packet numbers.

Kept apart from the session so that drivers (``aio.plan``, ``sim.wire``) depend
on the shape of a send, not on the session's internals.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanxport.core.numbering import WireNumbering
from wanxport.wire.frames import DATA_OVERHEAD, Frame


@dataclass(slots=True)
class Transmit:
    """Datagrams to send on ``path_id`` no earlier than ``not_before`` (the pacing schedule).

    Like quinn-proto's ``Transmit { segment_size }``, every datagram is a real
    protocol packet: they are numbered ``first_pn .. first_pn + count - 1`` on the
    wire. A DATA transmit (``frames`` is one ``DataFrame``) is ``count`` datagrams
    each carrying the next ``segment_size`` bytes of the frame's range (the last
    may be shorter), each with its own DATA frame header; any other transmit is
    one datagram carrying ``frames``.
    """

    path_id: int
    first_pn: int
    count: int
    segment_size: int
    frames: list[Frame]
    size: int  # bytes of all its datagrams: headers + frames + tags (no IP/UDP)
    not_before: float


def number_datagrams(numbering: WireNumbering, path_id: int, core_pn: int, frames: list[Frame],
                     data_length: int | None, segment: int, overhead: int, not_before: float) -> Transmit:
    """The Transmit of core packet ``core_pn``: DATA (``data_length`` bytes) cut into
    ``segment``-byte datagrams, or one control datagram; wire numbers taken from ``numbering``."""
    if data_length is not None:
        count = -(-data_length // segment)
        size = count * (overhead + DATA_OVERHEAD) + data_length
    else:
        count, size = 1, overhead + sum(f.wire_size for f in frames)
    first = numbering.allocate(core_pn, count)
    return Transmit(path_id, first, count, segment, frames, size, not_before)
