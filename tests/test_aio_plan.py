"""Send planning: consecutive DATA transmits merged into one native seal call (I/O only)."""

from __future__ import annotations

from wanxport.aio.plan import ControlPlan, DataPlan, plan_transmits
from wanxport.core.transmit import Transmit
from wanxport.wire.frames import DataFrame, Frame, ProbeFrame

SEGMENT = 10


def tx(path: int, first_pn: int, frames: list[Frame]) -> Transmit:
    frame = frames[0]
    count = -(-frame.length // SEGMENT) if isinstance(frame, DataFrame) else 1
    return Transmit(path, first_pn, count, SEGMENT, frames, 0, 0.0)


def test_plan_merges_contiguous_whole_segment_transmits_into_one_burst() -> None:
    buffers = {7: memoryview(bytes(100))}
    transmits = [
        tx(0, 0, [DataFrame(7, 0, 20)]),  # wire 0-1
        tx(0, 2, [DataFrame(7, 20, 20)]),  # wire 2-3
        tx(1, 0, [DataFrame(7, 40, 15)]),  # other path: its own plan
        tx(0, 4, [DataFrame(7, 40, 5)]),  # contiguous on path 0: merged (20 % 10 == 0)
        tx(0, 5, [DataFrame(7, 45, 10)]),  # previous one ends mid-segment: new burst
        tx(0, 6, [ProbeFrame(1)]),
        tx(0, 7, [DataFrame(7, 55, 10)]),  # after a control datagram: new burst
        tx(0, 9, [DataFrame(7, 65, 10)]),  # a gap in wire numbers: new burst
    ]
    plans = plan_transmits(transmits, buffers.__getitem__)
    summary = [(type(p).__name__, p.path_id, p.first_pn if isinstance(p, DataPlan) else p.pn,
                getattr(p, "offset", None), getattr(p, "length", None)) for p in plans]
    assert summary == [
        ("DataPlan", 0, 0, 0, 45),
        ("DataPlan", 1, 0, 40, 15),
        ("DataPlan", 0, 5, 45, 10),
        ("ControlPlan", 0, 6, None, None),
        ("DataPlan", 0, 7, 55, 10),
        ("DataPlan", 0, 9, 65, 10),
    ]
    assert isinstance(plans[3], ControlPlan)
    # A merged plan gives exactly the datagrams of its transmits: 2 + 2 + 1 numbered 0..4.
    assert isinstance(plans[0], DataPlan) and plans[0].count == 5
