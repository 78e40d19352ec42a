"""Path failures with nftables inside a test's own network namespace (root only).

A named nftables quota makes the blackhole deterministic: every packet to or
from a path's port (data and control share it) counts against the quota, and
once it is used up all of them are dropped, i.e. the path dies mid-transfer at
a byte count, not at a time. The paths are consecutive ports.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_helpers import loopback_netns, run, start, stop

from wanxport.control.certs import make_test_pki

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

PORTS = [7400, 7401, 7402]  # consecutive: one UDP port per path


@pytest.fixture
def netns() -> Iterator[str]:
    with loopback_netns("wxgw") as name:
        yield name


def blackhole(ns: str, port: int, after_bytes: int | None) -> None:
    """Drop everything to/from ``port`` (after ``after_bytes`` of it)."""
    quota = f"over {after_bytes or 0} bytes"
    script = f"""
table inet wxgw {{
  quota q {{ {quota} }}
  chain out {{ type filter hook output priority 0; policy accept;
    udp dport {port} quota name "q" drop
    udp sport {port} quota name "q" drop
  }}
}}
"""
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, check=True)


def wait_bound(ns: str, proc: subprocess.Popen[str], port: int, timeout_s: float = 20) -> None:
    """Until ``port`` is bound inside ``ns`` (the receiver's last path port)."""
    import socket
    import time

    from pyroute2 import netns as pr_netns

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        pr_netns.pushns(ns)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.bind(("127.0.0.1", port))
        except OSError:
            return
        finally:
            pr_netns.popns()
        time.sleep(0.02)
    raise TimeoutError("the receiver did not start listening")


def transfer(ns: str, tmp: Path, size: int) -> tuple[subprocess.CompletedProcess[str], str, Path]:
    pki = tmp / "pki"
    make_test_pki(pki, ["gw-a", "gw-b"])
    src = tmp / "payload.bin"
    src.write_bytes(os.urandom(size))
    out = tmp / "out"
    prefix = ("ip", "netns", "exec", ns)
    listen = [a for p in PORTS for a in ("--listen", f"127.0.0.1:{p}")]
    to = [a for p in PORTS for a in ("--to", f"127.0.0.1:{p}")]
    recv = start("recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"), *listen,
                 "--out", str(out), "--control-timeout", "1", prefix=prefix)
    try:
        wait_bound(ns, recv, PORTS[-1])
        sent = run("send", "--identity", str(pki / "gw-a"), "--ca", str(pki / "ca.pem"), *to,
                   "--control-timeout", "1", "--piece", "8MiB", "--json", str(src),
                   prefix=prefix, timeout=90)
        recv_out, recv_err = recv.communicate(timeout=30)
    finally:
        stop(recv)
    assert recv.returncode == 0, (recv_err, sent.stderr)
    return sent, hashlib.sha256(src.read_bytes()).hexdigest(), out / "payload.bin"


@pytest.mark.parametrize("path", [0, 1], ids=["control-path", "data-path"])
def test_path_blackholed_mid_transfer(netns: str, tmp_path: Path, path: int) -> None:
    blackhole(netns, PORTS[path], after_bytes=8 << 20)
    sent, digest, received = transfer(netns, tmp_path, 48 << 20)
    assert sent.returncode == 0, sent.stderr
    assert hashlib.sha256(received.read_bytes()).hexdigest() == digest
    import json

    report = json.loads(sent.stdout)
    assert report["intact"] is True
    # The control channel starts on whichever path answers first (a race on a busy
    # host); wherever it started, it must end on one that still works.
    assert report["control_via"] is not None
    assert not report["control_via"].endswith(f":{PORTS[path]}")


def test_first_path_dead_before_the_session(netns: str, tmp_path: Path) -> None:
    blackhole(netns, PORTS[0], after_bytes=None)
    sent, digest, received = transfer(netns, tmp_path, 16 << 20)
    assert sent.returncode == 0, sent.stderr
    assert hashlib.sha256(received.read_bytes()).hexdigest() == digest
