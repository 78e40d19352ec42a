"""CPU per GB of the gateway daemon's file path, beside the API path's, on loopback.

Each run, alternated: ``wanxport bench`` (the API path: two processes, one
payload in memory, the host's AES-GCM and BLAKE3 limits measured around it) and
the same number of bytes as a file through two ``wanxport gateway`` daemons
(``wanxport transfer submit``, the file dropped from the page cache first, so
the daemon reads it from the disk as a fresh file). A daemon's CPU by thread
role is read from its own ``wanxport_cpu_seconds_total{role}`` before the
submit and after the transfer is done; the clock runs from the submit command's
start to the first poll that finds the transfer done (every 0.1 s, as `wanxport transfer wait` polls). Every
received file's SHA-256 is checked against the source's. Needs no root:
loopback paths on free ports.

    PYTHONPATH=.:tests .venv/bin/python benchmarks/daemon_cpu.py [--size 1GiB] [--paths 4]
        [--runs 3] [--out docs/results/data/daemon/cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bigfile import sha256_streamed, stop_daemon, wait_api, write_source
from daemon_helpers import make_pki, start_daemon, two_sites
from gateway_helpers import free_path_ports
from prometheus_client.parser import text_string_to_metric_families

from wanxport.aio.threadcpu import ROLES
from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.units import parse_size

POLL_S = 0.1  # as `wanxport transfer wait` polls (GatewayClient.wait)


def cpu_by_role(url: str) -> dict[str, float]:
    """A daemon's ``wanxport_cpu_seconds_total`` by role, scraped now."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["role"]: sample.value
            for family in text_string_to_metric_families(text) if family.name == "wanxport_cpu_seconds"
            for sample in family.samples if sample.name == "wanxport_cpu_seconds_total"}


def with_metrics(config: Path, port: int) -> str:
    """Give the daemon ``config`` a metrics endpoint on ``port``; its URL."""
    config.write_text(f'metrics = "127.0.0.1:{port}"\n' + config.read_text())
    return f"http://127.0.0.1:{port}/metrics"


def per_gb(roles: dict[str, float], size: int) -> float:
    return round(sum(roles.values()) / (size / 1e9), 4)


