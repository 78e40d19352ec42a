"""The discrete-event network model: loop ordering, bottleneck, loss, delay, events."""

import math

import pytest

from wanxport.scenario import BurstLoss, LinkParams, Scenario, parse_scenario
from wanxport.sim.network import EventLoop, Network, PathDirection, link_rng

Trace = list[tuple[float, object]]


def make_link(params: LinkParams, seed: int = 1, **extra: float) -> tuple[EventLoop, PathDirection, Trace]:
    loop = EventLoop()
    trace: Trace = []
    link = PathDirection(params, link_rng(seed, 0, "a->b"), lambda p, now: trace.append((now, p)), loop,
                         **extra)
    return loop, link, trace


def pace(loop: EventLoop, link: PathDirection, count: int, size: int, interval: float) -> None:
    """Offer ``count`` packets numbered 0.. every ``interval`` seconds from now."""
    start = loop.now
    for n in range(count):
        loop.call_at(start + n * interval, link.send, n, size)


# ----------------------------------------------------------------------- event loop


def test_event_loop_orders_by_time_then_scheduling_order() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.call_at(2.0, seen.append, "c")
    loop.call_at(1.0, seen.append, "a")
    loop.call_at(1.0, seen.append, "b")
    cancelled = loop.call_at(1.5, seen.append, "x")
    loop.cancel(cancelled)
    loop.call_at(1.0, lambda: loop.call_at(0.0, seen.append, "past-runs-now"))
    loop.run_until(1.9)
    assert seen == ["a", "b", "past-runs-now"] and loop.now == 1.9
    loop.call_later(0.5, seen.append, "d")
    loop.run(stop=lambda: seen[-1] == "c")
    assert seen[-1] == "c" and loop.now == 2.0 and len(loop) == 1
    loop.run()
    assert seen[-1] == "d" and loop.now == 2.4 and loop.next_time() is None
    assert loop.processed == 6


# ----------------------------------------------------------------------- bottleneck


def test_delivered_rate_equals_bandwidth_under_overload() -> None:
    # 8 Mb/s = 1 MB/s; offer 2 MB/s of 1000-byte packets for 2 s.
    loop, link, trace = make_link(LinkParams(rtt_ms=40, bandwidth_mbps=8, queue_ms=50))
    pace(loop, link, 4000, 1000, 0.0005)
    loop.run()
    window = [t for t, _ in trace if 0.5005 <= t < 1.5005]  # off the packet grid
    assert len(window) == 1000  # exactly 1 MB per second once the queue is full
    assert link.dropped_queue > 1900 and link.dropped_loss == 0
    assert link.delivered + link.dropped_queue == link.sent == 4000
    # Last arrival: serialization of everything accepted, plus the one-way delay.
    assert trace[-1][0] == pytest.approx(link.delivered * 0.001 + 0.02)


def test_drop_tail_queue_capacity() -> None:
    # 10 ms at 1 MB/s = 10,000 bytes of queue, plus the one in service.
    loop, link, trace = make_link(LinkParams(rtt_ms=0, bandwidth_mbps=8, queue_ms=10))
    for n in range(100):
        link.send(n, 1000)
    assert link.backlog_bytes() == 10_000
    loop.run()
    assert [p for _, p in trace] == list(range(11))
    assert link.dropped_queue == 89
    assert [t for t, _ in trace] == pytest.approx([0.001 * (n + 1) for n in range(11)])


def test_iid_loss_rate_within_three_sigma() -> None:
    n, p = 20_000, 0.1
    loop, link, _ = make_link(LinkParams(rtt_ms=10, bandwidth_mbps=100, loss=p))
    pace(loop, link, n, 100, 0.0001)
    loop.run()
    assert abs(link.dropped_loss - n * p) < 3 * math.sqrt(n * p * (1 - p))
    assert link.delivered == n - link.dropped_loss


