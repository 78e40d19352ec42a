"""What the daemon adds to the gateway's Prometheus metrics.

``gateway.metrics.GatewayMetrics`` exports sessions and paths (shared with
``send``/``recv``); this collector adds what only a long-lived gateway has: its
transfers by state (a gauge of those in memory) and the transfers that ended, by final
state (a counter since start: ``outcomes.py``), whether it drains, and when its certificates expire
(``wanxport_certificate_expiry_timestamp_seconds``: an operator alerts on
``- time() < 14 days``, see ``deploy/alerts.yml``). The certificates are re-read
at most once a minute, so a renewed file shows up without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from cryptography import x509
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from wanxport import __version__
from wanxport.control import PROTOCOL_VERSION

from .config import DaemonConfig
from .outcomes import CountingStore
from .store import FINAL, STATES

CERT_REREAD_S = 60.0


def certificate_expiry(path: Path) -> float | None:
    """The notAfter of the first certificate in ``path`` (Unix seconds), None if unreadable."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc.timestamp()


class MetricsSource(Protocol):
    """What the collector reads of the daemon."""

    @property
    def config(self) -> DaemonConfig: ...

    @property
    def store(self) -> CountingStore | None: ...

    @property
    def draining(self) -> bool: ...

    @property
    def received_skipped(self) -> Mapping[str, int]: ...


class DaemonCollector(Collector):
    def __init__(self, daemon: MetricsSource) -> None:
        self.daemon = daemon
        self._certs: dict[str, float | None] = {}
        self._read_at = -CERT_REREAD_S

    def _expiries(self) -> dict[str, float | None]:
        now = time.monotonic()
        if now - self._read_at >= CERT_REREAD_S:
            config = self.daemon.config
            identity = config.identity.with_name(config.identity.name + ".pem")
            self._certs = {"identity": certificate_expiry(identity), "ca": certificate_expiry(config.ca)}
            self._read_at = now
        return self._certs

    def collect(self) -> Iterable[Metric]:
        daemon = self.daemon
        info = InfoMetricFamily("wanxport_gateway", "The gateway daemon: site, version, wire protocol.")
        info.add_metric([], {"site": daemon.config.site, "version": __version__,
                             "protocol_version": str(PROTOCOL_VERSION)})
        yield info
        transfers = GaugeMetricFamily("wanxport_transfers", "Transfers the daemon knows, by state.",
                                      labels=["state"])
        counts = dict.fromkeys(STATES, 0)
        if daemon.store is not None:
            for transfer in list(daemon.store.transfers.values()):
                counts[transfer.state] += 1
        for state, value in counts.items():
            transfers.add_metric([state], value)
        yield transfers
        ended = CounterMetricFamily("wanxport_transfers_finished",
                                    "Transfers that ended (done, failed, cancelled) since the daemon "
                                    "started; alert on increase() of it, not on the gauge.",
                                    labels=["state"])
        for state in FINAL:
            ended.add_metric([state], daemon.store.ended[state] if daemon.store is not None else 0)
        yield ended
        draining = GaugeMetricFamily("wanxport_draining", "1 while the daemon drains (SIGTERM).")
        draining.add_metric([], 1 if daemon.draining else 0)
        yield draining
        expiry = GaugeMetricFamily("wanxport_certificate_expiry_timestamp_seconds",
                                   "When a certificate the gateway uses expires (Unix time).",
                                   labels=["certificate"])
        for name, expires in self._expiries().items():
            if expires is not None:
                expiry.add_metric([name], expires)
        yield expiry
        skipped = CounterMetricFamily("wanxport_received_entries_skipped",
                                      "Received entries not recreated, by reason (symlink-outside: a "
                                      "symlink whose target leaves its transfer).", labels=["reason"])
        for reason, count in sorted(daemon.received_skipped.items()):
            skipped.add_metric([reason], count)
        yield skipped
