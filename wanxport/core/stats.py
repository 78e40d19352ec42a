"""Frozen snapshots of a session's figures: the one way to read a session from outside the core.

Reports, the Prometheus collector, the progress display and the drivers read
these instead of the session's paths, estimators and controllers, so the
parts can change shape without every reader changing too (quinn-proto's
``ConnectionStats`` plays the same role). A snapshot is a copy: it never
changes after it is taken, and taking one is safe from another thread under
the GIL (containers the event loop may resize are copied with one C-level
call first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from wanxport.core.paths import Path


@dataclass(frozen=True, slots=True)
class PathStats:
    """One path's figures at the moment of the snapshot."""

    path_id: int
    name: str
    state: str  # "active", "probing", "degraded" or "failed"
    srtt_s: float | None  # smoothed RTT; None before the first sample
    min_rtt_s: float | None  # lifetime minimum RTT; None before the first sample
    bandwidth_bps: float  # the scheduler's max-filtered delivery rate (0 before a sample)
    payload_bytes: int  # payload sent, retransmissions and hedges included
    retransmitted_bytes: int
    hedged_bytes: int
    repair_bytes: int  # erasure-code repair symbols sent on this path (core.fec)
    packets_sent: int
    bytes_sent: int  # datagram bytes (headers and tags included) of every packet sent
    packets_lost: int
    spurious_losses: int  # declared lost, acknowledged later
    failures: int  # times the path entered the failed state
    bytes_in_flight: int
    reorder_threshold: int  # the loss detector's packet threshold, widened by spurious losses
    time_threshold: float  # ... and its time threshold, in smoothed RTTs
    cwnd_bytes: int
    packet_bytes: int  # data bytes of the path's core packets now (grown on fast paths, core.packet_size)
    pacing_rate_bps: float  # what the path is paced at: the controller's rate under the path's cap
    resumes: int  # careful resumes from a previous session's saved state (Session.resume_path) ...
    resumes_dropped: int  # ... and saved states dropped because the route's RTT had moved
    late_wakes: int  # pacing wake-ups served more than 2 ms late: a driver's loop short of CPU
    rtt_probes: int  # probes sent because the path's RTT estimate had gone unsampled (core.freshness)
    reroutes: int  # idle restarts whose first round trip showed another route (controller reset, core.warm)
    cc_state: str  # the controller's state label ("startup", "probe_bw", ...)
    cc_metrics: Mapping[str, float]  # ``CongestionController.metrics()``, read-only (dict() it for JSON)


@dataclass(frozen=True, slots=True)
class SessionStats:
    """A session's figures and each of its paths' at the moment of the snapshot."""

    shards_submitted: int
    shards_acknowledged: int  # shards the peer reported done (verified or not)
    shards_received: int  # incoming shards checked and handed to the application
    bytes_submitted: int
    acked_bytes: int  # payload bytes the peer acknowledged, over the shards the session holds
    bytes_received: int  # payload bytes of the shards handed to the application
    receiving_bytes: int  # payload bytes placed so far in incoming shards not yet handed over
    data_dropped: int  # DATA the session could not accept (unknown shard, out of bounds)
    hedged_bytes: int
    repair_bytes: int  # repair symbols sent (the erasure-coded tail, core.fec)
    repaired_bytes: int  # incoming bytes rebuilt from repair instead of received
    retransmitted_after_repair_bytes: int  # incoming DATA for bytes already rebuilt: waste
    repair_blocks_rebuilt: int  # incoming blocks whose lost data repair rebuilt
    repair_blocks_short: int  # incoming blocks completed by retransmission: repair was not enough
    paths: tuple[PathStats, ...]


def path_stats(path: Path) -> PathStats:
    """Snapshot of one path's parts."""
    rtt, loss, cc, payload = path.rtt, path.loss, path.cc, path.payload
    return PathStats(
        path_id=path.path_id,
        name=path.name,
        state=path.health.state.value,
        srtt_s=rtt.smoothed_s if rtt.has_sample else None,
        min_rtt_s=rtt.min_s if rtt.has_sample else None,
        bandwidth_bps=path.bandwidth_bps,
        payload_bytes=payload.payload_bytes,
        retransmitted_bytes=payload.retransmitted_bytes,
        hedged_bytes=payload.hedged_bytes,
        repair_bytes=payload.repair_bytes,
        packets_sent=loss.packets_sent,
        bytes_sent=loss.bytes_sent,
        packets_lost=loss.packets_lost,
        spurious_losses=loss.spurious_losses,
        failures=path.health.failures,
        bytes_in_flight=loss.bytes_in_flight,
        reorder_threshold=loss.reorder_threshold,
        time_threshold=loss.time_threshold,
        cwnd_bytes=cc.cwnd_bytes,
        packet_bytes=path.mss,
        pacing_rate_bps=path.pacing_rate_bps,
        resumes=path.resumes,
        resumes_dropped=path.resumes_dropped,
        late_wakes=path.late_wakes,
        rtt_probes=path.freshness.probes,
        reroutes=path.warm.reroutes,
        cc_state=cc.state,
        cc_metrics=MappingProxyType(cc.metrics()),  # read-only, like the rest of the snapshot
    )
