"""Prometheus metrics of a training job's collective groups, read at scrape time.

A job that trains across sites for weeks needs the same view of its links an operator
has of a gateway, plus what only the job knows: which collectives ran, with which
schedule, how long and how many bytes; who is a live member; how far the collective in
flight has come; and, when it stalls, which site, rank and path it waits on. So the
paths are exported by the gateway's own collector (``gateway.metrics.GatewayMetrics``:
the daemon's names and ``peer``/``path`` labels, one entry per session however many
groups share it), and this collector adds the ``wanxport_collective_*`` families. Nothing
here runs per call: the group's own records (``Group.stats``, ``Group.in_flight``, its
state and gone members) are read when Prometheus asks, on the HTTP server's thread.

Counters fold each finished call in once: a scrape takes the calls recorded since the
last one it saw (by identity in the group's bounded record, so more than ``STATS_KEPT``
calls between two scrapes undercount, never double count).

The fraction done of a collective in flight is its received bytes (whole messages, plus
the bytes already placed in messages still arriving, counted toward the oldest call)
over the bytes the group's schedule receives for it: one message from every member for a
two-site exchange, a part from every member in each of the two phases among more sites.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from wanxport.gateway.metrics import GatewayMetrics, MetricsServer

from . import codec
from .elastic import ElasticGroup
from .group import CallStats, Group, part_bounds
from .inflight import InFlight
from .message import HEADER_BYTES, Call
from .state import ElasticState, GroupState

BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CallKey = tuple[str, str, str]  # (op, schedule, compress)

CALL_LABELS = ["op", "schedule", "compress"]
# name (after ``wanxport_collective_``; counters get ``_total`` on exposition) -> kind, help, labels
# besides ``group`` ("world" for the job's whole group, else its id in hex).
_G, _C, _H = GaugeMetricFamily, CounterMetricFamily, HistogramMetricFamily
FAMILIES: dict[str, tuple[type[Metric], str, list[str]]] = {
    "info": (_G, "A collective group this process is a member of: this site's name and rank.",
             ["site", "rank", "sites"]),
    "state": (_G, "1 for the group's current state, 0 for the others.", ["state"]),
    "members": (_G, "Members of the group, live or gone.", ["state"]),
    "member_up": (_G, "1 while a member is live, 0 once it is gone.", ["site", "rank"]),
    "membership_changes": (_C, "Changes of the group's membership since it formed.", []),
    "epoch": (_G, "An elastic group's current membership epoch (its group label: elastic).", []),
    "elastic_state": (_G, "1 for an elastic group's current state, 0 for the others.", ["state"]),
    "store_failures": (_C, "An elastic group's operations on the job's store that failed (each retried).",
                       []),
    "waiting_for_store": (_G, "1 while an elastic group waits for the job's store to answer.", []),
    "calls": (_C, "Collectives finished, by outcome.", [*CALL_LABELS, "outcome"]),
    "sent_bytes": (_C, "Collective bytes sent to the other members (headers included).", CALL_LABELS),
    "received_bytes": (_C, "Collective bytes received from the other members (headers included).",
                       CALL_LABELS),
    "duration_seconds": (_H, "Time of a collective from its call to its result.", CALL_LABELS),
    "in_flight": (_G, "Collectives running now.", []),
    "in_flight_progress_ratio": (_G, "Fraction of its bytes the oldest collective in flight has received.",
                                 CALL_LABELS),
    "in_flight_bytes": (_G, "Bytes the oldest collective in flight receives in all.", CALL_LABELS),
    "in_flight_seconds": (_G, "Time since the oldest collective in flight was called.", CALL_LABELS),
    "waiting_seconds": (_G, "How long a collective in flight has waited on a member: its site, its rank "
                            "and the path it was last heard on.", ["site", "rank", "path"]),
    "error_info": (_G, "1 while the group is unusable: the site, rank and path its error names.",
                   ["state", "site", "rank", "path"]),
}


@dataclass
class _Totals:
    calls: dict[tuple[str, str, str, str], int] = field(default_factory=dict)  # + outcome
    sent: dict[CallKey, int] = field(default_factory=dict)
    received: dict[CallKey, int] = field(default_factory=dict)
    buckets: dict[CallKey, list[int]] = field(default_factory=dict)  # per BUCKETS_S, then +Inf
    seconds: dict[CallKey, float] = field(default_factory=dict)


@dataclass
class _Watched:
    group: Group
    label: str
    totals: _Totals = field(default_factory=_Totals)
    last: CallStats | None = None
    gone_seen: set[int] = field(default_factory=set)


def schedule_of(record: CallStats | Call) -> str:
    """The schedule a call runs with, as the group reports it (``direct`` where it reports none:
    a two-site exchange, or reduce-scatter and all-gather over every pair among more)."""
    return str(getattr(record, "schedule", None) or "direct")


def expected_received(call: Call, site: int, size: int) -> int:
    """Bytes this site receives for ``call`` under the direct schedules (headers included)."""
    peers = size - 1
    whole = _body(call, call.count)
    if call.op == "all_reduce" and size == 2:
        return peers * (HEADER_BYTES + whole)
    if call.op in ("all_reduce", "reduce_scatter"):
        bounds = part_bounds(call.count, size)
        mine = _body(call, bounds[site][1] - bounds[site][0])
        scatter = peers * (HEADER_BYTES + mine)
        if call.op == "reduce_scatter":
            return scatter
        others = [HEADER_BYTES + _body(call, b - a) for k, (a, b) in enumerate(bounds) if k != site]
        return scatter + sum(others)
    if call.op == "all_gather":
        return peers * (HEADER_BYTES + call.count * _itemsize(call))
    if call.op == "broadcast":
        if call.root == site:
            return peers * HEADER_BYTES
        return HEADER_BYTES + whole + (peers - 1) * HEADER_BYTES
    return peers * HEADER_BYTES


def _itemsize(call: Call) -> int:
    return int(np.dtype(call.dtype).itemsize)


def _body(call: Call, elements: int) -> int:
    if call.compress is None or call.op in ("all_gather", "broadcast"):
        return elements * _itemsize(call)
    return codec.encoded_bytes(call.compress, elements)


class CollectiveMetrics(Collector):
    """Collector for the collective groups this process ``watch``es (and their sessions' paths)."""

    def __init__(self, paths: GatewayMetrics | None = None) -> None:
        self.paths = paths if paths is not None else GatewayMetrics("collective")
        self._lock = threading.Lock()
        self._watched: list[_Watched] = []
        self._elastic: list[ElasticGroup] = []
        self._sessions: dict[int, object] = {}  # id -> session handed to ``paths`` (once each)

    def watch(self, group: Group | ElasticGroup) -> None:
        """Export ``group`` (idempotent); its sessions' paths are exported once however many
        groups share them. An elastic group: its epoch and changes (group "elastic"), and each
        epoch's group as it opens."""
        if isinstance(group, ElasticGroup):
            with self._lock:
                if group in self._elastic:
                    return
                self._elastic.append(group)
            group.on_epoch.append(self.watch)
            if group.group is not None:
                self.watch(group.group)
            return
        with self._lock:
            if any(w.group is group for w in self._watched):
                return
            label = "world" if group.gid == group.world.root_gid else f"{group.gid:08x}"
            self._watched.append(_Watched(group, label))
            for link in group.links.values():
                if id(link.session) not in self._sessions:
                    self._sessions[id(link.session)] = link.session
                    self.paths.add(link.session)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            watched = list(self._watched)
            for w in watched:
                self._fold(w)
            for w in watched:
                if w.group.state is GroupState.CLOSED:
                    for link in w.group.links.values():
                        if self._sessions.pop(id(link.session), None) is not None:
                            self.paths.finish(link.session)
            families = list(self._families(watched))
        yield from self.paths.collect()
        yield from families

    # -- reading the groups (under the lock) -------------------------------------

    def _fold(self, w: _Watched) -> None:
        """Add the calls finished since the last scrape into the totals."""
        stats = w.group.stats()
        start = 0
        if w.last is not None:
            for i in range(len(stats) - 1, -1, -1):
                if stats[i] is w.last:
                    start = i + 1
                    break
        for s in stats[start:]:
            key = (s.op, schedule_of(s), s.compress or "none")
            t = w.totals
            outcome = (*key, "ok" if s.ok else "failed")
            t.calls[outcome] = t.calls.get(outcome, 0) + 1
            t.sent[key] = t.sent.get(key, 0) + s.sent_bytes
            t.received[key] = t.received.get(key, 0) + s.received_bytes
            t.seconds[key] = t.seconds.get(key, 0.0) + s.elapsed_s
            counts = t.buckets.setdefault(key, [0] * (len(BUCKETS_S) + 1))
            for i, bound in enumerate(BUCKETS_S):
                if s.elapsed_s <= bound:
                    counts[i] += 1
            counts[-1] += 1
        if stats:
            w.last = stats[-1]
        w.gone_seen |= set(dict(w.group.gone))

    def _families(self, watched: list[_Watched]) -> Iterator[Metric]:
        f = {name: kind(f"wanxport_collective_{name}", text, labels=["group", *labels])
             for name, (kind, text, labels) in FAMILIES.items()}
        now = time.monotonic()
        for elastic in self._elastic:
            f["epoch"].add_metric(["elastic"], elastic.epoch.number)
            f["membership_changes"].add_metric(["elastic"], elastic.changes)
            for value in ElasticState:
                f["elastic_state"].add_metric(["elastic", value.value], float(elastic.state is value))
            store = elastic.membership
            f["store_failures"].add_metric(["elastic"], store.store_failures)
            f["waiting_for_store"].add_metric(["elastic"], float(store.waiting_for_store))
        for w in watched:
            g, label = w.group, w.label
            f["info"].add_metric([label, g.name, str(g.site), str(g.size)], 1.0)
            for value in GroupState:
                f["state"].add_metric([label, value.value], 1.0 if g.state is value else 0.0)
            gone = dict(g.gone)
            f["members"].add_metric([label, "live"], g.size - len(gone))
            f["members"].add_metric([label, "gone"], len(gone))
            for rank, name in enumerate(g.names):
                f["member_up"].add_metric([label, name, str(rank)], 0.0 if rank in gone else 1.0)
            f["membership_changes"].add_metric([label], len(w.gone_seen))
            t = w.totals
            for outcome, value in sorted(t.calls.items()):
                f["calls"].add_metric([label, *outcome], value)
            for key in sorted(t.sent):
                f["sent_bytes"].add_metric([label, *key], t.sent[key])
                f["received_bytes"].add_metric([label, *key], t.received[key])
                buckets = list(zip([*map(str, BUCKETS_S), "+Inf"], t.buckets[key], strict=True))
                f["duration_seconds"].add_metric([label, *key], buckets, t.seconds[key])
            flights = g.in_flight()
            f["in_flight"].add_metric([label], len(flights))
            if flights:
                self._oldest(w, flights[0], now, f)
            self._waiting(w, flights, now, f["waiting_seconds"])
            if g.state is not GroupState.OPEN and g.error is not None:
                e = g.error
                rank = "" if e.rank is None else str(e.rank)
                f["error_info"].add_metric([label, g.state.value, e.site or "", rank, e.path or ""], 1.0)
        yield from f.values()

    @staticmethod
    def _oldest(w: _Watched, flight: InFlight, now: float, f: dict[str, Metric]) -> None:
        g, call = w.group, flight.call
        labels = [w.label, call.op, schedule_of(call), call.compress or "none"]
        total = expected_received(call, g.site, g.size)
        partial = sum(g.links[p].receiving_bytes() for p in flight.waiting_for if p in g.links)
        done = min(total, flight.received_bytes + partial)
        f["in_flight_progress_ratio"].add_metric(labels, done / total if total else 1.0)  # type: ignore[attr-defined]
        f["in_flight_bytes"].add_metric(labels, total)  # type: ignore[attr-defined]
        f["in_flight_seconds"].add_metric(labels, now - flight.started_s)  # type: ignore[attr-defined]

    @staticmethod
    def _waiting(w: _Watched, flights: list[InFlight], now: float, waiting: Metric) -> None:
        since: dict[int, float] = {}
        for flight in flights:
            for peer in flight.waiting_for:
                since[peer] = min(since.get(peer, flight.started_s), flight.started_s)
        for peer, started in sorted(since.items()):
            link = w.group.links.get(peer)
            path = link.last_heard()[0] if link is not None else ""
            waiting.add_metric([w.label, w.group.names[peer], str(peer), path], now - started)  # type: ignore[attr-defined]


class MetricsEndpoint:
    """``/metrics`` over HTTP on a daemon thread: the watched groups, their paths, the process."""

    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        self.metrics = CollectiveMetrics()
        self._server = MetricsServer(self.metrics, (host, port))  # type: ignore[arg-type]
        self.port = self._server.port
        self.url = self._server.url

    def watch(self, group: Group | ElasticGroup) -> None:
        self.metrics.watch(group)

    def close(self) -> None:
        self._server.close()


def serve(port: int, *groups: Group, host: str = "0.0.0.0") -> MetricsEndpoint:
    """Serve the Prometheus metrics of ``groups`` (and any ``watch``ed later) on ``host:port``
    (port 0 picks a free one: ``endpoint.port``)."""
    endpoint = MetricsEndpoint(port, host)
    for group in groups:
        endpoint.watch(group)
    return endpoint


def transport_bytes(group: Group) -> int:
    """Shard bytes the group's sessions sent plus received so far, by the sessions' own counters
    (every group on the same sessions, and heartbeats, included)."""
    return sum(link.transport_bytes() for link in group.links.values())