def test_gilbert_elliott_stationary_loss_and_bursts() -> None:
    burst = BurstLoss(p=0.01, r=0.09)  # stationary 0.1, bad runs of 1/r = 11 packets
    n = 50_000
    loop, link, trace = make_link(LinkParams(rtt_ms=10, bandwidth_mbps=100, burst_loss=burst))
    pace(loop, link, n, 100, 0.0001)
    loop.run()
    rho = 1 - burst.p - burst.r  # lag-1 correlation of the state chain
    sigma = math.sqrt(n * 0.1 * 0.9 * (1 + rho) / (1 - rho))
    assert abs(link.dropped_loss - n * burst.stationary_loss) < 3 * sigma
    got = {p for _, p in trace}
    lost = [k for k in range(n) if k not in got]
    runs = 1 + sum(1 for a, b in zip(lost, lost[1:], strict=False) if b != a + 1)
    assert len(lost) / runs > 5  # losses come in bursts, unlike i.i.d. (mean run 1.1)


def test_no_reordering_with_jitter_when_reorder_false() -> None:
    params = LinkParams(rtt_ms=40, bandwidth_mbps=100, jitter_ms=5, reorder=False)
    loop, link, trace = make_link(params)
    pace(loop, link, 2000, 100, 0.0005)
    loop.run()
    order = [p for _, p in trace]
    assert order == sorted(order) and len(order) == 2000
    delays = [t - 0.0005 * p for t, p in trace]  # type: ignore[operator]
    assert min(delays) >= 0 and max(delays) > 0.03  # jitter is really applied


def test_some_reordering_with_jitter_when_reorder_true() -> None:
    params = LinkParams(rtt_ms=40, bandwidth_mbps=100, jitter_ms=5, reorder=True)
    loop, link, trace = make_link(params)
    pace(loop, link, 2000, 100, 0.0005)
    loop.run()
    order = [p for _, p in trace]
    assert sorted(order) == list(range(2000)) and order != sorted(order)
    assert [t for t, _ in trace] == sorted(t for t, _ in trace)


def test_jitter_never_makes_delay_negative() -> None:
    params = LinkParams(rtt_ms=2, bandwidth_mbps=1000, jitter_ms=10, reorder=True)
    loop, link, trace = make_link(params)
    pace(loop, link, 500, 100, 0.001)
    loop.run()
    assert len(trace) == 500  # a lossless link: every packet is checked
    assert all(t >= 0.001 * p for t, p in trace)  # type: ignore[operator]


def test_duplicate_and_corrupt_test_impairments() -> None:
    loop, link, trace = make_link(LinkParams(rtt_ms=10, bandwidth_mbps=100), duplicate=0.2, corrupt=0.2)
    payload = bytes(64)
    for n in range(1000):
        loop.call_at(n * 0.001, link.send, payload, 64)
    loop.run()
    assert len(trace) == 1000 + link.duplicated and 120 < link.duplicated < 280
    damaged = [p for _, p in trace if p != payload]
    assert link.corrupted > 0 and len(damaged) >= link.corrupted
    assert all(sum(bin(b).count("1") for b in p) == 1 for p in damaged)  # type: ignore[union-attr]


# ----------------------------------------------------------------------- network

TWO_PATHS = """
name = "n"
seed = 3
[[paths]]
name = "slow"
rtt_ms = 100
bandwidth_mbps = 8
  [[paths.events]]
  at_s = 1.0
  set = { bandwidth_mbps = 16.0 }
  [[paths.events]]
  at_s = 2.0
  down = true
  [[paths.events]]
  at_s = 3.0
  down = false
[[paths]]
name = "fast"
rtt_ms = 20
bandwidth_mbps = 80
loss = 0.05
  [paths.reverse]
  loss = 0.0
  rtt_ms = 40
"""


def run_network(scenario: Scenario, seed: int | None = None, packets: int = 4000) -> list[tuple]:
    loop = EventLoop()
    trace: list[tuple] = []
    net = Network(
        scenario,
        loop,
        deliver_a=lambda i, p, now: trace.append(("a", i, p, now)),
        deliver_b=lambda i, p, now: trace.append(("b", i, p, now)),
        seed=seed,
    )
    loop.run_until(0.5)
    net.start()
    for n in range(packets):
        t = 0.5 + n * 0.001
        for i in range(len(scenario.paths)):
            loop.call_at(t, net.forward[i].send, n, 1000)
            loop.call_at(t, net.reverse[i].send, n, 1000)
    loop.run()
    return trace


