"""Mapping scenario parameters onto Linux netem qdiscs (pyroute2), and detecting netem.

Choices, each fixing a known pitfall:

* **limit** is sized for the path, not left at netem's default of 1000 packets:
  netem counts every packet it is delaying against ``limit``, so the default
  silently caps a path at limit x MTU / delay (about 120 Mb/s at 100 ms). We
  use (one-way delay + 2 x jitter + queue_ms) x rate in MTU-sized packets, so
  the drop-tail part holds ``queue_ms`` of the bottleneck as in the engine.
* **jitter** uses a normal distribution table we compute (``tc``'s
  ``normal.dist``; netem's default is uniform).
* **reorder**: netem with ``rate`` never lets a packet overtake the previous one
  (each send time is at least the last one's), which is ``reorder = false``. With
  ``reorder = true`` and jitter, the rate moves to an htb class and netem, now
  without rate, becomes its leaf, so jittered packets may overtake.
* **rate** counts IP bytes (packet overhead -14), like the engine.
* **burst_loss** becomes netem's Gilbert-Elliott model (p, r, 1-h, 1-k).

pyroute2's netem plugin lacks the delay distribution and the loss models, so
we register an extended plugin for kind ``netem`` (a superset of pyroute2's).
"""

from __future__ import annotations

import logging
import os
import types
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any

from pyroute2 import NetlinkError, NetNS, netns
from pyroute2.netlink import nla
from pyroute2.netlink.rtnl.tcmsg import plugins as tc_plugins
from pyroute2.netlink.rtnl.tcmsg import sched_netem

from emulation.params import netem_limit
from wanxport.scenario import LinkParams

log = logging.getLogger(__name__)

NETEM_DIST_SCALE = 8192
NORMAL_TABLE_SIZE = 4096
ETH_HEADER_BYTES = 14
U32_MAX = 2**32 - 1
ROOT_HANDLE = 0x10000  # 1:
HTB_CLASS = 0x10001  # 1:1
LEAF_HANDLE = 0x20000  # 2:


@dataclass(frozen=True)
class NetemConfig:
    """The qdiscs of one direction of one path."""

    netem: dict[str, Any]  # keyword arguments of IPRoute.tc("add", "netem", ...)
    htb_rate_bps: int | None  # set: an htb root shapes the rate and netem is its leaf
    limit_packets: int


def netem_config(lp: LinkParams) -> NetemConfig:
    """The netem (and maybe htb) configuration equivalent to ``lp``."""
    rate_bps = round(lp.bandwidth_mbps * 1e6)
    split_rate = lp.reorder and lp.jitter_ms > 0
    limit = netem_limit(lp)
    netem: dict[str, Any] = {
        "delay": round(lp.rtt_ms * 500.0),  # one-way, microseconds
        "limit": limit,
    }
    if lp.jitter_ms > 0:
        netem["jitter"] = round(lp.jitter_ms * 1000.0)
        netem["normal_dist"] = True
    if lp.down:
        netem["loss"] = 100.0
    elif lp.burst_loss is not None:
        bl = lp.burst_loss
        netem["gemodel"] = {"p": bl.p, "r": bl.r, "h": 1.0 - bl.loss_bad, "k1": bl.loss_good}
    elif lp.loss > 0:
        netem["loss"] = lp.loss * 100.0
    if not split_rate:
        netem["rate"] = f"{rate_bps}bit"
        netem["packet_overhead"] = -ETH_HEADER_BYTES
    return NetemConfig(netem=netem, htb_rate_bps=rate_bps if split_rate else None,
                       limit_packets=limit)


@lru_cache(maxsize=1)
def normal_table() -> bytes:
    """netem's delay distribution for a normal law: inverse CDF x 8192 as s16, like tc's."""
    nd = NormalDist()
    values = []
    for i in range(NORMAL_TABLE_SIZE):
        z = nd.inv_cdf((i + 0.5) / NORMAL_TABLE_SIZE) * NETEM_DIST_SCALE
        values.append(max(-32767, min(32767, round(z))))
    return b"".join(v.to_bytes(2, "little", signed=True) for v in values)


