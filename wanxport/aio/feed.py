"""Hand received packets to the core: placed DATA per run, control per packet.

The native receiver has already opened, replay-checked and placed every DATA
datagram; the core only has to learn *which* packet numbers arrived (to
acknowledge them) and *which* bytes (received ranges, shard completion).
Calling ``Session.receive_packet`` once per datagram would put a Python frame
per datagram back on the hot path, so consecutive records — same path,
consecutive packet numbers, same shard, contiguous offsets — are folded into
one *run* in C (``native.fold_runs``) and the core is told once per run
(``Session.receive_data_run``), as if each packet had arrived on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.aio.numbering import WireNumbering
from wanxport.core.session import Session
from wanxport.wire import native
from wanxport.wire.frames import AckFrame, Frame


def feed_runs(session: Session, runs: list[native.Run], now: float) -> None:
    """Tell the core about runs of placed DATA datagrams (``native.fold_runs``)."""
    for path_id, first_pn, count, shard_id, offset, length in runs:
        session.receive_data_run(path_id, first_pn, count, shard_id, offset, length, now)


def receive_control(session: Session, numbering: Sequence[WireNumbering], segments: Sequence[int],
                    path_id: int, pn: int, frames: list[Frame], now: float) -> None:
    """An opened packet; ACK frames are translated from wire to core packet numbers.

    A core packet counts as acknowledged only when all its datagrams are, but the
    datagrams of a partly acknowledged one did arrive: the session learns their
    bytes, so a loss re-sends one datagram's worth, not the whole core packet
    (with 32 datagrams a core packet and 1 % loss, that was a quarter of the data).
    """
    translated: list[Frame] = []
    for frame in frames:
        if isinstance(frame, AckFrame):
            if not 0 <= frame.path_id < len(numbering):
                continue
            wire = numbering[frame.path_id]
            oldest = session.oldest_acknowledgement_of_interest(frame.path_id)
            if oldest is None:
                continue  # nothing outstanding or remembered: nothing to learn
            # Ranges come highest first; those wholly below what is still of interest,
            # and those the previous ACK carried unchanged, are repeats of what earlier
            # ACKs said (most of every ACK) and are skipped.
            floor = wire.first_wire(oldest)
            kept = 0
            while kept < len(frame.ranges) and frame.ranges[kept][1] >= floor:
                kept += 1
            fresh = wire.unseen(frame.ranges[:kept])
            if not fresh:
                continue
            frame = AckFrame(frame.path_id, frame.ack_delay_us, fresh)
            for core_pn, first, last in wire.partly_covered(frame.ranges):
                _confirm_datagrams(session, frame.path_id, core_pn, first, last, segments[frame.path_id], now)
            ack = wire.translate(frame)
            if ack is None:
                continue
            frame = ack
        translated.append(frame)
    session.receive_packet(path_id, pn, translated, now)


def _confirm_datagrams(session: Session, path_id: int, core_pn: int, first: int, last: int,
                       segment: int, now: float) -> None:
    """Datagrams ``first..last`` of a DATA core packet arrived: confirm their bytes."""
    session.confirm_part(path_id, core_pn, first * segment, (last + 1) * segment, now)
