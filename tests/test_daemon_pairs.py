"""Every port is bound at start, and one session per peer pair, whoever dialled.

The daemon binds each configured peer's data ports when it starts (before READY), and a
session with that peer, set up later by either side, runs on exactly those sockets. When
both gateways dial each other at once, the session dialled by the site whose name sorts
first is kept on both sides; files then move both ways over it.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import socket
from pathlib import Path

import pytest
from daemon_helpers import NotifyListener, make_pki, start_daemon, write_config
from gateway_helpers import free_path_ports
from test_daemon_transfers import call, payload

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.peers import DUPLICATE
from wanxport.daemon.service import DaemonError, GatewayDaemon
from wanxport.gateway.session import GatewaySession

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _bind_fails(address: tuple[str, int]) -> bool:
    """True when the test cannot bind ``address`` because something holds it (EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(address)
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
            return True
    return False


def _same(one: GatewaySession, other: GatewaySession) -> bool:
    """``one`` and ``other`` are the two ends of one session (their connection ids pair up)."""
    a, b = one.endpoint.config, other.endpoint.config
    return (a.local_conn_id, a.remote_conn_id) == (b.remote_conn_id, b.local_conn_id)


async def _stop(*daemons: GatewayDaemon) -> None:
    for daemon in daemons:
        daemon.request_stop()
    await asyncio.gather(*(daemon.serve() for daemon in daemons))


async def test_every_data_port_is_bound_at_start_and_sessions_use_those_sockets(
        pki: Path, tmp_path: Path) -> None:
    ports = free_path_ports(8)
    a_ports, b_ports, c_ports, c_data = ports[:2], ports[2:4], ports[4:6], ports[6:]
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, b_ports, {"gw-a": a_ports, "gw-c": c_ports})
    # gw-c gets fixed data ports at gw-b (a firewall can name them); gw-a, the first peer, the path ports.
    b_cfg.write_text(b_cfg.read_text() + f"data_ports = {c_data}\n")
    a_cfg = write_config(tmp_path / "a.toml", "gw-a", pki, a_ports, {"gw-b": b_ports})
    c_cfg = write_config(tmp_path / "c.toml", "gw-c", pki, c_ports, {"gw-b": b_ports})
    b = GatewayDaemon(load_config(b_cfg), signals=False)
    await b.start()
    a = c = None
    try:
        assert b.listener is not None
        held = {peer: b.listener.data_ports(peer) for peer in ("gw-a", "gw-c")}
        assert [p.address[1] for p in held["gw-a"]] == b_ports, "the first peer shares the path ports"
        assert [p.address[1] for p in held["gw-c"]] == c_data
        for port in (*b_ports, *c_data):
            assert _bind_fails(("127.0.0.1", port)), f"port {port} is held from the start"
        sockets = {peer: [p.socket for p in held[peer]] for peer in held}

        a = GatewayDaemon(load_config(a_cfg), signals=False)
        c = GatewayDaemon(load_config(c_cfg), signals=False)
        await a.start()
        await c.start()
        sources = {d: tmp_path / f"{d.config.site}.bin" for d in (a, c)}
        digests = {d: payload(src, 6 << 20, i) for i, (d, src) in enumerate(sources.items())}
        for daemon, src in sources.items():
            client = GatewayClient(str(daemon.config.api_socket))
            t = await call(client, "submit", "gw-b", str(src))
            assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        for daemon in (a, c):
            session = b.sessions[daemon.config.site]
            assert session.endpoint.sockets == sockets[daemon.config.site], "the sockets bound at start"
            assert _same(session, daemon.sessions["gw-b"])
            got = b.config.received_dir / daemon.config.site / sources[daemon].name
            assert hashlib.sha256(got.read_bytes()).hexdigest() == digests[daemon]
        # The dialling side's data also leaves from its own ports for the peer (here its path ports).
        assert a.sessions["gw-b"].endpoint.sockets == [p.socket for p in a.listener.ports]  # type: ignore[union-attr]
    finally:
        await _stop(*(d for d in (a, c, b) if d is not None))
    for port in (*b_ports, *c_data):
        assert not _bind_fails(("127.0.0.1", port)), "released at exit"


