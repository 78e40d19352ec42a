"""A long monitored run of two gateway daemons: is anything leaking?

Two ``wanxport gateway`` daemons, one in each gateway namespace of a bundled
emulated scenario (``emulation/``: namespaces plus our impairment engine, since
this kernel has no netem), with every path's rate capped (``--rate-mbps``) so
the host sustains it with room to spare. Transfers move a->b continuously
through the transfer API (``wanxport.daemon.client``): ``--in-flight`` submissions are
kept queued or active, each received file's SHA-256 is compared with its
source's, then the file is deleted (so the disk stays bounded). Every
``--flap-every`` seconds one path goes down for ``--down-s`` seconds (events on
the engine's own timeline, i.e. the emulated WAN fails, not the daemon's
sockets); every ``--reload-every`` seconds both configs change (``warm_seconds``
toggles) and both daemons get SIGHUP, half a period after the flaps so the two
stay apart.

Sampled every ``--sample-every`` seconds: bytes moved (the API's progress) and
verified (SHA-256 end to end), each daemon's ``RssAnon`` (from
/proc/PID/status: anonymous memory only, since received files are mapped and
their pages are file-backed), open file descriptors (/proc/PID/fd), asyncio
tasks (``asyncio_tasks`` of ``GET /v1/status``), reloads applied and transfer
failures; each sample is printed as one line. Written to ``--out``: ``soak.json``
(compact; rewritten every minute with ``"complete": false``) and ``soak.png``
(RssAnon, fds, tasks, goodput over time). The verdict compares, per daemon, the
median RssAnon of the last 5 minutes (a quarter of the run when it is shorter
than 20 minutes) with the median of the second quarter: within 2 %, PASS.

Root only (namespaces). Namespaces and processes are removed on exit, on
Ctrl-C and on SIGTERM; the scenario is renamed per run (``soak<PID>-...``), so a
soak never collides with the netns tests or another soak. Usage:

    sudo .venv/bin/python benchmarks/soak.py --duration 1h [--scenario clean-2path] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from emulation.api import Emulation
from emulation.bundled import resolve_scenario
from wanxport.control.certs import make_test_pki
from wanxport.daemon.client import FINAL_STATES, GatewayClient
from wanxport.scenario import Scenario
from wanxport.scenario.model import PathEvent

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smaps import anon_by_mapping, by_kind, diff  # noqa: E402

PORT = 47100  # path k listens on PORT + k in its namespace (namespaces of our own: no clash)
SITES = ("gw-a", "gw-b")
TOLERANCE = 0.02
LAST_WINDOW_S = 300.0
UNIT = Path(__file__).resolve().parent.parent / "deploy" / "wanxport-gateway.service"


def unit_environment(unit: Path) -> dict[str, str]:
    """The ``Environment=`` settings of a systemd unit, so the soak runs the daemons as shipped.

    Without them a soak would measure a process the unit never starts (an allocator
    setting such as ``PYTHONMALLOC`` changes what stays resident).
    """
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "Environment":
            for assignment in shlex.split(value):
                name, eq, setting = assignment.partition("=")
                if not eq:
                    raise ValueError(f"{unit}: Environment= without NAME=VALUE: {assignment!r}")
                env[name] = setting
    return env


def parse_duration(text: str) -> float:
    """``1h``, ``45s``, ``10m`` or plain seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    try:
        if text and text[-1] in units:
            value = float(text[:-1]) * units[text[-1]]
        else:
            value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use e.g. 1h, 10m, 45s") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
    return value


def soak_scenario(base: Scenario, args: argparse.Namespace) -> Scenario:
    """``base`` renamed for this run, every path capped, its events replaced by the flaps."""
    paths = []
    for index, spec in enumerate(base.paths):
        forward = dataclasses.replace(spec.forward, bandwidth_mbps=args.rate_mbps)
        reverse = dataclasses.replace(spec.reverse, bandwidth_mbps=args.rate_mbps)
        events: tuple[PathEvent, ...] = ()
        if index == args.flap_path:
            times = []
            t = args.flap_every
            while t < args.duration + args.flap_every:
                times += [PathEvent(at_s=t, down=True), PathEvent(at_s=t + args.down_s, down=False)]
                t += args.flap_every
            events = tuple(times)
        paths.append(dataclasses.replace(spec, forward=forward, reverse=reverse, events=events))
    return dataclasses.replace(base, name=f"soak{os.getpid()}-{base.name}", paths=tuple(paths))


