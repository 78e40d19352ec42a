"""Build and remove the namespaces and links of a scenario (pyroute2, netlink only).

Per scenario: one gateway namespace per site (``<prefix>-a`` and ``<prefix>-b``
for the first two, ``naming.site_namespace``) and a middle namespace
``<prefix>-m``. Path k joins its two sites: a veth pair ``wan<k>`` (in its
first site) <-> ``a<k>`` (in m) and a pair ``b<k>`` (in m) <-> ``wan<k>`` (in
its second site). The middle joins ``a<k>`` and ``b<k>``: the engine forwards
between them, or, for netem, a Linux bridge ``br<k>`` does, with netem on the
egress of ``b<k>`` (first -> second site) and ``a<k>`` (back). So the
gateways' own qdiscs stay free for the transport under test, every kind of IP
traffic crosses the same impaired path, and between N sites each path is its
own impaired link between two of them.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
from collections.abc import Iterable
from contextlib import ExitStack

from pyroute2 import NetNS, netns

from emulation.hostenv import NETNS_RUN_DIR, disable_offloads, nic_offloads
from emulation.naming import Plan

log = logging.getLogger(__name__)


def existing_namespaces(names: Iterable[str]) -> list[str]:
    """Those of ``names`` that exist now."""
    return [n for n in names if os.path.exists(f"{NETNS_RUN_DIR}/{n}")]


def build(plan: Plan, bridge: bool) -> None:
    """Create namespaces, veths, addresses; with ``bridge``, join each path in the middle
    (for netem, whose qdiscs see frames of the link's size: offloads off), else leave the
    middle's ends to the engine (offloads as NICs have them, ``hostenv.nic_offloads``).

    On failure the caller removes what exists (``teardown``); every name here is
    derived from the plan, so nothing can be missed.
    """
    for name in plan.namespaces:
        netns.create(name)
    with ExitStack() as stack:
        handles = {name: stack.enter_context(NetNS(name)) for name in plan.namespaces}
        mid = handles[plan.ns_mid]
        for ipr in handles.values():
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        for p in plan.paths:
            ns_first, ns_second = p.ends
            nsa, nsb = handles[ns_first], handles[ns_second]
            for mid_if, gw_ns, gw in (
                (p.mid_a_ifname, ns_first, nsa),
                (p.mid_b_ifname, ns_second, nsb),
            ):
                mid.link("add", ifname=mid_if, kind="veth", peer=p.gw_ifname)
                peer = mid.link_lookup(ifname=p.gw_ifname)[0]
                mid.link("set", index=peer, net_ns_fd=gw_ns)
                index = mid.link_lookup(ifname=mid_if)[0]
                mid.link("set", index=index, mtu=p.mtu, state="up")
                gw_index = gw.link_lookup(ifname=p.gw_ifname)[0]
                gw.link("set", index=gw_index, mtu=p.mtu, state="up")
            nsa.addr("add", index=nsa.link_lookup(ifname=p.gw_ifname)[0], address=p.a_addr,
                     prefixlen=30)
            nsb.addr("add", index=nsb.link_lookup(ifname=p.gw_ifname)[0], address=p.b_addr,
                     prefixlen=30)
            if bridge:
                br = f"br{p.index}"
                mid.link("add", ifname=br, kind="bridge")
                br_index = mid.link_lookup(ifname=br)[0]
                for mid_if in (p.mid_a_ifname, p.mid_b_ifname):
                    mid.link("set", index=mid.link_lookup(ifname=mid_if)[0], master=br_index)
                mid.link("set", index=br_index, state="up")
    for p in plan.paths:
        ends = [(end, p.gw_ifname, True) for end in p.ends]
        middle = [(plan.ns_mid, ifname, False) for ifname in (p.mid_a_ifname, p.mid_b_ifname)]
        for ns, ifname, gateway in ends + middle:
            if bridge:
                disable_offloads(ns, ifname)
            else:
                nic_offloads(ns, ifname, gateway=gateway)
    log.info("built %s: %d sites, %d paths", plan.prefix, len(plan.namespaces) - 1, len(plan.paths))


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name``."""
    try:
        target = os.stat(f"{NETNS_RUN_DIR}/{name}").st_ino
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == target:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def terminate(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM ``pid``, wait for it to exit (pidfd, no polling), SIGKILL if it does not."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
            try:
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                return
            if select.select([fd], [], [], wait)[0]:
                return
        log.warning("process %d did not exit after SIGKILL", pid)
    finally:
        os.close(fd)


def teardown(plan: Plan) -> list[str]:
    """Stop every process in the scenario's namespaces, delete them and the state dir.

    Deleting a namespace deletes its veths; a namespace still used by a process
    would outlive its name, which is why processes go first. Returns what was removed.
    """
    removed = []
    for name in existing_namespaces(plan.namespaces):
        for pid in netns_pids(name):
            terminate(pid)
            removed.append(f"process {pid}")
        netns.remove(name)
        removed.append(f"namespace {name}")
    if os.path.isdir(plan.state_dir):
        shutil.rmtree(plan.state_dir, ignore_errors=True)
        removed.append(f"state {plan.state_dir}")
    return removed
