"""The scheduler's parts one by one (order, tail, stripes, hedging) and their composition."""

from __future__ import annotations

import pytest

from wanxport.core import scheduler as scheduler_module
from wanxport.core.cc import CcContext, FixedConfig
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.flow import SendCredit
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.scheduler import (
    ChunkKind,
    ComposedScheduler,
    available_schedulers,
    create_scheduler,
)
from wanxport.core.scheduling.hedge import Hedger
from wanxport.core.scheduling.order import ExpectedArrivalOrder, RotatingOrder, expected_arrival
from wanxport.core.scheduling.stripes import Stripes
from wanxport.core.scheduling.tail import Tail, tail_threshold_bytes, water_fill_cutoff
from wanxport.core.sent_packets import Chunk, SentPacket
from wanxport.core.shards import OutgoingShard
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, simulate

MSS = 1000


def make_path(path_id: int, rtt_s: float, rate_Bps: float) -> Path:
    """A path whose smoothed RTT is ``rtt_s`` and whose rate the scheduler takes as ``rate_Bps``."""
    cc = FixedConfig(rate_bps=rate_Bps * 8).build(CcContext(mss_bytes=MSS + 32, initial_rtt_s=rtt_s))
    return Path(path_id, f"p{path_id}", MSS, cc, rtt_s)


def outgoing_with(*sizes: int) -> OutgoingData:
    out = OutgoingData(SendCredit(1 << 30))
    for shard_id, size in enumerate(sizes):
        out.submit(OutgoingShard(shard_id, size, None, bytes(32)))
    out.open_ready()
    return out


def put_in_flight(path: Path, pn: int, sent_at: float, chunk: Chunk) -> None:
    """Record ``chunk`` as outstanding on ``path`` (what the session does when it sends it)."""
    path.loss.on_packet_sent(SentPacket(pn, sent_at, chunk[2] + 32, [chunk], None, True, True, None))


# -- order ----------------------------------------------------------------------------


def test_expected_arrival_order_puts_the_first_to_deliver_first() -> None:
    near, far, paced = make_path(0, 0.010, 1e6), make_path(1, 0.150, 1e6), make_path(2, 0.010, 1e6)
    paced.next_send_at = 0.2  # its pacing holds it: it departs late
    assert expected_arrival(paced, 0.0) == pytest.approx(0.205)
    assert ExpectedArrivalOrder().order([paced, far, near], 0.0) == [near, far, paced]


def test_rotating_order_starts_one_path_further_each_round() -> None:
    paths = [make_path(i, 0.01 * (i + 1), 1e6) for i in range(3)]
    order = RotatingOrder()
    firsts = [order.order(paths, 0.0)[0].path_id for _ in range(4)]
    assert firsts == [1, 2, 0, 1]
    assert sorted(p.path_id for p in order.order(paths, 0.0)) == [0, 1, 2]


# -- tail -----------------------------------------------------------------------------


def test_water_fill_gives_the_last_bytes_to_the_paths_that_finish_them_first() -> None:
    near, far = make_path(0, 0.010, 1e6), make_path(1, 0.150, 1e6)  # one-way 5 ms and 75 ms
    # 10 kB: the near path alone has them delivered at 15 ms, before the far one's first byte.
    assert water_fill_cutoff([near, far], 0.0, 10_000) == pytest.approx(0.015)
    # 200 kB: both, finishing together at (200000 + 1e6 * 0.005 + 1e6 * 0.075) / 2e6.
    assert water_fill_cutoff([far, near], 0.0, 200_000) == pytest.approx(0.14)


def test_tail_is_entered_below_one_and_a_half_longest_round_trips_of_data() -> None:
    near, far = make_path(0, 0.010, 1e6), make_path(1, 0.150, 1e6)
    assert tail_threshold_bytes([near, far], 1.5) == pytest.approx(2e6 * 0.150 * 1.5)
    tail = Tail(0.002)
    assert tail.update([near, far], 0.0, 460_000) is False and not tail.in_tail
    assert tail.cutoff == float("inf") and not tail.holds(far, 0.0, 460_000)
    assert tail.update([near, far], 0.1, 10_000) is True and tail.in_tail, "entered: reported once"
    assert tail.update([near, far], 0.1, 10_000) is False and tail.in_tail
    assert tail.holds(far, 0.1, 10_000) and not tail.holds(near, 0.1, 10_000)
    assert not tail.holds(far, 0.1, 0), "nothing left to send: nobody is held (hedging may follow)"
    assert tail.update([], 0.2, 10_000) is False and not tail.in_tail, "no usable path: no tail"


