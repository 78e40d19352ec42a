"""Making an elastic group: the same call on a first start and on a restart.

On a first start (the group has not formed yet) every configured site joins as
for a plain group (``mesh.join``: all of them must come) and epoch 0 lists them
all. On a restart, or for a site that the others left out, the group has formed:
the site waits until the survivors' epoch leaves its old self out (their liveness
notices the old process gone) or admits it, asks to be admitted, and returns once
an epoch admits it; its first ``boundary`` receives the state.

Groups that share a membership record (``membership_prefix``: a site's local
ranks) each form on their own, and enter the epochs the record holds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from wanxport.gateway.config import GatewayOptions

from .elastic import ElasticGroup
from .group import DEFAULT_TIMEOUT_S
from .link import LIVENESS_MIN_S
from .membership import Epoch, Membership, Store
from .mesh import JOIN_TIMEOUT_S, PathsArg, Sites, default_options, join, pair_paths
from .world import World

log = logging.getLogger("wanxport.collective.elastic")

DEFAULT_PREFIX = "wanxport/elastic/"
ADMIT_TIMEOUT_S = 10.0


async def elastic_join(store: Store, site: int, peers: Sequence[str], *, identity: str | os.PathLike[str],
                       ca: str | os.PathLike[str], paths: PathsArg, options: GatewayOptions | None = None,
                       timeout: float = DEFAULT_TIMEOUT_S, join_timeout: float = JOIN_TIMEOUT_S,
                       liveness_min_s: float = LIVENESS_MIN_S, prefix: str = DEFAULT_PREFIX,
                       admit_timeout: float = ADMIT_TIMEOUT_S,
                       membership_prefix: str | None = None) -> ElasticGroup:
    """Join (or rejoin) the elastic group of the sites ``peers`` as site ``site``.

    ``store``: the job's c10d store (``torch.distributed.TCPStore`` or any with ``set``,
    ``get``, ``add``, ``check``, ``compare_set``), reachable from every site and hosted
    outside the sites' training processes; ``prefix`` keeps this group's keys apart.
    The other arguments are ``join``'s; ``join_timeout`` also bounds each later session
    setup of a site being admitted (it waits for the members' next step boundary);
    ``admit_timeout`` bounds a member's session setup with it at the boundary that admits it,
    where the session set up beforehand (``elastic_admit``) is gone by then.
    ``membership_prefix`` (default ``prefix``): where the membership record lives, when
    several groups share one (each still forms and keeps its sessions on its own). At least
    three sites: a majority of them must stay to continue.
    """
    names = list(peers)
    if len(names) < 3:
        raise ValueError(f"peers: an elastic group needs at least three sites (a majority must survive a "
                         f"loss), got {len(names)}")
    if not 0 <= site < len(names):
        raise ValueError(f"site: {site} is not an index of peers (0..{len(names) - 1})")
    per_peer = pair_paths(site, len(names), paths)
    if len(per_peer) != len(names) - 1:
        raise ValueError("paths: an elastic group needs a session between every pair of sites")
    options = options or default_options()
    membership = Membership(store, prefix if membership_prefix is None else membership_prefix, names[site],
                            own_prefix=prefix)
    sites = Sites(site, names, per_peer, identity, ca, options, join_timeout,
                  min(admit_timeout, join_timeout))
    try:
        if not await membership.formed():
            root = await join(site, names, identity=identity, ca=ca, paths=per_peer, options=options,
                              timeout=timeout, join_timeout=join_timeout, liveness_min_s=liveness_min_s)
            await membership.mark_formed()
            group = ElasticGroup(root.world, membership, sites, prefix)
            current = await membership.read()
            first = current if current is not None else await membership.propose(
                None, Epoch(0, tuple(range(len(names)))))
            await group._advance(first)
            return group
        current = await membership.read()
        assert current is not None, "a group that formed has an epoch record"
        world = World(site, names, timeout, liveness_min_s)
        group = ElasticGroup(world, membership, sites, prefix)
        group._current = False
        while site in current.members and site not in current.admitted:
            log.info("site %s: restarted while epoch %d still lists it: waiting for the survivors to notice",
                     names[site], current.number)
            current = await membership.newer_than(current.number)
        await group._advance(current)
        return group
    except BaseException:
        membership.close()
        raise
