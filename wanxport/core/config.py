"""Session configuration: everything tunable about a session, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from wanxport.core.cc import BbrConfig, CcConfig, CcContext, PathGroup
from wanxport.core.packet_size import PacketSizer
from wanxport.wire.frames import DATA_OVERHEAD
from wanxport.wire.header import HEADER_LEN

IP_UDP_OVERHEAD = 28  # IPv4 + UDP headers
# The smallest window any controller accepts, in core packets (BBR's minimum).
MIN_INITIAL_CORE_PACKETS = 4
# The core paces per core packet: each Transmit carries its departure time. The
# data path only spreads a core packet's datagrams, this much faster than the
# core's rate (the native pacer; the simulator models it). At exactly the core's
# rate, every stall of the pacer thread on a busy host would become a standing
# queue in its ring that the congestion controller reads as a queue at the
# bottleneck (a sender-side RTT inflation that collapsed BBR's estimate on lossy
# emulated paths).
PACER_HEADROOM = 1.25
FEC_MODES = ("off", "auto")


def datagram_payload(path: PathConfig, tag_bytes: int) -> int:
    """Data bytes that one full-size DATA datagram carries on a path."""
    return min(path.mtu - IP_UDP_OVERHEAD - HEADER_LEN - tag_bytes - DATA_OVERHEAD, 0xFFFF)


@dataclass(frozen=True)
class PathConfig:
    name: str
    mtu: int = 1500
    # An operator's ceiling on this path's sending rate (bits/s): the pacer never sends
    # faster, whatever the controller estimates (a link shared under contract). None: no cap.
    max_rate_bps: float | None = None


@dataclass(frozen=True)
class SessionConfig:
    """Both gateways of a session must agree on ``paths`` (same order) and the credits."""

    paths: tuple[PathConfig, ...]
    # One validated config object, not a name plus loose options: every path's
    # controller is built from it the same way. A name and options from a user's
    # file become one with wanxport.core.cc.cc_config(name, options).
    congestion_control: CcConfig = field(default_factory=BbrConfig)
    scheduler: str = "earliest-arrival"
    chunk_bytes: int | None = None  # payload per core data packet; None: one full datagram
    # Payload per DATA datagram; None: as much as the MTU allows. Only the simulator
    # sets it (``--quantum``: datagrams larger than any MTU keep huge runs affordable).
    segment_bytes: int | None = None
    tag_bytes: int = 16  # AEAD tag per packet (0 with null protection)
    initial_rtt_s: float = 0.1
    # Long-haul paths have large bandwidth-delay products: start above RFC 6928's
    # 10 packets so a 150 ms path needs about one round trip less to fill. Counted
    # in full-size datagrams, whatever chunk_bytes makes a core packet (see
    # initial_window_core_packets), so the window on the wire does not grow with
    # the offload's segment count.
    initial_cwnd_packets: int = 64
    max_ack_delay_s: float = 0.005
    # None: every delayed ACK waits max_ack_delay_s. Set: a path's delayed ACK waits an
    # eighth of its smoothed RTT (the control interval, core.holdoff), at least this and at
    # most max_ack_delay_s; this until the path has an RTT sample. A thin short path (its
    # window below ack_threshold datagrams) then never waits out a WAN-sized delay, and a
    # long one acknowledges once per interval.
    min_ack_delay_s: float | None = None
    ack_threshold: int = 8
    receive_budget_bytes: int = 1 << 30  # our receive memory bound; granted to the peer
    peer_credit_bytes: int = 1 << 30  # the peer's budget, agreed at setup
    pacing_horizon_s: float = 0.002  # hand packets out this far ahead of departure ...
    burst_packets: int = 8  # ... or this many packets' worth, whichever is longer
    # New data goes to a path in contiguous runs of this many chunks (with a scheduler
    # that stripes; see wanxport.core.scheduler for what each one composes).
    stripe_chunks: int = 64
    # A path's core packets grow (powers of two of chunk_bytes, at most this factor) while
    # its measured bandwidth fills one within packet_budget_s (core.packet_size); 1: never.
    packet_budget_s: float = 0.008
    max_packet_growth: int = 8
    # A suspected path is probed at least this often, each probe awaited for an answer
    # (two misses fail it) ...
    max_probe_interval_s: float = 0.25
    # ... and a failed one this often, to see it return: 20 datagrams of ~70 bytes a
    # second (11 kb/s) buy readmission within 50 ms plus a round trip of its return.
    failed_probe_interval_s: float = 0.05
    # Erasure-coded tail (core.fec): "auto" adds repair where a recovery round trip would
    # extend the transfer, "off" never (the ablation).
    fec: str = "auto"

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("a session needs at least one path")
        if not isinstance(self.congestion_control, CcConfig):
            raise ValueError(f"congestion_control must be a controller config such as BbrConfig() "
                             f"(cc_config(name, options) makes one from a name), "
                             f"got {self.congestion_control!r}")
        if self.chunk_bytes is not None and not 0 < self.chunk_bytes <= (1 << 30):
            raise ValueError("chunk_bytes must be between 1 and 1 GiB (above 65535 only for virtual shards)")
        if self.segment_bytes is not None and not 0 < self.segment_bytes <= (1 << 30):
            raise ValueError("segment_bytes must be between 1 and 1 GiB (above 65535: virtual shards only)")
        if isinstance(self.initial_cwnd_packets, bool) or not (
                isinstance(self.initial_cwnd_packets, int) and self.initial_cwnd_packets >= 1):
            raise ValueError(f"initial_cwnd_packets must be a positive integer (full-size datagrams), "
                             f"got {self.initial_cwnd_packets!r}")
        for path in self.paths:
            if self.data_payload(path) <= 0:
                raise ValueError(f"path {path.name!r}: mtu {path.mtu} leaves no room for data")
            if path.max_rate_bps is not None and not path.max_rate_bps > 0:
                raise ValueError(f"path {path.name!r}: max_rate_bps must be > 0 (or None), "
                                 f"got {path.max_rate_bps!r}")
        if self.fec not in FEC_MODES:
            raise ValueError(f"fec must be one of {', '.join(FEC_MODES)}, got {self.fec!r}")
        if not self.packet_budget_s >= 0:
            raise ValueError(f"packet_budget_s must be >= 0 seconds, got {self.packet_budget_s!r}")
        if isinstance(self.max_packet_growth, bool) or not (
                isinstance(self.max_packet_growth, int) and self.max_packet_growth >= 1
                and self.max_packet_growth & (self.max_packet_growth - 1) == 0):
            raise ValueError(f"max_packet_growth must be a power of two >= 1, got {self.max_packet_growth!r}")
        if self.ack_threshold < 1:
            raise ValueError("ack_threshold must be >= 1")
        if self.min_ack_delay_s is not None and not 0 < self.min_ack_delay_s <= self.max_ack_delay_s:
            raise ValueError(f"min_ack_delay_s must be > 0 and at most max_ack_delay_s "
                             f"({self.max_ack_delay_s!r}), got {self.min_ack_delay_s!r}")
        for name in ("max_probe_interval_s", "failed_probe_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")

    def data_payload(self, path: PathConfig) -> int:
        """Data bytes per core data packet on a path (``chunk_bytes``, else one full datagram)."""
        if self.chunk_bytes is not None:
            return self.chunk_bytes
        return self.datagram_payload(path)

    def packet_sizer(self, path: PathConfig) -> PacketSizer | None:
        """The path's core packet sizer, or None when its packets keep one size: one datagram
        each (a data path that does not segment them), growth turned off, or a controller
        that reads a larger packet's serialisation as queueing (``CcConfig.grows_packets``)."""
        if (self.chunk_bytes is None or self.chunk_bytes <= self.datagram_payload(path)
                or self.packet_budget_s <= 0 or self.max_packet_growth <= 1
                or not self.congestion_control.grows_packets()):
            return None
        return PacketSizer(self.data_payload(path), self.packet_budget_s, self.max_packet_growth)

    def datagram_payload(self, path: PathConfig) -> int:
        """Data bytes that one full-size DATA datagram carries on a path (``segment_bytes``,
        else as much as the MTU allows)."""
        if self.segment_bytes is not None:
            return self.segment_bytes
        return datagram_payload(path, self.tag_bytes)

    def initial_window_core_packets(self, path: PathConfig) -> int:
        """``initial_cwnd_packets`` (full-size datagrams) in core packets, which controllers count.

        A data path that cuts each core packet into several datagrams (``chunk_bytes``
        a multiple of the datagram payload) would otherwise multiply the initial
        window by its segment count: 64 packets of 16 datagrams is a 1.5 MB first
        flight on every path. Never below the controllers' minimum window.
        """
        window_bytes = self.initial_cwnd_packets * datagram_payload(path, self.tag_bytes)
        return max(MIN_INITIAL_CORE_PACKETS, -(-window_bytes // self.data_payload(path)))

    def cc_context(self, index: int, group: PathGroup | None = None) -> CcContext:
        """What the controller of path ``index`` needs to know about it (and its session's group)."""
        path = self.paths[index]
        return CcContext(mss_bytes=self.data_payload(path) + self.packet_overhead(),
                         initial_window_packets=self.initial_window_core_packets(path),
                         path_index=index, initial_rtt_s=self.initial_rtt_s, group=group)

    def packet_overhead(self) -> int:
        return HEADER_LEN + self.tag_bytes
