"""Datagrams rejected by reconnect churn alone: what the rejection alert must stay above.

When a gateway restarts, its peer's datagrams of the old session keep arriving for a
moment (and the old session's were in flight towards the restarted one): the receiving
side counts them in ``wanxport_datagrams_rejected_total`` (``no_session``, ``conn``,
``quic``, ...), though nobody attacks. This measures how many, at a churn rate far
above what a site sees: two daemons on loopback, gw-a steady, gw-b restarted again and
again for ``--duration`` seconds (killed with SIGKILL and SIGTERM in turn), each time
after its session with gw-a is back and a transfer each way is under way.
gw-a's counters are read from its /metrics at the end; gw-b's are read just before
each of its deaths and summed (as ``increase()`` sums across a counter's resets).
It prints the totals by reason and the rate per 5 minutes (the alert's window). Usage:

    PYTHONPATH=.:tests .venv/bin/python benchmarks/reconnect_churn.py [--duration 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from daemon_helpers import NotifyListener, make_pki, start_daemon, write_config
from gateway_helpers import free_path_ports

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config

REJECTED = re.compile(r'^wanxport_datagrams_rejected_total\{reason="([^"]+)"\} (\S+)$', re.MULTILINE)
WINDOW_S = 300.0


def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rejected(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {reason: int(float(value)) for reason, value in REJECTED.findall(text)}


def _until(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _session_with(client: GatewayClient, instance: object) -> bool:
    """gw-a has a live session with gw-b's ``instance`` (None: with any instance of it)."""
    [peer] = [p for p in client.status()["peers"] if p["name"] == "gw-b"]
    session = peer["session"]
    return session is not None and (instance is None or session["peer_instance"] == instance)


def _ready(notify: NotifyListener) -> None:
    while notify.next(timeout=60).get("READY") != "1":
        pass  # a STOPPING=1 of the previous gw-b


def measure(directory: Path, duration_s: float) -> dict[str, object]:
    pki = make_pki(directory / "pki")
    a_ports, b_ports = free_path_ports(2), free_path_ports(2)
    metrics = {"a": _free_tcp_port(), "b": _free_tcp_port()}
    a_cfg = write_config(directory / "a.toml", "gw-a", pki, a_ports, {"gw-b": b_ports},
                         f'metrics = "127.0.0.1:{metrics["a"]}"')
    b_cfg = write_config(directory / "b.toml", "gw-b", pki, b_ports, {"gw-a": a_ports},
                         f'metrics = "127.0.0.1:{metrics["b"]}"')
    src = directory / "churn.bin"
    src.write_bytes(os.urandom(64 << 20))
    a_notify, b_notify = NotifyListener(directory / "a.sock"), NotifyListener(directory / "b.sock")
    a = start_daemon(a_cfg, a_notify)
    _ready(a_notify)
    client = GatewayClient(str(load_config(a_cfg).api_socket))
    b_client = GatewayClient(str(load_config(b_cfg).api_socket))
    b_total: dict[str, int] = {}
    restarts = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < duration_s:
            b = start_daemon(b_cfg, b_notify)
            try:
                _ready(b_notify)
                instance = b_client.status()["instance"]
                _until(lambda i=instance: _session_with(client, i), 30, "the session with the new gw-b")
                transfer = client.submit("gw-b", str(src), f"churn-{restarts}.bin", overwrite=True)
                back = b_client.submit("gw-a", str(src), f"churn-{restarts}.bin", overwrite=True)
                _until(lambda t=transfer: client.get(t["id"])["state"] != "queued", 30, "the transfer")
                _until(lambda t=back: b_client.get(t["id"])["state"] != "queued", 30, "the transfer back")
                time.sleep(0.3)  # data in flight both ways when gw-b dies
                for reason, value in rejected(metrics["b"]).items():
                    b_total[reason] = b_total.get(reason, 0) + value
            finally:
                b.send_signal(signal.SIGKILL if restarts % 2 == 0 else signal.SIGTERM)
                b.wait(60)
            restarts += 1
        elapsed = time.monotonic() - started
        _until(lambda: not _session_with(client, None), 60, "gw-a to notice gw-b is gone")
        a_total = rejected(metrics["a"])
    finally:
        a.send_signal(signal.SIGTERM)
        a.wait(60)
        a_notify.close()
        b_notify.close()
    per_window = {side: {reason: round(value * WINDOW_S / elapsed)
                         for reason, value in total.items() if value}
                  for side, total in (("gw-a", a_total), ("gw-b", b_total))}
    return {"duration_s": round(elapsed, 1), "restarts": restarts,
            "restarts_per_minute": round(restarts * 60 / elapsed, 1),
            "rejected_total": {"gw-a": a_total, "gw-b": b_total}, "rejected_per_5_minutes": per_window}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of churn (default 60)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wanxport-churn-") as tmp:
        result = measure(Path(tmp), args.duration)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
