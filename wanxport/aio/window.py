"""What the layers above an endpoint may read and steer of its session, and its keys.

The gateway, the collectives, the daemon and the benchmarks read a session
through these calls and nothing else (a test fails on any ``.endpoint.session``
chain outside ``wanxport/aio``), so the core and the endpoint can change shape
without every reader changing too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wanxport.aio.config import DirectionKey, EndpointConfig
from wanxport.aio.intake import Intake
from wanxport.core.session import Session
from wanxport.core.stats import SessionStats
from wanxport.core.warm import PathMemory


class SessionWindow:
    """Read and steer calls over ``session`` (an ``aio.Endpoint`` is one)."""

    session: Session
    config: EndpointConfig
    clock: Callable[[], float]
    intake: Intake
    datapath: Any
    services: int
    plans_sent: int
    timer_wakes: int

    # -- the window onto the session, for the layers above ---------------------

    def stats(self) -> SessionStats:
        """A frozen snapshot of the session's figures (``core.stats``)."""
        return self.session.stats()

    def acked_bytes(self) -> int:
        """Payload bytes the peer acknowledged so far (cheaper than ``stats()``)."""
        return self.session.acked_bytes()

    def receiving_bytes(self) -> int:
        """Payload bytes held in incoming shards not yet handed over."""
        return self.session.receiving_bytes()

    @property
    def peer_credit_bytes(self) -> int:
        """The peer's receive credit: how many bytes of open shards it accepts at once."""
        return self.config.session.peer_credit_bytes

    def set_rate_caps(self, caps_bps: tuple[float | None, ...]) -> None:
        """Each path's sending rate cap from the next packet on (``Session.set_rate_caps``)."""
        self.session.set_rate_caps(caps_bps)

    def rate_caps_bps(self) -> tuple[float | None, ...]:
        return self.session.rate_caps_bps()

    def resume_path(self, path_id: int, memory: PathMemory) -> bool:
        """Careful resume of a path from a previous session's state (``Session.resume_path``)."""
        return self.session.resume_path(path_id, memory, self.clock())

    @property
    def receive_holding(self) -> bool:
        """Whether a path that wakes now waits out the receive hold-off (``core.holdoff``)."""
        return self.session.receive_holdoff.holding

    @property
    def holdoff_yields(self) -> int:
        """Drains that found a socket pressed and turned the hold-off off."""
        return self.session.receive_holdoff.yields

    @property
    def receive_passes(self) -> int:
        return self.intake.passes

    def loop_events(self) -> dict[str, int]:
        """The event loop's work so far, by kind: control packets decoded (at a sender, the
        peer's ACKs), receive passes, session services, plans handed to the data path (a data
        plan is one native seal call) and timer wake-ups that reached the session (pacing, ACK
        and loss timers). Divided into the loop thread's CPU they give its cost per event;
        per second, whether the work follows the packet rate or the control interval."""
        return {"control_packets": self.intake.control_records, "receive_passes": self.intake.passes,
                "services": self.services, "plans": self.plans_sent, "timer_wakes": self.timer_wakes}

    # -- keys (rotation is the caller's policy; see wanxport.gateway.rekey) ----

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        """Seal from now on with ``key`` under key phase ``phase`` (its low bit goes on the wire)."""
        self.datapath.use_send_key(phase, key)

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        """Accept datagrams of key phase ``phase`` sealed with ``key`` (the peer's next key)."""
        self.datapath.install_recv_key(phase, key)

    @property
    def packets_under_key(self) -> int:
        return int(self.datapath.packets_under_key)

    @property
    def bytes_under_key(self) -> int:
        return int(self.datapath.bytes_under_key)

    @property
    def pacer_name(self) -> str | None:
        pacer = getattr(self.datapath, "pacer", None)
        return None if pacer is None else str(pacer.name)

