"""Shared helpers of the daemon tests: a PKI, two gateways' configs on free loopback ports."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from gateway_helpers import cli, env, free_path_ports

from wanxport.control.certs import make_test_pki
from wanxport.daemon.config import load_config
from wanxport.daemon.service import GatewayDaemon


def make_pki(directory: Path) -> Path:
    make_test_pki(directory, ["gw-a", "gw-b", "gw-c"], days=30)
    return directory


def write_config(path: Path, site: str, pki: Path, listen: list[int], peers: dict[str, list[int]],
                 extra: str = "", send_roots: list[Path] | None = None) -> Path:
    """A daemon config for ``site`` (identity ``pki/site``) listening on loopback ``listen`` ports,
    sending from under ``send_roots`` (default: the config's directory, where tests put sources)."""
    roots = [path.parent] if send_roots is None else send_roots
    lines = [f'site = "{site}"', f'identity = "{pki / site}"', f'ca = "{pki / "ca.pem"}"',
             "listen = [" + ", ".join(f'"127.0.0.1:{p}"' for p in listen) + "]",
             f'data_dir = "{path.parent / (site + "-data")}"',
             "send_roots = [" + ", ".join(f'"{r}"' for r in roots) + "]", extra]
    for name, ports in peers.items():
        lines += ["[[peers]]", f'name = "{name}"',
                  "paths = [" + ", ".join(f'"127.0.0.1:{p}"' for p in ports) + "]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def two_sites(tmp_path: Path, pki: Path, n_paths: int = 2, extra: str = "") -> tuple[Path, Path]:
    """Configs of gw-a and gw-b, each naming the other as its peer."""
    ports = free_path_ports(2 * n_paths)
    a_ports, b_ports = ports[:n_paths], ports[n_paths:]
    a = write_config(tmp_path / "a.toml", "gw-a", pki, a_ports, {"gw-b": b_ports}, extra)
    b = write_config(tmp_path / "b.toml", "gw-b", pki, b_ports, {"gw-a": a_ports}, extra)
    return a, b


class NotifyListener:
    """What systemd would see: the daemon's NOTIFY_SOCKET datagrams, in order."""

    def __init__(self, path: Path) -> None:
        import socket

        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def next(self, timeout: float = 30, skip_watchdog: bool = True) -> dict[str, str]:
        self.sock.settimeout(timeout)
        while True:
            data = self.sock.recv(4096).decode()
            message = dict(line.split("=", 1) for line in data.splitlines())
            self.messages.append(message)
            if not (skip_watchdog and set(message) == {"WATCHDOG"}):
                return message

    def close(self) -> None:
        self.sock.close()


def start_daemon(config: Path, notify: NotifyListener | None = None,
                 **extra_env: str) -> subprocess.Popen[str]:
    """``wanxport gateway -v CONFIG``; its log goes to CONFIG.log (a pipe could fill and block it)."""
    environ = {**env(), **extra_env}
    if notify is not None:
        environ["NOTIFY_SOCKET"] = str(notify.path)
    with open(config.with_suffix(".log"), "a") as log:
        return subprocess.Popen(cli("gateway", "-v", str(config)), stdout=subprocess.DEVNULL,
                                stderr=log, text=True, env=environ)


def log_of(config: Path) -> str:
    return config.with_suffix(".log").read_text()


@asynccontextmanager
async def running(config: Path) -> AsyncIterator[GatewayDaemon]:
    """A daemon on the test's own event loop (no signal handlers), drained on exit."""
    daemon = GatewayDaemon(load_config(config), signals=False)
    await daemon.start()
    try:
        yield daemon
    finally:
        daemon.request_stop()
        await daemon.serve()
