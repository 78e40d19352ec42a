"""Several flows in one virtual time over shared bottlenecks: wanxport sessions and TCP-like flows.

Why: fairness and "background yields to training" are claims about flows
competing for the same queue, which one ``SimRun`` cannot show. A
``MultiRun`` puts every flow on one event loop over ``SharedLinks``: each
wanxport flow is a full ``SimRun`` (the production core, virtual payload)
whose paths are attached to named links; each ``tcp`` flow is a
``TcpLikeFlow`` on one link. Flows start at their own times; a flow with a
``size_bytes`` completes (its completion time is reported), one without is
bulk that sends until the run ends. Between N sites a flow names the two
sites it runs between (``between``): its links are paths joining them, and
it sends in the direction leaving its first site, so flows between different
pairs share the links they have in common — one network, a node per site.

Throughput is measured where a flow's data leaves the bottleneck: payload
bytes of every DATA datagram (or TCP segment) reaching the receiver, in
windows of ``window_s`` — retransmissions count, since they use the link.
Jain's fairness index over the flows active in a window is
(Σx)² / (n Σx²): 1 when all get the same, 1/n when one takes everything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wanxport.core.cc import cc_config
from wanxport.scenario import Scenario, Transfer
from wanxport.sim.eventloop import EventLoop
from wanxport.sim.network import PathLinks
from wanxport.sim.runner import SimOptions, SimRun, _quiet_gc
from wanxport.sim.shared import Deliver, SharedLinks
from wanxport.sim.tcp_flow import TcpLikeFlow
from wanxport.sim.wire import VirtualDatagram

__all__ = ["FlowSpec", "MultiRun", "jain_index"]

KINDS = ("wanxport", "tcp")
#: A bulk flow's nominal size: more than any link here moves in a run; it never completes.
BULK_BYTES = 1 << 44
BULK_SHARDS = 64


@dataclass(frozen=True)
class FlowSpec:
    """One flow: its kind, the links its paths cross (one per path), controller and timing."""

    name: str
    links: tuple[str, ...]
    kind: str = "wanxport"
    cc: str = "bbr"
    cc_options: dict[str, Any] = field(default_factory=dict)  # cc_config options (a seed is added)
    start_s: float = 0.0
    size_bytes: int | None = None  # None: bulk, sends until the run ends
    shards: int = 16
    #: wanxport: datagrams per core packet (None: the simulator's default, 16 as the app's).
    datagrams_per_packet: int | None = None
    #: (from, to) sites; None: a two-site scenario's first site to its second.
    between: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"flow {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.links:
            raise ValueError(f"flow {self.name!r} needs at least one link")
        if self.kind == "tcp" and len(self.links) != 1:
            raise ValueError(f"flow {self.name!r}: a tcp flow crosses exactly one link, "
                             f"got {len(self.links)}")
        if not self.start_s >= 0.0:
            raise ValueError(f"flow {self.name!r}: start_s must be >= 0, got {self.start_s!r}")
        if self.size_bytes is not None and self.size_bytes <= 0:
            raise ValueError(f"flow {self.name!r}: size_bytes must be positive, got {self.size_bytes!r}")


def jain_index(rates: Sequence[float]) -> float:
    """Jain's fairness index of ``rates`` (1.0 for no or all-zero rates: nobody is treated worse)."""
    total = sum(rates)
    squares = sum(r * r for r in rates)
    if not rates or squares == 0.0:
        return 1.0
    return total * total / (len(rates) * squares)


class _Meter:
    """Payload bytes per window of ``window_s``, in total and per link crossed."""

    __slots__ = ("window_s", "bins", "by_link")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.bins: list[int] = []
        self.by_link: dict[str, list[int]] = {}

    def add(self, now: float, size: int, link: str | None = None) -> None:
        index = int(now / self.window_s)
        _count(self.bins, index, size)
        if link is not None:
            _count(self.by_link.setdefault(link, []), index, size)


def _count(bins: list[int], index: int, size: int) -> None:
    if index >= len(bins):
        bins.extend([0] * (index + 1 - len(bins)))
    bins[index] += size


class _Flow:
    """A flow on the shared links: started at its time, metered, asked whether it is done."""

    def __init__(self, spec: FlowSpec, meter: _Meter) -> None:
        self.spec = spec
        self.meter = meter

    def start(self) -> None:
        raise NotImplementedError

    def completed_at(self) -> float | None:
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        return {}


