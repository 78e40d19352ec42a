"""Run a scenario's transfer between two sessions over the simulated network.

The runner is the simulator's equivalent of the asyncio adapter: through a
``Driver`` it makes the same ``Session`` calls (receive_data_run for placed
DATA, receive_packets for control, shard_verified, poll_transmit,
next_deadline, on_deadline, events) from a virtual clock instead of sockets.
The links carry the core's ``Transmit`` batches as the individual datagrams
the sockets would send, each lost (or not) on its own.

Two payload modes:
- ``bytes``: real shard bytes; each datagram sealed with AES-256-GCM by the
  reference data path, opened at the receiver by the reference receiver
  (``wire.receiver``: replay check, placement into the shard buffer, run
  folding), so corruption and forgery are caught exactly as on a real
  network; the session verifies like aio's (``defer_verification``: a filled
  shard is hashed and the verdict handed back, here at once); checked byte
  for byte at the end;
- ``virtual``: datagrams cross the links as descriptors with their wire size;
  terabyte scenarios fit in memory and run in minutes. Integrity is range
  coverage, and the report says ``payload_mode: "virtual"``.

Core packets are ``datagrams_per_packet`` datagrams (16, as the emulated
app's), each of ``quantum`` payload bytes or as much as the MTU allows.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wanxport.core.cc import cc_config
from wanxport.core.config import IP_UDP_OVERHEAD, PACER_HEADROOM, PathConfig, SessionConfig, datagram_payload
from wanxport.core.digest import shard_digest
from wanxport.core.events import ReceiveStalled, ShardAcknowledged, ShardFilled, ShardReceived
from wanxport.core.session import Session
from wanxport.report import PathReport, build_report, spread
from wanxport.scenario import Scenario, ideal_time_s, relayed_ideal_time_s
from wanxport.sim.driver import Control, Driver, Run
from wanxport.sim.eventloop import EventLoop
from wanxport.sim.network import LinksFactory, Network, PathLinks
from wanxport.sim.steps import StepTracker
from wanxport.sim.wire import DatagramCutter, VirtualDatagram, VirtualReceiver
from wanxport.wire.datapath import PacketSealer
from wanxport.wire.errors import WireError
from wanxport.wire.frames import AckFrame, PaddingFrame, decode_frames
from wanxport.wire.protection import AeadProtection, Protection
from wanxport.wire.receiver import ReferenceReceiver, fold_runs

BYTES_MODE_LIMIT = 256 * 1024 * 1024
# random.Random.randbytes(n) asks for 8n random bits as a C int: a 256 MiB shard
# overflowed it (OverflowError, `wanxport sim` of a one-shard 256 MiB scenario).
PAYLOAD_CHUNK = 64 * 1024 * 1024
MAX_DATA_LENGTH = 0xFFFF  # a DATA frame's length field is 16 bits
TAG_BYTES = 16  # every simulated datagram is AEAD-protected, as on the wire
# Datagrams per core packet in the simulator (the core decides per burst, the data path
# cuts it); the sessions users run take theirs from wanxport.presets.
DATAGRAMS_PER_PACKET = 16


@dataclass
class SimOptions:
    size_bytes: int | None = None
    seed: int | None = None
    quantum: int | None = None
    payload_mode: str = "auto"  # "auto" | "bytes" | "virtual"
    # None: DATAGRAMS_PER_PACKET, or 1 with a quantum (its datagrams are already aggregates;
    # 16 of 1 MiB would make 16 MiB core packets and a 64 MiB minimum window per path).
    datagrams_per_packet: int | None = None
    congestion_control: str = "bbr"
    cc_options: dict[str, Any] = field(default_factory=dict)  # the controller's options (cc_config)
    scheduler: str = "earliest-arrival"
    fec: str = "auto"  # the erasure-coded tail: "auto" or "off" (SessionConfig.fec)
    deadline_s: float | None = None
    #: (from, to): the two sites of an N-site scenario the transfer runs between (None: its [transfer]'s).
    between: tuple[str, str] | None = None
    duplicate: float = 0.0  # test-only impairments
    corrupt: float = 0.0
    session: dict[str, Any] = field(default_factory=dict)  # extra SessionConfig fields
    # The transport policies a gateway runs, off unless asked for (core.holdoff, core.stall):
    # receive coalescing as aio's endpoint applies it (with the same defaults: a hold-off
    # given grows with the round trip), and the receiver's stall timeout.
    receive_holdoff_s: float = 0.0
    receive_interval: bool = True
    stall_timeout_s: float | None = None


class SimEndpoint:
    """One simulated gateway: a session's driver plus its side of the data path (bytes or virtual)."""

    def __init__(self, name: str, config: SessionConfig, cutter: DatagramCutter,
                 receiver: ReferenceReceiver | VirtualReceiver, receive_holdoff_s: float = 0.0,
                 receive_interval: bool = False) -> None:
        self.name = name
        self.session = Session(config, allocator=self.allocate, defer_verification=True,
                               receive_holdoff_s=receive_holdoff_s, receive_interval=receive_interval)
        self.driver = Driver(self.session)
        self.cutter = cutter
        self.receiver = receiver
        self.timer_at = float("inf")
        self.coalescing = self.session.receive_holdoff.holdoff_s > 0.0
        self.held: list[tuple[int, object, float]] = []  # (path, datagram, arrival) held back
        self.release_at = float("inf")  # when they go in
        self.received: list[ShardReceived] = []
        self.stalls: list[ReceiveStalled] = []
        self.buffers: dict[int, memoryview] = {}  # bytes mode: shards being received
        self.pacer_free = [0.0] * len(config.paths)  # per path: when its pacer ring is empty

    @property
    def rejected(self) -> int:
        counters = self.receiver.counters
        return sum(v for k, v in counters.items() if k.startswith("rejected_")) + counters.get("malformed", 0)

    def allocate(self, shard_id: int, size: int, meta: bytes) -> memoryview | None:
        """The session opens a shard: the data path places its DATA from now on (as aio's)."""
        if isinstance(self.receiver, VirtualReceiver):
            self.receiver.add_shard(shard_id)
            return None
        view = memoryview(bytearray(size))
        self.receiver.add_shard(shard_id, view)
        self.buffers[shard_id] = view
        return view