def test_tail_without_water_filling_detects_the_tail_but_holds_nobody() -> None:
    near, far = make_path(0, 0.010, 1e6), make_path(1, 0.150, 1e6)
    tail = Tail(0.002, water_fill=False)
    assert tail.update([near, far], 0.0, 10_000) is True and tail.in_tail
    assert tail.cutoff == float("inf") and not tail.holds(far, 0.0, 10_000)


def test_tail_is_rechecked_after_its_interval_or_once_marked_stale() -> None:
    path = make_path(0, 0.010, 1e6)
    tail = Tail(0.002)
    assert tail.due(0.0), "never evaluated"
    tail.update([path], 1.0, 10_000)
    assert not tail.due(1.001) and tail.due(1.002)
    tail.mark_stale()
    assert tail.due(1.001)


# -- stripes --------------------------------------------------------------------------


def test_each_path_sends_its_own_contiguous_stripe() -> None:
    out = outgoing_with(10_000)
    stripes = Stripes(out)
    picks = [(p, stripes.next_chunk(p, 1000, 3000)) for p in (0, 1, 0, 1, 0, 1, 0)]
    assert picks == [(0, (0, 0, 1000)), (1, (0, 3000, 1000)), (0, (0, 1000, 1000)), (1, (0, 4000, 1000)),
                     (0, (0, 2000, 1000)), (1, (0, 5000, 1000)), (0, (0, 6000, 1000))]
    assert stripes.reserved_bytes == 2000 and out.unsent_bytes == 1000


def test_a_released_stripe_is_served_first_by_the_next_path_that_asks() -> None:
    out = outgoing_with(10_000)
    stripes = Stripes(out)
    assert stripes.next_chunk(0, 1000, 4000) == (0, 0, 1000)
    assert stripes.release(0) is True and stripes.release(0) is False
    assert stripes.reserved_bytes == 3000, "still to send, now spare"
    assert stripes.next_chunk(1, 1000, 4000) == (0, 1000, 1000), "the spare run before new data"
    assert stripes.next_chunk(1, 1000, 4000) == (0, 2000, 1000)
    assert stripes.release_all() is True
    assert stripes.next_chunk(2, 5000, 4000) == (0, 3000, 1000), "a spare run is served as it is"
    assert stripes.next_chunk(2, 5000, 0) == (0, 4000, 5000)
    assert stripes.next_chunk(2, 5000, 0) == (0, 9000, 1000)
    assert stripes.next_chunk(2, 5000, 0) is None and stripes.reserved_bytes == 0


def test_without_striping_paths_take_single_chunks_in_turn() -> None:
    out = outgoing_with(3000)
    stripes = Stripes(out)
    picks = [stripes.next_chunk(p, 1000, 0) for p in (0, 1, 0)]
    assert picks == [(0, 0, 1000), (0, 1000, 1000), (0, 2000, 1000)]
    assert stripes.reserved_bytes == 0 and stripes.release_all() is False


def test_a_done_shard_leaves_no_reserved_bytes_behind() -> None:
    out = outgoing_with(5000, 5000)
    stripes = Stripes(out)
    stripes.next_chunk(0, 1000, 4000)  # path 0: shard 0 [0, 4000)
    stripes.next_chunk(1, 1000, 4000)  # path 1: shard 0 [4000, 5000)
    stripes.next_chunk(2, 1000, 4000)  # path 2: shard 1 [0, 4000)
    stripes.release(2)
    assert out.on_done(1, 0) is not None
    stripes.forget_shard(1)
    assert stripes.reserved_bytes == 3000 and not stripes.spare
    assert out.on_done(0, 0) is not None
    stripes.forget_shard(0)
    assert stripes.reserved_bytes == 0 and stripes.next_chunk(0, 1000, 4000) is None


