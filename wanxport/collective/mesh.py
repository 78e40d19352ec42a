"""Setting a group up: one persistent session per pair of sites, the lower index dials.

For the pair (i, j) with i < j, site j listens on that pair's paths and site i
connects to them, so no pair ever gets two sessions and no two sites race to
dial each other. Both sites of a pair name the same paths (``HOST:PORT`` of site
j's ports); each pair has its own ports because a wanxport listener serves one
session at a time. The peer's certificate name must be the one ``peers`` gives
for its index: a site cannot join in another's place.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from wanxport.control.certs import CertificateError
from wanxport.gateway.config import Address, GatewayOptions, parse_hostport
from wanxport.gateway.handshake import initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession
from wanxport.presets import COLLECTIVE

from .errors import CollectiveError
from .group import DEFAULT_TIMEOUT_S, Group
from .link import LIVENESS_MIN_S
from .planning import KINDS
from .pool import ReceivePool
from .world import World

log = logging.getLogger(__name__)

PathSpec = str | Address
PathsArg = Sequence[PathSpec] | Mapping[int, Sequence[PathSpec]]
RETRY_S = 0.2
# One handshake attempt's bound. QUIC doubles its probe timeout with every flight lost, so a
# handshake begun while the paths were down (a blackholed or partitioned-off site asking to
# come back) would wait out the next probe, seconds after the paths heal; a fresh attempt
# every few seconds starts from the initial timeout instead.
DIAL_ATTEMPT_S = 3.0
JOIN_TIMEOUT_S = 60.0  # every site must be up and connected within this (join's default)


@dataclass(eq=False)
class Sites:
    """How to reach every configured site: names, per-peer paths, this site's credentials."""

    site: int
    names: list[str]
    paths: dict[int, list[Address]]
    identity: str | os.PathLike[str]
    ca: str | os.PathLike[str]
    options: GatewayOptions | None
    connect_s: float  # a joiner's session setup with the members (they come at their next step)
    admit_s: float  # a member's session setup with a joiner (which is waiting already)
    quorum: int = field(init=False)

    def __post_init__(self) -> None:
        self.quorum = len(self.names) // 2 + 1

    async def connect(self, peer: int, deadline: float,
                      ) -> tuple[GatewaySession, GatewayListener | None, ReceivePool]:
        """``connect_pair`` between this site and ``peer``, on their paths and our credentials."""
        return await connect_pair(self.site, peer, self.names, self.paths[peer], self.identity, self.ca,
                                  self.options, deadline)


def default_options() -> GatewayOptions:
    """The gateway options a group uses unless ``join`` is given others: the collective
    preset (``wanxport.presets.COLLECTIVE``: WAN-only sessions sharing saturated paths
    with their control channel)."""
    return GatewayOptions.from_preset(COLLECTIVE)


def certificate_refused(peer: str, exc: Exception, we_dialed: bool) -> CollectiveError:
    """A TLS refusal between this site and ``peer``, saying whose certificate was refused.

    The control layer's reason names the refused side by its TLS role ("client
    certificate ... refused" or "server certificate refused"); this site dialed as
    the client when ``we_dialed``."""
    text = str(exc)
    ours = ("client certificate" in text) == we_dialed
    if ours:
        return CollectiveError(f"this site's own certificate or CA was refused by site {peer}: {text}", peer)
    return CollectiveError(f"site {peer}'s certificate is refused by this site's CA: {text}", peer)


def pair_paths(site: int, n_sites: int, paths: PathsArg) -> dict[int, list[Address]]:
    """Each peer index -> the paths of our session with it (ValueError, one line, if missing).
    An empty list says the pair has no direct path: no session (the peer is left out)."""
    if not isinstance(paths, Mapping):
        if n_sites != 2:
            raise ValueError("paths: with more than two sites give a mapping {peer index: [HOST:PORT, ...]}")
        paths = {1 - site: paths}
    out: dict[int, list[Address]] = {}
    for peer in range(n_sites):
        if peer == site:
            continue
        given = paths.get(peer)
        if given is None:
            raise ValueError(f"paths: no paths for peer site {peer} (an empty list: no direct path)")
        if not given:
            continue
        out[peer] = [parse_hostport(p, "paths") if isinstance(p, str) else (p[0], int(p[1])) for p in given]
    if not out:
        raise ValueError("paths: this site has a session with no other site")
    extra = set(paths) - {p for p in range(n_sites) if p != site}
    if extra:
        raise ValueError(f"paths: {sorted(extra)} are not peer site indices (0..{n_sites - 1}, not {site})")
    return out