def shard_payload(seed: int, direction: str, shard_id: int, size: int, chunk: int = PAYLOAD_CHUNK) -> bytes:
    """The seeded bytes of one shard in ``bytes`` mode, made ``chunk`` bytes at a time.

    The generator yields whole 32-bit words in order, so chunks of a multiple of 4
    bytes give the same bytes as one call would: the payload does not depend on ``chunk``.
    """
    rng = random.Random(f"{seed}:{direction}:{shard_id}")
    return b"".join(rng.randbytes(min(chunk, size - at)) for at in range(0, size, chunk))


class SimRun:
    """One simulated transfer; ``run()`` returns the v1 report.

    By default the run owns its loop and the scenario's ``Network``; several runs
    over shared bottlenecks (``sim.shared``) pass one ``loop`` and ``links`` instead.
    Between two sites of an N-site scenario the run is the pair's own two-site
    view (``Scenario.pair``): a transfer uses the paths joining its two sites.
    """

    def __init__(self, scenario: Scenario, options: SimOptions, loop: EventLoop | None = None,
                 links: LinksFactory | None = None) -> None:
        self.between = options.between or scenario.transfer_pair
        self.mesh = scenario if len(scenario.sites) > 2 else None  # the N sites the pair is part of
        scenario = scenario.pair(*self.between)
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
        self.loop = EventLoop() if loop is None else loop
        self.network: PathLinks = Network(
            scenario, self.loop, self._deliver_a, self._deliver_b, seed=self.seed,
            duplicate=options.duplicate, corrupt=options.corrupt,
        ) if links is None else links(self.loop, self._deliver_a, self._deliver_b)
        shard_count = max(1, min(scenario.transfer.shards, self.size))
        base, extra = divmod(self.size, shard_count)
        self.shard_sizes = [base + (1 if i < extra else 0) for i in range(shard_count)]
        # Virtual shards allocate nothing, so the receiver's budget need not throttle them.
        budget = self.size if mode == "virtual" else max(1 << 30, 2 * max(self.shard_sizes))
        settings: dict[str, Any] = {"receive_budget_bytes": budget, "peer_credit_bytes": budget}
        self.datagrams_per_packet = options.datagrams_per_packet or (
            1 if options.quantum is not None else DATAGRAMS_PER_PACKET)
        if self.datagrams_per_packet < 1:
            raise ValueError("datagrams_per_packet must be at least 1")
        paths = tuple(PathConfig(p.name, p.forward.mtu) for p in scenario.paths)
        segment = options.quantum or min(datagram_payload(p, TAG_BYTES) for p in paths)
        settings.setdefault("chunk_bytes", self.datagrams_per_packet * segment)
        settings.update(options.session)
        config = SessionConfig(
            paths=paths,
            congestion_control=cc_config(options.congestion_control, options.cc_options),
            scheduler=options.scheduler,
            segment_bytes=options.quantum,
            fec=options.fec,
            **settings,
        )
        self.chunk_bytes = config.chunk_bytes
        self.a = self._endpoint("a", config, 0)
        self.b = self._endpoint("b", config, 1)
        self.directions = ["a->b", "b->a"] if scenario.transfer.direction == "both" else ["a->b"]
        if options.stall_timeout_s is not None:
            for receiving in self._receivers():
                receiving.session.watch_stall(options.stall_timeout_s, 0.0)
        transfer = scenario.transfer
        self.steps = StepTracker(transfer.steps, len(self.shard_sizes), self.directions,
                                 transfer.think_ms / 1000.0)

    def _endpoint(self, name: str, config: SessionConfig, index: int) -> SimEndpoint:
        n = len(config.paths)
        holdoff, interval = self.options.receive_holdoff_s, self.options.receive_interval
        if self.mode == "virtual":
            return SimEndpoint(name, config, DatagramCutter(None, config), VirtualReceiver(n), holdoff,
                               interval)
        # Key 0 seals a->b, key 1 seals b->a; each side opens with the other's.
        rng = random.Random(self.seed)
        keys: list[Protection] = [
            AeadProtection("aes-256-gcm", rng.randbytes(32), rng.randbytes(12)) for _ in range(2)]
        receiver = ReferenceReceiver(0, n)
        receiver.set_key(0, keys[1 - index])
        return SimEndpoint(name, config, DatagramCutter(PacketSealer(0, {0: keys[index]}), config), receiver,
                           holdoff, interval)

    # -- running -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        with _quiet_gc():
            return self._run()

    def _run(self) -> dict[str, Any]:
        self.network.start(0.0)
        for side in ("a", "b"):
            self._submit_step(side, 0)
        ideal = ideal_time_s(self.scenario, self.size)
        deadline = self.options.deadline_s or self._default_deadline(ideal)
        self.loop.run(stop=self._finished, until=deadline)
        finished = self._finished()
        completion = max((r.at for e in self._receivers() for r in e.received), default=self.loop.now)
        if not finished:
            completion = deadline  # gave up at the deadline
        return self._report(finished, completion, ideal)

    def _default_deadline(self, ideal: float) -> float:
        """max(60 s, 20 x ideal) per step, plus the think time between steps."""
        transfer = self.scenario.transfer
        per_step = 20.0 * ideal if ideal != float("inf") else 60.0
        return max(60.0, transfer.steps * per_step + (transfer.steps - 1) * transfer.think_ms / 1000.0)

    def _submit_step(self, side: str, step: int) -> None:
        """``side`` submits every shard of ``step`` in each direction it sends (step driver)."""
        sender = self.a if side == "a" else self.b
        now = self.loop.now
        for direction in self.steps.sends(side):
            for shard_id, size in zip(self.steps.shard_ids(step), self.shard_sizes, strict=True):
                data = self._payload(direction, shard_id, size) if self.mode == "bytes" else None
                sender.driver.submit(shard_id, data, now, size=size)
            self.steps.submitted(direction, step, now)
        self._service(sender)

    def _step_ready(self, side: str, step: int | None) -> None:
        """``side`` has seen the previous step end: it submits ``step`` after the think time."""
        if step is not None:
            self.loop.call_at(self.loop.now + self.steps.think_s, self._submit_step, side, step)

    def _payload(self, direction: str, shard_id: int, size: int) -> bytes:
        return shard_payload(self.seed, direction, shard_id, size)

    def _receivers(self) -> list[SimEndpoint]:
        return [self.b if d == "a->b" else self.a for d in self.directions]

    def _finished(self) -> bool:
        return self.steps.done()

    def _deliver_a(self, path_index: int, packet: object, now: float) -> None:
        self._deliver(self.a, path_index, packet, now)

    def _deliver_b(self, path_index: int, packet: object, now: float) -> None:
        self._deliver(self.b, path_index, packet, now)

    def _deliver(self, endpoint: SimEndpoint, path_index: int, packet: object, now: float) -> None:
        """One datagram arrived: the data path opens (and places) it, the core learns of it.

        While the core's receive hold-off holds (``core.holdoff``), it waits with whatever
        arrives on any path until the hold-off ends, and they go in as one pass, as
        aio's endpoint drains its held sockets."""
        if endpoint.coalescing:
            wait_s = endpoint.session.receive_holdoff.wait_s()
            if wait_s > 0.0:
                if not endpoint.held:
                    endpoint.release_at = now + wait_s
                    self.loop.call_at(endpoint.release_at, self._release_held, endpoint)
                endpoint.held.append((path_index, packet, now))
                return
        runs: list[Run] = []
        controls: list[Control] = []
        self._open(endpoint, path_index, packet, runs, controls)
        self._hand_in(endpoint, runs, controls, now)

    def _release_held(self, endpoint: SimEndpoint) -> None:
        """The hold-off ended: what waited goes to the session in one pass."""
        if self.loop.now >= endpoint.release_at:  # else released early, for a timer: another stands
            self._flush_held(endpoint)

    def _flush_held(self, endpoint: SimEndpoint) -> None:
        held, endpoint.held = endpoint.held, []
        endpoint.release_at = float("inf")
        now = self.loop.now
        runs: list[Run] = []
        controls: list[Control] = []
        waited = [0.0] * len(endpoint.session.config.paths)  # per path: its newest datagram's wait
        for path_index, packet, arrived in held:
            self._open(endpoint, path_index, packet, runs, controls)
            if 0 <= path_index < len(waited):
                waited[path_index] = now - arrived
        self._hand_in(endpoint, runs, controls, now, waited, now - held[0][2] if held else 0.0)

    def _hand_in(self, endpoint: SimEndpoint, runs: list[Run], controls: list[Control], now: float,
                 waited: list[float] | None = None, held_s: float = 0.0) -> None:
        """One pass; ``waited``: per path, its newest datagram's wait; ``held_s``: the hold-off's."""
        if runs or controls:
            endpoint.driver.receive(runs, controls, now, waited or ())
        if endpoint.coalescing:
            endpoint.driver.receive_pass(now, held_s)
        if runs or controls:
            self._service(endpoint)

    @staticmethod
    def _open(endpoint: SimEndpoint, path_index: int, packet: object, runs: list[Run],
              controls: list[Control]) -> None:
        """Open one datagram into ``runs`` and ``controls``; one on the wrong path is rejected whole."""
        receiver = endpoint.receiver
        if isinstance(receiver, VirtualReceiver):
            assert isinstance(packet, VirtualDatagram)
            if packet.path_id != path_index:
                receiver.counters["rejected_path"] += 1
                return
            receiver.process(packet, runs, controls)
            return
        assert isinstance(packet, bytes)
        processed = receiver.process((packet,))
        placed, opened = processed.placed, processed.controls
        if placed and placed[0].path_id != path_index:
            receiver.counters["rejected_path"] += 1
            return
        mine: list[Control] = []
        for control in opened:
            if control.path_id != path_index:
                receiver.counters["rejected_path"] += 1
                return
            try:
                frames = decode_frames(control.plaintext)
            except WireError:
                receiver.counters["malformed"] = receiver.counters.get("malformed", 0) + 1
                continue
            mine.append((control.path_id, control.packet_number, frames))
        if placed:
            runs.extend(fold_runs(placed))
        controls.extend(mine)

    def _on_timer(self, endpoint: SimEndpoint) -> None:
        now = self.loop.now
        if now < endpoint.timer_at:
            return  # superseded by an earlier or later schedule
        endpoint.timer_at = float("inf")
        if endpoint.held:
            # As aio's endpoint: what already arrived goes in before a deadline judges its absence.
            self._flush_held(endpoint)
        endpoint.driver.fire(now)
        self._service(endpoint)

    def _service(self, endpoint: SimEndpoint) -> None:
        """Collect events, send what the session wants to send, re-arm its timer."""
        driver = endpoint.driver
        now = self.loop.now
        serviced = driver.service(now)
        links = self.network.forward if endpoint is self.a else self.network.reverse
        cutter = endpoint.cutter
        rates = endpoint.session.pacing_rates_bps() if serviced.transmits else []
        call_at = self.loop.call_at
        pacer_free = endpoint.pacer_free
        for tx in serviced.transmits:
            path_id = tx.path_id
            link = links[path_id]
            # aio's native pacer: one FIFO ring per path that spreads a core packet's
            # datagrams PACER_HEADROOM faster than the core paces (a shallow queue sees them
            # spaced). Nothing overtakes a datagram queued before it, except an ACK-only one:
            # the core lets it leave ahead of our data (core.transmitter ``overtake``) and the
            # native path sends it past the pacer, taking no pacing time.
            ack_only = all(isinstance(frame, AckFrame | PaddingFrame) for frame in tx.frames)
            at = max(now, tx.not_before) if ack_only else max(now, tx.not_before, pacer_free[path_id])
            s_per_byte = 8.0 / (rates[path_id] * PACER_HEADROOM)
            for datagram, size in cutter.cut(tx):
                if at <= now:
                    link.send(datagram, size + IP_UDP_OVERHEAD)
                else:
                    call_at(at, link.send, datagram, size + IP_UDP_OVERHEAD)
                at += size * s_per_byte
            if not ack_only:
                pacer_free[path_id] = at
        deadline = serviced.deadline
        if deadline is not None and deadline < endpoint.timer_at:
            endpoint.timer_at = max(deadline, now)
            self.loop.call_at(endpoint.timer_at, self._on_timer, endpoint)
        filled = False
        side = endpoint.name
        for event in serviced.events:
            if isinstance(event, ShardReceived):
                endpoint.received.append(event)
                endpoint.buffers.pop(event.shard_id, None)
                if isinstance(endpoint.receiver, VirtualReceiver):
                    endpoint.receiver.remove_shard(event.shard_id)
                incoming = "b->a" if side == "a" else "a->b"
                self._step_ready(side, self.steps.verified(incoming, event.shard_id, event.at))
            elif isinstance(event, ShardAcknowledged):
                outgoing = "a->b" if side == "a" else "b->a"
                self._step_ready(side, self.steps.acknowledged(outgoing, event.shard_id))
            elif isinstance(event, ShardFilled):
                # aio hashes off its loop while the shard arrives and answers later; the
                # simulator hashes at once, through the same calls.
                endpoint.receiver.remove_shard(event.shard_id)  # no writes while it is hashed
                driver.received_prefix(event.shard_id)
                ok = shard_digest(event.buffer) == event.digest
                driver.verified(event.shard_id, ok, now)
                filled = True
            elif isinstance(event, ReceiveStalled):
                endpoint.stalls.append(event)
        if filled:
            self._service(endpoint)

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
        path_reports = [
            PathReport(path.name, path.payload_bytes, path.retransmitted_bytes, path.srtt_s, path.state,
                       {"hedged_bytes": path.hedged_bytes, "packets_lost": path.packets_lost,
                        "failures": path.failures, "repair_bytes": path.repair_bytes,
                        "packets_sent": path.packets_sent, "min_rtt_s": path.min_rtt_s})
            for path in sender.session.stats().paths]
        receiving = [e.session.stats() for e in self._receivers()]
        # Verified shards, plus what had arrived of unfinished ones when time ran out.
        delivered = sum(r.size for e in self._receivers() for r in e.received if r.ok)
        delivered += sum(e.session.stats().receiving_bytes for e in self._receivers())
        payload = self.size * len(self.directions) * self.scenario.transfer.steps
        return build_report(
            scenario=self.scenario.name, mode="sim", transport="wanxport", payload_bytes=payload,
            completion_s=completion, ideal_s=ideal, intact=self._intact(finished), wall_s=None,
            paths=path_reports, delivered_bytes=delivered,
            seed=self.seed, direction=self.scenario.transfer.direction, shards=len(self.shard_sizes),
            payload_mode=self.mode, quantum_bytes=self.options.quantum,
            datagrams_per_packet=self.datagrams_per_packet, chunk_bytes=self.chunk_bytes,
            cc=self.options.congestion_control, scheduler=self.options.scheduler,
            datagrams_rejected=self.a.rejected + self.b.rejected,
            fec=self.options.fec,
            repair_bytes=sum(e.session.stats().repair_bytes for e in (self.a, self.b)),
            repaired_bytes=sum(s.repaired_bytes for s in receiving),
            retransmitted_after_repair_bytes=sum(s.retransmitted_after_repair_bytes for s in receiving),
            fec_blocks_rebuilt=sum(s.repair_blocks_rebuilt for s in receiving),
            fec_blocks_short=sum(s.repair_blocks_short for s in receiving),
            events_processed=self.loop.processed,
            steps=self.scenario.transfer.steps, step_s=self.steps.step_s(),
            think_ms=self.scenario.transfer.think_ms,
            shard_completion_s=spread(self.steps.shard_completion_s),
            **({} if self.mesh is None else {
                "between": list(self.between), "ideal_relayed_s": relayed_ideal_time_s(
                    self.mesh, *self.between, self.size, self.scenario.transfer.direction)}),
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
