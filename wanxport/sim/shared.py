"""Bottleneck links that several flows share: one queue, one drop-tail buffer, one rate.

Why: fairness is a property of flows *together* — two sessions, or a session
and a TCP flow, filling the same queue — and the single-run ``Network`` gives
every path its own links. Here a scenario's paths are read as bottleneck
links; each flow attaches its paths to them (a path crosses exactly one
bottleneck link each way, and several paths, of one flow or of many, may
cross the same one). Every direction of a link is one ``network.Link``, so
the semantics are exactly the single-run simulator's (DESIGN.md section 4):
serialization at the link's rate, ``queue_ms`` of drop-tail buffer shared by
everything queued, random loss and propagation per packet. The flows'
datagrams are wrapped with their destination on the way in and unwrapped on
arrival, so a link never needs to know whose packet it carries.

Every flow crossing a link sees that link's ``rtt_ms``; per-flow access delay
and events timelines are not modelled (a scenario with events is refused).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from wanxport.scenario import Scenario
from wanxport.sim.eventloop import EventLoop
from wanxport.sim.network import Link, link_rng

__all__ = ["FlowLinks", "SharedLinks"]

#: ``deliver(path_index, packet, now)``: what a side of a flow receives, as in ``Network``.
Deliver = Callable[[int, object, float], None]


class _Tagged:
    """A flow's datagram on a shared link, with where it goes on arrival."""

    __slots__ = ("deliver", "path_index", "packet")

    def __init__(self, deliver: Deliver, path_index: int, packet: object) -> None:
        self.deliver = deliver
        self.path_index = path_index
        self.packet = packet


def _arrive(packet: object, now: float) -> None:
    assert isinstance(packet, _Tagged)
    packet.deliver(packet.path_index, packet.packet, now)


class _Port:
    """One flow path's entry onto one direction of a shared link."""

    __slots__ = ("_link", "_deliver", "_path_index")

    def __init__(self, link: Link, deliver: Deliver, path_index: int) -> None:
        self._link = link
        self._deliver = deliver
        self._path_index = path_index

    def send(self, packet: object, size_bytes: int) -> None:
        self._link.send(_Tagged(self._deliver, self._path_index, packet), size_bytes)


class FlowLinks:
    """One flow's view of the shared links: per path a port each way (``sim.network.PathLinks``)."""

    __slots__ = ("forward", "reverse")

    def __init__(self, forward: tuple[_Port, ...], reverse: tuple[_Port, ...]) -> None:
        self.forward = forward
        self.reverse = reverse

    def start(self, t0: float | None = None) -> None:
        """Nothing to schedule: shared links have no events timeline."""


class SharedLinks:
    """The scenario's paths as bottleneck links, each direction one queue for every flow."""

    def __init__(self, scenario: Scenario, loop: EventLoop, seed: int | None = None) -> None:
        timed = [spec.name for spec in scenario.paths if spec.events]
        if timed:
            raise ValueError(f"shared-link runs do not model events timelines; path(s) {', '.join(timed)} "
                             f"have events")
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.forward = tuple(Link(spec.forward, link_rng(self.seed, i, "a->b"), _arrive, loop)
                             for i, spec in enumerate(scenario.paths))
        self.reverse = tuple(Link(spec.reverse, link_rng(self.seed, i, "b->a"), _arrive, loop)
                             for i, spec in enumerate(scenario.paths))
        self._index = {spec.name: i for i, spec in enumerate(scenario.paths)}

    def index(self, name: str) -> int:
        """The link called ``name``; ValueError naming the valid ones otherwise."""
        found = self._index.get(name)
        if found is None:
            raise ValueError(f"unknown link {name!r}; valid: {', '.join(self._index)}")
        return found

    def attach(self, links: Sequence[int], deliver_a: Deliver, deliver_b: Deliver,
               src: str | None = None) -> FlowLinks:
        """Ports for a flow whose path ``k`` crosses link ``links[k]``.

        What a path sends forward arrives at ``deliver_b(k, ...)``, what it sends
        back at ``deliver_a(k, ...)``. Forward is each link's "a->b" direction,
        or, with ``src`` (the flow's sending site), the direction leaving ``src``:
        between N sites one link carries flows both ways, each in its own queue.
        """
        leaving = [i if src is None or self.scenario.paths[i].direction_from(src) == "a->b" else ~i
                   for i in links]
        return FlowLinks(
            tuple(_Port(self.forward[i] if i >= 0 else self.reverse[~i], deliver_b, k)
                  for k, i in enumerate(leaving)),
            tuple(_Port(self.reverse[i] if i >= 0 else self.forward[~i], deliver_a, k)
                  for k, i in enumerate(leaving)),
        )

    def stats(self) -> list[dict[str, object]]:
        """Per link: name and both directions' counters (as ``Network.stats``)."""
        return [
            {"name": spec.name, "a->b": fwd.stats(), "b->a": rev.stats()}
            for spec, fwd, rev in zip(self.scenario.paths, self.forward, self.reverse, strict=True)
        ]
