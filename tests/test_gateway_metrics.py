"""Gateway Prometheus metrics: real loopback sessions scraped over HTTP, and ``--metrics`` errors."""

from __future__ import annotations

import asyncio
import random
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from gateway_helpers import (
    free_path_ports,
    run,
    start,
    stop,
    throw_hostile_datagrams,
    transfer,
    transfer_all,
    wait_listening,
)
from prometheus_client.parser import text_string_to_metric_families

from wanxport.control.certs import make_test_pki
from wanxport.core.health import PathState
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.handshake import initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.metrics import GatewayMetrics, MetricsServer, parse_metrics_address
from wanxport.gateway.session import GatewaySession

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
PATH_FAMILIES = ("wanxport_path_payload_sent_bytes_total", "wanxport_path_retransmitted_bytes_total",
                 "wanxport_path_packets_lost_total", "wanxport_path_failures_total",
                 "wanxport_path_srtt_seconds", "wanxport_path_min_rtt_seconds", "wanxport_path_cwnd_bytes",
                 "wanxport_path_pacing_rate_bytes_per_second", "wanxport_path_in_flight_bytes",
                 "wanxport_path_packet_bytes", "wanxport_path_reroutes_total")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def labelled(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for (n, labels), _ in samples.items() if n == name}


def counters(samples: Samples) -> Samples:
    return {key: v for key, v in samples.items()
            if key[0].startswith("wanxport_") and key[0].endswith("_total")}


class Gateways:
    """A receiving listener and sending sessions, each side exported by its own metrics server."""

    def __init__(self, pki: Path, n_paths: int) -> None:
        self.pki = pki
        self.listens = [("127.0.0.1", p) for p in free_path_ports(n_paths)]
        self.listener = GatewayListener(self.listens, pki / "gw-b", pki / "ca.pem", GatewayOptions())
        self.recv_metrics = GatewayMetrics("receiver", self.listener)
        self.send_metrics = GatewayMetrics("sender")
        self.recv_server = MetricsServer(self.recv_metrics, ("127.0.0.1", 0))
        self.send_server = MetricsServer(self.send_metrics, ("127.0.0.1", 0))

    async def connect(self) -> tuple[GatewaySession, GatewaySession]:
        sender = await initiate(self.listens, self.pki / "gw-a", self.pki / "ca.pem", GatewayOptions())
        receiver = await self.listener.accept()
        self.send_metrics.add(sender)
        self.recv_metrics.add(receiver)
        return sender, receiver

    async def end(self, sender: GatewaySession, receiver: GatewaySession) -> None:
        await sender.close()
        await receiver.close()
        self.send_metrics.finish(sender)
        self.recv_metrics.finish(receiver)
        self.listener.release()

    def close(self) -> None:
        self.listener.close()
        self.recv_server.close()
        self.send_server.close()


@pytest.fixture
async def gateways(pki: Path) -> AsyncIterator[Gateways]:
    gw = Gateways(pki, 2)
    try:
        await gw.listener.start()
        yield gw
    finally:
        gw.close()


def assert_path_labels(samples: Samples, peer: str, paths: set[str]) -> None:
    for name in PATH_FAMILIES:
        assert labelled(samples, name, "path") == paths, name
        assert labelled(samples, name, "peer") == {peer}, name
    for path in paths:  # exactly one state is current
        assert sum(value(samples, "wanxport_path_state", peer=peer, path=path, state=s.value)
                   for s in PathState) == 1


async def test_metrics_follow_transfers_across_sessions(gateways: Gateways) -> None:
    rng = random.Random(5)
    data = [rng.randbytes(3 << 20) for _ in range(3)]
    sender, receiver = await gateways.connect()
    scrapes: list[Samples] = []
    try:
        moving = asyncio.ensure_future(transfer_all(sender, receiver, {0: data[0], 1: data[1]}))
        while not moving.done():  # scrape from another thread while the loop moves data
            scrapes.append(await asyncio.to_thread(scrape, gateways.send_server.url))
        assert await moving
        live_send = scrape(gateways.send_server.url)
        live_recv = scrape(gateways.recv_server.url)
    finally:
        await gateways.end(sender, receiver)
    moved = len(data[0]) + len(data[1])
    scrapes.append(live_send)
    for before, after in zip(scrapes, scrapes[1:], strict=False):
        for key, v in counters(before).items():
            assert counters(after).get(key, 0.0) >= v, key  # counters never go down

    assert_path_labels(live_send, "gw-b", {"p0", "p1"})
    first_sent = (total(live_send, "wanxport_path_payload_sent_bytes_total")
                  - total(live_send, "wanxport_path_retransmitted_bytes_total")
                  - total(live_send, "wanxport_path_hedged_bytes_total"))
    assert first_sent == moved  # every byte leaves once, plus counted repeats
    assert value(live_send, "wanxport_acked_bytes_total") == moved
    assert value(live_send, "wanxport_shards_sent_total") == 2
    assert value(live_send, "wanxport_sessions_active") == 1
    assert value(live_send, "wanxport_session_info", peer="gw-b", role="sender", cipher="aes-256-gcm",
                 datapath=sender.endpoint.datapath_name) == 1
    assert all(value(live_send, "wanxport_path_srtt_seconds", peer="gw-b", path=p) > 0 for p in ("p0", "p1"))
    assert value(live_recv, "wanxport_received_bytes_total") == moved
    assert value(live_recv, "wanxport_shards_received_total") == 2
    assert value(live_recv, "wanxport_sessions_refused_total", reason="busy") == 0

    ended = scrape(gateways.send_server.url)  # the session is over: totals stay, live gauges go
    assert value(ended, "wanxport_sessions_active") == 0
    assert not labelled(ended, "wanxport_path_srtt_seconds", "path")
    for key, v in counters(live_send).items():
        assert counters(ended)[key] >= v, key

    sender, receiver = await gateways.connect()  # a second session adds to the same counters
    try:
        assert await transfer(sender, receiver, 0, data[2])
    finally:
        await gateways.end(sender, receiver)
    after_send = scrape(gateways.send_server.url)
    after_recv = scrape(gateways.recv_server.url)
    assert value(after_send, "wanxport_sessions_total") == 2
    assert value(after_send, "wanxport_acked_bytes_total") == moved + len(data[2])
    assert value(after_recv, "wanxport_received_bytes_total") == moved + len(data[2])
    assert value(after_recv, "wanxport_shards_received_total") == 3
    first_sent = (total(after_send, "wanxport_path_payload_sent_bytes_total")
                  - total(after_send, "wanxport_path_retransmitted_bytes_total")
                  - total(after_send, "wanxport_path_hedged_bytes_total"))
    assert first_sent == moved + len(data[2])
    assert "process_cpu_seconds_total" in {name for name, _ in after_send}


