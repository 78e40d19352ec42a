"""``python -m emulation diloco``: DiLoCo across a scenario's sites while sites fail.

The runner brings the scenario up (one namespace per site, the paths through the impairment
engine), adds the control network (``emulation.control``) and starts the job's store there,
then one ``examples/diloco_elastic.py site`` process per site, each in its own process group.
When every site has joined it says "go" to all at once and starts the engine's timeline,
so "go" is time 0 for the faults: blackholes and partitions are ``down`` events on that
timeline (``emulation.faults``), kills and restarts are the runner's, scheduled on the same
clock (CLOCK_MONOTONIC, which every namespace shares). It collects each site's JSON lines
until every process has finished or ended, and builds the report (``diloco_report``).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulation.api import REPO_ROOT, Emulation
from emulation.control import ControlNetwork, store_address
from emulation.diloco_report import RunLog, build_diloco_report, summary
from emulation.errors import EmulationError
from emulation.faults import Fault, check_faults, with_fault_events
from emulation.mesh_allreduce import address_at
from emulation.ranks import make_rank_pki
from emulation.siteprocs import STOP_GRACE_S, Line, NamespaceProcess
from wanxport.scenario import Scenario

EXAMPLE = str(Path(REPO_ROOT) / "examples" / "diloco_elastic.py")
STORE_PORT = 29400
WAN_PORT = 7600
SETUP_TIMEOUT_S = 180.0
COMPRESS_CHOICES = ("none", "int8", "bf16")


@dataclass(frozen=True)
class DilocoOptions:
    """What one run trains and which faults it injects (times from "go")."""

    sites: int
    outer_steps: int = 10
    inner_steps: int = 20
    hidden: int = 2048
    compress: str | None = None
    seed: int = 0
    noise: float | None = None  # the targets' noise; None: the example's default
    timeout_s: float = 60.0
    deadline_s: float | None = None
    hold_s: float = 120.0  # past the last outer step, how long the sites wait for one the faults bring back
    backend: str | None = None
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    logs: str | None = None  # a directory for every process's stderr (LABEL.log), else not kept

    @property
    def run_deadline_s(self) -> float:
        if self.deadline_s is not None:
            return self.deadline_s
        return 120.0 + 60.0 * self.outer_steps + self.hold_s

    def awaited(self) -> list[str]:
        """The sites the faults take out and bring back (a kill with a restart, a blackhole, a
        partition's minority), unless a later kill takes them for good: past the last outer
        step, the sites train on until these are back (``examples/diloco_elastic.py``)."""
        back: dict[str, bool] = {}
        for fault in self.faults:
            for site in fault.cut_off():
                back[site] = fault.kind != "kill" or fault.rejoin_after_s is not None
        return [site for site, returns in back.items() if returns]


def check_options(scenario: Scenario, sites: int, outer_steps: int, inner_steps: int, hidden: int,
                  raw_faults: list[dict[str, Any]], noise: float | None = None,
                  ) -> tuple[list[str], list[Fault]]:
    """The run's sites (the scenario's first ``sites``) and its checked faults; ValueError (one
    line naming the option) for a run that cannot be."""
    if not 2 <= sites <= len(scenario.sites):
        raise ValueError(f"--sites: {sites} is not valid for {scenario.name} ({len(scenario.sites)} "
                         f"sites: {', '.join(scenario.sites)}); use 2..{len(scenario.sites)}")
    counts = (("--outer-steps", outer_steps), ("--inner-steps", inner_steps), ("--hidden", hidden))
    for option, value in counts:
        if value < 1:
            raise ValueError(f"{option}: {value} is not valid; use >= 1")
    if noise is not None and not noise >= 0:
        raise ValueError(f"--noise: {noise} is not valid; use >= 0")
    names = list(scenario.sites[:sites])
    return names, check_faults(raw_faults, names)


def site_spec(emu: Emulation, sites: list[str], index: int, pki: str, options: DilocoOptions,
              restart: bool) -> dict[str, Any]:
    """Site ``index``'s spec: for each peer, the direct paths of the pair at the listener's end
    (the higher index listens), the store on this site's control link."""
    site = sites[index]
    paths = {}
    for peer, other in enumerate(sites):
        if peer == index:
            continue
        listener = sites[max(index, peer)]
        paths[str(peer)] = [f"{address_at(p, listener)}:{WAN_PORT}" for p in emu.paths
                            if set(p.between) == {site, other}]
    return {"site": index, "names": sites, "pki": pki, "paths": paths,
            "store": f"{store_address(index)}:{STORE_PORT}", "outer_steps": options.outer_steps,
            "inner_steps": options.inner_steps, "hidden": options.hidden, "compress": options.compress,
            "seed": options.seed, "timeout": options.timeout_s, "no_go": restart,
            "awaited": options.awaited(), "hold_s": options.hold_s,
            **({} if options.noise is None else {"noise": options.noise})}


def _git_commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or None


