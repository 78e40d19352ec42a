"""Fixed-rate control for provisioned links.

On a link whose capacity is reserved for us (a leased wavelength, a QoS
class) probing is wasted effort and loss says nothing about congestion, so
the sender simply paces at the configured rate. The window is two
rate x RTT products: enough to keep the pipe full while acknowledgements and
retransmissions take their time, and still a bound if the peer vanishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wanxport.core.cc.base import CcConfig, CcContext, CongestionController
from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import RttEstimator

#: Floor of the RTT used for the window, so a LAN-like RTT still leaves a usable window.
_MIN_WINDOW_RTT_S = 0.001


@dataclass(frozen=True)
class FixedConfig(CcConfig):
    """The provisioned rate; there is nothing to measure, so nothing else to set."""

    #: What the link is provisioned for, bits/s: every path of the session paces at it.
    rate_bps: float

    def __post_init__(self) -> None:
        rate = self.rate_bps
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ValueError(f"fixed option rate_bps must be a number > 0 (bits/s), got {rate!r}")

    def build(self, context: CcContext) -> FixedRateCongestionController:
        return FixedRateCongestionController(self, context)


class FixedRateCongestionController(CongestionController):
    """Paces at ``rate_bps`` and ignores loss."""

    __slots__ = ("_mss", "_rate_bps", "_srtt_s", "_cwnd")

    name: ClassVar[str] = "fixed"

    def __init__(self, config: FixedConfig, context: CcContext) -> None:
        self._mss = context.mss_bytes
        self._rate_bps = float(config.rate_bps)
        self._srtt_s = float(context.initial_rtt_s)
        self._cwnd = self._window()

    def _window(self) -> int:
        window = int(2.0 * self._rate_bps / 8.0 * max(self._srtt_s, _MIN_WINDOW_RTT_S))
        return max(window, 4 * self._mss)

    def on_packet_sent(self, now: float, size_bytes: int, bytes_in_flight: int) -> None:
        """Nothing to do: the rate does not depend on what was sent."""

    def on_ack(
        self,
        now: float,
        acked_bytes: int,
        rtt: RttEstimator,
        sample: RateSample | None,
        bytes_in_flight: int,
    ) -> None:
        """Follow the smoothed RTT so the window stays two rate x RTT products."""
        if rtt.smoothed_s != self._srtt_s:
            self._srtt_s = rtt.smoothed_s
            self._cwnd = self._window()

    def on_loss(
        self,
        now: float,
        lost_bytes: int,
        bytes_in_flight: int,
        lost_sent_time: float,
        rtt: RttEstimator,
    ) -> None:
        """Loss on a provisioned link is not congestion: ignore it."""

    def on_path_reset(self, now: float) -> None:
        """The rate is provisioned; a reset changes nothing."""

    @property
    def cwnd_bytes(self) -> int:
        return self._cwnd

    @property
    def pacing_rate_bps(self) -> float:
        return self._rate_bps

    @property
    def in_startup(self) -> bool:
        return False

    def metrics(self) -> dict[str, float]:
        """The provisioned rate besides the common figures."""
        figures = super().metrics()
        figures["rate_bps"] = self._rate_bps
        return figures
