"""How torch finds the ``"wanxport"`` backend: its registration and creator, and its byte count.

``register`` (run by ``import wanxport.torch``) tells torch.distributed that
``"wanxport"`` groups are made by ``_create`` for CPU and CUDA tensors, with torch's
extended API (the creator gets the group's store, rank, size, timeout and
``pg_options``). The creator takes this member's ports (``rendezvous.PORTS``), meets
the others through the group's store and joins the collective group; a failed join
gives the ports back.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from wanxport.torch import _bridge
from wanxport.torch.backend import BACKEND, WanxportProcessGroup
from wanxport.torch.config import ConfigError, SiteConfig
from wanxport.torch.rendezvous import PORTS, join_through_store, local_rank
from wanxport.torch.work import WanxportOptions

__all__ = ["cross_site_bytes", "register"]


def cross_site_bytes(pg: dist.ProcessGroup | None = None) -> int:
    """Collective bytes this member's wanxport group sent plus received so far (``pg``: default group)."""
    group = dist.group.WORLD if pg is None else pg
    if not isinstance(group, WanxportProcessGroup):
        raise ValueError(f"cross_site_bytes: {group!r} is not a 'wanxport' process group")
    return _bridge.cross_site_bytes(group.group)


def _options(backend_options: Any) -> WanxportOptions:
    if backend_options is None:
        return WanxportOptions()
    if isinstance(backend_options, SiteConfig):
        return WanxportOptions(backend_options)
    if isinstance(backend_options, WanxportOptions):
        return backend_options
    raise ConfigError(f"pg_options for the wanxport backend must be a SiteConfig or WanxportOptions, "
                      f"got {backend_options!r}")


def _create(options: Any, backend_options: Any) -> WanxportProcessGroup:
    """torch's extended-API creator: this member's ports, the store rendezvous, the join."""
    wanted = _options(backend_options)
    config = wanted.config or SiteConfig.from_env()
    timeout = options.timeout.total_seconds() if isinstance(options.timeout, timedelta) else 1800.0
    size = options.group_size
    if size < 2:
        raise ValueError("a wanxport group needs at least two members (sites)")
    here = local_rank() if wanted.local_rank is None else wanted.local_rank
    paths, release = PORTS.take(config, here, wanted.ports_per_rank, size - 1)
    try:
        group = join_through_store(options.store, options.group_rank, size, config, timeout=timeout,
                                   paths=paths)
    except BaseException:
        release()
        raise
    return WanxportProcessGroup(group, options.group_rank, size, timeout, release)


def register() -> None:
    """Register the ``"wanxport"`` backend with torch.distributed (idempotent; done on import)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
