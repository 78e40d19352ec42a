"""Run a scenario's transfer between two sessions over the simulated network.

The runner is the simulator's equivalent of the asyncio adapter: it feeds the
same ``Session`` calls (receive_packet, poll_transmit, next_deadline,
on_deadline, events) from a virtual clock instead of sockets.

Two payload modes:
- ``bytes``: real shard bytes, sealed with AES-256-GCM by the reference data
  path, through the links as datagrams (corruption and forgery are caught
  exactly as on a real network), checked byte for byte at the end;
- ``virtual``: packets cross the links as descriptors with their wire size;
  terabyte scenarios fit in memory and run in minutes. Integrity is range
  coverage, and the report says ``payload_mode: "virtual"``.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wanxport.core.config import IP_UDP_OVERHEAD, PathConfig, SessionConfig
from wanxport.core.events import ShardReceived
from wanxport.core.session import Session, Transmit
from wanxport.report import PathReport, build_report
from wanxport.scenario import Scenario, ideal_time_s
from wanxport.sim.eventloop import EventLoop
from wanxport.sim.network import Network
from wanxport.wire.datapath import PacketOpener, PacketSealer
from wanxport.wire.protection import AeadProtection, Protection
from wanxport.wire.replay import ReplayWindow

BYTES_MODE_LIMIT = 256 * 1024 * 1024
MAX_DATA_LENGTH = 0xFFFF  # a DATA frame's length field is 16 bits


@dataclass
class SimOptions:
    size_bytes: int | None = None
    seed: int | None = None
    quantum: int | None = None
    payload_mode: str = "auto"  # "auto" | "bytes" | "virtual"
    congestion_control: str = "bbr"
    scheduler: str = "earliest-arrival"
    deadline_s: float | None = None
    duplicate: float = 0.0  # test-only impairments
    corrupt: float = 0.0
    session: dict[str, Any] = field(default_factory=dict)  # extra SessionConfig fields


class Endpoint:
    """One gateway: a session plus its side of the data path."""

    def __init__(self, name: str, session: Session, sealer: PacketSealer | None,
                 opener: PacketOpener | None, path_count: int) -> None:
        self.name = name
        self.session = session
        self.sealer = sealer
        self.opener = opener
        self.replay = [ReplayWindow() for _ in range(path_count)]
        self.rejected = 0
        self.timer_at = float("inf")
        self.received: list[ShardReceived] = []


class SimRun:
    """One simulated transfer; ``run()`` returns the v1 report."""

    def __init__(self, scenario: Scenario, options: SimOptions) -> None:
        self.scenario = scenario
        self.options = options
        self.seed = scenario.seed if options.seed is None else options.seed
        self.size = options.size_bytes or scenario.transfer.size_bytes
        mode = options.payload_mode
        if mode == "auto":
            mode = "bytes" if self.size <= BYTES_MODE_LIMIT and options.quantum is None else "virtual"
        if mode not in ("bytes", "virtual"):
            raise ValueError("payload mode must be auto, bytes or virtual")
        if mode == "bytes" and options.quantum is not None and options.quantum > MAX_DATA_LENGTH:
            raise ValueError(f"a quantum of {options.quantum} bytes does not fit a DATA frame "
                             f"(at most {MAX_DATA_LENGTH}); use the virtual payload mode")
        self.mode = mode
        self.loop = EventLoop()
        self.network = Network(scenario, self.loop, self._deliver_a, self._deliver_b, seed=self.seed,
                               duplicate=options.duplicate, corrupt=options.corrupt)
        shard_count = max(1, min(scenario.transfer.shards, self.size))
        base, extra = divmod(self.size, shard_count)
        self.shard_sizes = [base + (1 if i < extra else 0) for i in range(shard_count)]
        # Virtual shards allocate nothing, so the receiver's budget need not throttle them.
        budget = self.size if mode == "virtual" else max(1 << 30, 2 * max(self.shard_sizes))
        settings: dict[str, Any] = {"receive_budget_bytes": budget, "peer_credit_bytes": budget}
        settings.update(options.session)
        config = SessionConfig(
            paths=tuple(PathConfig(p.name, p.forward.mtu) for p in scenario.paths),
            congestion_control=options.congestion_control,
            scheduler=options.scheduler,
            chunk_bytes=options.quantum,
            **settings,
        )
        self.a = self._endpoint("a", config, 0)
        self.b = self._endpoint("b", config, 1)
        self.directions = ["a->b", "b->a"] if scenario.transfer.direction == "both" else ["a->b"]
        self._shards_pending = len(self.shard_sizes) * len(self.directions)

    def _endpoint(self, name: str, config: SessionConfig, index: int) -> Endpoint:
        allocator = None if self.mode == "bytes" else (lambda shard_id, size, meta: None)
        session = Session(config, allocator=allocator)
        if self.mode == "virtual":
            return Endpoint(name, session, None, None, len(config.paths))
        # Key 0 seals a->b, key 1 seals b->a; each side opens with the other's.
        rng = random.Random(self.seed)
        keys: list[dict[int, Protection]] = [
            {0: AeadProtection("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))} for _ in range(2)]
        send: dict[int, Protection] = keys[index]
        recv: dict[int, Protection] = keys[1 - index]
        return Endpoint(name, session, PacketSealer(0, send), PacketOpener(0, len(config.paths), recv),
                        len(config.paths))

    # -- running -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        with _quiet_gc():
            return self._run()

    def _run(self) -> dict[str, Any]:
        self.network.start(0.0)
        for direction in self.directions:
            sender = self.a if direction == "a->b" else self.b
            for shard_id, size in enumerate(self.shard_sizes):
                data = self._payload(direction, shard_id, size) if self.mode == "bytes" else None
                sender.session.submit(shard_id, data, 0.0, size=size)
        ideal = ideal_time_s(self.scenario, self.size)
        deadline = self.options.deadline_s or max(60.0, 20.0 * ideal if ideal != float("inf") else 60.0)
        for endpoint in (self.a, self.b):
            self._service(endpoint)
        self.loop.run(stop=self._finished, until=deadline)
        finished = self._finished()
        completion = max((r.at for e in self._receivers() for r in e.received), default=self.loop.now)
        if not finished:
            completion = deadline  # gave up at the deadline
        return self._report(finished, completion, ideal)

    def _payload(self, direction: str, shard_id: int, size: int) -> bytes:
        rng = random.Random(f"{self.seed}:{direction}:{shard_id}")
        return rng.randbytes(size)

    def _receivers(self) -> list[Endpoint]:
        return [self.b if d == "a->b" else self.a for d in self.directions]

    def _finished(self) -> bool:
        return self._shards_pending == 0

    def _deliver_a(self, path_index: int, packet: object, now: float) -> None:
        self._deliver(self.a, path_index, packet, now)

    def _deliver_b(self, path_index: int, packet: object, now: float) -> None:
        self._deliver(self.b, path_index, packet, now)

    def _deliver(self, endpoint: Endpoint, path_index: int, packet: object, now: float) -> None:
        if endpoint.opener is not None:
            assert isinstance(packet, bytes)
            opened = endpoint.opener.open(packet)
            if opened is None or opened.header.path_id != path_index:
                endpoint.rejected += 1
                return
            endpoint.session.receive_packet(path_index, opened.header.packet_number, opened.frames, now)
        else:
            assert isinstance(packet, Transmit)
            window = endpoint.replay[path_index]
            if packet.path_id != path_index or not window.check(packet.packet_number):
                endpoint.rejected += 1
                return
            window.record(packet.packet_number)
            endpoint.session.receive_packet(path_index, packet.packet_number, packet.frames, now)
        self._service(endpoint)

    def _on_timer(self, endpoint: Endpoint) -> None:
        now = self.loop.now
        if now < endpoint.timer_at:
            return  # superseded by an earlier or later schedule
        endpoint.timer_at = float("inf")
        endpoint.session.on_deadline(now)
        self._service(endpoint)

    def _service(self, endpoint: Endpoint) -> None:
        """Collect events, send what the session wants to send, re-arm its timer."""
        session = endpoint.session
        now = self.loop.now
        for event in session.events():
            if isinstance(event, ShardReceived):
                endpoint.received.append(event)
                self._shards_pending -= 1
        links = self.network.forward if endpoint is self.a else self.network.reverse
        sealer = endpoint.sealer
        for tx in session.poll_transmit(now):
            packet: object = sealer.seal(tx.path_id, tx.packet_number, tx.frames) if sealer else tx
            link = links[tx.path_id]
            size = tx.size + IP_UDP_OVERHEAD
            if tx.not_before <= now:
                link.send(packet, size)
            else:
                self.loop.call_at(tx.not_before, link.send, packet, size)
        deadline = session.next_deadline()
        if deadline is not None and deadline < endpoint.timer_at:
            endpoint.timer_at = max(deadline, now)
            self.loop.call_at(endpoint.timer_at, self._on_timer, endpoint)

    # -- report --------------------------------------------------------------

    def _intact(self, finished: bool) -> bool:
        if not finished:
            return False
        for receiver in self._receivers():
            if not all(r.ok for r in receiver.received):
                return False
        return True

    def _report(self, finished: bool, completion: float, ideal: float) -> dict[str, Any]:
        sender = self.a
        path_reports = []
        for path in sender.session.paths:
            path_reports.append(PathReport(
                path.name, path.stats.payload_bytes, path.stats.retransmitted_bytes,
                path.rtt.smoothed_s if path.rtt.has_sample else None, path.state.value,
                {"hedged_bytes": path.stats.hedged_bytes, "packets_lost": path.stats.packets_lost,
                 "failures": path.stats.failures}))
        # Verified shards, plus what had arrived of unfinished ones when time ran out.
        delivered = sum(r.size for e in self._receivers() for r in e.received if r.ok)
        delivered += sum(shard.received.total for e in self._receivers()
                         for shard in e.session.incoming.shards.values())
        payload = self.size * len(self.directions)
        return build_report(
            scenario=self.scenario.name, mode="sim", transport="wanxport", payload_bytes=payload,
            completion_s=completion, ideal_s=ideal, intact=self._intact(finished), wall_s=None,
            paths=path_reports, delivered_bytes=delivered,
            seed=self.seed, direction=self.scenario.transfer.direction, shards=len(self.shard_sizes),
            payload_mode=self.mode, quantum_bytes=self.options.quantum,
            cc=self.options.congestion_control, scheduler=self.options.scheduler,
            datagrams_rejected=self.a.rejected + self.b.rejected,
            events_processed=self.loop.processed,
        )


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Collect cycles rarely while a run allocates millions of short-lived objects.

    Packets, frames and events form no reference cycles, so the cyclic GC's
    frequent young-generation passes (and the full passes over every packet in
    flight) found nothing and took about a sixth of a large run's time.
    Objects from before the run are frozen out of the scans altogether.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def simulate(scenario: Scenario, options: SimOptions | None = None) -> dict[str, Any]:
    """Run the scenario's transfer in virtual time; return the run report v1.

    The report's ``wall_s`` is None: virtual time reads no clock, so the caller
    measures real time around this call (``wanxport.report.with_wall_time``).
    """
    return SimRun(scenario, options or SimOptions()).run()
