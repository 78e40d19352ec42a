"""Seeded discrete-event model of a scenario's WAN (docs/design.md section 4 semantics).

One direction of one path decides each packet as the lab's impairment engine
(``ext/impair/engine.c``) does, after netem; docs/notes/emulation.md "One impairment
model" is the shared specification, checked by feeding both the same trace of
packets and random draws. In order:

1. ``down``: the packet is dropped (``dropped_down``).
2. Random loss, drawn as the packet is offered (as netem draws it at enqueue,
   so a lost packet takes no queue space and no bandwidth): i.i.d. ``loss``,
   or Gilbert-Elliott ``burst_loss`` stepped once per offered packet (loss
   drawn with the probability of the state the packet found, then the state
   transition). A uniform draw is taken only for a non-zero probability.
3. Bottleneck: FIFO serialization at ``bandwidth_mbps`` behind a drop-tail
   queue holding at most ``queue_ms`` worth of bytes at the current rate (half
   a byte of rounding allowed); the packet being serialized does not count
   against the queue. A packet that does not fit is dropped (``dropped_queue``).
4. Propagation: ``rtt_ms/2 + normal(0, jitter_ms)`` clipped at 0, one normal
   draw when jitter is on. With ``reorder = false`` a packet never arrives
   before the previous one on the same link (it waits); with
   ``reorder = true`` jitter may reorder.

A packet's fate is drawn when the link admits it, in FIFO order; its
serialization slot is scheduled then too, so a queued packet costs no event of
its own until it arrives. Timeline changes go beyond the engine: a rate change
applies from the next packet to start serialization (queued packets are
re-timed); loss and delay changes apply to packets admitted after them; a link
going down drops what is queued and what is being serialized, while packets
already propagating still arrive. Packet sizes are not checked against ``mtu``:
the simulator may move aggregate "packets" for speed, and loss applies per
packet.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from wanxport.scenario import LinkParams, Scenario
from wanxport.sim.eventloop import EventLoop

__all__ = [
    "Draws", "EventLoop", "LinksFactory", "Network", "PacketPort", "PathDirection", "PathLinks", "link_rng",
]

Deliver = Callable[[object, float], None]


class Draws(Protocol):
    """Where a link takes its random draws: a seeded ``random.Random``, or a replayed trace."""

    def random(self) -> float: ...

    def gauss(self, mu: float, sigma: float, /) -> float: ...

    def randrange(self, stop: int, /) -> int: ...


def link_rng(seed: int, path_index: int, direction: str) -> random.Random:
    """Independent RNG per (seed, path, direction): adding a path changes no other path."""
    return random.Random(f"wanxport.sim/{seed}/{path_index}/{direction}")


class _Admitted:
    """A packet the bottleneck accepted: its serialization slot and its copies in flight.

    Kept only while it waits or is being serialized, so that a rate change can
    re-time it and a link failure can take it back.
    """

    __slots__ = ("packet", "size", "start", "end", "delays", "handles")

    def __init__(self, packet: object, size: int, start: float, end: float) -> None:
        self.packet = packet
        self.size = size
        self.start = start
        self.end = end
        self.delays: list[float] = []  # one-way delay of each copy
        self.handles: list[int] = []  # reorder links: the copies' arrival events


class PathDirection:
    """One direction of one path. ``deliver(packet, now)`` is called on arrival."""

    __slots__ = (
        "params",
        "_rng",
        "_deliver",
        "_loop",
        "_duplicate",
        "_corrupt",
        "_waiting",
        "_serving",
        "_queued_bytes",
        "_capacity_bytes",
        "_s_per_byte",
        "_busy_until",
        "_flight",
        "_flight_gen",
        "_last_arrival",
        "_delay_s",
        "_jitter_s",
        "_bad_state",
        "sent",
        "bytes_sent",
        "dropped_queue",
        "dropped_loss",
        "dropped_down",
        "delivered",
        "bytes_delivered",
        "duplicated",
        "corrupted",
    )

    def __init__(
        self,
        params: LinkParams,
        rng: Draws,
        deliver: Deliver,
        loop: EventLoop,
        duplicate: float = 0.0,
        corrupt: float = 0.0,
    ) -> None:
        """``duplicate``/``corrupt`` are test-only impairments beyond the scenario format:
        the probability that a delivered packet arrives twice, or with one bit flipped
        (``bytes``/``bytearray`` packets only)."""
        self._rng = rng
        self._deliver = deliver
        self._loop = loop
        self._duplicate = duplicate
        self._corrupt = corrupt
        self._waiting: deque[_Admitted] = deque()  # admitted, serialization not yet begun
        self._serving: _Admitted | None = None  # the latest to begin serialization
        self._queued_bytes = 0
        self._busy_until = loop.now  # when the last admitted packet has been serialized
        self._s_per_byte = 0.0
        # reorder = false links: arrivals are monotonic, so they wait in a FIFO with
        # only its head on the loop's heap; the heap stays small and fast.
        self._flight: deque[tuple[float, object, int]] = deque()
        self._flight_gen = 0  # invalidates the head event when the FIFO is emptied
        self._last_arrival = 0.0
        self._bad_state = False  # Gilbert-Elliott state, starts good
        self.sent = self.bytes_sent = 0
        self.dropped_queue = self.dropped_loss = self.dropped_down = 0
        self.delivered = self.bytes_delivered = 0
        self.duplicated = self.corrupted = 0
        self.set_params(params)

    def set_params(self, params: LinkParams) -> None:
        """Apply new parameters now (a timeline event)."""
        old_s_per_byte = self._s_per_byte
        self.params = params
        bytes_per_s = params.bandwidth_mbps * 125_000.0
        self._s_per_byte = 1.0 / bytes_per_s
        self._capacity_bytes = params.queue_ms / 1000.0 * bytes_per_s
        self._delay_s = params.rtt_ms / 2000.0
        self._jitter_s = params.jitter_ms / 1000.0
        if params.down:
            self._drop_backlog()
        elif self._s_per_byte != old_s_per_byte:
            self._retime()

    def send(self, packet: object, size_bytes: int) -> None:
        """Offer a packet to the link at ``loop.now``."""
        self.sent += 1
        self.bytes_sent += size_bytes
        if self.params.down:
            self.dropped_down += 1
            return
        if self._lost():
            self.dropped_loss += 1
            return
        now = self._loop.now
        self._advance(now)
        if self._waiting or now < self._busy_until:
            if self._queued_bytes + size_bytes > self._capacity_bytes + 0.5:
                self.dropped_queue += 1
                return
            start = self._busy_until
        else:
            start = now
        entry = self._admit(packet, size_bytes, start)
        if start > now:
            self._waiting.append(entry)
            self._queued_bytes += size_bytes
        else:
            self._serving = entry

    def backlog_bytes(self) -> int:
        """Bytes waiting in the bottleneck queue (not counting the one in service)."""
        self._advance(self._loop.now)
        return self._queued_bytes

    def _advance(self, now: float) -> None:
        """Packets whose slot has begun leave the queue."""
        waiting = self._waiting
        while waiting and waiting[0].start <= now:
            entry = waiting.popleft()
            self._queued_bytes -= entry.size
            self._serving = entry

    def _admit(self, packet: object, size_bytes: int, start: float) -> _Admitted:
        """Serialize from ``start``; draw the packet's delay now, in FIFO order."""
        end = start + size_bytes * self._s_per_byte
        self._busy_until = end
        rng = self._rng
        if self._corrupt and isinstance(packet, bytes | bytearray) and packet:
            if rng.random() < self._corrupt:
                damaged = bytearray(packet)
                bit = rng.randrange(len(damaged) * 8)
                damaged[bit >> 3] ^= 1 << (bit & 7)
                packet = bytes(damaged)
                self.corrupted += 1
        entry = _Admitted(packet, size_bytes, start, end)
        self._propagate(entry, self._draw_delay())
        if self._duplicate and rng.random() < self._duplicate:
            self.duplicated += 1
            self._propagate(entry, self._draw_delay())
        return entry

    def _lost(self) -> bool:
        params = self.params
        burst = params.burst_loss
        if burst is None:
            return params.loss > 0.0 and self._rng.random() < params.loss
        rng = self._rng
        loss = burst.loss_bad if self._bad_state else burst.loss_good
        lost = loss > 0.0 and rng.random() < loss
        if self._bad_state:
            if rng.random() < burst.r:
                self._bad_state = False
        elif rng.random() < burst.p:
            self._bad_state = True
        return lost

    def _draw_delay(self) -> float:
        delay = self._delay_s
        if self._jitter_s:
            delay += self._rng.gauss(0.0, self._jitter_s)
            if delay < 0.0:
                delay = 0.0
        return delay

    def _propagate(self, entry: _Admitted, delay: float) -> None:
        entry.delays.append(delay)
        arrival = entry.end + delay
        if self.params.reorder:
            entry.handles.append(self._loop.call_at(arrival, self._arrive, entry.packet, entry.size))
            return
        if arrival < self._last_arrival:
            arrival = self._last_arrival
        self._last_arrival = arrival
        flight = self._flight
        flight.append((arrival, entry.packet, entry.size))
        if len(flight) == 1:
            self._loop.call_at(arrival, self._arrive_head, self._flight_gen)

    def _withdraw(self, entries: list[_Admitted]) -> None:
        """Take back the arrivals of the most recently admitted ``entries``."""
        flight = self._flight
        fifo_copies = 0
        for entry in entries:
            for handle in entry.handles:
                self._loop.cancel(handle)
            fifo_copies += len(entry.delays) - len(entry.handles)
        for _ in range(fifo_copies):
            flight.pop()
        if fifo_copies:
            if flight:
                self._last_arrival = flight[-1][0]
            else:
                self._flight_gen += 1  # its head event is void
                self._last_arrival = self._loop.now

    def _drop_backlog(self) -> None:
        """Going down: drop the queue and the packet in service."""
        now = self._loop.now
        self._advance(now)
        victims = list(self._waiting)
        if self._serving is not None and self._serving.end > now:
            victims.insert(0, self._serving)
        self.dropped_down += len(victims)
        self._withdraw(victims)
        self._waiting.clear()
        self._queued_bytes = 0
        self._serving = None
        self._busy_until = now

    def _retime(self) -> None:
        """A new rate: packets still waiting are serialized at it (their fates stand)."""
        self._advance(self._loop.now)
        waiting = list(self._waiting)
        if not waiting:
            return
        self._withdraw(waiting)
        t = waiting[0].start
        for entry in waiting:
            entry.start = t
            entry.end = t = t + entry.size * self._s_per_byte
            delays, entry.delays, entry.handles = entry.delays, [], []
            for delay in delays:
                self._propagate(entry, delay)
        self._busy_until = t

    def _arrive(self, packet: object, size_bytes: int) -> None:
        self.delivered += 1
        self.bytes_delivered += size_bytes
        self._deliver(packet, self._loop.now)

    def _arrive_head(self, generation: int) -> None:
        if generation != self._flight_gen:
            return  # the FIFO was emptied by a link failure; a newer event owns the head
        flight = self._flight
        _, packet, size_bytes = flight.popleft()
        if flight:
            self._loop.call_at(flight[0][0], self._arrive_head, generation)
        self.delivered += 1
        self.bytes_delivered += size_bytes
        self._deliver(packet, self._loop.now)

    def stats(self) -> dict[str, int]:
        """Counters since creation."""
        return {
            "sent": self.sent,
            "bytes_sent": self.bytes_sent,
            "dropped_queue": self.dropped_queue,
            "dropped_loss": self.dropped_loss,
            "dropped_down": self.dropped_down,
            "delivered": self.delivered,
            "bytes_delivered": self.bytes_delivered,
            "duplicated": self.duplicated,
            "corrupted": self.corrupted,
        }


