"""The interface every per-path congestion controller implements.

The session calls a controller once per *batch* (an acknowledgement batch, a
batch of packets declared lost), never per datagram on the hot path except
:meth:`CongestionController.on_packet_sent`, which must stay trivial. The
controller answers with two numbers the sender obeys: a congestion window
(bytes allowed in flight) and a pacing rate (bits per second).

Controllers are pure: time is the ``now`` argument, there is no clock, no I/O,
and randomness, if any, comes from a seed option.

A controller is made from two parts (quinn-proto's ``ControllerFactory``
shape): a frozen :class:`CcConfig`, which says *how* the user wants it to
behave, is validated once when the session configuration is built and is
shared by every path; and a :class:`CcContext`, which says *where* it runs
(one path's packet size, initial window and index), known only when the
session creates that path. ``config.build(context)`` joins them, so the
session creates every controller the same way, whatever its name.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import INITIAL_RTT_S, RttEstimator


class PathGroup:
    """The controllers of one session's paths, so that a coupled controller sees its siblings.

    The session makes one per session and passes it in every path's context;
    controllers that couple (``bbr`` with ``coupled = true``) join it when built.
    """

    __slots__ = ("controllers",)

    def __init__(self) -> None:
        self.controllers: list[CongestionController] = []


@dataclass(frozen=True)
class CcContext:
    """What a controller needs to know about the one path it runs on."""

    #: Bytes of the path's full-size core packet (data, header and tag), the unit of its window.
    mss_bytes: int
    #: Initial window in core packets (the session converts its datagram count for this path).
    initial_window_packets: int = 32
    #: The path's position in the session: seeds per-path randomness, so paths differ.
    path_index: int = 0
    #: The RTT to assume before the first sample, seconds.
    initial_rtt_s: float = INITIAL_RTT_S
    #: The session's other paths' controllers (None: a controller on its own).
    group: PathGroup | None = None

    def __post_init__(self) -> None:
        for name in ("mss_bytes", "initial_window_packets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.path_index, bool) or not isinstance(self.path_index, int) or self.path_index < 0:
            raise ValueError(f"path_index must be an integer >= 0, got {self.path_index!r}")
        if not self.initial_rtt_s > 0:
            raise ValueError(f"initial_rtt_s must be > 0 seconds, got {self.initial_rtt_s!r}")


class CcConfig:
    """A controller's settings: validated fields, and :meth:`build` to make one per path.

    Subclasses are frozen dataclasses whose fields are the controller's
    options (what a user may write in a file), each checked in
    ``__post_init__`` with a message naming it and what would be valid.
    (A plain base rather than an ``abc.ABC``: mypyc cannot compile a
    dataclass derived from one.)
    """

    __slots__ = ()

    def build(self, context: CcContext) -> CongestionController:
        """A fresh controller for the path ``context`` describes."""
        raise NotImplementedError

    def grows_packets(self) -> bool:
        """Whether a fast path's core packets may grow under this controller (core.packet_size)."""
        return True


