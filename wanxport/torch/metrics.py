"""A training job's Prometheus endpoint: ``serve_metrics(base_port)`` at every rank.

Each rank serves its own ``/metrics`` on ``base_port + LOCAL_RANK`` (ranks of one host
never collide, and a scrape config lists the same ports on every host). What it exports
is ``wanxport.collective.metrics``: the cross-site groups this rank takes part in (the
default ``"wanxport"`` process group when there is one, and any given or ``watch``ed later:
process groups, a ``HookState``, or collective groups), their sessions' paths under the
gateway daemon's names, and the process. ``deploy/grafana/wanxport-job.json`` charts them.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from wanxport.collective import ElasticGroup, Group, SyncGroup
from wanxport.collective import metrics as collective_metrics

__all__ = ["JobMetrics", "collective_group", "serve_metrics", "transport_bytes"]


def collective_group(source: Any) -> Group:
    """The collective group behind ``source``: a ``"wanxport"`` process group (or a torch
    ProcessGroup with one as its CPU backend), a ``HookState``, a ``SyncGroup`` or a ``Group``."""
    if isinstance(source, Group):
        return source
    if isinstance(source, SyncGroup):
        return source.group
    inner = getattr(source, "group", None)
    if inner is not None and inner is not source:
        return collective_group(inner)
    get_backend = getattr(source, "_get_backend", None)
    if get_backend is not None:
        import torch

        backend = get_backend(torch.device("cpu"))
        if backend is not source:
            return collective_group(backend)
    raise ValueError(f"{source!r} is not a wanxport group (a 'wanxport' process group, HookState, "
                     "SyncGroup or Group)")


def elastic_group_of(source: Any) -> ElasticGroup | None:
    """The elastic group behind ``source`` (an ``ElasticGroup``, the ``elastic_group`` face, or
    a ``HookState`` holding one); None for any other group."""
    for _ in range(3):
        if isinstance(source, ElasticGroup):
            return source
        source = getattr(source, "group", None)
    return None


class JobMetrics:
    """This rank's metrics endpoint; ``watch`` adds a group, ``close`` stops serving."""

    def __init__(self, endpoint: collective_metrics.MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self.port = endpoint.port
        self.url = endpoint.url

    def watch(self, group: Any) -> None:
        elastic = elastic_group_of(group)
        self.endpoint.watch(collective_group(group) if elastic is None else elastic)

    def close(self) -> None:
        self.endpoint.close()


def serve_metrics(base_port: int, *groups: Any, host: str = "0.0.0.0") -> JobMetrics:
    """Serve this rank's metrics on ``host:base_port + LOCAL_RANK`` (``LOCAL_RANK`` from the
    environment, 0 without it; ``base_port`` 0 picks a free port). Exports ``groups`` and,
    when torch.distributed's default group is a ``"wanxport"`` one, that group."""
    text = os.environ.get("LOCAL_RANK") or "0"
    if not text.isdigit():
        raise ValueError(f"serve_metrics: LOCAL_RANK={text!r} is not a non-negative integer")
    local_rank = int(text)
    port = 0 if base_port == 0 else base_port + local_rank
    if not 0 <= port <= 65535:
        raise ValueError(f"serve_metrics: port {port} (base {base_port} + LOCAL_RANK {local_rank}) "
                         "is not 0..65535")
    job = JobMetrics(collective_metrics.MetricsEndpoint(port, host))
    if dist.is_initialized() and dist.get_backend() == "wanxport":
        job.watch(dist.group.WORLD)
    for group in groups:
        job.watch(group)
    return job


def transport_bytes(source: Any = None) -> int:
    """Shard bytes this rank's sessions with the other sites sent plus received so far, by the
    sessions' own counters (``source``: as ``collective_group``; the default process group)."""
    group = collective_group(dist.group.WORLD if source is None else source)
    return collective_metrics.transport_bytes(group)
