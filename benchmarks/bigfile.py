"""A file larger than this host's memory through two gateway daemons, with memory watched.

Two ``wanxport gateway`` processes on loopback paths; a random-content source file
of ``--size`` (default 32 GiB: more than this 24 GiB host's RAM) is submitted with
``wanxport transfer submit``. Every second the benchmark samples both daemons'
``RssAnon`` and ``RssFile`` (``/proc/PID/status``) and the host's ``Cached`` and
``Dirty`` (``/proc/meminfo``), and the transfer's progress. At the end it checks
the received file's SHA-256 against the source's, then writes a JSON report and
a figure, and deletes both files.

The source is written fast and not periodic: one random block (numpy, seeded)
repeated with a per-block counter stamped into every 4 KiB page, hashed as it is
written, synced and dropped from the page cache block by block, so the transfer
starts from a cold file. The destination's SHA-256 needs one more pass over it
(the daemon verifies every piece's digest as it arrives; this is the whole-file
check on top): read piece by piece and dropped from the page cache behind, so
the check itself does not fill the cache.

Refuses (one line, exit 2) unless source + destination fit on the disk with 8 GB
to spare. Timing on a shared 2-core host is noisy. Usage:

    PYTHONPATH=.:tests .venv/bin/python benchmarks/bigfile.py [--size 32GiB] [--dir DIR]
        [--paths 2] [--memory-budget 1GiB] [--json OUT.json] [--png OUT.png]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from daemon_helpers import make_pki, start_daemon, two_sites

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.units import parse_size

SPARE_BYTES = 8_000_000_000
BLOCK = 256 << 20
MEMINFO = ("MemTotal", "MemAvailable", "Cached", "Dirty", "Writeback")
STATUS = ("RssAnon", "RssFile", "RssShmem", "VmRSS")


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in MEMINFO:
                out[key] = int(rest.split()[0]) * 1024
    return out


def proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in STATUS:
                out[key] = int(rest.split()[0]) * 1024
    return out


def cpu_seconds(pid: int) -> float:
    """User + system time of the process, all threads (/proc/PID/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_source(path: Path, size: int, seed: int) -> str:
    """A non-periodic random file of ``size`` bytes, synced and out of the page cache; its SHA-256."""
    block = np.random.default_rng(seed).integers(0, 256, BLOCK, dtype=np.uint8)
    stamps = block.view(np.uint64)[:: 4096 // 8]  # the first 8 bytes of every 4 KiB page
    pages = np.arange(stamps.size, dtype=np.uint64)
    digest = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for index, offset in enumerate(range(0, size, BLOCK)):
            stamps[:] = (np.uint64(index) << np.uint64(32)) | pages
            chunk = memoryview(block)[: min(BLOCK, size - offset)]
            digest.update(chunk)
            written = 0
            while written < len(chunk):
                written += os.write(fd, chunk[written:])
            os.fdatasync(fd)
            os.posix_fadvise(fd, offset, len(chunk), os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return digest.hexdigest()


def sha256_streamed(path: Path, piece: int = 64 << 20) -> str:
    """SHA-256 of a file read piece by piece, each piece dropped from the page cache after."""
    digest = hashlib.sha256()
    buf = bytearray(piece)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        offset = 0
        while True:
            n = os.readv(fd, [view])
            if n == 0:
                break
            digest.update(view[:n])
            os.posix_fadvise(fd, offset, n, os.POSIX_FADV_DONTNEED)
            offset += n
    finally:
        os.close(fd)
    return digest.hexdigest()


def wait_api(client: GatewayClient, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a daemon exited at start (status {proc.returncode})")
        try:
            client.status()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("a daemon's API did not answer within 60 s")


def stop_daemon(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace, directory: Path, size: int) -> dict[str, Any]:
    pki = make_pki(directory / "pki")
    budget = parse_size(args.memory_budget)
    extra = f'[limits]\nmemory_budget = "{args.memory_budget}"\n[transfer]\ncheckpoint_bytes = "{args.piece}"'
    a_cfg, b_cfg = two_sites(directory, pki, n_paths=args.paths, extra=extra)
    source = directory / "source.bin"
    print(f"writing {size / 2**30:.1f} GiB of random content to {source}", file=sys.stderr)
    started = time.monotonic()
    source_sha = write_source(source, size, args.seed)
    generate_s = time.monotonic() - started
    print(f"source written in {generate_s:.0f} s (sha256 {source_sha[:16]}...)", file=sys.stderr)
    receiver = start_daemon(b_cfg)
    sender = start_daemon(a_cfg)
    dest = load_config(b_cfg).received_dir / "gw-a" / "bigfile.bin"
    samples: list[dict[str, Any]] = []
    try:
        client = GatewayClient(str(load_config(a_cfg).api_socket))
        wait_api(GatewayClient(str(load_config(b_cfg).api_socket)), receiver)
        wait_api(client, sender)
        cpu0 = {"sender": cpu_seconds(sender.pid), "receiver": cpu_seconds(receiver.pid)}
        submit = subprocess.run([sys.executable, "-m", "wanxport", "transfer", "--config", str(a_cfg),
                                 "submit", "gw-b", str(source), "--dest", "bigfile.bin"],
                                capture_output=True, text=True, check=True)
        transfer = json.loads(submit.stdout)
        t0 = time.monotonic()
        while True:
            now = time.monotonic() - t0
            state = client.get(transfer["id"])
            row: dict[str, Any] = {"t": round(now, 2), "bytes_done": state.get("bytes_done", 0),
                                   **{f"host_{k}": v for k, v in meminfo().items()}}
            for role, proc in (("sender", sender), ("receiver", receiver)):
                row.update({f"{role}_{k}": v for k, v in proc_status(proc.pid).items()})
            samples.append(row)
            if state["state"] in ("done", "failed", "cancelled"):
                break
            if sender.poll() is not None or receiver.poll() is not None:
                raise RuntimeError("a daemon exited during the transfer")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - now)))
        duration = time.monotonic() - t0
        cpu = {"sender": cpu_seconds(sender.pid) - cpu0["sender"],
               "receiver": cpu_seconds(receiver.pid) - cpu0["receiver"]}
    finally:
        stop_daemon(sender)
        stop_daemon(receiver)
    if state["state"] != "done":
        raise RuntimeError(f"the transfer ended {state['state']}: {state.get('reason')}")
    print(f"transfer done in {duration:.0f} s; checking the received file's SHA-256", file=sys.stderr)
    started = time.monotonic()
    dest_sha = sha256_streamed(dest)
    check_s = time.monotonic() - started
    for path in (source, dest):
        path.unlink(missing_ok=True)

    def peak(key: str) -> int:
        return max(int(s.get(key, 0)) for s in samples)

    first = samples[0]
    return {
        "benchmark": "bigfile", "size_bytes": size, "paths": args.paths,
        "piece_bytes": parse_size(args.piece),
        "memory_budget_bytes": budget, "host_mem_total_bytes": first["host_MemTotal"],
        "intact": dest_sha == source_sha, "sha256": source_sha, "received_sha256": dest_sha,
        "transfer_s": round(duration, 1), "goodput_gbps": round(size * 8 / duration / 1e9, 3),
        "generate_s": round(generate_s, 1), "check_s": round(check_s, 1),
        "cpu_s_per_gb": {role: round(c / (size / 1e9), 3) for role, c in cpu.items()},
        "daemon_stats": state.get("stats"),
        "peaks": {
            "sender_rss_anon": peak("sender_RssAnon"), "receiver_rss_anon": peak("receiver_RssAnon"),
            "sender_rss_file": peak("sender_RssFile"), "receiver_rss_file": peak("receiver_RssFile"),
            "host_cached": peak("host_Cached"), "host_dirty": peak("host_Dirty"),
            "host_writeback": peak("host_Writeback"),
        },
        "at_start": {"host_cached": first["host_Cached"], "host_dirty": first["host_Dirty"]},
        "anon_within_budget": max(peak("sender_RssAnon"), peak("receiver_RssAnon")) <= budget,
        "samples": samples,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    t = [s["t"] for s in samples]
    gib = 2 ** 30
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for key, label in (("sender_RssAnon", "sender RssAnon"), ("receiver_RssAnon", "receiver RssAnon"),
                       ("sender_RssFile", "sender RssFile"), ("receiver_RssFile", "receiver RssFile"),
                       ("host_Cached", "host Cached"), ("host_Dirty", "host Dirty")):
        top.plot(t, [s.get(key, 0) / gib for s in samples], label=label)
    top.axhline(report["memory_budget_bytes"] / gib, color="k", ls="--", lw=0.8, label="memory_budget")
    top.set_ylabel("GiB")
    top.set_title(f"{report['size_bytes'] / gib:.0f} GiB through two daemons on a "
                  f"{report['host_mem_total_bytes'] / gib:.0f} GiB host "
                  f"({report['goodput_gbps']:.2f} Gb/s, intact: {report['intact']})")
    top.legend(fontsize=8, ncol=2)
    bottom.plot(t, [s["bytes_done"] / gib for s in samples], color="tab:green")
    bottom.set_ylabel("GiB acknowledged")
    bottom.set_xlabel("seconds since submission")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def compact(report: dict[str, Any]) -> str:
    return json.dumps(report, separators=(",", ":")) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="32GiB", help="source file size (default 32GiB)")
    parser.add_argument("--dir", type=Path, help="where both files go (default: a temporary directory)")
    parser.add_argument("--paths", type=int, default=2)
    parser.add_argument("--memory-budget", default="1GiB", help="the daemons' [limits] memory_budget")
    parser.add_argument("--piece", default="64MiB", help="the daemons' [transfer] checkpoint_bytes")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        print(f"bigfile: --size: {exc}", file=sys.stderr)
        return 2
    base = args.dir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if 2 * size + SPARE_BYTES > free:
        fits = max(0, (free - SPARE_BYTES) // 2) >> 30
        print(f"bigfile: {base} has {free / 1e9:.1f} GB free; source + destination of {args.size} "
              f"need {(2 * size + SPARE_BYTES) / 1e9:.1f} GB with 8 GB to spare "
              f"(at most --size {fits}GiB fits now)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="wanxport-bigfile-", dir=base) as tmp:
        report = run(args, Path(tmp), size)
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(compact(report))
    if args.png is not None:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(report, args.png)
    return 0 if report["intact"] else 1


if __name__ == "__main__":
    sys.exit(main())
