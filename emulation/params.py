"""Scenario link parameters -> what the impairment backends consume.

Pure functions, shared by the namespace emulation, the engine daemon and the
Mininet topology (which runs under the system python3, so stdlib only here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from wanxport.scenario import BurstLoss, LinkParams, PathSpec

DIRECTIONS = ("a->b", "b->a")


def engine_params(lp: LinkParams) -> dict[str, Any]:
    """Keyword arguments of ``_engine.Engine.add_direction``/``set_params``.

    Rate counts IP bytes (the engine is told the L2 header length), so
    ``bandwidth_mbps`` means the same as netem's rate with a -14 byte overhead.
    """
    rate_bps = lp.bandwidth_mbps * 1e6
    out: dict[str, Any] = {
        "rate_bps": rate_bps,
        "delay_s": lp.rtt_ms / 2000.0,
        "jitter_s": lp.jitter_ms / 1000.0,
        "reorder": lp.reorder,
        "queue_bytes": rate_bps / 8.0 * lp.queue_ms / 1000.0,
        "loss": lp.loss,
        "down": lp.down,
    }
    if lp.burst_loss is not None:
        bl = lp.burst_loss
        out.update(ge=True, ge_p=bl.p, ge_r=bl.r, ge_loss_bad=bl.loss_bad, ge_loss_good=bl.loss_good)
    return out


def link_to_dict(lp: LinkParams) -> dict[str, Any]:
    """JSON-ready form of ``lp`` (inverse: ``link_from_dict``)."""
    return dataclasses.asdict(lp)


def link_from_dict(raw: dict[str, Any]) -> LinkParams:
    fields = dict(raw)
    burst = fields.pop("burst_loss", None)
    return LinkParams(**fields, burst_loss=BurstLoss(**burst) if burst else None)


def path_timeline(spec: PathSpec) -> dict[str, Any]:
    """Base parameters (before the start signal) and every change after it, per direction.

    ``{"base": {dir: params}, "changes": [{"at_s": t, "params": {dir: params}}]}``
    with params as ``link_to_dict`` dicts. Events at ``at_s = 0`` apply at the start signal.
    """
    base = {"a->b": spec.forward, "b->a": spec.reverse}
    changes = [
        {"at_s": t, "params": {d: link_to_dict(spec.params_at(t, d)) for d in DIRECTIONS}}
        for t in spec.change_times()
    ]
    return {"base": {d: link_to_dict(lp) for d, lp in base.items()}, "changes": changes}


def netem_limit(lp: LinkParams) -> int:
    """Packets a netem qdisc must hold: those on the delay line plus ``queue_ms`` of rate.

    netem counts delayed packets against its limit (default 1000), which would
    otherwise cap a path at limit x MTU / delay. Shared with the Mininet topology.
    """
    seconds = lp.rtt_ms / 2000.0 + 2.0 * lp.jitter_ms / 1000.0 + lp.queue_ms / 1000.0
    packets = lp.bandwidth_mbps * 1e6 / 8.0 * seconds / lp.mtu
    return max(2, math.ceil(packets - 1e-9))  # 1e-9: float dust must not add a packet