async def test_a_data_port_in_use_stops_the_start_with_one_line(pki: Path, tmp_path: Path) -> None:
    ports = free_path_ports(6)
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, ports[:2], {"gw-a": ports[2:4], "gw-c": ports[4:]})
    data = free_path_ports(2)
    b_cfg.write_text(b_cfg.read_text() + f"data_ports = {data}\n")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", data[1]))
        with pytest.raises(DaemonError, match=f"port in use .*127.0.0.1:{data[1]}"):
            await GatewayDaemon(load_config(b_cfg), signals=False).start()
    for port in (*ports[:2], data[0]):
        assert not _bind_fails(("127.0.0.1", port)), "nothing stays bound after a failed start"


async def test_simultaneous_dial_keeps_one_session_and_files_move_both_ways(
        pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="wanxport.daemon.peers")
    ports = free_path_ports(4)
    a_cfg = write_config(tmp_path / "a.toml", "gw-a", pki, ports[:2], {"gw-b": ports[2:]})
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, ports[2:], {"gw-a": ports[:2]})
    # Both daemons are up and both dial at the same moment: each one's first dial waits here
    # until the other's has started too, so their Hellos cross.
    barrier = asyncio.Barrier(2)
    waited: set[str] = set()
    dial = GatewayDaemon._dial

    async def crossing(self: GatewayDaemon, peer):  # type: ignore[no-untyped-def]
        if self.config.site not in waited:
            waited.add(self.config.site)
            await barrier.wait()
        return await dial(self, peer)

    monkeypatch.setattr(GatewayDaemon, "_dial", crossing)
    a = GatewayDaemon(load_config(a_cfg), signals=False)
    b = GatewayDaemon(load_config(b_cfg), signals=False)
    await asyncio.gather(a.start(), b.start())
    try:
        n, size = 3, 3 << 20
        jobs = []
        for side, (daemon, peer) in enumerate(((a, "gw-b"), (b, "gw-a"))):
            client = GatewayClient(str(daemon.config.api_socket))
            for i in range(n):
                src = tmp_path / f"{daemon.config.site}-{i}.bin"
                digest = payload(src, size + i, 10 * side + i)
                t = await call(client, "submit", peer, str(src))
                jobs.append((client, t, daemon, peer, src, digest))
        for client, t, daemon, peer, src, digest in jobs:
            done = await call(client, "wait", t["id"], 90)  # type: ignore[index]
            assert done["state"] == "done", done  # type: ignore[index]
            got = (a if peer == "gw-a" else b).config.received_dir / daemon.config.site / src.name
            assert hashlib.sha256(got.read_bytes()).hexdigest() == digest
        assert list(a.sessions) == ["gw-b"] and list(b.sessions) == ["gw-a"]
        kept = a.sessions["gw-b"]
        assert _same(kept, b.sessions["gw-a"]), "both sides kept the same session"
        assert kept.role == "initiator", "the one gw-a dialled (its name sorts first)"
        assert (a.dialled, b.dialled) == (1, 0)
        assert a.peers.refused == 1, "gw-b's dial was refused during its setup, at gw-a"
        assert f"{DUPLICATE} gw-a" in caplog.text
        for daemon, peer in ((a, "gw-b"), (b, "gw-a")):
            status = await call(GatewayClient(str(daemon.config.api_socket)), "status")
            (entry,) = status["peers"]  # type: ignore[index]
            assert entry["name"] == peer and entry["session"]["dialled_by"] == "gw-a"
    finally:
        await _stop(a, b)


