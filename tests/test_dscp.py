"""DSCP marking: the config's code point on every data and control socket, and on the wire."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites
from test_daemon_transfers import call, payload, running

from wanxport.aio.config import PathSocket
from wanxport.aio.port import PathPort
from wanxport.aio.sockets import open_path_socket, set_dscp
from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(120)
AF41 = 34  # the code point; the TOS byte / traffic class carries it shifted left by two (ECN bits 0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tos(sock: socket.socket) -> int:
    if sock.family == socket.AF_INET6:
        return sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
    return sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)


def test_path_sockets_carry_the_code_point_v4_and_v6() -> None:
    v4 = open_path_socket(PathSocket(("127.0.0.1", 0), dscp=46), 1 << 16, 1 << 16)
    v6 = open_path_socket(PathSocket(("::1", 0), dscp=10), 1 << 16, 1 << 16)
    plain = open_path_socket(PathSocket(("127.0.0.1", 0)), 1 << 16, 1 << 16)
    try:
        assert (_tos(v4), _tos(v6), _tos(plain)) == (46 << 2, 10 << 2, 0)
        with pytest.raises(ValueError, match="dscp: 64 is not valid"):
            set_dscp(plain, 64)
    finally:
        for sock in (v4, v6, plain):
            sock.close()


async def test_path_port_is_marked() -> None:
    port = PathPort.open(("127.0.0.1", 0), dscp=AF41)
    try:
        assert _tos(port.socket) == AF41 << 2
    finally:
        port.close()


def test_dscp_config_names_and_numbers(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki, extra='[network]\ndscp = "af41"')
    config = load_config(a_cfg)
    assert config.dscp == AF41 and config.gateway_options(config.peer("gw-b")).dscp == AF41
    a_cfg.write_text(a_cfg.read_text() + "dscp = 46\n")  # in the [[peers]] table: that peer only
    config = load_config(a_cfg)
    assert config.gateway_options(config.peer("gw-b")).dscp == 46 and config.gateway_options().dscp == AF41
    for bad, text in (("70", "network.dscp: 70 is not valid; use 0..63 or a class name"),
                      ('"gold"', "network.dscp: 'gold' is not valid")):
        a_cfg.write_text(a_cfg.read_text().replace('dscp = "af41"', f"dscp = {bad}"))
        with pytest.raises(ConfigError, match=text):
            load_config(a_cfg)
        a_cfg.write_text(a_cfg.read_text().replace(f"dscp = {bad}", 'dscp = "af41"'))


async def test_a_daemon_marks_its_data_and_control_sockets(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra='[network]\ndscp = "AF41"')
    src = tmp_path / "d.bin"
    payload(src, 1 << 20, 3)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        t = await call(client, "submit", "gw-b", str(src))
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        session = a.sessions["gw-b"]
        assert [_tos(s) for s in session.endpoint.sockets] == [AF41 << 2] * 2, "our data sockets"
        link = session.channel._link  # type: ignore[attr-defined]
        assert _tos(link._transport.get_extra_info("socket")) == AF41 << 2, "our control client socket"
        assert b.listener is not None
        assert [_tos(p.socket) for p in b.listener.ports] == [AF41 << 2] * 2, "the receiver's path ports"


NFT = """
table ip wxdscp {
    chain out {
        type filter hook output priority 0; policy accept;
        meta l4proto udp ip dscp 34 counter
        meta l4proto udp ip dscp != 34 counter
    }
}
"""

CHILD = """
import asyncio, sys
from pathlib import Path
from test_daemon_transfers import call, payload, running
from daemon_helpers import two_sites
from wanxport.daemon.client import GatewayClient

async def main(tmp, pki):
    a_cfg, b_cfg = two_sites(tmp, pki, extra='[network]\\ndscp = "AF41"')
    src = tmp / "n.bin"
    payload(src, 4 << 20, 8)
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        t = await call(client, "submit", "gw-b", str(src))
        print((await call(client, "wait", t["id"], 60))["state"], flush=True)

asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
"""


@pytest.mark.netns
def test_every_udp_datagram_of_a_transfer_is_marked_on_the_wire(pki: Path, tmp_path: Path) -> None:
    """Two daemons in a namespace of their own; nftables counts their UDP datagrams by DSCP."""
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs root, iproute2 and nftables")
    ns = f"wxdscp-{uuid.uuid4().hex[:6]}"
    root = Path(__file__).resolve().parent.parent
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=NFT, text=True, check=True)
        env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'tests'}"}
        child = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CHILD, str(tmp_path),
                                str(pki)], capture_output=True, text=True, timeout=90, env=env)
        assert child.stdout.strip() == "done", child.stderr[-2000:]
        ruleset = json.loads(subprocess.run(["ip", "netns", "exec", ns, "nft", "-j", "list", "chain", "ip",
                                             "wxdscp", "out"], check=True, capture_output=True,
                                            text=True).stdout)
        counters = [next(e["counter"] for e in item["rule"]["expr"] if "counter" in e)
                    for item in ruleset["nftables"] if "rule" in item]
        marked, unmarked = counters
        # Bytes, not packets: on loopback a GSO batch passes the hook as one packet.
        assert marked["bytes"] >= 4 << 20, counters
        assert unmarked["packets"] == 0, f"{unmarked} UDP datagrams left without the mark"
    finally:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
