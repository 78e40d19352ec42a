"""Shared helpers of the collective tests: a PKI for n sites and n groups joined over loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway_helpers import free_path_ports

from wanxport.collective import Group, join
from wanxport.control.certs import make_test_pki


def site_names(n: int) -> list[str]:
    return [f"site-{k}" for k in range(n)]


def make_pki(directory: Path, n: int = 3) -> Path:
    make_test_pki(directory, site_names(n))
    return directory


def mesh_paths(n: int, paths_per_pair: int = 2) -> dict[tuple[int, int], list[str]]:
    """Loopback paths of every pair (i, j), i < j: consecutive free ports, drawn in one go
    (pairs drawn one by one could be handed overlapping ranges)."""
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    ports = iter(free_path_ports(len(pairs) * paths_per_pair))
    return {pair: [f"127.0.0.1:{next(ports)}" for _ in range(paths_per_pair)] for pair in pairs}


def paths_of(site: int, n: int, pairs: dict[tuple[int, int], list[str]]) -> dict[int, list[str]]:
    return {peer: pairs[(min(site, peer), max(site, peer))] for peer in range(n) if peer != site}


async def join_all(pki: Path, n: int, timeout: float = 30.0, paths_per_pair: int = 2) -> list[Group]:
    """n groups in this process, one per site, joined concurrently."""
    names = site_names(n)
    pairs = mesh_paths(n, paths_per_pair)
    return list(await asyncio.gather(*(
        join(k, names, identity=pki / names[k], ca=pki / "ca.pem", paths=paths_of(k, n, pairs),
             timeout=timeout, join_timeout=30.0)
        for k in range(n))))


async def close_all(groups: list[Group]) -> None:
    await asyncio.gather(*(g.close() for g in groups))