# -- hedging --------------------------------------------------------------------------


def test_hedging_copies_the_chunk_expected_latest_onto_a_faster_path() -> None:
    fast, slow = make_path(0, 0.010, 1e6), make_path(1, 0.300, 1e6)
    out = outgoing_with(3000)
    put_in_flight(slow, 0, 0.000, (0, 0, 1000))  # due at 0.150
    put_in_flight(slow, 1, 0.010, (0, 1000, 1000))  # due at 0.160
    put_in_flight(fast, 0, 0.000, (0, 2000, 1000))  # due at 0.005, and on the asking path
    hedger = Hedger()
    assert hedger.next_chunk(slow, 0.02, [fast, slow], out) is None, "it would not arrive sooner"
    hedger = Hedger()
    assert hedger.next_chunk(fast, 0.02, [fast, slow], out) == (0, 1000, 1000)
    out.on_acked([(0, 0, 1000)])
    assert hedger.next_chunk(fast, 0.02, [fast, slow], out) is None, "acknowledged, and its own chunk"
    assert hedger.hedged == {(0, 1000)}


def test_a_chunk_is_hedged_at_most_once() -> None:
    fast, slow = make_path(0, 0.010, 1e6), make_path(1, 0.300, 1e6)
    other_fast = make_path(2, 0.010, 1e6)
    out = outgoing_with(1000)
    put_in_flight(slow, 0, 0.0, (0, 0, 1000))
    hedger = Hedger()
    assert hedger.next_chunk(fast, 0.01, [fast, slow, other_fast], out) == (0, 0, 1000)
    later = 0.01 + 0.010  # past the rebuild interval: the queue is read again from the paths
    assert hedger.next_chunk(other_fast, later, [fast, slow, other_fast], out) is None


# -- composition ----------------------------------------------------------------------


def config(**overrides: object) -> SessionConfig:
    return SessionConfig(paths=(PathConfig("a"), PathConfig("b")), **overrides)  # type: ignore[arg-type]


def test_every_registered_scheduler_is_created_by_its_name() -> None:
    names = available_schedulers()
    assert {"earliest-arrival", "round-robin", "earliest-arrival-no-hedge", "earliest-arrival-no-cutoff",
            "earliest-arrival-no-stripes"} <= set(names)
    for name in names:
        assert create_scheduler(name, config(), outgoing_with(1)).name == name
    with pytest.raises(ValueError, match="valid: .*round-robin"):
        create_scheduler("fastest", config(), outgoing_with(1))


def test_earliest_arrival_holds_a_slow_path_back_at_the_tail_and_hedges() -> None:
    fast, slow = make_path(0, 0.010, 1e6), make_path(1, 0.150, 1e6)
    out = outgoing_with(100_000)
    scheduler = create_scheduler("earliest-arrival", config(stripe_chunks=8), out)
    assert scheduler.next_chunk(slow, 0.0, [fast, slow]) == ((0, 0, 1000), ChunkKind.NEW)
    assert scheduler.remaining_bytes == 99_000, "the slow path's stripe still counts as to send"
    for _ in range(90):  # the fast path sends 90 kB: 9 kB left, mostly in the slow path's stripe
        scheduler.next_chunk(fast, 0.0, [fast, slow])
    assert scheduler.remaining_bytes == 9000
    assert scheduler.refresh([fast, slow], 0.0) is True, "entering the tail frees the stripes"
    assert scheduler.hold(slow, 0.0) == pytest.approx(0.002) and scheduler.hold(fast, 0.0) is None
    while scheduler.remaining_bytes:
        picked = scheduler.next_chunk(fast, 0.0, [fast, slow])
        assert picked is not None and picked[1] is ChunkKind.NEW
    put_in_flight(slow, 0, 0.0, (0, 0, 1000))
    assert scheduler.next_chunk(fast, 0.01, [fast, slow]) == ((0, 0, 1000), ChunkKind.HEDGE)
    out.requeue([(0, 50_000, 1000)])
    scheduler.data_requeued()
    assert scheduler.next_chunk(slow, 0.01, [fast, slow]) == ((0, 50_000, 1000), ChunkKind.RETRANSMISSION)


