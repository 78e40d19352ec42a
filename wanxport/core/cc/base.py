"""The interface every per-path congestion controller implements.

The session calls a controller once per *batch* (an acknowledgement batch, a
batch of packets declared lost), never per datagram on the hot path except
:meth:`CongestionController.on_packet_sent`, which must stay trivial. The
controller answers with two numbers the sender obeys: a congestion window
(bytes allowed in flight) and a pacing rate (bits per second).

Controllers are pure: time is the ``now`` argument, there is no clock, no I/O,
and randomness, if any, comes from a seed option.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import RttEstimator


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
