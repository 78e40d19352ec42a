"""The Python API of the emulation, used by the CLI and by experiment runners.

    from emulation.api import Emulation
    with Emulation(load_scenario("s.toml"), backend=None) as emu:   # None: netem if present
        emu.namespaces            # {"a": "wx-...-a", "b": "wx-...-b"}: site -> namespace
        emu.paths                 # [PathInfo(name, a_addr, b_addr, ifname, between)]
        server = emu.popen("b", ["iperf3", "-s"])
        emu.start_events()        # events timeline starts now (send at the first byte)
        emu.run("a", ["ping", "-c", "3", emu.paths[0].b_addr])

``Emulation.attach(scenario)`` gives the same object for a scenario that an
earlier ``python -m emulation up`` built, so a runner can use either.

Between N sites (contract v2) every site has its namespace and every path is a
link between two of them: ``emu.namespaces`` maps each site's name, and
``popen``/``run`` take a site name. "a" and "b" always name the first two
sites, so a runner written for two gateways runs on any two-site view
(``Scenario.pair``) unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulation import hostenv, topology
from emulation.errors import EmulationError
from emulation.naming import Plan, plan
from emulation.params import path_timeline
from wanxport.scenario import Scenario
from wanxport.scenario.model import V1_SITES

log = logging.getLogger(__name__)

BACKENDS = ("netem", "engine")
READY_TIMEOUT_S = 20.0
REPO_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class PathInfo:
    """What a runner needs of one path: its addresses and the gateway interface.

    ``a_addr`` is at the path's first site (``between[0]``), ``b_addr`` at its second.
    """

    name: str
    a_addr: str
    b_addr: str
    ifname: str
    between: tuple[str, str] = V1_SITES


def choose_backend(requested: str | None) -> str:
    """``requested`` if given, else netem when the kernel has it, else the engine."""
    if requested is not None:
        if requested not in BACKENDS:
            raise EmulationError(f"--backend: unknown backend {requested!r}; valid: netem, engine")
        if requested == "netem":
            from emulation.netem import netem_available

            if not netem_available():
                raise EmulationError(
                    "--backend netem: this kernel has no netem qdisc (sch_netem); "
                    "use --backend engine or load the module (modprobe sch_netem)"
                )
        return requested
    from emulation.netem import netem_available

    return "netem" if netem_available() else "engine"


def check_namespaces_supported() -> None:
    """One clear line when the kernel or the container forbids network namespaces."""
    if not os.path.exists("/proc/self/ns/net"):
        raise EmulationError("this kernel has no network namespace support (CONFIG_NET_NS)")


class Emulation:
    """One scenario's namespaces, links and impairment daemon."""

    def __init__(self, scenario: Scenario, backend: str | None = None) -> None:
        self.scenario = scenario
        self.plan: Plan = plan(scenario)
        self.requested_backend = backend
        self.backend: str | None = None
        self._daemon: subprocess.Popen[bytes] | None = None

    # -- facts ------------------------------------------------------------

    @property
    def namespaces(self) -> dict[str, str]:
        """Site name -> its namespace, in site order (``a``, ``b`` for a v1 scenario)."""
        return dict(self.plan.site_namespaces)

    @property
    def paths(self) -> list[PathInfo]:
        return [PathInfo(p.name, p.a_addr, p.b_addr, p.gw_ifname, spec.between)
                for p, spec in zip(self.plan.paths, self.scenario.paths, strict=True)]

    def describe(self) -> dict[str, Any]:
        """The ``up --json`` document."""
        return {
            "namespaces": self.namespaces,
            "backend": self.backend,
            "paths": [{"name": p.name, "a_addr": p.a_addr, "b_addr": p.b_addr, "between": list(p.between)}
                      for p in self.paths],
        }

    def is_up(self) -> bool:
        return bool(topology.existing_namespaces(self.plan.namespaces))

    # -- life cycle -------------------------------------------------------

    def up(self) -> None:
        """Build everything; on any failure remove what this call built, then raise."""
        hostenv.require_root()
        check_namespaces_supported()
        hostenv.require_tool("ethtool")
        if self.is_up():
            raise EmulationError(
                f"scenario {self.scenario.name!r} is already up (namespace {self.plan.ns_a}); "
                f"run 'python -m emulation down' on it first"
            )
        backend = choose_backend(self.requested_backend)
        try:
            os.makedirs(self.plan.state_dir, exist_ok=True)
            topology.build(self.plan, bridge=backend == "netem")
            self._start_daemon(backend)
            self.backend = backend
            with open(f"{self.plan.state_dir}/state.json", "w") as fh:
                json.dump(self.describe(), fh)
        except BaseException:
            self.down()
            raise
        log.info("up: %s with %s", self.scenario.name, backend)

    @classmethod
    def attach(cls, scenario: Scenario) -> Emulation:
        """An ``Emulation`` for a scenario already up (built by another process)."""
        emu = cls(scenario)
        try:
            with open(f"{emu.plan.state_dir}/state.json") as fh:
                emu.backend = json.load(fh)["backend"]
        except (OSError, ValueError, KeyError):
            raise EmulationError(
                f"scenario {scenario.name!r} is not up; run 'python -m emulation up' first"
            ) from None
        return emu

    def down(self) -> list[str]:
        """Remove every namespace, link and process of the scenario; returns what was removed."""
        removed = topology.teardown(self.plan)
        if self._daemon is not None:
            self._daemon.wait()  # our child: reap it (teardown already stopped it)
            self._daemon = None
        return removed

    def __enter__(self) -> Emulation:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _spec(self, backend: str) -> dict[str, Any]:
        return {
            "backend": backend,
            # The topology leaves the engine's veths their offloads: frames carry
            # virtio-net headers (hostenv.nic_offloads).
            "vnet": backend == "engine",
            "netns": self.plan.ns_mid,
            "seed": self.scenario.seed,
            "paths": [
                {"name": spec.name, "if_a": p.mid_a_ifname, "if_b": p.mid_b_ifname,
                 **path_timeline(spec)}
                for spec, p in zip(self.scenario.paths, self.plan.paths, strict=True)
            ],
        }

    def _start_daemon(self, backend: str) -> None:
        state = self.plan.state_dir
        with open(f"{state}/spec.json", "w") as fh:
            json.dump(self._spec(backend), fh)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        read_fd, write_fd = os.pipe()
        with open(f"{state}/engine.log", "ab") as logf:
            self._daemon = subprocess.Popen(
                [sys.executable, "-m", "emulation.engine", "--spec", f"{state}/spec.json",
                 "--ready-fd", str(write_fd), "--pidfile", f"{state}/engine.pid",
                 "--stats", f"{state}/stats.json"],
                pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True, env=env,
            )
        os.close(write_fd)
        try:
            ready = select.select([read_fd], [], [], READY_TIMEOUT_S)[0]
            line = os.read(read_fd, 64) if ready else b""
        finally:
            os.close(read_fd)
        if line.strip() != b"ready":
            tail = Path(f"{state}/engine.log").read_text(errors="replace").strip().splitlines()
            raise EmulationError(
                f"the {backend} daemon did not start: {tail[-1] if tail else 'no output'} "
                f"(log: {state}/engine.log)"
            )

    # -- use --------------------------------------------------------------

    def _ns(self, side: str) -> str:
        names = {"a": self.plan.ns_a, "b": self.plan.ns_b, **self.plan.site_namespaces}
        if side not in names:
            raise ValueError(f"side must be a site ({', '.join(self.plan.site_namespaces)}) or 'a'/'b' "
                             f"(the first two sites), got {side!r}")
        return names[side]

    def popen(self, side: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in gateway ``side``: a site's name, or "a"/"b" for the first two sites."""
        return hostenv.popen_in(self._ns(side), argv, **kwargs)

    def run(self, side: str, argv: Sequence[str], timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in gateway ``side`` to completion, capturing its output."""
        return hostenv.run_in(self._ns(side), argv, timeout=timeout, check=check)

    def _daemon_pid(self) -> int:
        try:
            with open(f"{self.plan.state_dir}/engine.pid") as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            raise EmulationError(f"scenario {self.scenario.name!r} has no running daemon") from None

    def start_events(self) -> None:
        """Start (or restart) the events timeline now: call at the transfer's first byte."""
        os.kill(self._daemon_pid(), signal.SIGUSR1)

    def pair(self, src: str, dst: str) -> PairView:
        """Sites ``src`` and ``dst`` as gateways "a" and "b" with their direct paths (``Scenario.pair``)."""
        return PairView(self, src, dst)

    def lag_max_s(self) -> float | None:
        """The longest any frame has waited for the engine to read it since the engine started,
        over every path and direction. None under netem (the kernel's qdiscs keep no such
        figure) or when the daemon does not answer: a diagnostic must not fail the run."""
        if self.backend != "engine":
            return None
        try:
            counters = self.counters()
        except EmulationError as exc:
            log.warning("no engine lag: %s", exc)
            return None
        return max((c["rx_lag_max_s"] for dirs in counters.values() for c in dirs.values()), default=0.0)

    def engine_cpu_s(self) -> float | None:
        """CPU-s the impairment engine (every thread) has used so far; None without one (netem).
        On a 2-core host the engine forwards every datagram next to the gateways: its CPU is
        part of what a run costs here and nothing a real WAN would charge (``cpu_other``)."""
        try:
            with open(f"{self.plan.state_dir}/engine.pid") as fh:
                pid = int(fh.read().strip())
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except (OSError, ValueError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stats_path(self) -> str:
        """Where the daemon writes its per-path counters (on SIGUSR2 and at exit)."""
        return f"{self.plan.state_dir}/stats.json"

    def counters(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The daemon's per-path, per-direction counters now (``{path: {"a->b": {...}}}``):
        forwarded packets and bytes, and drops by cause (``drop_queue`` is the bottleneck's
        drop-tail buffer, ``drop_loss`` the scenario's random loss). The engine backend's
        daemon only (under netem the counters live in the qdiscs): EmulationError without one."""
        stats = Path(self.stats_path())
        before = stats.stat().st_mtime_ns if stats.exists() else 0
        os.kill(self._daemon_pid(), signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while not stats.exists() or stats.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise EmulationError(f"the daemon wrote no counters within {timeout_s:.0f} s")
            time.sleep(0.01)  # the daemon answers within a signal's handling time
        counters: dict[str, Any] = json.loads(stats.read_text())
        return counters


class PairView:
    """Two sites of an emulation as a two-gateway one: what a two-site runner needs.

    ``a`` is ``src``'s namespace, ``b`` is ``dst``'s; ``paths`` are the paths
    joining the two in file order, with ``a_addr`` always at ``src`` (the same
    paths, in the same order, as ``Scenario.pair(src, dst)``). The rest of the
    scenario's sites and links stay up, idle, around the pair.
    """

    def __init__(self, emulation: Emulation, src: str, dst: str) -> None:
        self.emulation = emulation
        self.scenario = emulation.scenario.pair(src, dst)
        self.src, self.dst = src, dst

    @property
    def backend(self) -> str | None:
        return self.emulation.backend

    @property
    def namespaces(self) -> dict[str, str]:
        names = self.emulation.namespaces
        return {"a": names[self.src], "b": names[self.dst]}

    @property
    def paths(self) -> list[PathInfo]:
        joined = [p for p in self.emulation.paths if set(p.between) == {self.src, self.dst}]
        return [p if p.between[0] == self.src else
                PathInfo(p.name, p.b_addr, p.a_addr, p.ifname, (self.src, self.dst)) for p in joined]

    def _side(self, side: str) -> str:
        return {"a": self.src, "b": self.dst}.get(side, side)

    def popen(self, side: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` at ``side``: "a" (``src``), "b" (``dst``) or any site's name."""
        return self.emulation.popen(self._side(side), argv, **kwargs)

    def run(self, side: str, argv: Sequence[str], timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.emulation.run(self._side(side), argv, timeout=timeout, check=check)

    def start_events(self) -> None:
        self.emulation.start_events()

    def counters(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return self.emulation.counters(timeout_s)

    def lag_max_s(self) -> float | None:
        return self.emulation.lag_max_s()

    def engine_cpu_s(self) -> float | None:
        return self.emulation.engine_cpu_s()


#: What a two-site runner drives: a whole two-site emulation, or two sites of an N-site one.
Gateways = Emulation | PairView
