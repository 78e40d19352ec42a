"""How the sites of a ``"wanxport"`` process group find each other: through the c10d store.

Each site publishes its certificate name (read from its identity) and its path
addresses under ``wanxport/site/<rank>``, waits for every other site's, then joins
the ``wanxport.collective`` group. For a pair of sites (i, j), i < j, site j listens
and site i dials on site j's addresses with the port raised by i (``PORT + i``): each
pair gets its own ports, so with n sites a site uses ports PORT .. PORT+n-2 of each
path. The store is only used once, at setup; collectives never touch it.

Ports. Several ranks of one site share the site's config (one file, torchrun's
``LOCAL_RANK`` tells them apart), and one process may join several wanxport groups
(a DeviceMesh dimension, a ``new_group``, the hook's group). So each process owns a
block of ``ports_per_rank`` ports per path, starting at ``PORT + LOCAL_RANK *
ports_per_rank``, and each group it joins takes the next ``size - 1`` ports of that
block (``PortBlock``). What a rank publishes is where it listens, so members never
need to agree on how many groups the others joined before.

Setup is bounded by ``JOIN_TIMEOUT_S`` (or the process group's timeout when shorter),
not torch's 30-minute default: a site that never publishes itself is named (its rank)
at every site that waited for it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from cryptography import x509

from wanxport.collective import JOIN_TIMEOUT_S, CollectiveError, SyncGroup, join_sync
from wanxport.control.certs import certificate_name, load_identity
from wanxport.torch.config import ConfigError, SiteConfig

__all__ = ["PORTS_PER_RANK", "PortBlock", "cross_site_group", "join_through_store", "listen_paths",
           "local_rank"]

KEY = "wanxport/site/{}"
PORTS_PER_RANK = 32


def local_rank() -> int:
    """This process's rank within its site: torchrun's ``LOCAL_RANK`` (0 when unset)."""
    value = os.environ.get("LOCAL_RANK", "0")
    if not value.isdigit():
        raise ConfigError(f"LOCAL_RANK={value!r} is not a non-negative integer")
    return int(value)


class PortBlock:
    """The ports this process listens on: ``ports_per_rank`` per path from ``PORT + local_rank
    * ports_per_rank``; each group joined takes the lowest ``size - 1`` free ones of them
    and gives them back when it shuts down (``release``), so groups rebuilt in a long
    job reuse ports instead of running out."""

    def __init__(self) -> None:
        self.taken: dict[tuple[int, int], set[int]] = {}  # (local rank, ports per rank) -> offsets
        self.lock = threading.Lock()

    def take(self, config: SiteConfig, rank_here: int, per_rank: int,
             count: int) -> tuple[list[str], Callable[[], None]]:
        """This process's base paths for a group of ``count + 1`` members (``count`` pair ports),
        and the call that gives them back."""
        key = (rank_here, per_rank)
        with self.lock:
            taken = self.taken.setdefault(key, set())
            start = next((s for s in range(per_rank - count + 1)
                          if not taken.intersection(range(s, s + count))), None)
            if start is None:
                raise ConfigError(f"local rank {rank_here}: its block of {per_rank} ports per path is used "
                                  f"up ({len(taken)} taken, {count} more wanted); pass "
                                  f"WanxportOptions(ports_per_rank=...)")
            mine = set(range(start, start + count))
            taken |= mine

        def release() -> None:
            with self.lock:
                taken.difference_update(mine)

        return listen_paths(config.paths, rank_here * per_rank + start), release


PORTS = PortBlock()


def _identity_name(config: SiteConfig) -> str:
    cert, _ = load_identity(config.identity)
    return certificate_name(x509.load_pem_x509_certificate(cert.read_bytes()))


def listen_paths(paths: tuple[str, ...] | list[str], lower_peer: int) -> list[str]:
    """Site j's addresses for its session with site ``lower_peer`` (< j): each port + lower_peer."""
    out = []
    for spec in paths:
        host, _, port = spec.rpartition(":")
        out.append(f"{host}:{int(port) + lower_peer}")
    return out