async def test_rejected_datagrams_are_exported(gateways: Gateways) -> None:
    rng = random.Random(11)
    sender, receiver = await gateways.connect()
    try:
        assert await transfer(sender, receiver, 0, rng.randbytes(1 << 20))
        before = scrape(gateways.recv_server.url)
        quic = throw_hostile_datagrams(sender, rng)  # 40 garbage, 20 forged, 1 replayed
        assert await transfer(sender, receiver, 1, rng.randbytes(1 << 20))  # the hostile ones came first
        during = scrape(gateways.recv_server.url)
    finally:
        await gateways.end(sender, receiver)
    after = scrape(gateways.recv_server.url)
    # Counted as differences: anything on the host may send a stray datagram to a port (a late
    # one of an earlier test's session that had the same port), and it is counted too.
    def added(reason: str | None = None) -> float:
        if reason is None:
            return total(during, "wanxport_datagrams_rejected_total") - total(
                before, "wanxport_datagrams_rejected_total")
        key = ("wanxport_datagrams_rejected_total", (("reason", reason),))
        return during.get(key, 0.0) - before.get(key, 0.0)

    assert added() == 61
    # The QUIC-looking garbage went to aioquic on the shared port, the rest to the data path.
    assert added("quic") == quic > 0
    assert receiver.datagrams_rejected == 61 - quic
    assert added("replay") == 1
    assert added("auth") >= 20
    assert total(after, "wanxport_datagrams_rejected_total") >= 61  # kept after the session ended


@pytest.mark.parametrize("text,expected", [("0.0.0.0:9464", ("0.0.0.0", 9464)), (":0", ("0.0.0.0", 0)),
                                           ("[::1]:9464", ("::1", 9464)), ("gw-b:1", ("gw-b", 1))])
def test_parse_metrics_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_metrics_address(text) == expected


@pytest.mark.parametrize("text", ["9464", "host:", "host:http", "host:65536", "host:-1", "[::1:9464"])
def test_parse_metrics_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--metrics"):
        parse_metrics_address(text)


def _recv_args(pki: Path, out: Path, port: int) -> list[str]:
    return ["recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"),
            "--listen", f"127.0.0.1:{port}", "--out", str(out)]


def test_bad_metrics_value_is_one_line_usage_error(pki: Path, tmp_path: Path) -> None:
    (port,) = free_path_ports(1)
    result = run(*_recv_args(pki, tmp_path / "out", port), "--metrics", "localhost")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "wanxport recv: --metrics: 'localhost' is not valid; use HOST:PORT with PORT 0..65535 "
        "(e.g. 0.0.0.0:9464)"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = run("send", "--identity", str(pki / "gw-a"), "--ca", str(pki / "ca.pem"),
                     "--to", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{taken}", str(pki / "ca.pem"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wanxport send: --metrics: cannot listen on"), lines


def test_recv_serves_metrics_for_its_sessions(pki: Path, tmp_path: Path) -> None:
    (port,) = free_path_ports(1)
    with socket.socket() as probe:  # a free TCP port for the exporter
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    src = tmp_path / "blob.bin"
    src.write_bytes(random.Random(9).randbytes(1_500_001))
    recv = start(*_recv_args(pki, tmp_path / "out", port), "--keep",
                 "--metrics", f"127.0.0.1:{metrics_port}")
    try:
        wait_listening(recv, port)
        sent = run("send", "--identity", str(pki / "gw-a"), "--ca", str(pki / "ca.pem"),
                   "--to", f"127.0.0.1:{port}", "--piece", "1MiB", str(src))
        assert sent.returncode == 0, sent.stderr
        samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop(recv)
    assert value(samples, "wanxport_sessions_total") == 1
    assert value(samples, "wanxport_shards_received_total") == 2
    assert value(samples, "wanxport_received_bytes_total") == 1_500_001
    assert value(samples, "wanxport_datagrams_rejected_total", reason="malformed_control") == 0