def test_network_events_change_rate_and_take_paths_down_and_up() -> None:
    scenario = parse_scenario(TWO_PATHS)
    loop = EventLoop()
    arrivals: list[float] = []
    net = Network(scenario, loop, lambda i, p, now: None, lambda i, p, now: arrivals.append(now))
    net.start(0.0)
    slow = net.forward[0]
    # Offer 2 MB/s of 1000-byte packets for 4 s; the path runs 1 MB/s, then 2 MB/s,
    # then is down (queue and in-service dropped), then up again at 2 MB/s.
    for n in range(8000):
        loop.call_at(n * 0.0005, slow.send, n, 1000)
    loop.run()
    edge = 0.05 + 0.00025  # one-way delay, off the 0.5 ms packet grid
    per_second = [sum(1 for t in arrivals if s + edge <= t < s + 1 + edge) for s in range(4)]
    assert per_second[0] == 1000
    assert per_second[1] == pytest.approx(2000, abs=2)
    assert per_second[2] == 0  # down from 2.0 to 3.0 (one-way delay 0.05)
    assert per_second[3] == pytest.approx(2000, abs=2)
    assert slow.dropped_down >= 2000  # offered while down, plus the queue it held
    assert slow.params.bandwidth_mbps == 16.0 and not slow.params.down
    assert net.stats()[0]["name"] == "slow"


@pytest.mark.parametrize("reorder", ["false", "true"])
def test_packets_propagating_when_the_path_fails_still_arrive(reorder: str) -> None:
    scenario = parse_scenario(
        'name = "d"\n[[paths]]\nname = "p"\nrtt_ms = 200\nbandwidth_mbps = 8\n'
        f"reorder = {reorder}\n"
        "[[paths.events]]\nat_s = 0.0105\ndown = true\n"
    )
    loop = EventLoop()
    got: list[object] = []
    net = Network(scenario, loop, lambda i, p, now: None, lambda i, p, now: got.append(p))
    net.start()
    for n in range(20):
        net.forward[0].send(n, 1000)  # 1 ms each: 10 serialized, #10 in service at 10.5 ms
    loop.run()
    assert got == list(range(10))
    assert net.forward[0].dropped_down == 10


def test_reverse_overrides_and_directions() -> None:
    trace = run_network(parse_scenario(TWO_PATHS), packets=500)
    fast_b = [now - 0.5 - p * 0.001 for side, i, p, now in trace if side == "b" and i == 1]
    fast_a = [now - 0.5 - p * 0.001 for side, i, p, now in trace if side == "a" and i == 1]
    assert len(fast_a) == 500 and 400 < len(fast_b) < 500  # loss only a->b
    assert min(fast_b) == pytest.approx(0.0101)  # 10 ms + 100 us serialization
    assert min(fast_a) == pytest.approx(0.0201)


def test_exact_reproducibility_and_independent_path_randomness() -> None:
    scenario = parse_scenario(TWO_PATHS)
    first = run_network(scenario)
    assert run_network(scenario) == first
    assert run_network(scenario, seed=4) != first
    # Appending a path leaves the existing paths' randomness (and traces) unchanged.
    extra = parse_scenario(TWO_PATHS + '[[paths]]\nname = "x"\nrtt_ms = 5\nbandwidth_mbps = 50\nloss = 0.2\n')
    assert [e for e in run_network(extra) if e[1] < 2] == first


def test_start_applies_events_due_now_and_refuses_twice() -> None:
    scenario = parse_scenario(
        'name = "z"\n[[paths]]\nname = "p"\nrtt_ms = 10\nbandwidth_mbps = 8\n'
        "[[paths.events]]\nat_s = 0\ndown = true\n"
    )
    loop = EventLoop()
    net = Network(scenario, loop, lambda i, p, now: None, lambda i, p, now: None)
    net.start()
    net.forward[0].send("x", 100)
    net.reverse[0].send("y", 100)
    assert net.forward[0].dropped_down == 1 and net.reverse[0].dropped_down == 1
    with pytest.raises(RuntimeError):
        net.start()
