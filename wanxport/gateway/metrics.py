"""Prometheus metrics of a gateway: a collector that reads the live sessions at scrape time.

Nothing here runs per datagram or per packet. The collector takes each
live session's ``Session.stats()`` snapshot (and the data path's drop
counters) when Prometheus asks, on the HTTP server's thread; the snapshot is
built to be safe there under the GIL (containers the event loop may resize
are copied with one C-level call first), and it is the only view of the
session's paths and controllers that code outside the core gets.

Counters must never go down, but a session's counters start at zero and
vanish when it ends. So each counter is exported as the totals of finished
sessions plus the live sessions' current values, and every live session's
values are held at their high-water mark (a shard that the core has
released but the gateway has not yet counted would otherwise dip the
received bytes for a moment). A lock orders scrapes against sessions
starting and ending, so a session is never counted twice or not at all.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wanxport.core.health import PathState

from .cpu_metrics import ThreadCpuCollector

if TYPE_CHECKING:
    from .listener import GatewayListener
    from .session import GatewaySession

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9464
Key = tuple[str, ...]  # (metric family name, *label values)

# core.stats.PathStats attribute -> counter family (``_total`` is added on exposition), help text.
PATH_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("payload_bytes", "wanxport_path_payload_sent_bytes",
     "Payload bytes sent on the path, retransmissions and hedges included."),
    ("retransmitted_bytes", "wanxport_path_retransmitted_bytes",
     "Payload bytes sent again on the path after a loss."),
    ("hedged_bytes", "wanxport_path_hedged_bytes",
     "Payload bytes sent again on the path to finish a shard's tail sooner."),
    ("packets_sent", "wanxport_path_packets_sent", "Packets sent on the path."),
    ("packets_lost", "wanxport_path_packets_lost", "Packets declared lost on the path."),
    ("spurious_losses", "wanxport_path_spurious_losses",
     "Packets declared lost on the path that were acknowledged later."),
    ("failures", "wanxport_path_failures", "Times the path was declared failed."),
    ("late_wakes", "wanxport_path_late_wakes",
     "Pacing wake-ups of the path served more than 2 ms late (the gateway's loop is short of CPU)."),
    ("rtt_probes", "wanxport_path_rtt_probes",
     "Probes sent on the path because its round-trip estimate had gone unsampled for a while."),
    ("reroutes", "wanxport_path_reroutes",
     "Times the path's first round trip after an idle gap showed another route, so its controller "
     "and RTT estimates started over."),
)
# Gateway-wide counters: family, help text.
GATEWAY_COUNTERS: tuple[tuple[str, str], ...] = (
    ("wanxport_sessions", "Sessions set up with a peer gateway."),
    ("wanxport_shards_sent", "Shards the peer acknowledged."),
    ("wanxport_shards_received", "Shards received and handed to the application."),
    ("wanxport_acked_bytes", "Payload bytes the peer acknowledged (sending side)."),
    ("wanxport_received_bytes", "Payload bytes placed in shard buffers (receiving side), once each."),
    ("wanxport_key_rotations", "Rotations of our data-plane sending key."),
)
REJECTED = "wanxport_datagrams_rejected"
GAUGE_HELP = {
    "wanxport_path_srtt_seconds": "Smoothed round-trip time of the path.",
    "wanxport_path_min_rtt_seconds": "Minimum round-trip time seen on the path.",
    "wanxport_path_cwnd_bytes": "Congestion window of the path.",
    "wanxport_path_pacing_rate_bytes_per_second": "Pacing rate of the path.",
    "wanxport_path_bandwidth_estimate_bytes_per_second": "Delivery-rate estimate of the path.",
    "wanxport_path_in_flight_bytes": "Bytes sent on the path and not yet acknowledged or lost.",
    "wanxport_path_packet_bytes": "Data bytes of the path's core packets now (grown on fast paths).",
}


def parse_metrics_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (all interfaces); port 0 picks a free one."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not port_text.isdigit() or int(port_text) > 65535 or "[" in host or "]" in host:
        raise ValueError(f"--metrics: {text!r} is not valid; use HOST:PORT with PORT 0..65535 "
                         f"(e.g. 0.0.0.0:{DEFAULT_METRICS_PORT})")
    return host or "0.0.0.0", int(port_text)


def _session_counters(session: GatewaySession) -> dict[Key, int]:
    """The counters one session contributes, read now."""
    endpoint = session.endpoint
    snapshot = session.stats()
    peer = session.peer_name
    out: dict[Key, int] = {}
    for path in snapshot.paths:
        for attr, family, _ in PATH_COUNTERS:
            out[(family, peer, path.name)] = int(getattr(path, attr))
    for name, value in dict(endpoint.datapath.counters).items():
        if name.startswith("rejected_"):
            out[(REJECTED, name.removeprefix("rejected_"))] = int(value)
    out[(REJECTED, "malformed_control")] = endpoint.intake.malformed_controls
    stats = session.totals
    out[("wanxport_shards_sent",)] = stats.shards_sent
    out[("wanxport_shards_received",)] = stats.shards_received
    out[("wanxport_acked_bytes",)] = snapshot.acked_bytes
    out[("wanxport_received_bytes",)] = stats.bytes_received + snapshot.receiving_bytes
    out[("wanxport_key_rotations",)] = session.keys.rotations
    return out


def _add_into(total: dict[Key, int], more: dict[Key, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


def _high_water(last: dict[Key, int], now: dict[Key, int]) -> dict[Key, int]:
    return {key: max(last.get(key, 0), now.get(key, 0)) for key in last.keys() | now.keys()}


class GatewayMetrics(Collector):
    """Collector for one gateway process: its live sessions, its finished ones, its listener."""

    def __init__(self, role: str, listener: GatewayListener | None = None) -> None:
        self.role = role  # "sender" or "receiver"
        self.listener = listener
        self._lock = threading.Lock()
        self._live: dict[int, tuple[GatewaySession, dict[Key, int]]] = {}
        self._finished: dict[Key, int] = {(family,): 0 for family, _ in GATEWAY_COUNTERS}
        self._refused_certificate = 0
        self._port_drops: dict[Key, int] = {}

    # -- session lifecycle (event loop thread) ---------------------------------

    def add(self, session: GatewaySession) -> None:
        with self._lock:
            self._finished[("wanxport_sessions",)] += 1
            self._live[id(session)] = (session, {})

    def finish(self, session: GatewaySession) -> None:
        """Fold the session's final counters into the totals (call after it closed)."""
        with self._lock:
            entry = self._live.pop(id(session), None)
            if entry is not None:
                _add_into(self._finished, _high_water(entry[1], _session_counters(session)))

    @contextlib.contextmanager
    def tracking(self, session: GatewaySession) -> Iterator[GatewaySession]:
        """Export ``session`` while the block runs; close the session inside the block."""
        self.add(session)
        try:
            yield session
        finally:
            self.finish(session)

    # -- scrape (HTTP server thread) -------------------------------------------

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            sessions = [session for session, _ in self._live.values()]
            counters = dict(self._finished)
            for key, (session, last) in list(self._live.items()):
                current = _high_water(last, _session_counters(session))
                self._live[key] = (session, current)
                _add_into(counters, current)
            refused = self._refused_counts()
            _add_into(counters, self._port_counts())
            gauges = list(self._gauges(sessions))
        yield from self._counter_families(counters)
        if refused is not None:
            family = CounterMetricFamily("wanxport_sessions_refused",
                                         "Sessions refused: bad certificate, busy, failed setup.",
                                         labels=["reason"])
            for reason, value in refused.items():
                family.add_metric([reason], value)
            yield family
        active = GaugeMetricFamily("wanxport_sessions_active", "Sessions in progress.")
        active.add_metric([], len(sessions))
        yield active
        yield from gauges

    def _refused_counts(self) -> dict[str, int] | None:
        listener = self.listener
        if listener is None:
            return None
        server = listener.server  # None once the listener closed: keep the last count
        if server is not None:
            self._refused_certificate = max(self._refused_certificate, server.rejected_total)
        return {"certificate": self._refused_certificate, "busy": listener.busy_refusals,
                "setup": listener.setup_failures}

    def _port_counts(self) -> dict[Key, int]:
        """What the listener's shared path ports dropped outside the sessions' data
        paths: data-plane datagrams with no session, garbage, and QUIC-looking
        datagrams aioquic dropped (``reason="quic"``). Kept once the listener closed."""
        listener = self.listener
        if listener is not None:
            now = {(REJECTED, reason): value for reason, value in listener.port_counters.items()}
            self._port_drops = _high_water(self._port_drops, now)
        return self._port_drops

    @staticmethod
    def _counter_families(counters: dict[Key, int]) -> Iterator[Metric]:
        for _, family, help_text in PATH_COUNTERS:
            metric = CounterMetricFamily(family, help_text, labels=["peer", "path"])
            for key in sorted(k for k in counters if k[0] == family):
                metric.add_metric(list(key[1:]), counters[key])
            yield metric
        for family, help_text in GATEWAY_COUNTERS:
            metric = CounterMetricFamily(family, help_text)
            metric.add_metric([], counters.get((family,), 0))
            yield metric
        metric = CounterMetricFamily(REJECTED, "Datagrams dropped: malformed, forged, replayed, "
                                               "wrong connection or key phase.", labels=["reason"])
        for key in sorted(k for k in counters if k[0] == REJECTED):
            metric.add_metric([key[1]], counters[key])
        yield metric

    def _gauges(self, sessions: list[GatewaySession]) -> Iterator[Metric]:
        families = {name: GaugeMetricFamily(name, help_text, labels=["peer", "path"])
                    for name, help_text in GAUGE_HELP.items()}
        state = GaugeMetricFamily("wanxport_path_state", "1 for the path's current state, 0 for the others.",
                                  labels=["peer", "path", "state"])
        info = GaugeMetricFamily("wanxport_session_info", "A live session with its peer gateway.",
                                 labels=["peer", "role", "cipher", "datapath"])
        phase = GaugeMetricFamily("wanxport_key_phase", "Current data-plane key phase.",
                                  labels=["peer", "direction"])
        sealed = GaugeMetricFamily("wanxport_key_sealed_packets",
                                   "Packets sealed under the current sending key.", labels=["peer"])
        age = GaugeMetricFamily("wanxport_key_age_seconds", "Age of the current sending key.",
                                labels=["peer"])
        for session in sessions:
            peer = session.peer_name
            for path in session.stats().paths:
                labels = [peer, path.name]
                if path.srtt_s is not None and path.min_rtt_s is not None:  # None before a sample
                    families["wanxport_path_srtt_seconds"].add_metric(labels, path.srtt_s)
                    families["wanxport_path_min_rtt_seconds"].add_metric(labels, path.min_rtt_s)
                families["wanxport_path_cwnd_bytes"].add_metric(labels, path.cwnd_bytes)
                families["wanxport_path_pacing_rate_bytes_per_second"].add_metric(
                    labels, path.pacing_rate_bps / 8)
                families["wanxport_path_bandwidth_estimate_bytes_per_second"].add_metric(
                    labels, path.bandwidth_bps / 8)
                families["wanxport_path_in_flight_bytes"].add_metric(labels, path.bytes_in_flight)
                families["wanxport_path_packet_bytes"].add_metric(labels, path.packet_bytes)
                for value in PathState:
                    state.add_metric([*labels, value.value], 1.0 if value.value == path.state else 0.0)
            keys = session.keys
            endpoint = session.endpoint
            info.add_metric([peer, self.role, keys.schedule.cipher, endpoint.datapath_name], 1.0)
            phase.add_metric([peer, "send"], keys.current.key_phase)
            phase.add_metric([peer, "receive"], keys.peer_phase)
            sealed.add_metric([peer], endpoint.packets_under_key)
            age.add_metric([peer], keys.clock() - keys.phase_started)
        yield from families.values()
        yield from (state, info, phase, sealed, age)


class MetricsServer:
    """The HTTP endpoint (``/metrics``) on a daemon thread, with its own registry."""

    def __init__(self, metrics: GatewayMetrics, address: tuple[str, int]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(metrics)
        for collector in (ThreadCpuCollector(), PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self._httpd, self._thread = start_http_server(address[1], address[0], registry=self.registry)
        self.host = address[0]
        self.port = int(self._httpd.server_port)  # the bound port (port 0 picks one)
        log.info("serving Prometheus metrics on %s", self.url)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