def write_config(path: Path, site: str, pki: Path, own: list[str], peer: str, theirs: list[str],
                 warm_s: int, in_flight: int) -> None:
    lines = [f'site = "{site}"', f'identity = "{pki / site}"', f'ca = "{pki / "ca.pem"}"',
             "listen = [" + ", ".join(f'"{a}:{PORT + k}"' for k, a in enumerate(own)) + "]",
             f'data_dir = "{path.parent / (site + "-data")}"',
             f'send_roots = ["{path.parent}"]',  # the sources are made next to the configs
             "[limits]", f"concurrent_transfers = {in_flight}",
             "[transfer]", f"warm_seconds = {warm_s}", 'checkpoint_bytes = "8MiB"',
             "[[peers]]", f'name = "{peer}"',
             "paths = [" + ", ".join(f'"{a}:{PORT + k}"' for k, a in enumerate(theirs)) + "]"]
    path.write_text("\n".join(lines) + "\n")


def proc_sample(pid: int) -> dict[str, int]:
    """RssAnon (KiB) and open fds of ``pid``."""
    rss = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                rss = int(line.split()[1])
    return {"rss_anon_kib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Soak:
    """One run: the emulation, two daemons, the workload, the sampler."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.scenario = soak_scenario(resolve_scenario(args.scenario), args)
        self.emu = Emulation(self.scenario, backend="engine")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.configs: dict[str, Path] = {}
        self.sources: list[tuple[Path, str]] = []
        self.samples: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.done = 0
        self.bytes_verified = 0
        self.bytes_done_final = 0
        self.active: dict[str, dict[str, Any]] = {}  # id -> {dest, source, digest, bytes_done}
        self.reloads_sent = 0
        self.start = 0.0
        self.next_write_s = 60.0
        self.cleanup: dict[str, Any] = {}
        # per daemon: its anonymous memory by mapping at the second quarter's start and now
        self.maps: dict[str, dict[str, dict[str, int]]] = {}

    # -- set-up -----------------------------------------------------------

    def make_sources(self) -> None:
        rng = random.Random(self.args.seed)
        for k in range(self.args.sources):
            path = self.work / f"source-{k}.bin"
            with open(path, "wb") as fh:
                fh.write(rng.randbytes(self.args.file_size))
            self.sources.append((path, sha256_of(path)))

    def write_configs(self, warm_s: int) -> None:
        a = [p.a_addr for p in self.emu.paths]
        b = [p.b_addr for p in self.emu.paths]
        pki = self.work / "pki"
        write_config(self.configs["gw-a"], "gw-a", pki, a, "gw-b", b, warm_s, self.args.in_flight)
        write_config(self.configs["gw-b"], "gw-b", pki, b, "gw-a", a, warm_s, self.args.in_flight)

    def start_daemons(self) -> None:
        make_test_pki(self.work / "pki", list(SITES), days=30)
        self.configs = {site: self.work / f"{site}.toml" for site in SITES}
        self.write_configs(warm_s=300)
        env = {**os.environ, **unit_environment(UNIT),
               "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        for site, side in (("gw-b", "b"), ("gw-a", "a")):
            with open(self.work / f"{site}.log", "ab") as log:
                self.procs[site] = self.emu.popen(
                    side, [sys.executable, "-m", "wanxport", "gateway", "-v", str(self.configs[site])],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
                    start_new_session=True)
        deadline = time.monotonic() + 60
        for site in SITES:
            client = self.client(site)
            while True:
                if self.procs[site].poll() is not None:
                    raise RuntimeError(f"{site} exited at start: {self.log_tail(site)}")
                try:
                    client.status()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{site}: API not up after 60 s: {self.log_tail(site)}") from None
                    time.sleep(0.2)

    def client(self, site: str) -> GatewayClient:
        return GatewayClient(str(self.work / f"{site}-data" / "api.sock"), timeout_s=30)

    def log_tail(self, site: str) -> str:
        lines = (self.work / f"{site}.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no output"

    def reloads_applied(self, site: str) -> int:
        """The daemon's one line per reload it took (``reload: <diff>``; refusals say
        ``reload refused``)."""
        return (self.work / f"{site}.log").read_text(errors="replace").count("reload: ")

    # -- the run ----------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.start

    async def workload(self) -> None:
        """Keep ``in_flight`` transfers submitted; verify and delete each one done."""
        client = self.client("gw-a")
        received = self.work / "gw-b-data" / "received" / "gw-a"
        serial = 0
        while True:
            while len(self.active) < self.args.in_flight and self.now() < self.args.duration:
                source, digest = self.sources[serial % len(self.sources)]
                dest = f"soak-{serial:06d}.bin"
                t = await asyncio.to_thread(client.submit, "gw-b", str(source), dest,
                                            key=f"soak-{serial}")
                self.active[t["id"]] = {"dest": dest, "digest": digest, "bytes_done": 0,
                                        "submitted_s": round(self.now(), 1)}
                serial += 1
            if not self.active:
                return
            await asyncio.sleep(0.2)
            for tid, info in list(self.active.items()):
                t = await asyncio.to_thread(client.get, tid)
                info["bytes_done"] = t.get("bytes_done") or 0
                if t["state"] not in FINAL_STATES:
                    continue
                del self.active[tid]
                if t["state"] != "done":
                    self.failures.append({"t_s": round(self.now(), 1), "id": tid, "state": t["state"],
                                          "reason": t.get("reason")})
                    continue
                path = received / info["dest"]
                got = await asyncio.to_thread(sha256_of, path)
                if got != info["digest"]:
                    self.failures.append({"t_s": round(self.now(), 1), "id": tid, "state": "corrupt",
                                          "reason": f"SHA-256 {got} != {info['digest']}"})
                else:
                    self.bytes_verified += self.args.file_size
                    self.done += 1
                self.bytes_done_final += self.args.file_size
                path.unlink()

    async def reloader(self) -> None:
        """SIGHUP both daemons every ``reload_every`` s, with a changed config each time."""
        await asyncio.sleep(self.args.reload_every / 2)
        while True:
            self.reloads_sent += 1
            self.write_configs(warm_s=300 + self.reloads_sent % 2)
            for proc in self.procs.values():
                proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(self.args.reload_every)

    async def sampler(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.args.sample_every)

    async def sample(self) -> None:
        row: dict[str, Any] = {"t_s": round(self.now(), 2)}
        moved = self.bytes_done_final + sum(i["bytes_done"] for i in self.active.values())
        row.update(bytes_moved=moved, bytes_verified=self.bytes_verified, transfers_done=self.done,
                   failures=len(self.failures), flap_down=self.flap_down(self.now()))
        for site in SITES:
            proc = self.procs[site]
            if proc.poll() is not None:
                raise RuntimeError(f"{site} exited ({proc.returncode}): {self.log_tail(site)}")
            status = await asyncio.to_thread(self.client(site).status)
            row[site] = {**proc_sample(proc.pid), "tasks": status["asyncio_tasks"],
                         "reloads": self.reloads_applied(site)}
            maps = self.maps.setdefault(site, {})
            maps["now"] = anon_by_mapping(proc.pid)
            if "q2" not in maps and row["t_s"] >= self.args.duration / 4:
                maps["q2"] = maps["now"]
        self.samples.append(row)
        if row["t_s"] >= self.next_write_s:
            self.next_write_s += 60
            self.write_report(None, complete=False)
        print(f"t={row['t_s']:7.1f}s verified {self.bytes_verified / 2**30:7.2f} GiB "
                  f"done {self.done} failures {len(self.failures)} "
                  + " ".join(f"{s}: rss {row[s]['rss_anon_kib'] / 1024:.1f} MiB fds {row[s]['fds']} "
                             f"tasks {row[s]['tasks']}" for s in SITES), flush=True)

    def flap_down(self, t: float) -> bool:
        period = self.args.flap_every
        return t >= period and (t % period) < self.args.down_s

    async def run(self) -> None:
        self.start = time.monotonic()
        self.emu.start_events()
        tasks = [asyncio.create_task(self.reloader()), asyncio.create_task(self.sampler())]
        try:
            work = asyncio.create_task(self.workload())
            done, _ = await asyncio.wait([work, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a sampler or reloader error ends the run with it
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.sample()

    def report(self, error: str | None, complete: bool) -> dict[str, Any]:
        args, samples = self.args, self.samples
        return {
            "benchmark": "soak", "complete": complete, "scenario": args.scenario,
            "duration_s": args.duration, "rate_mbps_per_path": args.rate_mbps,
            "paths": len(self.scenario.paths), "flap_path": self.scenario.paths[args.flap_path].name,
            "flap_every_s": args.flap_every, "down_s": args.down_s, "reload_every_s": args.reload_every,
            "file_size": args.file_size, "in_flight": args.in_flight, "error": error,
            "transfers_done": self.done, "bytes_verified": self.bytes_verified,
            "failures": self.failures, "reloads_sent": self.reloads_sent,
            "flaps": int(samples[-1]["t_s"] // args.flap_every) if samples else 0,
            "cleanup": self.cleanup, "daemon_environment": unit_environment(UNIT),
            "smaps_growth": self.smaps_growth(),
            "verdict": verdict(samples, args.duration) if samples else None,
            "samples": columns(samples) if samples else None,
        }

    def smaps_growth(self) -> dict[str, Any]:
        """Per daemon, where its anonymous memory grew since the second quarter began:
        the largest changes (KiB) by mapping kind and by mapping (``smaps.py``)."""
        out: dict[str, Any] = {}
        for site, maps in self.maps.items():
            if "q2" in maps:
                out[site] = {"by_kind": diff(by_kind(maps["q2"]), by_kind(maps["now"])),
                             "by_mapping": diff(maps["q2"], maps["now"])}
        return out

    def write_report(self, error: str | None, complete: bool) -> dict[str, Any]:
        """``soak.json``, replaced atomically: a run cut short still leaves its samples."""
        report = self.report(error, complete)
        path = self.args.out / "soak.json"
        tmp = path.with_name(".soak.json.tmp")
        tmp.write_text(json.dumps(report, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
        return report

    # -- tear-down --------------------------------------------------------

    def stop(self) -> None:
        """SIGTERM the daemons (kill after 15 s), remove the namespaces; record what was left."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for site, proc in self.procs.items():
            try:
                codes[site] = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[site] = proc.wait()
        removed = self.emu.down()
        self.cleanup = {"daemon_exit_codes": codes, "removed": removed,
                        "namespaces_left": sorted(set(self.emu.plan.namespaces) & set(
                            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
                            .stdout.split()))}


