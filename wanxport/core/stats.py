"""Frozen snapshots of a session's figures: the one way to read a session from outside the core.

Reports, the Prometheus collector, the progress display and the drivers read
these instead of the session's paths, estimators and controllers, so the
parts can change shape without every reader changing too (quinn-proto's
``ConnectionStats`` plays the same role). A snapshot is a copy: it never
changes after it is taken, and taking one is safe from another thread under
the GIL (containers the event loop may resize are copied with one C-level
call first).

Taking one is cheap: the counters are kept in place in typed groups where
their events happen (``core.counters``) and each group is copied with one
C-level call; only the gauges of the moment (RTT, window, rate, state) are
read one by one. The snapshots are named tuples for the same reason: built
from those copies in one call, where a frozen dataclass set its 28 fields one
by one. A controller's metrics are captured the same way, as its raw figures,
and named only when read (``PathStats.cc_metrics``): most snapshots are read for
a few counters, and naming every path's figures cost a third of taking one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from wanxport.core.counters import (
    RepairReceiveCounters,
    ShardCounters,
    copy_path,
    copy_repair_receive,
    copy_shards,
)
from wanxport.core.paths import Path


class PathStats(NamedTuple):
    """One path's figures at the moment of the snapshot (immutable: a tuple with names)."""

    path_id: int
    name: str
    state: str  # "active", "probing", "degraded" or "failed"
    # The path's counters (core.counters.PathCounters), copied: payload ...
    payload_bytes: int  # payload sent, retransmissions and hedges included
    retransmitted_bytes: int
    hedged_bytes: int
    repair_bytes: int  # erasure-code repair symbols sent on this path (core.fec)
    # ... core packets ...
    packets_sent: int
    bytes_sent: int  # datagram bytes (headers and tags included) of every packet sent
    packets_lost: int
    spurious_losses: int  # declared lost, acknowledged later
    # ... and events
    failures: int  # times the path entered the failed state
    resumes: int  # careful resumes from a previous session's saved state (Session.resume_path) ...
    resumes_dropped: int  # ... and saved states dropped because the route's RTT had moved
    late_wakes: int  # pacing wake-ups served more than 2 ms late: a driver's loop short of CPU
    rtt_probes: int  # probes sent because the path's RTT estimate had gone unsampled (core.freshness)
    reroutes: int  # idle restarts whose first round trip showed another route (controller reset, core.warm)
    # Gauges, read at the snapshot
    srtt_s: float | None  # smoothed RTT; None before the first sample
    min_rtt_s: float | None  # lifetime minimum RTT; None before the first sample
    bandwidth_bps: float  # the scheduler's max-filtered delivery rate (0 before a sample)
    bytes_in_flight: int
    reorder_threshold: int  # the loss detector's packet threshold, widened by spurious losses
    time_threshold: float  # ... and its time threshold, in smoothed RTTs
    cwnd_bytes: int
    packet_bytes: int  # data bytes of the path's core packets now (grown on fast paths, core.packet_size)
    pacing_rate_bps: float  # what the path is paced at: the controller's rate under the path's cap
    cc_state: str  # the controller's state label ("startup", "probe_bw", ...)
    # ``CongestionController.metrics_figures()``: the figures captured at the snapshot and the
    # function that names them; read them as ``cc_metrics``.
    cc_figures: tuple[Callable[[Any], dict[str, float]], Any]

    @property
    def cc_metrics(self) -> Mapping[str, float]:
        """``CongestionController.metrics()`` at the snapshot, read-only (dict() it for JSON)."""
        name, figures = self.cc_figures
        return MappingProxyType(name(figures))


class SessionStats(NamedTuple):
    """A session's figures and each of its paths' at the moment of the snapshot."""

    # Shards (core.counters.ShardCounters)
    shards_submitted: int
    shards_acknowledged: int  # shards the peer reported done (verified or not)
    shards_received: int  # incoming shards checked and handed to the application
    bytes_submitted: int
    bytes_received: int  # payload bytes of the shards handed to the application
    data_dropped: int  # DATA the session could not accept (unknown shard, out of bounds)
    # Repair of incoming shards (RepairReceiveCounters)
    repaired_bytes: int  # incoming bytes rebuilt from repair instead of received
    retransmitted_after_repair_bytes: int  # incoming DATA for bytes already rebuilt: waste
    repair_blocks_rebuilt: int  # incoming blocks whose lost data repair rebuilt
    repair_blocks_short: int  # incoming blocks completed by retransmission: repair was not enough
    # Read at the snapshot
    acked_bytes: int  # payload bytes the peer acknowledged, over the shards the session holds
    receiving_bytes: int  # payload bytes placed so far in incoming shards not yet handed over
    hedged_bytes: int
    repair_bytes: int  # repair symbols sent (the erasure-coded tail, core.fec)
    paths: tuple[PathStats, ...]


_NO_RTT = (None, None)
_copy_rtt = attrgetter("smoothed_s", "min_s")
_copy_loss_gauges = attrgetter("bytes_in_flight", "reorder_threshold", "time_threshold")


def path_stats(path: Path) -> PathStats:
    """Snapshot of one path: its counters copied, its gauges read."""
    rtt, cc = path.rtt, path.cc
    return PathStats._make(
        (path.path_id, path.name, path.health.state)  # a StrEnum member: the state's name itself
        + copy_path(path.counters) + (_copy_rtt(rtt) if rtt.has_sample else _NO_RTT) + (path.bandwidth_bps,)
        + _copy_loss_gauges(path.loss)
        + (cc.cwnd_bytes, path.mss, path.pacing_rate_bps, cc.state, cc.metrics_figures()))


def session_stats(shards: ShardCounters, acked_bytes: int, receiving_bytes: int, hedged_bytes: int,
                  repair_bytes: int, repair_receive: RepairReceiveCounters, paths: Sequence[Path]
                  ) -> SessionStats:
    """Snapshot of a session from its counter groups, the figures read now and its paths."""
    return SessionStats._make(
        copy_shards(shards) + copy_repair_receive(repair_receive)
        + (acked_bytes, receiving_bytes, hedged_bytes, repair_bytes, tuple(map(path_stats, paths))))
