"""The simulator's calls into one session: the same calls, in the same order, as aio's.

Why a module of its own: the simulator is only worth its determinism if it
drives the core the way the asyncio endpoint does. Every call the simulator
makes on a ``Session`` goes through a ``Driver``, whose methods are the
endpoint's moments — datagrams received (placed DATA runs, then opened control
packets), a timer fired, a verdict on a filled shard, a shard submitted —
each followed by ``service`` (events, then ``poll_transmit``, then
``next_deadline``), exactly as ``aio.Endpoint._service``. A recorded loopback
transfer replays through it call for call (``tests/test_replay_core_calls.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wanxport.core.events import Event
from wanxport.core.session import Session
from wanxport.core.transmit import Transmit
from wanxport.wire.frames import Frame

#: A run of placed DATA datagrams: (path_id, first_pn, count, shard_id, offset, length).
Run = tuple[int, int, int, int, int, int]
#: An opened control datagram: (path_id, packet_number, frames).
Control = tuple[int, int, list[Frame]]


@dataclass(slots=True)
class Serviced:
    """What the session had to say after a call: events, datagrams to send, its next timer."""

    events: list[Event]
    transmits: list[Transmit]
    deadline: float | None


class Driver:
    """Makes the core calls of one endpoint of a simulated session."""

    __slots__ = ("session",)

    def __init__(self, session: Session) -> None:
        self.session = session

    def submit(self, shard_id: int, data: bytes | bytearray | memoryview | None, now: float, *,
               size: int | None = None, meta: bytes = b"", digest: bytes | None = None,
               digest_later: bool = False) -> None:
        self.session.submit(shard_id, data, now, size=size, meta=meta, digest=digest,
                            digest_later=digest_later)

    def set_digest(self, shard_id: int, digest: bytes) -> None:
        self.session.set_digest(shard_id, digest)

    def receive(self, runs: Sequence[Run], controls: Sequence[Control], now: float,
                held_s: Sequence[float] = ()) -> None:
        """One receive batch, as the data path hands it over: placed runs first, then controls.
        ``held_s``: per path, how long its newest datagram waited out the receive hold-off."""
        session = self.session
        for path_id, first_pn, count, shard_id, offset, length in runs:
            held = held_s[path_id] if path_id < len(held_s) else 0.0
            session.receive_data_run(path_id, first_pn, count, shard_id, offset, length, now, held)
        if controls:
            session.receive_packets(controls, now, held_s)

    def receive_pass(self, now: float, held_s: float = 0.0) -> None:
        """A receive pass ended (with a receive hold-off in force), held ``held_s``: the
        simulated sockets never fill."""
        self.session.receive_holdoff.after_pass(now, False, held_s)

    def received_prefix(self, shard_id: int) -> int:
        return self.session.received_prefix(shard_id)

    def verified(self, shard_id: int, ok: bool, now: float) -> None:
        self.session.shard_verified(shard_id, ok, now)

    def fire(self, now: float) -> None:
        self.session.on_deadline(now)

    def service(self, now: float) -> Serviced:
        session = self.session
        events = session.events()
        return Serviced(events, session.poll_transmit(now), session.next_deadline())