class DilocoRun:
    """One run on an emulation that is up: the store, the sites, the faults, the log."""

    def __init__(self, emu: Emulation, control: ControlNetwork, sites: list[str], pki: str,
                 options: DilocoOptions) -> None:
        self.emu, self.control, self.sites, self.pki, self.options = emu, control, sites, pki, options
        self.lines: queue.Queue[Line] = queue.Queue()
        self.log = RunLog(sites)
        self.procs: list[NamespaceProcess] = []
        self.current: dict[str, NamespaceProcess] = {}

    def _start_site(self, index: int, restart: bool) -> None:
        site = self.sites[index]
        earlier = sum(p.label.split("#")[0] == site for p in self.procs)
        label = f"{site}#{earlier + 1}" if restart else site
        spec = site_spec(self.emu, self.sites, index, self.pki, self.options, restart)
        argv = [sys.executable, EXAMPLE, "site", json.dumps(spec)]
        ns = self.emu.plan.site_namespaces[site]
        proc = NamespaceProcess(label, ns, argv, self.lines, stdin=not restart, stderr_path=self._log(label))
        self.procs.append(proc)
        self.current[site] = proc
        self.log.started(label, site, proc.started_at)

    def _log(self, label: str) -> str | None:
        return os.path.join(self.options.logs, f"{label}.log") if self.options.logs else None

    def _take(self, timeout_s: float) -> bool:
        """Record the next line (False when none came within ``timeout_s``)."""
        try:
            label, obj, at = self.lines.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return False
        if obj is None:
            proc = next(p for p in self.procs if p.label == label)
            try:
                proc.proc.wait(STOP_GRACE_S)  # its output ended: it is exiting
            except subprocess.TimeoutExpired:
                proc.kill()
            self.log.ended(label, at, proc.proc.returncode, proc.stderr_tail())
        else:
            self.log.line(label, obj, at)
        return True

    def _wait_ready(self, labels: set[str]) -> None:
        stop = time.monotonic() + SETUP_TIMEOUT_S
        while not labels <= self.log.ready_labels():
            ended = self.log.ended_labels() & labels
            if ended:
                label = sorted(ended)[0]
                raise EmulationError(f"{label} ended before it was ready: {self.log.end_reason(label)}")
            if not self._take(stop - time.monotonic()):
                missing = sorted(labels - self.log.ready_labels())
                raise EmulationError(f"not ready within {SETUP_TIMEOUT_S:.0f} s: {', '.join(missing)}")

    def run(self) -> None:
        store = NamespaceProcess("store", self.control.namespace,
                                 [sys.executable, EXAMPLE, "store", str(STORE_PORT)], self.lines, stdin=True,
                                 stderr_path=self._log("store"))
        self.procs.append(store)
        self._wait_ready({"store"})
        for index in range(len(self.sites)):
            self._start_site(index, restart=False)
        self._wait_ready(set(self.sites))
        self.log.meter_start(self.emu)
        go = time.monotonic()
        self.emu.start_events()
        for site in self.sites:
            self.current[site].tell("go")
        self.log.go(go, self.options.faults)
        actions = sorted([(go + f.at_s, "kill", f.target) for f in self.options.faults if f.kind == "kill"]
                         + [(go + f.at_s + f.rejoin_after_s, "restart", f.target) for f in self.options.faults
                            if f.kind == "kill" and f.rejoin_after_s is not None])
        stop = go + self.options.run_deadline_s
        while actions or not self._finished():
            now = time.monotonic()
            if actions and actions[0][0] <= now:
                _, what, site = actions.pop(0)
                if what == "kill":
                    self.current[site].kill()
                    self.log.killed(site, self.current[site].killed_at or now)
                else:
                    self._start_site(self.sites.index(site), restart=True)
                continue
            if now >= stop:
                self.log.timed_out(self.options.run_deadline_s)
                break
            self._take(min(stop, actions[0][0] if actions else stop) - now)
        self.log.meter_stop(self.emu)

    def _finished(self) -> bool:
        """Every site's current process has said "done" or ended."""
        return all(self.log.finished(p.label) for p in self.current.values())

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


def run_diloco(scenario: Scenario, sites: list[str], options: DilocoOptions) -> dict[str, Any]:
    """Bring the scenario (with the faults' path events) and the control network up, run, report."""
    wall_start = time.perf_counter()
    emu = Emulation(with_fault_events(scenario, options.faults), backend=options.backend)
    emu.up()
    control = ControlNetwork(emu.plan, sites)
    load_before = os.getloadavg()
    try:
        control.up()
        with tempfile.TemporaryDirectory(prefix="wx-diloco-") as pki:
            make_rank_pki(pki, sites)
            run = DilocoRun(emu, control, sites, pki, options)
            try:
                run.run()
            finally:
                run.close()
    finally:
        control.down()
        emu.down()
    host = {"name": os.uname().nodename, "cpus": os.cpu_count(), "load_before": load_before,
            "load_after": os.getloadavg()}
    return build_diloco_report(scenario, options, run.log, backend=emu.backend, commit=_git_commit(),
                               host=host, wall_s=time.perf_counter() - wall_start)


def main_diloco(args: Any) -> int:
    """The CLI's ``diloco``: 0 when every site that should finish finished with the same model."""
    from emulation.bundled import resolve_scenario
    from wanxport.report import dumps

    scenario = resolve_scenario(args.scenario)
    sites, faults = check_options(scenario, args.sites, args.outer_steps, args.inner_steps, args.hidden,
                                  args.faults, args.noise)
    options = DilocoOptions(sites=args.sites, outer_steps=args.outer_steps, inner_steps=args.inner_steps,
                            hidden=args.hidden, compress=None if args.compress == "none" else args.compress,
                            seed=args.seed, noise=args.noise, timeout_s=args.timeout,
                            deadline_s=args.deadline, hold_s=args.hold,
                            backend=args.backend, faults=tuple(faults), logs=args.logs)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    report = run_diloco(scenario, sites, options)
    if args.json:
        Path(args.json).write_text(dumps(report) + "\n")
    print(summary(report), flush=True)
    return 0 if report["intact"] else 1