def _pair_paths(rank: int, published: list[dict[str, Any]]) -> dict[int, list[str]]:
    pairs: dict[int, list[str]] = {}
    for peer in range(len(published)):
        if peer != rank:
            low, high = min(rank, peer), max(rank, peer)
            pairs[peer] = listen_paths(published[high]["paths"], low)
    for site, info in enumerate(published):
        used = [p for low in range(site) for p in listen_paths(info["paths"], low)]
        if len(set(used)) != len(used):
            raise ConfigError(f"paths of site {site} ({info['name']}): with {len(published)} sites each path "
                              f"uses ports PORT..PORT+{len(published) - 2}; they overlap, space them further")
    return pairs


def join_through_store(store: Any, rank: int, size: int, config: SiteConfig, timeout: float,
                       paths: list[str] | None = None) -> SyncGroup:
    """Publish this site, read every other's, join the group (``timeout``: each call's; the
    setup's is the shorter of it and ``JOIN_TIMEOUT_S``). ``paths``: where this member
    listens (default: the config's, as with one rank per site)."""
    if size < 2:
        raise ValueError("the wanxport process group needs at least two sites (world_size >= 2)")
    join_timeout = min(timeout, JOIN_TIMEOUT_S)
    names, pairs = meet_through_store(store, rank, size, config, join_timeout, paths)
    return join_sync(rank, names, identity=config.identity, ca=config.ca,
                     paths=pairs if size > 2 else pairs[1 - rank], timeout=timeout,
                     join_timeout=join_timeout)


def meet_through_store(store: Any, rank: int, size: int, config: SiteConfig, join_timeout: float,
                       paths: list[str] | None = None) -> tuple[list[str], dict[int, list[str]]]:
    """Publish this site, wait (up to ``join_timeout``) for every other's: every site's
    certificate name and the paths of this site's session with each."""
    name = _identity_name(config)
    mine = list(config.paths) if paths is None else paths
    store.set(KEY.format(rank), json.dumps({"name": name, "paths": mine}))
    keys = [KEY.format(r) for r in range(size)]
    try:
        store.wait(keys, timedelta(seconds=join_timeout))
    except Exception as exc:  # noqa: BLE001 - the store's timeout error names no one; this does
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise CollectiveError(f"site rank(s) {missing} never arrived: not in the store within "
                              f"{join_timeout:g} s ({type(exc).__name__})") from None
    published = [json.loads(store.get(k)) for k in keys]
    names = [info["name"] for info in published]
    if len(set(names)) != len(names):
        twins = sorted(r for r, n in enumerate(names) if names.count(n) > 1)
        raise ConfigError(f"group ranks {twins} share one identity ({names[twins[0]]}): a wanxport group's "
                          f"members must be different sites (the cross-site dimension of the mesh)")
    return names, _pair_paths(rank, published)


def cross_site_group(store: Any, site: int, n_sites: int, *, config: SiteConfig | None = None,
                     rank_in_site: int | None = None, ports_per_rank: int = PORTS_PER_RANK,
                     timeout: float = 60.0) -> SyncGroup:
    """The DDP hook's cross-site group for a job whose sites are separate torch worlds (a
    torchrun per site): rank ``rank_in_site`` (default ``LOCAL_RANK``) of every site, meeting
    through ``store`` (one the sites share, e.g. a TCPStore on the control network) under
    its own prefix, each listening on its port block of ``config`` (default
    ``WANXPORT_TORCH_CONFIG``)."""
    from torch.distributed import PrefixStore

    config = config or SiteConfig.from_env()
    here = local_rank() if rank_in_site is None else rank_in_site
    paths, release = PORTS.take(config, here, ports_per_rank, n_sites - 1)
    try:
        return join_through_store(PrefixStore(f"wanxport/hook/{here}/", store), site, n_sites, config,
                                  timeout=timeout, paths=paths)
    except BaseException:
        release()
        raise
