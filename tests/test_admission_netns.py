"""Address validation measured on the wire: a spray of forged Initials from 250 sources.

A control server runs in one namespace with the default ``AdmissionLimits``; an
attacker namespace, which may use any address of 10.77.1.0/24 and 10.77.2.0/24
(a local route, as if spoofing), sends full-size Initials that decrypt (built by
aioquic's client, no certificate): one from each of 250 sources, then 150 from
one source. nftables counts bytes per remote address at the server (dynamic sets
with counters): to every address the server sends at most 3x what it received
from it (RFC 9000 §8.1; none of them ever validates). The server samples its
half-open count throughout: never above the Retry threshold (the forged sources
never return a token), so never above the cap; the single source is rate
limited to its burst plus 20/s; the half-open handshakes time out and free.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from wanxport.control.admission import DEFAULT_MAX_HALF_OPEN, DEFAULT_RETRY_ABOVE, DEFAULT_SOURCE_BURST
from wanxport.control.certs import make_test_pki

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

SERVER, PORT = "10.77.0.1", 7500
MANY, ONE_SOURCE, FROM_ONE = 250, "10.77.2.1", 150

NFT = f"""
table inet wxadm {{
  set rx {{ type ipv4_addr; size 65536; flags dynamic; counter; }}
  set tx {{ type ipv4_addr; size 65536; flags dynamic; counter; }}
  chain input {{ type filter hook input priority 0; udp dport {PORT} update @rx {{ ip saddr }}; }}
  chain output {{ type filter hook output priority 0; udp sport {PORT} update @tx {{ ip daddr }}; }}
}}
"""

SERVER_SCRIPT = """
import asyncio, json, sys
from wanxport.control import serve_control
pki, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main():
    srv = await serve_control(host, port, cert=pki + "/gw-b.pem", key=pki + "/gw-b.key",
                              ca=pki + "/ca.pem", on_session=lambda channel: None, idle_timeout_s=1.0)
    loop = asyncio.get_running_loop()
    peak = 0
    def sample():  # not synchronisation: a watch on the half-open count every 2 ms
        nonlocal peak
        peak = max(peak, srv.half_open)
        loop.call_later(0.002, sample)
    sample()
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # the attacker is done
    while srv.half_open:  # the forged handshakes time out (idle timeout 1 s)
        await asyncio.sleep(0.01)
    adm = srv.admission
    print(json.dumps({"peak_half_open": peak, "max_half_open_seen": adm.max_half_open_seen,
                      "verdicts": {v.value: n for v, n in adm.verdicts.items()},
                      "drops": dict(srv.quic_drops.reasons), "sources": adm.tracked_sources}), flush=True)
    srv.close()

asyncio.run(main())
"""

ATTACKER_SCRIPT = """
import socket, sys, time
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
many, one_source, from_one = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
server = (sys.argv[4], int(sys.argv[5]))

def initial():
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=["wanxport/1"]))
    quic.connect(server, now=0.0)
    return quic.datagrams_to_send(now=0.0)[0][0]

plan = [(f"10.77.1.{1 + i}", initial()) for i in range(many)]
plan += [(one_source, initial()) for _ in range(from_one)]
socks = {}
for source, data in plan:
    sock = socks.get(source)
    if sock is None:
        sock = socks[source] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((source, 0))
    sock.sendto(data, server)
    time.sleep(0.001)  # a rate (1000 Initials/s) the server's default socket buffer absorbs
print(len(plan), flush=True)
"""


def _sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs root, iproute2 and nftables")
    uid = uuid.uuid4().hex[:6]
    srv, atk = f"wxadm-s-{uid}", f"wxadm-a-{uid}"
    try:
        for ns in (srv, atk):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", f"wxs{uid}", "netns", srv, "type", "veth", "peer", "name", f"wxa{uid}",
            "netns", atk)
        _sh("ip", "-n", srv, "addr", "add", f"{SERVER}/24", "dev", f"wxs{uid}")
        _sh("ip", "-n", atk, "addr", "add", "10.77.0.2/24", "dev", f"wxa{uid}")
        for ns, dev in ((srv, f"wxs{uid}"), (atk, f"wxa{uid}")):
            _sh("ip", "-n", ns, "link", "set", dev, "up")
        for net in ("10.77.1.0/24", "10.77.2.0/24"):  # the attacker may send from (and hear) any of these
            _sh("ip", "-n", srv, "route", "add", net, "via", "10.77.0.2")
            _sh("ip", "-n", atk, "route", "add", "local", net, "dev", "lo")
        subprocess.run(["ip", "netns", "exec", srv, "nft", "-f", "-"], input=NFT, text=True, check=True)
        yield srv, atk
    finally:
        for ns in (srv, atk):
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                      text=True).stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _udp_payload_bytes(ns: str, name: str) -> dict[str, int]:
    """Per address: the set's IP-level byte counter less 28 B of IPv4 + UDP header per packet,
    i.e. the UDP payload bytes RFC 9000's limit is stated in."""
    out = json.loads(_sh("ip", "netns", "exec", ns, "nft", "-j", "list", "set", "inet", "wxadm", name))
    elems = next(item["set"] for item in out["nftables"] if "set" in item).get("elem", [])
    return {e["elem"]["val"]: e["elem"]["counter"]["bytes"] - 28 * e["elem"]["counter"]["packets"]
            for e in elems}


def test_spoofed_spray_gets_at_most_3x_and_half_open_stays_capped(namespaces: tuple[str, str],
                                                                  tmp_path: Path) -> None:
    srv_ns, atk_ns = namespaces
    make_test_pki(tmp_path, ["gw-b"])
    server = subprocess.Popen(["ip", "netns", "exec", srv_ns, sys.executable, "-c", SERVER_SCRIPT,
                               str(tmp_path), SERVER, str(PORT)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdin is not None
        assert server.stdout.readline().strip() == "ready"
        sent = _sh("ip", "netns", "exec", atk_ns, sys.executable, "-c", ATTACKER_SCRIPT, str(MANY),
                   ONE_SOURCE, str(FROM_ONE), SERVER, str(PORT))
        assert int(sent) == MANY + FROM_ONE
        server.stdin.write("done\n")
        server.stdin.flush()
        report = json.loads(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
    rx, tx = _udp_payload_bytes(srv_ns, "rx"), _udp_payload_bytes(srv_ns, "tx")
    print(json.dumps({"server": report, "rx_payload_bytes": sum(rx.values()),
                      "tx_payload_bytes": sum(tx.values()), "worst_ratio": max(tx[a] / rx[a] for a in tx)}))
    assert len(rx) == MANY + 1, "every source reached the server"
    assert set(tx) <= set(rx)
    for address, sent_bytes in tx.items():
        assert sent_bytes <= 3 * rx[address], f"{address}: sent {sent_bytes} B for {rx[address]} B received"
    assert report["peak_half_open"] <= DEFAULT_RETRY_ABOVE <= DEFAULT_MAX_HALF_OPEN
    assert report["max_half_open_seen"] <= DEFAULT_RETRY_ABOVE
    verdicts = report["verdicts"]
    assert sum(verdicts.values()) == MANY + FROM_ONE, "every Initial was put to admission"
    # 150 Initials at ~1000/s from one source: its burst, plus 20/s for ~0.15-0.5 s.
    assert DEFAULT_SOURCE_BURST <= FROM_ONE - verdicts.get("rate_limited", 0) <= DEFAULT_SOURCE_BURST + 15
    assert report["drops"].get("rate_limited") == verdicts.get("rate_limited")
    assert verdicts.get("retry", 0) >= MANY - DEFAULT_RETRY_ABOVE
