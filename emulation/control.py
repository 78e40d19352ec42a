"""The control network: a namespace with one unimpaired link to every site, for the job's store.

A training job across sites has a control plane beside its WAN paths (torch's c10d store;
in a real deployment a management network or a VPN to a coordinator). The emulation gives
it one namespace, ``<prefix>-c``, joined to site i by a veth pair ``ctl<i>`` (control
side, 10.199.i.1/30) <-> ``ctl`` (site side, 10.199.i.2/30). The links are plain veths,
outside the impairment engine, so a blackhole or a partition of the WAN paths never
touches them. The control namespace does not forward, so sites cannot reach each other
through it: their traffic to each other stays on the scenario's paths.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from contextlib import ExitStack

from pyroute2 import NetNS, netns

from emulation.hostenv import NETNS_RUN_DIR, run_in
from emulation.naming import Plan
from emulation.topology import netns_pids, terminate

log = logging.getLogger(__name__)

SITE_IFNAME = "ctl"


def control_namespace(plan: Plan) -> str:
    return f"{plan.prefix}-c"


def store_address(index: int) -> str:
    """The control namespace's address on site ``index``'s link (where that site dials the store)."""
    return f"10.199.{index}.1"


def site_address(index: int) -> str:
    return f"10.199.{index}.2"


class ControlNetwork:
    """The control namespace and its links to ``sites`` (names, in the plan's site order)."""

    def __init__(self, plan: Plan, sites: Sequence[str]) -> None:
        self.plan = plan
        self.sites = list(sites)
        self.namespace = control_namespace(plan)

    def exists(self) -> bool:
        return os.path.exists(f"{NETNS_RUN_DIR}/{self.namespace}")

    def up(self) -> None:
        """Build the namespace and links (a leftover of a run that died is removed first;
        call after the scenario's own ``up``, which refuses a scenario already up)."""
        self.down()
        netns.create(self.namespace)
        try:
            with ExitStack() as stack:
                ctl = stack.enter_context(NetNS(self.namespace))
                ctl.link("set", index=ctl.link_lookup(ifname="lo")[0], state="up")
                for i, site in enumerate(self.sites):
                    site_ns = self.plan.site_namespaces[site]
                    gw = stack.enter_context(NetNS(site_ns))
                    ctl.link("add", ifname=f"ctl{i}", kind="veth", peer=SITE_IFNAME)
                    ctl.link("set", index=ctl.link_lookup(ifname=SITE_IFNAME)[0], net_ns_fd=site_ns)
                    index = ctl.link_lookup(ifname=f"ctl{i}")[0]
                    ctl.addr("add", index=index, address=store_address(i), prefixlen=30)
                    ctl.link("set", index=index, state="up")
                    gw_index = gw.link_lookup(ifname=SITE_IFNAME)[0]
                    gw.addr("add", index=gw_index, address=site_address(i), prefixlen=30)
                    gw.link("set", index=gw_index, state="up")
            run_in(self.namespace, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=0"])
        except BaseException:
            self.down()
            raise
        log.info("control network %s: links to %s", self.namespace, ", ".join(self.sites))

    def down(self) -> list[str]:
        """Stop every process in the control namespace and remove it (its veths go with it)."""
        if not self.exists():
            return []
        removed = []
        for pid in netns_pids(self.namespace):
            terminate(pid)
            removed.append(f"process {pid}")
        netns.remove(self.namespace)
        return [*removed, f"namespace {self.namespace}"]
