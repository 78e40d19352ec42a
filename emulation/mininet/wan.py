"""Mininet topology of a scenario: ``mn --custom emulation/mininet/wan.py --topo wan,scenario=FILE``.

Runs under Mininet's own Python (the system python3), so it uses only the
standard library, Mininet and our stdlib-only modules. One host per site is
its gateway: ``a``, ``b``, ``c``, ... in site order (a two-site scenario's
``a`` and ``b``); path k is a two-port node ``s<k>`` between its two sites'
hosts, with the same addresses as ``python -m emulation up`` (10.200.k.1 at
the path's first site, 10.200.k.2 at its second).

* Where the kernel has netem, ``s<k>`` is a plain Linux bridge and TCLink
  carries the impairment (bw, delay, jitter, loss, netem limit sized as in
  ``emulation.params.netem_limit``); a->b on a's side, b->a on the node's side.
  Burst loss becomes its stationary rate and events are not applied there
  (TCLink has no such knobs); use ``backend=engine`` for those.
* Otherwise ``s<k>`` runs our engine daemon between its two ports, with every
  field of the scenario; ``start_events(net)`` starts the events timeline.

Add ``backend=engine`` or ``backend=netem`` to the --topo arguments to force one.
The path nodes are switches, so ``pingall`` pings between the gateways only
(and, between N sites, reaches only the pairs joined by a path).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

# `mn --custom` exec()s this file without __file__; the code object still knows its path.
_HERE = os.path.abspath(sys._getframe().f_code.co_filename)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from mininet.link import TCLink  # noqa: E402
from mininet.node import Host, Switch  # noqa: E402
from mininet.topo import Topo  # noqa: E402

from emulation.naming import plan  # noqa: E402
from emulation.params import netem_limit, path_timeline  # noqa: E402
from wanxport.scenario import LinkParams, Scenario, load_scenario  # noqa: E402

OFFLOADS_OFF = "tx off tso off gso off gro off"
READY_TIMEOUT_S = 20.0


def netem_present() -> bool:
    """Try a netem qdisc on a veth in a scratch namespace (root's qdiscs stay untouched)."""
    ns = f"wx-mnprobe-{os.getpid()}"
    run = lambda *argv: subprocess.run(argv, capture_output=True).returncode  # noqa: E731
    if run("ip", "netns", "add", ns):
        return False
    try:
        run("ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        return run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "root",
                   "netem", "delay", "1ms") == 0
    finally:
        run("ip", "netns", "del", ns)


def tclink_params(lp: LinkParams) -> dict[str, Any]:
    """TCLink/TCIntf parameters for one direction (netem on the sending interface)."""
    params: dict[str, Any] = {
        "bw": lp.bandwidth_mbps,
        "delay": f"{lp.rtt_ms / 2:g}ms",
        "max_queue_size": netem_limit(lp),
        "use_htb": True,
    }
    if lp.jitter_ms > 0:
        params["jitter"] = f"{lp.jitter_ms:g}ms"
    loss = 1.0 if lp.down else lp.effective_loss
    if loss > 0:
        params["loss"] = loss * 100.0
    return params


class WanHost(Host):
    """A gateway host: offloads off, so the engine sees MTU-sized frames with checksums."""

    def config(self, **params: Any) -> dict[str, Any]:
        result: dict[str, Any] = super().config(**params)
        for intf in self.intfList():
            if intf.name != "lo":
                self.cmd("ethtool -K", intf.name, OFFLOADS_OFF)
        return result


class WanBridge(Switch):
    """A path node that just joins its two ports (iproute2; no brctl needed)."""

    def start(self, controllers: list[Any]) -> None:
        self.cmd("ip link add name", self.name, "type bridge")
        for intf in self.intfList():
            if self.name in intf.name:
                self.cmd("ip link set", intf.name, "master", self.name)
        self.cmd("ip link set", self.name, "up")

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        self.cmd("ip link del", self.name)
        super().stop(deleteIntfs)


class EngineSwitch(Switch):
    """A path node whose two ports are joined by our impairment engine (one daemon per node)."""

    def __init__(self, name: str, spec: str = "{}", **params: Any) -> None:
        super().__init__(name, **params)
        self.spec = json.loads(spec)
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir = tempfile.mkdtemp(prefix=f"wx-mn-{name}-")

    def start(self, controllers: list[Any]) -> None:
        ports = {f"{self.name}-eth1": "if_a", f"{self.name}-eth2": "if_b"}
        for ifname in ports:
            self.cmd("ethtool -K", ifname, OFFLOADS_OFF)
            self.cmd("ip link set", ifname, "up")
        spec = dict(self.spec, netns=None, backend="engine")
        spec["paths"] = [dict(spec["paths"][0], if_a=f"{self.name}-eth1",
                              if_b=f"{self.name}-eth2")]
        spec_path = os.path.join(self.workdir, "spec.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        read_fd, write_fd = os.pipe()
        with open(os.path.join(self.workdir, "engine.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "emulation.engine", "--spec", spec_path,
                 "--ready-fd", str(write_fd)],
                pass_fds=(write_fd,), stdout=log, stderr=log, env=env, start_new_session=True,
            )
        os.close(write_fd)
        ready = select.select([read_fd], [], [], READY_TIMEOUT_S)[0]
        line = os.read(read_fd, 64) if ready else b""
        os.close(read_fd)
        if line.strip() != b"ready":
            raise RuntimeError(f"engine on {self.name} did not start; see {self.workdir}/engine.log")

    def start_events(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGUSR1)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        super().stop(deleteIntfs)


class WanTopo(Topo):
    """A gateway host per site (``a``, ``b``, ...) and one path node ``s<k>`` per scenario path."""

    def build(self, scenario: str = "", backend: str = "") -> None:  # type: ignore[override]
        if not scenario:
            raise ValueError("--topo wan needs scenario=FILE")
        sc = load_scenario(scenario)
        layout = plan(sc)
        use_netem = {"netem": True, "engine": False}.get(backend) if backend else netem_present()
        if use_netem is None:
            raise ValueError(f"backend: unknown {backend!r}; valid: netem, engine")
        hosts = {}
        for site in sc.sites:
            spec, p = next((s, p) for s, p in zip(sc.paths, layout.paths, strict=True) if site in s.between)
            address = p.a_addr if spec.between[0] == site else p.b_addr
            hosts[site] = self.addHost(host_name(sc, site), cls=WanHost, ip=f"{address}/30")
        for spec, p in zip(sc.paths, layout.paths, strict=True):
            a, b = hosts[spec.between[0]], hosts[spec.between[1]]
            name = f"s{p.index}"
            a_ip = {"ip": f"{p.a_addr}/30"}
            b_ip = {"ip": f"{p.b_addr}/30"}
            if use_netem:
                s = self.addSwitch(name, cls=WanBridge)
                self.addLink(a, s, port2=1, cls=TCLink, params1=dict(a_ip, **tclink_params(
                    spec.forward)), params2=tclink_params(spec.reverse))
            else:
                one = {"seed": sc.seed, "paths": [dict(name=spec.name, **path_timeline(spec))]}
                s = self.addSwitch(name, cls=EngineSwitch, spec=json.dumps(one))
                self.addLink(a, s, port2=1, params1=a_ip)
            self.addLink(s, b, port1=2, params2=b_ip)


def host_name(scenario: Scenario, site: str) -> str:
    """The Mininet host of ``site``: ``a``, ``b``, ``c``, ... in site order (short, unlike site names,
    since Mininet names interfaces after hosts)."""
    return chr(ord("a") + scenario.sites.index(site))


def start_events(net: Any) -> None:
    """Start every engine's events timeline now (call at the experiment's first byte)."""
    for switch in net.switches:
        if isinstance(switch, EngineSwitch):
            switch.start_events()


topos = {"wan": WanTopo}