async def dial(paths: list[Address], identity: str | os.PathLike[str], ca: str | os.PathLike[str],
               options: GatewayOptions | None, deadline: float, peer: str, pool: ReceivePool,
               ) -> GatewaySession:
    """Connect, retrying while the peer is not listening yet or an attempt outlasts
    ``DIAL_ATTEMPT_S``, until ``deadline`` (monotonic). A certificate refused either way ends
    it at once, saying whose."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return await asyncio.wait_for(initiate(paths, identity, ca, options, allocator=pool.allocate),
                                          max(0.1, min(DIAL_ATTEMPT_S, deadline - time.monotonic())))
        except CertificateError as exc:
            raise certificate_refused(peer, exc, we_dialed=True) from None
        except (TimeoutError, ConnectionError, OSError) as exc:
            last = exc
            await asyncio.sleep(RETRY_S)
    raise CollectiveError(f"site {peer} never arrived: no session within the join timeout ({last})", peer)


async def accept(paths: list[Address], identity: str | os.PathLike[str], ca: str | os.PathLike[str],
                 options: GatewayOptions | None, deadline: float, peer: str, pool: ReceivePool,
                 ) -> tuple[GatewaySession, GatewayListener]:
    """Listen on the pair's paths and take the one session the peer opens; a connection
    refused for its certificate (ours by the peer, or the peer's by us) ends it at once."""
    listener = GatewayListener(paths, identity, ca, options, allocator=pool.allocate)
    await listener.start()
    accepting = asyncio.ensure_future(listener.accept())
    refused = asyncio.ensure_future(listener.rejections.get())
    try:
        done, _ = await asyncio.wait({accepting, refused}, timeout=max(0.1, deadline - time.monotonic()),
                                     return_when=asyncio.FIRST_COMPLETED)
        if accepting in done:
            return accepting.result(), listener
        if refused in done:
            raise certificate_refused(peer, refused.result(), we_dialed=False)
        raise CollectiveError(f"site {peer} never arrived: it did not connect within the join timeout", peer)
    except BaseException:
        listener.close()
        raise
    finally:
        for task in (accepting, refused):
            task.cancel()


async def connect_pair(site: int, peer: int, names: Sequence[str], paths: list[Address],
                       identity: str | os.PathLike[str], ca: str | os.PathLike[str],
                       options: GatewayOptions | None, deadline: float,
                       ) -> tuple[GatewaySession, GatewayListener | None, ReceivePool]:
    """The session of the pair (``site``, ``peer``): the lower index dials, the higher accepts;
    the peer's certificate must carry ``names[peer]``. Returns what ``World.add_link`` takes."""
    listener = None
    pool = ReceivePool()
    if site < peer:
        session = await dial(paths, identity, ca, options, deadline, names[peer], pool)
    else:
        session, listener = await accept(paths, identity, ca, options, deadline, names[peer], pool)
    if session.peer_name != names[peer]:
        await session.close("wrong site")
        if listener is not None:
            listener.close()
        raise CollectiveError(f"site {peer}: expected certificate {names[peer]!r}, "
                              f"got {session.peer_name!r}", names[peer])
    return session, listener, pool


async def join(site: int, peers: Sequence[str], *, identity: str | os.PathLike[str],
               ca: str | os.PathLike[str], paths: PathsArg, options: GatewayOptions | None = None,
               timeout: float = DEFAULT_TIMEOUT_S, join_timeout: float = JOIN_TIMEOUT_S,
               liveness_min_s: float = LIVENESS_MIN_S, schedule: str = "auto",
               deterministic: bool = False) -> Group:
    """Join the group as site ``site``: one persistent session with every other site.

    ``peers``: every site's certificate name in site-index order (this site's included).
    ``identity``/``ca``: this site's key pair directory/prefix and the group's CA (mutual TLS).
    ``paths``: the ``HOST:PORT`` paths of each pair's session, as a mapping
    {peer index: [...]}, or, with two sites, the one list; for a pair (i, j), i < j, they
    are site j's ports (j listens, i dials) and both sites pass the same list (both an
    empty list where the pair has no direct path: the all-reduce relays its share).
    ``options``: gateway options (default ``default_options()``: the collective preset).
    ``timeout``: the default per-call timeout; ``join_timeout``: for the whole setup;
    ``liveness_min_s``: the least a peer may be silent on every path before it counts
    as dead (the bound is max(this, 4 x the largest smoothed RTT): ``link``).
    ``schedule``: with three or more sites, the all-reduce's schedule: "auto" (chosen per
    call from the sessions' measured rates and delays), or "direct", "relay", "ring",
    "tree" (``planning``; the lowest-index site's setting counts). ``deterministic``: one
    schedule per array size for the group's life, from the sessions alone, so every run
    sums in the same order.
    Raises CollectiveError naming a site that did not come, or came with the wrong name.
    Returns the world's group; ``group.new_group(ranks)`` makes groups of subsets of it
    on the same sessions.
    """
    names = list(peers)
    if len(names) < 2:
        raise ValueError("peers: a world needs at least two sites (a group of one: new_group([site]))")
    if len(set(names)) != len(names):
        raise ValueError(f"peers: site names must be unique, got {names}")
    if not 0 <= site < len(names):
        raise ValueError(f"site: {site} is not an index of peers (0..{len(names) - 1})")
    if not timeout > 0 or not join_timeout > 0:
        raise ValueError("timeout and join_timeout must be > 0 seconds")
    if schedule not in KINDS:
        raise ValueError(f"schedule: unknown {schedule!r}; valid: {', '.join(map(repr, KINDS))}")
    per_peer = pair_paths(site, len(names), paths)
    options = options or default_options()
    world = World(site, names, timeout, liveness_min_s, schedule, deterministic)
    deadline = time.monotonic() + join_timeout

    async def connect_one(peer: int) -> None:
        world.add_link(peer, *await connect_pair(site, peer, names, per_peer[peer], identity, ca, options,
                                                 deadline))

    results = await asyncio.gather(*(connect_one(p) for p in per_peer), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        await world.close(drain_s=0.0)
        raise failures[0]
    group = world.new_group(range(len(names)))
    assert group is not None
    world.root_gid = group.gid
    log.info("site %s joined a group of %d sites", names[site], len(names))
    return group