def test_round_robin_keeps_its_stripes_holds_nobody_and_never_hedges() -> None:
    fast, slow = make_path(0, 0.010, 1e6), make_path(1, 0.150, 1e6)
    out = outgoing_with(20_000)
    scheduler = create_scheduler("round-robin", config(stripe_chunks=8), out)
    assert isinstance(scheduler, ComposedScheduler)
    assert scheduler.tail is None and scheduler.hedger is None
    assert scheduler.next_chunk(slow, 0.0, [fast, slow]) == ((0, 0, 1000), ChunkKind.NEW)
    for _ in range(12):
        scheduler.next_chunk(fast, 0.0, [fast, slow])
    assert scheduler.refresh([fast, slow], 0.0) is False and scheduler.hold(slow, 0.0) is None
    assert scheduler.remaining_bytes == 7000, "the slow path's stripe is still its own"
    assert scheduler.next_chunk(fast, 0.0, [fast, slow]) is None
    put_in_flight(slow, 0, 0.0, (0, 0, 1000))
    assert scheduler.next_chunk(fast, 0.01, [fast, slow]) is None, "no hedging"


# -- in the simulator -----------------------------------------------------------------

NEAR_FAR = """
name = "near-far"
seed = 1
[transfer]
size = "4MiB"
shards = 4
[[paths]]
name = "near"
rtt_ms = 10.0
bandwidth_mbps = 40.0
[[paths]]
name = "far"
rtt_ms = 150.0
bandwidth_mbps = 4.0
"""


def far_payload_and_hedged(scheduler: str) -> tuple[int, int]:
    # Without the coded tail, whose repair symbols go before hedges and would take their place.
    report = simulate(parse_scenario(NEAR_FAR), SimOptions(scheduler=scheduler, payload_mode="virtual",
                                                           fec="off"))
    assert report["intact"] and report["scheduler"] == scheduler
    near, far = report["paths"]
    return far["payload_bytes"], near["hedged_bytes"] + far["hedged_bytes"]


def test_the_named_scheduler_decides_where_the_last_bytes_go() -> None:
    """Round-robin keeps striping onto the far path to the end and hedges nothing;
    earliest-arrival holds the far path back in the tail; without its cutoff it hedges instead."""
    rr_far, rr_hedged = far_payload_and_hedged("round-robin")
    ea_far, ea_hedged = far_payload_and_hedged("earliest-arrival")
    no_cutoff_far, no_cutoff_hedged = far_payload_and_hedged("earliest-arrival-no-cutoff")
    assert rr_hedged == 0
    assert ea_far < no_cutoff_far and ea_far < rr_far, "the cutoff keeps the far path out of the tail"
    assert no_cutoff_hedged > 0


class NearOnly(ComposedScheduler):
    """The default's parts, but path 1 always waits: nothing else may send on it."""

    def hold(self, path: Path, now: float) -> float | None:
        return now + 0.01 if path.path_id == 1 else super().hold(path, now)


@pytest.mark.skipif(not str(scheduler_module.__file__).endswith(".py"),
                    reason="mypyc-compiled core: an interpreted class cannot subclass a compiled one")
def test_a_registered_scheduler_is_what_the_session_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    def near_only(config: SessionConfig, outgoing: OutgoingData) -> NearOnly:
        return NearOnly("near-only", outgoing, order=ExpectedArrivalOrder(),
                        tail=Tail(config.pacing_horizon_s), stripe_chunks=config.stripe_chunks,
                        hedger=Hedger())

    monkeypatch.setitem(scheduler_module._REGISTRY, "near-only", near_only)
    report = simulate(parse_scenario(NEAR_FAR), SimOptions(scheduler="near-only", payload_mode="virtual"))
    near, far = report["paths"]
    assert report["intact"] and far["payload_bytes"] == 0 and near["payload_bytes"] >= 4 << 20
