"""Turn the core's Transmits into send plans: wire numbers, merged data bursts.

Why a separate step: the core hands out one Transmit per core packet, and
both data paths (native and Python) need the same decisions made once — which
wire packet numbers each datagram gets (``numbering``), and which consecutive
DATA transmits can be cut and sealed in one native call. Consecutive DATA
transmits on one path, for one shard, at contiguous offsets, where every one
but the last is a whole number of segments, become one ``DataPlan``: the
datagrams are exactly those the transmits would have given one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wanxport.aio.numbering import WireNumbering
from wanxport.core.session import Transmit
from wanxport.wire.frames import DataFrame, Frame

ShardLookup = Callable[[int], memoryview]


@dataclass(slots=True)
class DataPlan:
    """Shard bytes ``[offset, offset + length)`` as ``segment``-byte datagrams numbered from ``first_pn``."""

    path_id: int
    first_pn: int
    shard_id: int
    buffer: memoryview
    offset: int
    length: int
    segment: int
    not_before: float

    @property
    def count(self) -> int:
        return -(-self.length // self.segment)


@dataclass(slots=True)
class ControlPlan:
    """One control datagram (frames other than a lone DATA frame)."""

    path_id: int
    pn: int
    frames: list[Frame]
    not_before: float


Plan = DataPlan | ControlPlan


def plan_transmits(transmits: Sequence[Transmit], numbering: Sequence[WireNumbering],
                   segments: Sequence[int], shard_buffer: ShardLookup) -> list[Plan]:
    """Plans in send order (per path, the order of the transmits)."""
    plans: list[Plan] = []
    open_runs: dict[int, DataPlan] = {}
    for tx in transmits:
        path = tx.path_id
        frames = tx.frames
        frame = frames[0] if len(frames) == 1 else None
        if isinstance(frame, DataFrame):
            segment = segments[path]
            count = -(-frame.length // segment)
            first = numbering[path].allocate(tx.packet_number, count)
            run = open_runs.get(path)
            if (run is not None and run.shard_id == frame.shard_id
                    and run.offset + run.length == frame.offset and run.length % segment == 0):
                run.length += frame.length
                continue
            run = DataPlan(path, first, frame.shard_id, shard_buffer(frame.shard_id), frame.offset,
                           frame.length, segment, tx.not_before)
            open_runs[path] = run
            plans.append(run)
        else:
            open_runs.pop(path, None)
            plans.append(ControlPlan(path, numbering[path].allocate(tx.packet_number, 1), frames,
                                     tx.not_before))
    return plans
