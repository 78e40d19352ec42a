"""Send planning: consecutive DATA transmits merged into one native seal call (I/O only)."""

from __future__ import annotations

import pytest

from wanxport.aio.plan import ControlPlan, DataPlan, plan_transmits
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.session import Session
from wanxport.core.transmit import DataSource, Transmit
from wanxport.wire.frames import DataFrame, Frame, ProbeFrame

SEGMENT = 10
BUFFERS = {7: memoryview(bytes(100))}


def tx(path: int, first_pn: int, frames: list[Frame]) -> Transmit:
    frame = frames[0]
    if not isinstance(frame, DataFrame):
        return Transmit(path, first_pn, 1, SEGMENT, frames, 0, 0.0)
    source = DataSource(frame.shard_id, BUFFERS.get(frame.shard_id), frame.offset, frame.length)
    return Transmit(path, first_pn, -(-frame.length // SEGMENT), SEGMENT, frames, 0, 0.0, source)


def test_plan_merges_contiguous_whole_segment_transmits_into_one_burst() -> None:
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
    plans = plan_transmits(transmits)
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


def test_a_data_transmit_names_the_submitted_buffer_itself() -> None:
    """The session's DATA transmits carry the application's buffer (no copy, no lookup), and
    the plans hand that same memory to the sealer."""
    session = Session(SessionConfig(paths=(PathConfig("a"), PathConfig("b"))))
    payload = bytearray(range(256)) * 64
    session.submit(3, payload, 0.0)
    transmits = session.poll_transmit(0.0)
    sources = [t.source for t in transmits if t.source is not None]
    assert sources and all(s.shard_id == 3 and s.buffer is not None and s.buffer.obj is payload
                           for s in sources)
    assert all(t.source is None for t in transmits if not isinstance(t.frames[0], DataFrame))
    data_plans = [p for p in plan_transmits(transmits) if isinstance(p, DataPlan)]
    assert data_plans and all(p.buffer.obj is payload for p in data_plans)
    assert sum(p.length for p in data_plans) == sum(s.length for s in sources)


def test_a_virtual_shard_cannot_be_planned_for_a_socket() -> None:
    with pytest.raises(ValueError, match="shard 9 is virtual"):
        plan_transmits([tx(0, 0, [DataFrame(9, 0, 20)])])
