"""Simulator properties over random small scenarios (docs/design.md sections 3-5).

For each generated scenario (1-4 paths, delay, rate, loss, jitter with and
without reordering, bursty loss, links going down and up, duplicated and
corrupted datagrams) one run in ``bytes`` mode must:

- never report a shard ok that does not hold the sender's bytes, and report
  ``intact`` exactly when every shard arrived ok;
- keep each path's outstanding packets within its congestion window (plus a
  few control packets), and only send data while the window has room;
- keep the receiver's opened-but-not-released shard bytes within its budget.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from wanxport.core.config import SessionConfig
from wanxport.core.failover import PROBE_MEMORY_S
from wanxport.core.recovery import LossDetector
from wanxport.core.sent_packets import SentPacket
from wanxport.scenario import Scenario, parse_scenario
from wanxport.sim import runner as runner_module
from wanxport.sim.runner import SimEndpoint, SimOptions, SimRun
from wanxport.wire.protection import NullProtection

# These tests watch a run by replacing SimRun._service; a mypyc-compiled class
# (the regular install that ./dev test also runs) does not let a method be replaced.
instrumentable = pytest.mark.skipif(runner_module.__file__.endswith(".so"),
                                    reason="instruments SimRun methods; compiled classes are closed")

# Packets a path may hold beyond cwnd/mss: the packet that crossed the window,
# SHARD_OPEN and probe packets, which are small and exempt from pacing.
SLACK_PACKETS = 8


@dataclass
class PathSpec:
    rtt_ms: float
    bandwidth_mbps: float
    loss: float
    jitter_ms: float
    reorder: bool
    queue_ms: float
    burst: tuple[float, float] | None
    outage: tuple[float, float] | None

    def toml(self, index: int) -> str:
        lines = [
            "[[paths]]",
            f'name = "p{index}"',
            f"rtt_ms = {self.rtt_ms!r}",
            f"bandwidth_mbps = {self.bandwidth_mbps!r}",
            f"jitter_ms = {self.jitter_ms!r}",
            f"reorder = {'true' if self.reorder else 'false'}",
            f"queue_ms = {self.queue_ms!r}",
        ]
        if self.burst is None:
            lines.append(f"loss = {self.loss!r}")  # burst_loss replaces loss
        else:
            lines += ["[paths.burst_loss]", f"p = {self.burst[0]!r}", f"r = {self.burst[1]!r}"]
        if self.outage is not None:
            start, length = self.outage
            lines += ["[[paths.events]]", f"at_s = {start!r}", "down = true",
                      "[[paths.events]]", f"at_s = {start + length!r}", "down = false"]
        return "\n".join(lines)


def rounded(lo: float, hi: float, places: int = 3) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False).map(lambda x: round(x, places))


path_specs = st.builds(
    PathSpec,
    rtt_ms=rounded(1.0, 200.0, 1),
    bandwidth_mbps=rounded(1.0, 100.0, 1),
    loss=st.one_of(st.just(0.0), rounded(0.0, 0.2)),
    jitter_ms=st.one_of(st.just(0.0), rounded(0.0, 20.0, 1)),
    reorder=st.booleans(),
    queue_ms=st.sampled_from([5.0, 20.0, 50.0]),
    burst=st.one_of(st.none(), st.tuples(rounded(0.001, 0.05), rounded(0.1, 0.6))),
    outage=st.one_of(st.none(), st.none(), st.tuples(rounded(0.0, 1.0, 2), rounded(0.05, 1.5, 2))),
)


@st.composite
def scenarios(draw: st.DrawFn) -> str:
    """TOML text of a small scenario: 64 KiB to 2 MiB over 1-4 paths."""
    paths = draw(st.lists(path_specs, min_size=1, max_size=4))
    slowest = min(p.bandwidth_mbps for p in paths)
    # Keep each run well under a second of wall time: low rates get small sizes.
    max_kib = 2048 if slowest * len(paths) >= 20 else 512
    size_kib = draw(st.integers(64, max_kib))
    header = [
        'name = "prop"',
        f"seed = {draw(st.integers(0, 2**31))}",
        "[transfer]",
        f'size = "{size_kib}KiB"',
        f"shards = {draw(st.integers(1, 8))}",
        f'direction = "{draw(st.sampled_from(["a->b", "a->b", "both"]))}"',
    ]
    return "\n".join(header + [p.toml(i) for i, p in enumerate(paths)]) + "\n"


@dataclass
class Observed:
    """What an instrumented run saw, beyond its report."""

    report: dict[str, Any]
    run: SimRun
    buffers: dict[str, dict[int, memoryview]]
    violations: list[str] = field(default_factory=list)
    data_sends: int = 0


@contextmanager
def receive_budget(budget: int | None):  # type: ignore[no-untyped-def]
    """Give the runner's sessions a small receive budget.

    ``SimOptions(session={"receive_budget_bytes": ...})`` raises TypeError (the
    runner passes those fields itself), so the config class is wrapped instead.
    """
    if budget is None:
        yield
        return

    def config(**kwargs: Any) -> SessionConfig:
        kwargs["receive_budget_bytes"] = kwargs["peer_credit_bytes"] = budget
        return SessionConfig(**kwargs)

    with mock.patch.object(runner_module, "SessionConfig", config):
        yield


def observe(text: str, options: SimOptions, budget: int | None = None) -> Observed:
    """Run one scenario with invariant checks after every service of either endpoint."""
    scenario: Scenario = parse_scenario(text)
    with receive_budget(budget):
        run = SimRun(scenario, options)
    buffers: dict[str, dict[int, memoryview]] = {"a": {}, "b": {}}
    observed = Observed({}, run, buffers)

    for endpoint in (run.a, run.b):
        incoming = endpoint.session.incoming
        incoming.allocator = recording(incoming.allocator, buffers[endpoint.name])

    service = run._service
    peak_cwnd: dict[tuple[str, int], int] = {}

    def checked_service(endpoint: SimEndpoint) -> None:
        service(endpoint)
        session = endpoint.session
        overhead = session.config.packet_overhead()
        for path in session.paths:
            # cwnd may shrink below what was legitimately sent earlier, so bound by its peak
            key = (endpoint.name, path.path_id)
            peak_cwnd[key] = max(peak_cwnd.get(key, 0), path.cc.cwnd_bytes)
            limit = peak_cwnd[key] + SLACK_PACKETS * (path.mss + overhead)
            # Data is held to the window (in bytes: a core packet re-sending the lost
            # datagrams of a segmented one is smaller than a full one); small control
            # packets (SHARD_OPEN, SHARD_DONE, CREDIT) are bounded by the shards, and a
            # failed path's probes by how long they are remembered (plus the few sent
            # while it was suspected).
            outstanding = path.loss.outstanding()
            data_packets = sum(1 for packet in outstanding if held_to_window(packet))
            data_bytes = sum(packet.size for packet in outstanding if held_to_window(packet))
            control_packets = len(outstanding) - data_packets
            probes = math.ceil(PROBE_MEMORY_S / session.config.failed_probe_interval_s) + 3
            if data_bytes > limit or control_packets > 4 * len(run.shard_sizes) + SLACK_PACKETS + probes:
                observed.violations.append(
                    f"{endpoint.name} path {path.path_id}: {data_packets} data packets ({data_bytes} B) + "
                    f"{control_packets} control packets outstanding, "
                    f"peak cwnd {peak_cwnd[key]} B allows {limit} B at t={run.loop.now}")
        budget_state = session.incoming.budget
        if budget_state.opened - budget_state.released > budget_state.budget:
            observed.violations.append(
                f"{endpoint.name} holds {budget_state.opened - budget_state.released} B "
                f"of shards, budget {budget_state.budget} B")

    run._service = checked_service  # type: ignore[method-assign]

    original_sent = LossDetector.on_packet_sent
    control_since_data: dict[int, int] = {}  # id(detector) -> bytes of control packets since its last data

    def on_packet_sent(loss: LossDetector, packet: SentPacket) -> None:
        # A SHARD_OPEN travels in its own small packet right before the shard's first
        # DATA packet, in the same window check; only data is held to the window.
        if not held_to_window(packet):
            if packet.in_flight:
                control_since_data[id(loss)] = control_since_data.get(id(loss), 0) + packet.size
        else:
            observed.data_sends += 1
            before = loss.bytes_in_flight - control_since_data.pop(id(loss), 0)
            if before >= loss.cc.cwnd_bytes:
                observed.violations.append(
                    f"packet {packet.pn}: data sent with {before} B of data in flight, "
                    f"cwnd {loss.cc.cwnd_bytes} B")
        original_sent(loss, packet)

    with mock.patch.object(LossDetector, "on_packet_sent", on_packet_sent):
        observed.report = run.run()
    return observed


def held_to_window(packet: SentPacket) -> bool:
    """Data, and repair symbols (in flight, neither data nor control: core.fec), fill the window."""
    return bool(packet.chunks) or (packet.in_flight and packet.control is None)


def recording(allocate: Callable[[int, int, bytes], memoryview | None],
              into: dict[int, memoryview]) -> Callable[[int, int, bytes], memoryview | None]:
    def wrapper(shard_id: int, size: int, meta: bytes) -> memoryview | None:
        buffer = allocate(shard_id, size, meta)
        if buffer is not None:
            into[shard_id] = buffer
        return buffer
    return wrapper


def check_integrity(observed: Observed) -> None:
    """No shard reported ok unless it holds the sender's bytes; ``intact`` means all ok."""
    run, report = observed.run, observed.report
    all_ok = True
    for receiver, sender in ((run.b, run.a), (run.a, run.b)):
        direction = f"{sender.name}->{receiver.name}"
        if direction not in run.directions:
            assert not receiver.received
            continue
        ids = [r.shard_id for r in receiver.received]
        assert len(ids) == len(set(ids)), f"{direction}: a shard was reported twice: {ids}"
        for received in receiver.received:
            # The session releases the sender's buffer once acknowledged; the runner's
            # payload is deterministic, so regenerate what was sent.
            size = run.shard_sizes[received.shard_id]
            sent = run._payload(direction, received.shard_id, size)
            if received.ok:
                got = observed.buffers[receiver.name][received.shard_id]
                assert hashlib.sha256(got).digest() == hashlib.sha256(sent).digest(), (
                    f"{direction}: shard {received.shard_id} reported ok with wrong bytes")
            assert received.size == len(sent)
        all_ok &= len(ids) == len(run.shard_sizes) and all(r.ok for r in receiver.received)
    assert report["intact"] is all_ok