def daemon_run(directory: Path, source: Path, size: int, paths: int, index: int) -> dict[str, Any]:
    """One file through two fresh daemons: each end's CPU by role, the time, the check."""
    run_dir = directory / f"run{index}"
    run_dir.mkdir()
    a_cfg, b_cfg = two_sites(run_dir, directory / "pki", n_paths=paths)
    ports = free_path_ports(2)
    urls = {"sender": with_metrics(a_cfg, ports[0]), "receiver": with_metrics(b_cfg, ports[1])}
    sent = run_dir / source.name
    os.link(source, sent)  # under the sender's send root (its config's directory)
    fd = os.open(sent, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the disk, as a fresh file is
    os.close(fd)
    procs = {"receiver": start_daemon(b_cfg), "sender": start_daemon(a_cfg)}
    try:
        client = GatewayClient(str(load_config(a_cfg).api_socket))
        wait_api(GatewayClient(str(load_config(b_cfg).api_socket)), procs["receiver"])
        wait_api(client, procs["sender"])
        before = {end: cpu_by_role(url) for end, url in urls.items()}
        t0 = time.monotonic()
        submit = subprocess.run([sys.executable, "-m", "wanxport", "transfer", "--config", str(a_cfg),
                                 "submit", "gw-b", str(sent), "--dest", "file.bin"],
                                capture_output=True, text=True, check=False)
        if submit.returncode != 0:
            raise RuntimeError(f"wanxport transfer submit failed: {submit.stderr.strip()}")
        transfer = json.loads(submit.stdout)
        while (state := client.get(transfer["id"]))["state"] not in ("done", "failed", "cancelled"):
            if any(proc.poll() is not None for proc in procs.values()):
                raise RuntimeError("a daemon exited during the transfer")
            time.sleep(POLL_S)
        completion_s = time.monotonic() - t0
        after = {end: cpu_by_role(url) for end, url in urls.items()}
    finally:
        for proc in procs.values():
            stop_daemon(proc)
    if state["state"] != "done":
        raise RuntimeError(f"the transfer ended {state['state']}: {state.get('reason')}")
    dest = load_config(b_cfg).received_dir / "gw-a" / "file.bin"
    intact = sha256_streamed(dest) == sha256_streamed(source)
    dest.unlink()
    sent.unlink()
    cpu = {end: {role: round(after[end][role] - before[end][role], 4) for role in ROLES} for end in urls}
    return {"path": "daemon", "completion_s": round(completion_s, 3),
            "goodput_bps": round(size * 8 / completion_s), "intact": intact, "cpu": cpu,
            "cpu_s_per_gb": {end: per_gb(roles, size) for end, roles in cpu.items()}}


def bench_run(size: int, size_arg: str, paths: int) -> dict[str, Any]:
    """``wanxport bench`` with the same bytes and paths, and the host's AEAD + digest limits."""
    out = subprocess.run([sys.executable, "-m", "wanxport", "bench", "--paths", str(paths),
                          "--size", size_arg, "--mtu", "1500", "--baseline", "aead", "--baseline", "digest",
                          "--json"], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    return {"path": "api", "completion_s": report["completion_s"], "goodput_bps": report["goodput_bps"],
            "intact": report["intact"], "cpu": report["cpu"], "cpu_s_per_gb": report["cpu_s_per_gb"],
            "cpu_limit_s_per_gb": report["cpu_limit_s_per_gb"]}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per path and end; each end's CPU per GB against the limit of the runs' bench."""
    limit = statistics.median(r["cpu_limit_s_per_gb"] for r in runs if r["path"] == "api")
    out: dict[str, Any] = {"cpu_limit_s_per_gb": limit}
    for path in ("api", "daemon"):
        mine = [r for r in runs if r["path"] == path]
        entry: dict[str, Any] = {"completion_s": statistics.median(r["completion_s"] for r in mine),
                                 "all_intact": all(r["intact"] for r in mine)}
        for end in ("sender", "receiver"):
            gb = statistics.median(r["cpu_s_per_gb"][end] for r in mine)
            entry[end] = {"cpu_s_per_gb": gb, "vs_limit": round(gb / limit, 2),
                          "roles_s_per_gb": {role: round(statistics.median(
                              r["cpu"][end][role] / (r["size_bytes"] / 1e9) for r in mine), 4)
                              for role in ROLES}}
        out[path] = entry
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="runs of each path, alternated")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="write the runs and their medians here (JSON)")
    parser.add_argument("--only", choices=("api", "daemon"), help="run one path alone")
    parser.add_argument("--json", action="store_true",
                        help="print each run's report as one JSON line (for benchmarks/ab_emulated.py)")
    args = parser.parse_args()
    size = parse_size(args.size)
    if args.paths < 1 or args.runs < 1 or size < 1:
        parser.error("--paths, --runs and --size must be positive")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="wx-daemon-cpu-") as tmp:
        directory = Path(tmp)
        make_pki(directory / "pki")
        source = directory / "source.bin"
        write_source(source, size, args.seed)
        for index in range(args.runs):
            if args.only != "daemon":
                runs.append(bench_run(size, args.size, args.paths))
            if args.only != "api":
                runs.append(daemon_run(directory, source, size, args.paths, index))
            for run in runs[-2 if args.only is None else -1:]:
                run["size_bytes"] = size
                print(f"{run['path']:>6}: {run['completion_s']:.2f} s, CPU-s/GB sender "
                      f"{run['cpu_s_per_gb']['sender']:.3f} receiver {run['cpu_s_per_gb']['receiver']:.3f}"
                      f"{'' if run['intact'] else ' NOT INTACT'}", file=sys.stderr)
                if args.json:
                    print(json.dumps(run), flush=True)
    report = {"benchmark": "daemon_cpu", "size_bytes": size, "paths": args.paths, "runs": runs,
              "summary": summary(runs) if args.only is None else None}
    if not args.json:
        print(json.dumps(report["summary"], indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["intact"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