class _WanxportFlow(_Flow):
    """A wanxport session pair (``SimRun``, virtual payload) whose paths cross shared links."""

    def __init__(self, spec: FlowSpec, scenario: Scenario, links: SharedLinks, loop: EventLoop,
                 seed: int, meter: _Meter) -> None:
        super().__init__(spec, meter)
        indices = [links.index(name) for name in spec.links]
        src, dst = _ends(spec, scenario)
        paths = tuple(replace(scenario.paths[i].oriented(src), name=f"{spec.name}.{k}")
                      for k, i in enumerate(indices))
        size = spec.size_bytes or BULK_BYTES
        shards = spec.shards if spec.size_bytes else BULK_SHARDS
        transfer = Transfer(size_bytes=size, shards=shards, direction="a->b", from_site=src, to_site=dst)
        flow_scenario = replace(scenario, name=spec.name, paths=paths, transfer=transfer, sites=(src, dst))
        cc_options = {**_seeded(spec.cc, seed), **spec.cc_options}
        options = SimOptions(payload_mode="virtual", congestion_control=spec.cc, cc_options=cc_options,
                             seed=seed, datagrams_per_packet=spec.datagrams_per_packet)

        def attach(_loop: EventLoop, deliver_a: Deliver, deliver_b: Deliver) -> PathLinks:
            return links.attach(indices, deliver_a, self._metered(deliver_b), src)

        self.run = SimRun(flow_scenario, options, loop=loop, links=attach)

    def _metered(self, deliver: Deliver) -> Deliver:
        add = self.meter.add
        links = self.spec.links

        def metered(path_index: int, packet: object, now: float) -> None:
            if isinstance(packet, VirtualDatagram) and packet.frames is None:
                add(now, packet.length, links[path_index])
            deliver(path_index, packet, now)

        return metered

    def start(self) -> None:
        run = self.run
        now = run.loop.now
        for shard_id, size in enumerate(run.shard_sizes):
            run.a.driver.submit(shard_id, None, now, size=size)
        # The same calls SimRun's own start makes after submitting: both sides send.
        run._service(run.a)
        run._service(run.b)

    def completed_at(self) -> float | None:
        received = self.run.b.received
        if len(received) < len(self.run.shard_sizes):
            return None
        return max(r.at for r in received)

    def summary(self) -> dict[str, Any]:
        paths = self.run.a.session.stats().paths
        return {"retransmitted_bytes": sum(p.retransmitted_bytes for p in paths),
                "paths": [{"link": link, "srtt_s": p.srtt_s, "state": p.state}
                          for link, p in zip(self.spec.links, paths, strict=True)]}


class _TcpFlow(_Flow):
    def __init__(self, spec: FlowSpec, scenario: Scenario, links: SharedLinks, loop: EventLoop, seed: int,
                 meter: _Meter) -> None:
        super().__init__(spec, meter)
        index = links.index(spec.links[0])
        cc_options = {**_seeded(spec.cc, seed), **spec.cc_options}

        src = _ends(spec, scenario)[0]

        def attach(_loop: EventLoop, deliver_a: Deliver, deliver_b: Deliver) -> PathLinks:
            return links.attach([index], deliver_a, deliver_b, src)

        link = spec.links[0]
        self.flow = TcpLikeFlow(loop, attach, cc_config(spec.cc, cc_options), size_bytes=spec.size_bytes,
                                on_data=lambda now, size: meter.add(now, size, link))

    def start(self) -> None:
        self.flow.start()

    def completed_at(self) -> float | None:
        return self.flow.completed_at

    def summary(self) -> dict[str, Any]:
        return {"retransmitted_bytes": self.flow.retransmitted_bytes, "srtt_s": self.flow.srtt_s}


def _ends(spec: FlowSpec, scenario: Scenario) -> tuple[str, str]:
    """The flow's (from, to) sites: its ``between``, else a two-site scenario's sites in order."""
    return spec.between or (scenario.sites[0], scenario.sites[1])