class CongestionController(abc.ABC):
    """Decides how much one path may have in flight and how fast it sends."""

    __slots__ = ()

    #: Registry name ("bbr", "cubic", "fixed").
    name: ClassVar[str]

    @abc.abstractmethod
    def on_packet_sent(self, now: float, size_bytes: int, bytes_in_flight: int) -> None:
        """A packet of ``size_bytes`` left; ``bytes_in_flight`` excludes it."""

    @abc.abstractmethod
    def on_ack(
        self,
        now: float,
        acked_bytes: int,
        rtt: RttEstimator,
        sample: RateSample | None,
        bytes_in_flight: int,
    ) -> None:
        """An ack batch newly acknowledged ``acked_bytes``.

        ``rtt`` has already taken this batch's sample; ``sample`` is the
        batch's delivery-rate sample, if any; ``bytes_in_flight`` is after
        removing the acknowledged packets.
        """

    @abc.abstractmethod
    def on_loss(
        self,
        now: float,
        lost_bytes: int,
        bytes_in_flight: int,
        lost_sent_time: float,
        rtt: RttEstimator,
    ) -> None:
        """A batch of packets was declared lost.

        ``lost_sent_time`` is the newest send time among them: losses of
        packets sent before the controller's last reduction describe a
        congestion episode it has already answered and must not count twice.
        ``bytes_in_flight`` is after removing the lost packets.
        """

    @abc.abstractmethod
    def on_path_reset(self, now: float) -> None:
        """The path failed or was readmitted: start over, but keep min-RTT knowledge."""

    def on_route_change(self, now: float) -> None:
        """The path now runs over another route (its RTT moved): forget its model, min RTT too.

        This default suits controllers that keep no RTT of their own.
        """
        self.on_path_reset(now)

    def on_path_resume(self, now: float, rate_bps: float) -> None:
        """A failed path answers again over what looks like the same route: resume it.

        ``rate_bps`` is the delivery rate the path sustained before it failed,
        and the session calls this only when the path's fresh RTT matches the
        one it had (careful resume, draft-ietf-tsvwg-careful-resume). A controller with a rate model
        may start from a safe share of that rate instead of searching from the
        initial window; this default, for controllers without one, simply
        starts over.
        """
        self.on_path_reset(now)

    def on_app_idle(self, now: float) -> None:
        """The session has nothing left to send: every shard it had was acknowledged (a step ended).

        What is still in flight carries data the peer already has. A controller
        whose search for capacity would otherwise resume at full strength in the
        next step may settle on what it measured (``core.warm``); this default
        keeps its state.
        """
        return None

    @property
    @abc.abstractmethod
    def cwnd_bytes(self) -> int:
        """Bytes the sender may have in flight on this path."""

    @property
    @abc.abstractmethod
    def pacing_rate_bps(self) -> float:
        """Rate at which the sender should release packets, bits/s; always > 0."""

    @property
    @abc.abstractmethod
    def in_startup(self) -> bool:
        """True while the controller is still searching for the path's capacity."""

    @property
    def bandwidth_bps(self) -> float:
        """Best estimate of what the path delivers, bits/s (for the scheduler).

        Unlike :attr:`pacing_rate_bps` it carries no probing gain; subclasses
        with a bandwidth model override it.
        """
        return self.pacing_rate_bps

    @property
    def state(self) -> str:
        """Short state label for statistics and logs (e.g. "probe_bw")."""
        return self.name

    def metrics(self) -> dict[str, float]:
        """The controller's figures, by name, for statistics, reports and metrics.

        This is the one way to read a controller from outside the core, so no
        caller has to know which controller a path runs. Every controller
        reports ``cwnd_bytes``, ``pacing_rate_bps`` and ``bandwidth_bps``;
        subclasses add their model's figures (BBR: ``max_bw_bps``,
        ``min_rtt_s``, ``pacing_gain``, ...; CUBIC: ``ssthresh_bytes``, ...).
        Every value is a finite float, so the dict goes straight into JSON
        and Prometheus: a figure the controller does not have (no RTT sample
        yet, no congestion cap, slow start's unbounded threshold) is left out
        rather than reported as infinity. The state label is :attr:`state`.
        """
        return {
            "cwnd_bytes": float(self.cwnd_bytes),
            "pacing_rate_bps": self.pacing_rate_bps,
            "bandwidth_bps": self.bandwidth_bps,
        }

    def metrics_figures(self) -> tuple[Callable[[Any], dict[str, float]], tuple[Any, ...]]:
        """:meth:`metrics` as a pair: the figures captured now, and the function that names them.

        The figures open with ``(cwnd_bytes, pacing_rate_bps, state)``, the three a statistics
        snapshot reports on every path, and the function turns the whole tuple into
        :meth:`metrics`' dict. A snapshot keeps the pair and names the figures only if
        someone reads them (``core.stats``): every path of every snapshot asks, few readers
        look. A controller whose figures are its own fields hands them over as they are
        (no property asked); by default the dict is built now and travels as the fourth figure.
        """
        return _metrics_built, (self.cwnd_bytes, self.pacing_rate_bps, self.state, self.metrics())


def _metrics_built(figures: tuple[Any, ...]) -> dict[str, float]:
    """The default controller's figures name themselves: the fourth is :meth:`metrics`' dict."""
    built: dict[str, float] = figures[3]
    return built
