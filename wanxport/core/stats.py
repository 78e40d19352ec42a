"""Frozen snapshots of a session's figures: the one way to read a session from outside the core.

Reports, the Prometheus collector, the progress display and the drivers read
these instead of the session's paths, estimators and controllers, so the
parts can change shape without every reader changing too (quinn-proto's
``ConnectionStats`` plays the same role). A snapshot is a copy: it never
changes after it is taken, and taking one is safe from another thread under
the GIL (containers the event loop may resize are copied with one C-level
call first).

Taking one is cheap because it only copies. The counters are kept in place in
typed groups where their events happen (``core.counters``), the controllers keep
their figures as fields (a state label set when the state changes; a controller's
figures open with its window, pacing rate and state, so nothing is asked of it
twice), and naming what is not read on every path waits for a reader
(``PathStats.cc_metrics``). The copy is plain attribute reads of slotted
objects: the interpreter specialises each to a slot load (a struct load under
mypyc), two to three times cheaper per figure than ``operator.attrgetter``'s generic
lookups, and the tuples are built without a call to the named tuples' ``__new__``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from wanxport.core.counters import RepairReceiveCounters, ShardCounters
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
    # ``CongestionController.metrics_figures()``: the function that names the figures and the
    # figures captured at the snapshot; read them as ``cc_metrics``.
    cc_figures: tuple[Callable[[Any], dict[str, float]], tuple[Any, ...]]

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


_new_tuple = tuple.__new__  # a named tuple from a tuple of its fields, without its Python __new__


def path_stats(path: Path) -> PathStats:
    """Snapshot of one path: its counters copied, its gauges and its controller's figures read."""
    counted, rtt, loss = path.counters, path.rtt, path.loss
    cc_figures = path.cc.metrics_figures()
    figures = cc_figures[1]  # (cwnd_bytes, pacing_rate_bps, state, ...): CongestionController.metrics_figures
    rate, cap = figures[1], path.max_rate_bps
    sampled = rtt.has_sample
    return _new_tuple(PathStats, (
        path.path_id, path.name, path.health.state,  # a StrEnum member: the state's name itself
        counted.payload_bytes, counted.retransmitted_bytes, counted.hedged_bytes, counted.repair_bytes,
        counted.packets_sent, counted.bytes_sent, counted.packets_lost, counted.spurious_losses,
        counted.failures, counted.resumes, counted.resumes_dropped, counted.late_wakes, counted.rtt_probes,
        counted.reroutes,
        rtt.smoothed_s if sampled else None, rtt.min_s if sampled else None, path.bandwidth_bps,
        loss.bytes_in_flight, loss.reorder_threshold, loss.time_threshold,
        figures[0], path.mss, rate if rate <= cap else cap, figures[2], cc_figures))


def session_stats(shards: ShardCounters, acked_bytes: int, receiving_bytes: int, hedged_bytes: int,
                  repair_bytes: int, repair: RepairReceiveCounters, paths: Sequence[Path]) -> SessionStats:
    """Snapshot of a session from its counter groups, the figures read now and its paths."""
    return _new_tuple(SessionStats, (
        shards.shards_submitted, shards.shards_acknowledged, shards.shards_received, shards.bytes_submitted,
        shards.bytes_received, shards.data_dropped,
        repair.repaired_bytes, repair.retransmitted_after_repair_bytes, repair.blocks_rebuilt,
        repair.blocks_short,
        acked_bytes, receiving_bytes, hedged_bytes, repair_bytes,
        tuple([path_stats(path) for path in paths])))