class PacketPort(Protocol):
    """Where a side puts a path's datagrams: a ``PathDirection``, or a port onto a shared one."""

    def send(self, packet: object, size_bytes: int) -> None: ...


class PathLinks(Protocol):
    """What a run needs of its network: per path a port each way, and the timeline's start."""

    @property
    def forward(self) -> Sequence[PacketPort]: ...

    @property
    def reverse(self) -> Sequence[PacketPort]: ...

    def start(self, t0: float | None = None) -> None: ...


#: Builds the links a run's datagrams cross from its loop and its two sides' deliver callbacks
#: (``deliver_a``, ``deliver_b``), so several runs can share one loop and one set of links.
_Deliver = Callable[[int, object, float], None]
LinksFactory = Callable[[EventLoop, _Deliver, _Deliver], PathLinks]


class Network:
    """All paths of a scenario: ``forward[i]`` carries a->b, ``reverse[i]`` b->a.

    ``deliver_b(path_index, packet, now)`` receives what arrives at side b (sent
    on a forward link), ``deliver_a`` what arrives at side a. The links start
    with the scenario's base parameters; ``start(t0)`` anchors the events
    timeline (seconds from transfer start) at virtual time ``t0``.
    """

    def __init__(
        self,
        scenario: Scenario,
        loop: EventLoop,
        deliver_a: Callable[[int, object, float], None],
        deliver_b: Callable[[int, object, float], None],
        seed: int | None = None,
        duplicate: float = 0.0,
        corrupt: float = 0.0,
    ) -> None:
        self.scenario = scenario
        self.loop = loop
        self.seed = scenario.seed if seed is None else seed
        self.forward: tuple[PathDirection, ...] = tuple(
            PathDirection(
                spec.forward,
                link_rng(self.seed, i, "a->b"),
                partial(deliver_b, i),
                loop,
                duplicate,
                corrupt,
            )
            for i, spec in enumerate(scenario.paths)
        )
        self.reverse: tuple[PathDirection, ...] = tuple(
            PathDirection(
                spec.reverse,
                link_rng(self.seed, i, "b->a"),
                partial(deliver_a, i),
                loop,
                duplicate,
                corrupt,
            )
            for i, spec in enumerate(scenario.paths)
        )
        self.started_at: float | None = None

    def start(self, t0: float | None = None) -> None:
        """Schedule the scenario's events relative to ``t0`` (default: ``loop.now``).

        Events due at ``t0`` itself apply immediately, so a packet sent right
        after ``start`` already sees them.
        """
        if self.started_at is not None:
            raise RuntimeError("Network.start called twice")
        t0 = self.loop.now if t0 is None else t0
        self.started_at = t0
        for i, spec in enumerate(self.scenario.paths):
            for at_s in spec.change_times():
                if t0 + at_s <= self.loop.now:
                    self._apply(i, at_s)
                else:
                    self.loop.call_at(t0 + at_s, self._apply, i, at_s)

    def _apply(self, index: int, at_s: float) -> None:
        spec = self.scenario.paths[index]
        self.forward[index].set_params(spec.params_at(at_s, "a->b"))
        self.reverse[index].set_params(spec.params_at(at_s, "b->a"))

    def stats(self) -> list[dict[str, object]]:
        """Per path: name and both directions' counters."""
        return [
            {"name": spec.name, "a->b": fwd.stats(), "b->a": rev.stats()}
            for spec, fwd, rev in zip(self.scenario.paths, self.forward, self.reverse, strict=True)
        ]
