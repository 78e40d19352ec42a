"""A receiving gateway serves sessions from several peers at once, one session per peer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from daemon_helpers import make_pki, write_config
from gateway_helpers import free_path_ports
from test_daemon_transfers import call, payload, running

from wanxport.daemon.client import GatewayClient
from wanxport.gateway.session import GatewaySession

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def test_two_peers_send_to_one_gateway_at_once(pki: Path, tmp_path: Path) -> None:
    ports = free_path_ports(6)
    a_ports, b_ports, c_ports = ports[:2], ports[2:4], ports[4:]
    a_cfg = write_config(tmp_path / "a.toml", "gw-a", pki, a_ports, {"gw-b": b_ports})
    c_cfg = write_config(tmp_path / "c.toml", "gw-c", pki, c_ports, {"gw-b": b_ports})
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, b_ports, {"gw-a": a_ports, "gw-c": c_ports})
    sources = {name: tmp_path / f"{name}.bin" for name in ("gw-a", "gw-c")}
    digests = {name: payload(src, 24 << 20, i) for i, (name, src) in enumerate(sources.items())}
    async with running(b_cfg) as b, running(a_cfg) as a, running(c_cfg) as c:
        clients = {"gw-a": GatewayClient(str(a.config.api_socket)),
                   "gw-c": GatewayClient(str(c.config.api_socket))}
        submitted = {name: await call(client, "submit", "gw-b", str(sources[name]))
                     for name, client in clients.items()}
        done = await asyncio.gather(*(call(clients[name], "wait", t["id"], 90)  # type: ignore[index]
                                      for name, t in submitted.items()))
        assert [d["state"] for d in done] == ["done", "done"], done  # type: ignore[index]
        assert b.listener is not None
        assert b.listener.busy_refusals == 0, "neither peer was turned away as busy"
        assert b.peers.peak == 2
        assert sorted(b.sessions) == ["gw-a", "gw-c"]
        # One session per pair, on each pair's own data ports at gw-b.
        for peer in (a, c):
            assert _same(peer.sessions["gw-b"], b.sessions[peer.config.site])
        assert {s.endpoint.sockets[0].getsockname() for s in b.sessions.values()} == {
            p.address for p in (*b.listener.data_ports("gw-a")[:1], *b.listener.data_ports("gw-c")[:1])}
    import hashlib
    for name, src in sources.items():
        received = b.config.received_dir / name / src.name
        assert hashlib.sha256(received.read_bytes()).hexdigest() == digests[name]


def _same(one: GatewaySession, other: GatewaySession) -> bool:
    """``one`` and ``other`` are the two ends of one session (their connection ids pair up)."""
    a, b = one.endpoint.config, other.endpoint.config
    return (a.local_conn_id, a.remote_conn_id) == (b.remote_conn_id, b.local_conn_id)
