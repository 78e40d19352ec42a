"""Group the core's Transmits into send plans: one native seal call per data burst.

An I/O optimisation only: the core has already decided every datagram — its
wire packet number, its bytes (``Transmit.first_pn``, ``count``,
``segment_size``). Consecutive DATA transmits on one path, for one shard, at
contiguous offsets and consecutive wire numbers, where every one but the last
is a whole number of segments, become one ``DataPlan``: the datagrams are
exactly those the transmits give one by one, cut and sealed in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wanxport.core.transmit import Transmit
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


def plan_transmits(transmits: Sequence[Transmit], shard_buffer: ShardLookup) -> list[Plan]:
    """Plans in send order (per path, the order of the transmits)."""
    plans: list[Plan] = []
    open_runs: dict[int, DataPlan] = {}
    for tx in transmits:
        path = tx.path_id
        frames = tx.frames
        frame = frames[0] if len(frames) == 1 else None
        if isinstance(frame, DataFrame):
            run = open_runs.get(path)
            if (run is not None and run.shard_id == frame.shard_id and run.segment == tx.segment_size
                    and run.offset + run.length == frame.offset and run.length % run.segment == 0
                    and run.first_pn + run.count == tx.first_pn):
                run.length += frame.length
                continue
            run = DataPlan(path, tx.first_pn, frame.shard_id, shard_buffer(frame.shard_id), frame.offset,
                           frame.length, tx.segment_size, tx.not_before)
            open_runs[path] = run
            plans.append(run)
        else:
            open_runs.pop(path, None)
            plans.append(ControlPlan(path, tx.first_pn, frames, tx.not_before))
    return plans
