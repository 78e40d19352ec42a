"""Group the core's Transmits into send plans: one native seal call per data burst.

An I/O optimisation only: the core has already decided every datagram — its
wire packet number, its bytes (``Transmit.first_pn``, ``count``,
``segment_size``). Consecutive DATA transmits on one path, for one shard, at
contiguous offsets and consecutive wire numbers, where every one but the last
is a whole number of segments, become one ``DataPlan``: the datagrams are
exactly those the transmits give one by one, cut and sealed in one call. The
bytes come from each transmit's ``DataSource``: the shard's own buffer, sliced
by the sealer, never copied here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wanxport.core.transmit import Transmit
from wanxport.wire.frames import Frame


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


def plan_transmits(transmits: Sequence[Transmit]) -> list[Plan]:
    """Plans in send order (per path, the order of the transmits).

    A DATA transmit of a virtual shard (no bytes: the simulator's) has nothing to
    seal and is refused with a ValueError rather than sent as garbage.
    """
    plans: list[Plan] = []
    open_runs: dict[int, DataPlan] = {}
    for tx in transmits:
        path = tx.path_id
        source = tx.source
        if source is not None:
            run = open_runs.get(path)
            if (run is not None and run.shard_id == source.shard_id and run.segment == tx.segment_size
                    and run.offset + run.length == source.offset and run.length % run.segment == 0
                    and run.first_pn + run.count == tx.first_pn):
                run.length += source.length
                continue
            if source.buffer is None:
                raise ValueError(f"shard {source.shard_id} is virtual: a data path needs its bytes")
            run = DataPlan(path, tx.first_pn, source.shard_id, source.buffer, source.offset,
                           source.length, tx.segment_size, tx.not_before)
            open_runs[path] = run
            plans.append(run)
        else:
            open_runs.pop(path, None)
            plans.append(ControlPlan(path, tx.first_pn, tx.frames, tx.not_before))
    return plans