@instrumentable
@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([0.0, 0.0, 0.02]), st.sampled_from([0.0, 0.0, 0.02]),
       st.booleans(), st.sampled_from(["bbr", "bbr", "cubic"]),
       st.sampled_from(["earliest-arrival", "earliest-arrival", "round-robin"]), st.sampled_from([1, 16]))
def test_random_scenarios_never_deliver_wrong_bytes_and_respect_bounds(
        text: str, duplicate: float, corrupt: float, small_budget: bool, cc: str, scheduler: str,
        datagrams_per_packet: int) -> None:
    scenario = parse_scenario(text)
    # A bottleneck queue shorter than a core packet's burst (16 datagrams of ~1.5 kB spread
    # 1.25x faster than the core paces) lets only the head of each core packet through;
    # such packets are only ever confirmed in part, which yields no rate sample, so the
    # controller never learns the path's rate (a known limitation, see the packet-path
    # report). Segmented runs are drawn where every queue holds a core packet.
    assume(datagrams_per_packet == 1 or all(
        p.forward.queue_ms / 1000 * p.forward.bandwidth_mbps * 125_000 >= datagrams_per_packet * 1500
        for p in scenario.paths))
    size = scenario.transfer.size_bytes
    largest_shard = -(-size // scenario.transfer.shards)
    options = SimOptions(payload_mode="bytes", duplicate=duplicate, corrupt=corrupt, deadline_s=120.0,
                         congestion_control=cc, scheduler=scheduler,
                         datagrams_per_packet=datagrams_per_packet)
    observed = observe(text, options, budget=2 * largest_shard if small_budget else None)
    event(f"paths={len(scenario.paths)}")
    event(f"outage={'down = true' in text}")
    event(f"burst={'burst_loss' in text}")
    event(f"direction={scenario.transfer.direction}")
    event(f"dup={duplicate > 0} corrupt={corrupt > 0}")
    event(f"cc={cc} scheduler={scheduler}")
    check_integrity(observed)
    assert not observed.violations, observed.violations[:3]
    assert observed.data_sends > 0
    assert observed.report["intact"], f"transfer did not complete intact:\n{text}"
    lossless = all(p.forward.loss == 0 and p.forward.burst_loss is None and p.forward.jitter_ms == 0
                   for p in scenario.paths)
    if lossless:  # nothing can beat the section-4 bound without luck in loss or jitter
        assert observed.report["completion_s"] >= observed.report["ideal_s"] * (1 - 1e-5)


@instrumentable
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([0.01, 0.05]))
def test_unauthenticated_corruption_is_never_reported_ok(text: str, corrupt: float) -> None:
    """With the AEAD replaced by null protection, flipped bits reach the frames.

    The transfer may then fail (a corrupted ACK can even acknowledge data that
    never arrived), but the shard digest must keep every *reported-ok* shard
    byte-exact, and ``intact`` must not claim otherwise.
    """
    with mock.patch.object(runner_module, "AeadProtection", lambda cipher, key, iv: NullProtection()):
        observed = observe(text, SimOptions(payload_mode="bytes", corrupt=corrupt, deadline_s=20.0))
    failed = sum(not r.ok for e in (observed.run.a, observed.run.b) for r in e.received)
    event(f"intact={observed.report['intact']} digest_failures={failed > 0}")
    check_integrity(observed)


@instrumentable
def test_tail_cutoff_never_excludes_every_path_for_good() -> None:
    """Regression (found by the property above): with 99 bytes left, a stale tail cutoff
    excluded both paths on every re-check and the transfer stalled until its deadline."""
    text = ('name = "prop"\nseed = 501\n[transfer]\nsize = "478KiB"\nshards = 7\n'
            '[[paths]]\nname = "p0"\nrtt_ms = 2.0\nbandwidth_mbps = 92.7\nqueue_ms = 5.0\n'
            '[paths.burst_loss]\np = 0.024\nr = 0.283\n'
            '[[paths]]\nname = "p1"\nrtt_ms = 106.8\nbandwidth_mbps = 30.3\njitter_ms = 4.0\nqueue_ms = 5.0\n'
            '[paths.burst_loss]\np = 0.031\nr = 0.5\n')
    largest_shard = -(-478 * 1024 // 7)
    observed = observe(text, SimOptions(payload_mode="bytes", duplicate=0.02, congestion_control="cubic",
                                        deadline_s=120.0), budget=2 * largest_shard)
    check_integrity(observed)
    assert observed.report["intact"] and observed.report["completion_s"] < 5.0