def _prob_u32(p: float) -> int:
    return max(0, min(U32_MAX, round(p * U32_MAX)))


class _Options(sched_netem.options):
    """pyroute2's netem options plus the delay distribution and the loss models."""

    nla_map = (
        ("TCA_NETEM_UNSPEC", "none"),
        ("TCA_NETEM_CORR", "netem_corr"),
        ("TCA_NETEM_DELAY_DIST", "cdata"),
        ("TCA_NETEM_REORDER", "netem_reorder"),
        ("TCA_NETEM_CORRUPT", "netem_corrupt"),
        ("TCA_NETEM_LOSS", "netem_loss"),
        ("TCA_NETEM_RATE", "netem_rate"),
    )

    class netem_loss(nla):  # noqa: N801 - pyroute2 names nested nla classes in lower case
        nla_map = (
            ("NETEM_LOSS_UNSPEC", "none"),
            ("NETEM_LOSS_GI", "none"),
            ("NETEM_LOSS_GE", "netem_gemodel"),
        )

        class netem_gemodel(nla):  # noqa: N801
            fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


def _get_parameters(kwarg: dict[str, Any]) -> dict[str, Any]:
    extra = {k: kwarg.pop(k) for k in ("gemodel", "normal_dist") if k in kwarg}
    opts: dict[str, Any] = sched_netem.get_parameters(kwarg)
    if extra.get("normal_dist"):
        opts["attrs"].append(["TCA_NETEM_DELAY_DIST", normal_table()])
    if "gemodel" in extra:
        ge = {k: _prob_u32(v) for k, v in extra["gemodel"].items()}
        opts["attrs"].append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", ge]]}])
    return opts


NETEM_PLUGIN = types.SimpleNamespace(
    parent=sched_netem.parent, get_parameters=_get_parameters, options=_Options
)
tc_plugins["netem"] = NETEM_PLUGIN


def apply(ipr: Any, ifindex: int, cfg: NetemConfig, previous: NetemConfig | None) -> None:
    """Install ``cfg`` as the egress qdiscs of ``ifindex``; change in place when the shape allows.

    Changing in place keeps the packets already in flight, which an event must not drop.
    """
    same_shape = previous is not None and (previous.htb_rate_bps is None) == (
        cfg.htb_rate_bps is None
    )
    if not same_shape and previous is not None:
        ipr.tc("del", index=ifindex, handle=ROOT_HANDLE)
    command = "change" if same_shape else "add"
    if cfg.htb_rate_bps is None:
        ipr.tc(command, "netem", ifindex, ROOT_HANDLE, **dict(cfg.netem))
        return
    rate = f"{cfg.htb_rate_bps}bit"
    if command == "add":
        ipr.tc("add", "htb", ifindex, ROOT_HANDLE, default=1)
    ipr.tc(f"{command}-class", "htb", ifindex, HTB_CLASS, parent=ROOT_HANDLE, rate=rate, ceil=rate)
    ipr.tc(command, "netem", ifindex, LEAF_HANDLE, parent=HTB_CLASS, **dict(cfg.netem))


@lru_cache(maxsize=1)
def netem_available() -> bool:
    """True when the kernel accepts a netem qdisc (tried on a veth in a scratch namespace)."""
    name = f"wx-probe-{os.getpid()}"
    netns.create(name)
    try:
        with NetNS(name) as ns:
            ns.link("add", ifname="probe0", kind="veth", peer="probe1")
            index = ns.link_lookup(ifname="probe0")[0]
            try:
                ns.tc("add", "netem", index, ROOT_HANDLE, delay=1000)
            except NetlinkError as exc:
                log.info("netem unavailable: %s", exc)
                return False
            return True
    finally:
        netns.remove(name)