def verdict(samples: list[dict[str, Any]], duration: float) -> dict[str, Any]:
    """Per daemon: median RssAnon of the last window vs the second quarter's median."""
    last_window = min(LAST_WINDOW_S, duration / 4)
    end = samples[-1]["t_s"] if samples else 0.0
    out: dict[str, Any] = {"tolerance": TOLERANCE, "last_window_s": last_window,
                           "second_quarter_s": [duration / 4, duration / 2]}
    ok = True
    for site in SITES:
        q2 = [s[site]["rss_anon_kib"] for s in samples if duration / 4 <= s["t_s"] < duration / 2]
        last = [s[site]["rss_anon_kib"] for s in samples if s["t_s"] >= end - last_window]
        if not q2 or not last:
            out[site] = {"error": "too few samples"}
            ok = False
            continue
        m2, ml = statistics.median(q2), statistics.median(last)
        change = (ml - m2) / m2
        out[site] = {"q2_median_kib": m2, "last_median_kib": ml, "change": round(change, 4)}
        ok = ok and abs(change) <= TOLERANCE
    out["pass"] = ok
    return out


def columns(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples as columns (compact JSON)."""
    cols: dict[str, Any] = {k: [s[k] for s in samples] for k in samples[0] if k not in SITES}
    for site in SITES:
        cols[site] = {k: [s[site][k] for s in samples] for k in samples[0][site]}
    return cols


def plot(samples: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    for site in SITES:
        axes[0].plot(t, [s[site]["rss_anon_kib"] / 1024 for s in samples], label=site)
        axes[1].plot(t, [s[site]["fds"] for s in samples], label=site)
        axes[2].plot(t, [s[site]["tasks"] for s in samples], label=site)
    goodput = [0.0] + [
        8 * (b["bytes_moved"] - a["bytes_moved"]) / max(b["t_s"] - a["t_s"], 1e-9) / 1e6
        for a, b in zip(samples, samples[1:], strict=False)]
    axes[3].plot(t, goodput, color="black")
    for sample in samples:
        if sample["flap_down"]:  # shade the samples taken while the flapping path was down
            axes[3].axvline(sample["t_s"] / 60, color="red", alpha=0.15, linewidth=3)
    for ax, label in zip(axes, ("RssAnon (MiB)", "open fds", "asyncio tasks", "goodput (Mb/s)"),
                         strict=True):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for ax in axes[:3]:
        ax.legend(loc="upper left")
    axes[3].set_xlabel("minutes")
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=parse_duration, default=3600.0, help="1h, 10m, 45s")
    parser.add_argument("--scenario", default="clean-2path", help="a bundled scenario name or file")
    parser.add_argument("--out", type=Path, default=Path("soak-out"))
    parser.add_argument("--rate-mbps", type=float, default=100.0,
                        help="cap of every path, each way (default: about 80 %% of what this host moved)")
    parser.add_argument("--flap-path", type=int, default=1, help="index of the path that flaps")
    parser.add_argument("--flap-every", type=parse_duration, default=60.0)
    parser.add_argument("--down-s", type=float, default=10.0)
    parser.add_argument("--reload-every", type=parse_duration, default=60.0)
    parser.add_argument("--sample-every", type=parse_duration, default=10.0)
    parser.add_argument("--file-size", type=int, default=32 << 20, help="bytes per transfer")
    parser.add_argument("--sources", type=int, default=3, help="distinct random source files")
    parser.add_argument("--in-flight", type=int, default=2, help="transfers kept submitted")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args(argv)
    if args.down_s >= args.flap_every:
        parser.error("--down-s must be shorter than --flap-every")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("soak: needs root (network namespaces)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wanxport-soak-"))
    soak = Soak(args, work)
    if not 0 <= args.flap_path < len(soak.scenario.paths):
        print(f"soak: --flap-path {args.flap_path}: the scenario has {len(soak.scenario.paths)} paths",
              file=sys.stderr)
        return 2
    error = None
    main_pid = os.getpid()
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        """SIGINT (Ctrl-C) and SIGTERM end the run; the finally below cleans up either way.

        pyroute2 forks helpers into the namespaces and ends them with SIGTERM: they
        inherit this handler and must just exit, not run our clean-up.
        """
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        if not stopping:
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_term)  # also when started in the background (SIGINT ignored)
        signal.signal(signal.SIGTERM, on_term)
        soak.make_sources()
        soak.emu.up()
        soak.start_daemons()
        asyncio.run(soak.run())
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as exc:  # the report still records what ran
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stopping = True  # a second Ctrl-C or SIGTERM must not stop the clean-up
        soak.stop()
        logs = {site: str(args.out / f"{site}.log") for site in SITES}
        for site in SITES:
            if (work / f"{site}.log").exists():
                shutil.copy(work / f"{site}.log", logs[site])
        shutil.rmtree(work, ignore_errors=True)
    report = soak.write_report(error, complete=True)
    if soak.samples:
        plot(soak.samples, args.out / "soak.png",
             f"soak: {args.scenario}, {len(soak.scenario.paths)} paths at {args.rate_mbps:g} Mb/s, "
             f"flap every {args.flap_every:g} s, reload every {args.reload_every:g} s")
    v = report["verdict"]
    summary = (f"soak: {args.duration:g} s, {soak.done} transfers, {soak.bytes_verified / 2**30:.2f} GiB "
               f"verified, {len(soak.failures)} failures, {soak.reloads_sent} reloads"
               + (f", error: {error}" if error else ""))
    print(summary)
    if v is not None:
        for site in SITES:
            print(f"  {site}: {v[site]}")
            growth = report["smaps_growth"].get(site)
            if growth:
                print(f"    anonymous KiB since the second quarter, by mapping kind: {growth['by_kind'][:4]}")
        print(f"verdict: {'PASS' if v['pass'] else 'FAIL'} (median RssAnon of the last "
              f"{v['last_window_s']:g} s within {TOLERANCE:.0%} of the second quarter's)")
    return 1 if error or soak.failures or v is None or not v["pass"] else 0


if __name__ == "__main__":
    sys.exit(main())