def _check_sites(spec: FlowSpec, scenario: Scenario) -> None:
    """A flow between N sites names two of them, and every link it crosses joins the two."""
    if spec.between is None:
        if len(scenario.sites) > 2:
            raise ValueError(f"flow {spec.name!r}: name the two sites it runs between (between) in a "
                             f"scenario of {len(scenario.sites)} sites")
        return
    src, dst = spec.between
    for site in spec.between:
        if site not in scenario.sites:
            raise ValueError(f"flow {spec.name!r}: unknown site {site!r}; sites: {', '.join(scenario.sites)}")
    if src == dst:
        raise ValueError(f"flow {spec.name!r}: a flow needs two different sites, got {src!r} twice")
    for name in spec.links:
        path = next((p for p in scenario.paths if p.name == name), None)
        if path is not None and not path.joins(src, dst):
            raise ValueError(f"flow {spec.name!r}: link {name!r} joins {path.between[0]} and "
                             f"{path.between[1]}, not {src} and {dst}")


def _seeded(cc: str, seed: int) -> dict[str, Any]:
    """``{"seed": seed}`` for a controller with a seed option (BBR's ProbeBW phases), else nothing."""
    try:
        cc_config(cc, {"seed": seed})
    except ValueError:
        return {}
    return {"seed": seed}


class MultiRun:
    """Flows over shared links for ``duration_s`` of virtual time; ``run()`` returns the fairness report."""

    def __init__(self, scenario: Scenario, flows: Sequence[FlowSpec], duration_s: float,
                 window_s: float = 0.5, seed: int | None = None) -> None:
        if not flows:
            raise ValueError("a shared-link run needs at least one flow")
        names = [f.name for f in flows]
        if len(set(names)) != len(names):
            raise ValueError(f"flow names must be unique, got {', '.join(names)}")
        if not duration_s > 0.0 or not window_s > 0.0:
            raise ValueError("duration_s and window_s must be positive")
        self.scenario = scenario
        self.duration_s = duration_s
        self.window_s = window_s
        self.seed = scenario.seed if seed is None else seed
        self.loop = EventLoop()
        self.links = SharedLinks(scenario, self.loop, self.seed)
        self.flows: list[_Flow] = []
        for spec in flows:
            _check_sites(spec, scenario)
        for i, spec in enumerate(flows):
            meter = _Meter(window_s)
            flow_seed = self.seed * 1000 + i  # flows differ (ProbeBW phases) but runs repeat
            if spec.kind == "tcp":
                self.flows.append(_TcpFlow(spec, scenario, self.links, self.loop, flow_seed, meter))
            else:
                self.flows.append(_WanxportFlow(spec, scenario, self.links, self.loop, flow_seed, meter))

    def run(self) -> dict[str, Any]:
        with _quiet_gc():
            for flow in self.flows:
                self.loop.call_at(flow.spec.start_s, flow.start)
            self.loop.run(stop=self._all_sized_done, until=self.duration_s)
        return self._report()

    def _rates(self, bins: list[int], windows: int) -> list[float]:
        """Bits per second in each of the first ``windows`` windows."""
        padded = bins[:windows] + [0] * max(0, windows - len(bins))
        return [b * 8.0 / self.window_s for b in padded]

    def _all_sized_done(self) -> bool:
        """Stop early only when every flow has a size and all completed."""
        return all(f.spec.size_bytes is not None and f.completed_at() is not None for f in self.flows)

    def _report(self) -> dict[str, Any]:
        end = min(self.loop.now, self.duration_s)
        windows = max(1, math.ceil(end / self.window_s - 1e-9))
        flows: list[dict[str, Any]] = []
        for flow in self.flows:
            spec = flow.spec
            done = flow.completed_at()
            flows.append({
                "name": spec.name, "kind": spec.kind, "cc": spec.cc, "links": list(spec.links),
                "start_s": spec.start_s, "size_bytes": spec.size_bytes,
                "completion_s": None if done is None else done - spec.start_s,
                "delivered_bytes": sum(flow.meter.bins),
                "throughput_bps": self._rates(flow.meter.bins, windows),
                "throughput_bps_by_link": {link: self._rates(b, windows)
                                           for link, b in flow.meter.by_link.items()},
                **flow.summary(),
            })
        jain = []
        for w in range(windows):
            lo, hi = w * self.window_s, (w + 1) * self.window_s
            active = [f["throughput_bps"][w] for f, flow in zip(flows, self.flows, strict=True)
                      if flow.spec.start_s <= lo and (flow.completed_at() or math.inf) >= hi]
            jain.append(jain_index(active) if len(active) > 1 else None)
        return {
            "schema": "wanxport.fairness/1", "mode": "sim", "scenario": self.scenario.name,
            "seed": self.seed, "duration_s": end, "window_s": self.window_s, "flows": flows,
            "jain": jain, "links": self.links.stats(), "events_processed": self.loop.processed,
        }