async def test_a_restarted_peer_replaces_its_old_session_at_once(pki: Path, tmp_path: Path) -> None:
    """gw-b is killed (no goodbye: gw-a still holds the old session) and started again: its
    new instance's session replaces the old one, and transfers go both ways over it."""
    ports = free_path_ports(4)
    a_cfg = write_config(tmp_path / "a.toml", "gw-a", pki, ports[:2], {"gw-b": ports[2:]})
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, ports[2:], {"gw-a": ports[:2]})
    notify = NotifyListener(tmp_path / "notify.sock")
    a = GatewayDaemon(load_config(a_cfg), signals=False)
    await a.start()
    proc = start_daemon(b_cfg, notify)
    try:
        assert notify.next().get("READY") == "1"
        b_client = GatewayClient(str(load_config(b_cfg).api_socket))
        first = await _until_session(a)
        proc.kill()
        proc.wait()
        proc = start_daemon(b_cfg, notify)
        assert notify.next().get("READY") == "1"
        b_status = await call(b_client, "status")
        second = await _until_session(a, lambda s: s.peer_instance == b_status["instance"])  # type: ignore[index]
        assert second is not first and first.end_reason is not None
        assert list(a.sessions) == ["gw-b"]
        a_client = GatewayClient(str(a.config.api_socket))
        b_received = load_config(b_cfg).received_dir
        jobs = []
        for i, (client, peer, received) in enumerate(((a_client, "gw-b", b_received / "gw-a"),
                                                       (b_client, "gw-a", a.config.received_dir / "gw-b"))):
            src = tmp_path / f"r{i}.bin"
            digest = payload(src, 2 << 20, i)
            jobs.append((client, await call(client, "submit", peer, str(src)), received / src.name, digest))
        for client, t, got, digest in jobs:
            assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
            assert hashlib.sha256(got.read_bytes()).hexdigest() == digest
        # One session with the new instance. Usually the one found first; but when gw-a's
        # re-dial crossed the new gw-b's own dial, both sides keep gw-a's (the pair rule), so
        # the one found first may have given way to it: the same two processes either way.
        live = a.sessions["gw-b"]
        assert live.peer_instance == second.peer_instance and live.end_reason is None
        assert live is second or second.end_reason is not None, "no two sessions at once"
        (entry,) = (await call(b_client, "status"))["peers"]  # type: ignore[index]
        assert entry["session"]["peer_instance"] == a.peers.instance
    finally:
        proc.terminate()
        proc.wait(30)
        notify.close()
        await _stop(a)


async def _until_session(daemon: GatewayDaemon, accept=lambda s: True) -> GatewaySession:  # type: ignore[no-untyped-def]
    """The daemon's live session with gw-b, once there is one ``accept`` takes."""
    for _ in range(3000):
        session = daemon.sessions.get("gw-b")
        if session is not None and session.end_reason is None and accept(session):
            return session
        await asyncio.sleep(0.01)
    raise AssertionError(f"no session with gw-b: {daemon.sessions}")


async def test_a_reload_binds_an_added_peers_ports_or_is_refused(pki: Path, tmp_path: Path) -> None:
    ports = free_path_ports(8)
    listen, a_paths, c_paths, c_data = ports[:2], ports[2:4], ports[4:6], ports[6:]
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, listen, {"gw-a": a_paths})
    b = GatewayDaemon(load_config(b_cfg), signals=False)
    await b.start()
    try:
        added = write_config(tmp_path / "b.toml", "gw-b", pki, listen, {"gw-a": a_paths, "gw-c": c_paths})
        text = added.read_text() + f"data_ports = {c_data}\n"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
            squatter.bind(("127.0.0.1", c_data[1]))
            b_cfg.write_text(text)
            b.reload()
            assert b.config.peer("gw-c") is None, "a data port in use: the old config stays"
            assert not _bind_fails(("127.0.0.1", c_data[0])), "and nothing of the new one is held"
        b.reload()
        assert b.config.peer("gw-c") is not None
        assert all(_bind_fails(("127.0.0.1", port)) for port in c_data), "bound by the reload"
        assert b.listener is not None and [p.address[1] for p in b.listener.data_ports("gw-c")] == c_data
        write_config(tmp_path / "b.toml", "gw-b", pki, listen, {"gw-a": a_paths})
        b.reload()
        assert not any(_bind_fails(("127.0.0.1", port)) for port in c_data), "a removed peer's ports go"
    finally:
        await _stop(b)
