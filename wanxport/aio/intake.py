"""The endpoint's receive side: draining the sockets, coalescing wakes, handing batches to the session.

What arrives is handed to the session in passes: one pass drains one or more
paths and hands the session their placed DATA runs and opened control packets
together. Whether a waking path waits first (receive coalescing) is the core's
decision (``core.holdoff``); this module only holds the sockets and drains them.

While data keeps arriving, the sockets stay out of the loop's watch and are
polled once per hold-off instead (as a NIC driver polls under load and turns
interrupts back on when a poll finds nothing): the first wake of a burst stops
watching every path, and each pass that drained something arms the next one
directly. A wake per path per hold-off cost a callback and a watch cycle (a
uvloop handle and about six ``epoll_ctl`` calls) for each path that woke; a
poll costs one ``poll`` for all of them.
"""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wanxport.aio.datapath import Received
from wanxport.wire.errors import WireError
from wanxport.wire.frames import Frame, decode_frames

if TYPE_CHECKING:
    from wanxport.aio.endpoint import Endpoint


class Intake:
    """Drains an endpoint's paths into its session, one pass at a time."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._ep = endpoint
        self._polling = False  # every path out of the loop's watch, drained when the hold-off ends
        self._held_timer: asyncio.TimerHandle | None = None
        self._held_since = 0.0  # clock() when the hold-off began
        self.passes = 0  # drains of one or more paths handed to the session together
        self.malformed_controls = 0
        self.data_runs = 0
        self.data_records = 0
        self.control_records = 0  # control packets decoded in Python (at a sender: its ACKs)
        self._poller = select.poll()  # every path's socket, asked at once before a deadline
        self._polled: tuple[int, ...] = ()  # the descriptors registered with it

    def on_readable(self, path_id: int) -> None:
        wait_s = self._ep.session.receive_holdoff.wait_s()
        if wait_s > 0.0:
            self._hold(wait_s)
        else:
            self._drain((path_id,))

    def _hold(self, wait_s: float) -> None:
        """Stop watching every path; drain what they hold when the hold-off ends.

        What arrives until then, on any path, is drained in one pass. The sockets
        must leave the loop's watch meanwhile: their readiness is level-triggered.
        """
        if not self._polling:
            self._polling = True
            for path_id in range(len(self._ep.sockets)):
                self._watch(path_id, False)
        if self._held_timer is None:
            loop = self._ep.loop
            assert loop is not None  # readers run only while the endpoint does
            self._held_since = self._ep.clock()
            self._held_timer = loop.call_later(wait_s, self._release_held)

    def _release_held(self) -> None:
        """The hold-off ended: one pass over the paths with something to read."""
        self._held_timer = None
        self._poll_pass(self._readable())

    def drain_all(self) -> None:
        """Read what already waits in every socket before a deadline judges its absence.

        A loop runs its due timers before it polls for I/O, so after a stall (a
        busy host descheduled the process, or a path waits out the receive
        hold-off) the loss and probe timeouts would fire with acknowledgements
        unread in the sockets: a probe timeout then declares a whole window lost
        and re-sends it though it arrived (measured with two ranks per site on two
        cores). Draining first costs one ``poll`` for every path, then a drain of those
        that have something to read.
        """
        readable = self._readable()
        if not self._polling:
            self._drain(readable)
        elif readable:  # else the hold-off's own pass still stands
            if self._held_timer is not None:
                self._held_timer.cancel()
            self._poll_pass(readable)

    def _poll_pass(self, readable: Sequence[int]) -> None:
        """Drain ``readable`` in one pass while polling; then poll on at the next hold-off if it
        found something and the session still holds, else hand the paths back to the loop."""
        waited = self._ep.clock() - self._held_since
        try:
            if readable:
                self._drain(readable, waited)
        finally:
            ep = self._ep
            if ep.loop is not None:  # not closed by what the drain handed on
                wait_s = ep.session.receive_holdoff.wait_s()
                if readable and wait_s > 0.0:
                    self._held_since = ep.clock()
                    self._held_timer = ep.loop.call_later(wait_s, self._release_held)
                else:
                    self._polling = False
                    for path_id in range(len(ep.sockets)):
                        self._watch(path_id, True)

    def _readable(self) -> list[int]:
        """The paths whose socket has a datagram (or an error) to read now."""
        fds = tuple(sock.fileno() for sock in self._ep.sockets)
        if fds != self._polled:
            self._poller = select.poll()
            for fd in fds:
                if fd >= 0:
                    self._poller.register(fd, select.POLLIN)
            self._polled = fds
        ready = {fd for fd, _ in self._poller.poll(0)}
        return [path_id for path_id, fd in enumerate(fds) if fd in ready]

    def cancel(self) -> None:
        if self._held_timer is not None:
            self._held_timer.cancel()
        self._held_timer = None
        self._polling = False

    def _watch(self, path_id: int, on: bool) -> None:
        """Let the loop watch the path's socket again (``on``) or stop watching it."""
        ep = self._ep
        assert ep.loop is not None
        if ep.ports is not None:
            port = ep.ports[path_id]
            port.resume_reading() if on else port.pause_reading()
        elif on:
            ep.loop.add_reader(ep.sockets[path_id].fileno(), self.on_readable, path_id)
        else:
            ep.loop.remove_reader(ep.sockets[path_id].fileno())

    def _drain(self, path_ids: Sequence[int], held_s: float = 0.0) -> None:
        """Drain these paths' sockets and hand everything to the session in one pass; ``held_s``:
        how long the pass was held back (none of what arrived waited longer)."""
        ep = self._ep
        now = ep.clock()
        self.passes += 1
        drained = [(path_id, ep.datapath.receive(path_id)) for path_id in path_ids]
        self.deliver(drained, now, held_s)
        holdoff = ep.session.receive_holdoff
        if holdoff.holdoff_s > 0.0:
            holdoff.after_pass(now, any(received.pressed for _, received in drained), held_s)

    def on_delivered(self, items: list[tuple[int, Received]]) -> None:
        """What the data path's worker threads drained (``Datapath.start``), on the loop."""
        if self._ep.loop is None:
            return  # closed meanwhile
        self.deliver(items, self._ep.clock())

    def deliver(self, items: Sequence[tuple[int, Received]], now: float, held_s: float = 0.0) -> None:
        """One pass: everything to the session, then the digests, then QUIC datagrams to their side."""
        ep = self._ep
        grown: set[int] = set()
        wall = time.time() if held_s > 0.0 else 0.0
        for path_id, received in items:
            # How long the path's newest datagram waited out the hold-off (kernel receive time;
            # unknown: none), so the session leaves it out of its round-trip samples.
            waited = min(held_s, max(0.0, wall - received.rx_ns * 1e-9)) if received.rx_ns and wall else 0.0
            self._absorb(path_id, received, now, grown, waited)
        ep.verifier.advance(grown, ep.session.received_prefix)
        ep.service_soon()
        for path_id, received in items:
            if received.quic:
                ep.handoff.hand(path_id, received.quic)

    def _absorb(self, path_id: int, received: Received, now: float, grown: set[int], held_s: float) -> None:
        """Hand what a path received to the session; add to ``grown`` the shards it may have grown."""
        ep = self._ep
        session = ep.session
        if received.runs or received.controls:
            ep.heard(path_id, now)
        if received.runs:
            self.data_records += received.datagrams
            self.data_runs += len(received.runs)
            for pid, first_pn, count, shard_id, offset, length in received.runs:
                session.receive_data_run(pid, first_pn, count, shard_id, offset, length, now, held_s)
                grown.add(shard_id)
        if received.controls:
            # DATA on the Python path, a repair symbol, a SHARD_OPEN releasing early data:
            # any open shard may have grown.
            grown.update(ep.verifier.open_shards)
        self.control_records += len(received.controls)
        opened: list[tuple[int, int, list[Frame]]] = []
        for pid, pn, plaintext in received.controls:
            try:
                opened.append((pid, pn, decode_frames(plaintext)))
            except WireError:
                self.malformed_controls += 1
        if opened:
            waits = [held_s if i == path_id else 0.0 for i in range(len(ep.sockets))] if held_s else ()
            session.receive_packets(opened, now, waits)  # a path's ACKs of one drain applied as one


