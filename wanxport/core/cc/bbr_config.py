"""The BBR-family controller's options (``core.cc.bbr`` is the controller itself).

Apart from the controller so the registry and the session's configuration can name
the options without loading the state machine, and so the controller reads on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanxport.core.cc.base import CcConfig, CcContext, CongestionController


@dataclass(frozen=True)
class BbrConfig(CcConfig):
    """Options of the BBR-family controller (the default)."""

    #: ProbeRTT drains a path to 4 packets for a round trip every ~10 s to
    #: re-measure the minimum RTT. On provisioned long-haul paths that costs ~3 %
    #: of every long transfer for a route change that rarely happens, and the
    #: windowed minimum still follows a path whose RTT really moved, so it is
    #: off by default. Set it for shared paths.
    probe_rtt: bool = False
    #: Each path's RNG (its first ProbeBW phase) is seeded with this plus the path's index.
    seed: int = 0
    #: Links shared with other traffic: couple the paths, hold the min RTT (core.cc.coupling).
    shared: bool = False

    def __post_init__(self) -> None:
        for option in ("probe_rtt", "shared"):
            if not isinstance(getattr(self, option), bool):
                raise ValueError(f"bbr option {option} must be true or false, got {getattr(self, option)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"bbr option seed must be an integer, got {self.seed!r}")

    def build(self, context: CcContext) -> CongestionController:
        from wanxport.core.cc.bbr import BbrCongestionController  # the controller imports this module

        return BbrCongestionController(self, context)
