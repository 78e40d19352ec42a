"""The gateway process's CPU by thread role, as a Prometheus counter.

``process_cpu_seconds_total`` says how busy a gateway is, not why: an
interpreter short of CPU, a pacer sealing at line rate and a disk-bound digest
all read the same. ``wanxport_cpu_seconds_total{role}`` splits the same clock
by the roles of ``aio.threadcpu`` (loop, release, receive, digest, other), so
``rate()`` of it over the bytes moved is the CPU per byte of each part of the
data path while the gateway serves real transfers. Read at scrape time on the
HTTP server's thread: one clock read per thread, nothing per packet.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from wanxport.aio.threadcpu import RunningRoles

CPU_FAMILY = "wanxport_cpu_seconds"


class ThreadCpuCollector(Collector):
    """``wanxport_cpu_seconds_total{role}``: this process's CPU since the collector was made."""

    def __init__(self) -> None:
        self._roles = RunningRoles()

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            CPU_FAMILY, "CPU seconds of the gateway process by thread role: loop (the event loop: the "
            "core's decisions, the control channel), release (sealing and pacing datagrams out), "
            "receive (receive threads), digest (hashing shards), other (the rest).", labels=["role"])
        for role, seconds in self._roles.read().items():
            family.add_metric([role], seconds)
        yield family
