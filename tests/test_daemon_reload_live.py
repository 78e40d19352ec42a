"""A reload applies rate caps to running sessions, logs one diff line, and works through
the API (``wanxport gateway reload|drain``) as through the signals.

No rate is measured here (loopback speed says nothing): the tests read the cap in
force on the running session's paths, which the pacer follows from its next packet.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import pytest
from daemon_helpers import make_pki, running, two_sites, write_config
from gateway_helpers import cli, env, free_path_ports

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.service import GatewayDaemon

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


_PLAIN: dict[Path, str] = {}


def rates(config: Path, limit_mbps: int, peer_mbps: int) -> None:
    """``config`` (as ``two_sites`` wrote it) with [limits] rate_mbps and its one peer's rate_mbps."""
    head, _, peers = _PLAIN.setdefault(config, config.read_text()).partition("[[peers]]")
    config.write_text(f"{head}[limits]\nrate_mbps = {limit_mbps}\n[[peers]]{peers}rate_mbps = {peer_mbps}\n")


async def test_reload_lowers_the_caps_of_the_running_session_without_dropping_it(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wanxport.daemon")
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    rates(a_cfg, 400, 300)
    src = tmp_path / "r.bin"
    data = __import__("random").Random(7).randbytes(48 << 20)
    src.write_bytes(data)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(src))
        assert a.store is not None
        while a.store.get(t["id"]).state != "active":  # type: ignore[union-attr]
            await asyncio.sleep(0.005)
        session = a.sessions["gw-b"]
        core = session.endpoint.session  # the core: its paths show the caps in force
        assert core.rate_caps_bps() == (300e6, 300e6), "the peer's own cap, not [limits]'"
        rates(a_cfg, 100, 200)
        result = a.reload()
        assert result.taken
        assert result.changes == ["limits.rate_mbps 400 -> 100", "peer gw-b rate_mbps 300 -> 200"]
        assert core.rate_caps_bps() == (200e6, 200e6), "in force on the running session"
        assert [p.max_rate_bps for p in core.paths] == [200e6, 200e6]
        done = await asyncio.to_thread(client.wait, t["id"], 60)
        assert done["state"] == "done" and done["attempts"] == 1, done
        assert a.sessions.get("gw-b") is session or session.end_reason == "idle", "the session was kept"
        got = (b.config.received_dir / "gw-a" / "r.bin").read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    lines = [r.getMessage() for r in caplog.records if r.name == "wanxport.daemon.reload"]
    assert lines == ["reload: limits.rate_mbps 400 -> 100; peer gw-b rate_mbps 300 -> 200"], lines
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "paths changed" not in logged and "reconnecting" not in logged


async def test_a_session_the_peer_dialled_gets_our_caps_for_that_peer(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    rates(b_cfg, 400, 70)  # gw-b's caps toward gw-a; gw-a dials (its name sorts first)
    async with running(a_cfg) as a, running(b_cfg) as b:
        for _ in range(3000):
            session = b.sessions.get("gw-a")
            if session is not None and a.sessions.get("gw-b") is not None:
                break
            await asyncio.sleep(0.01)
        assert session is not None
        assert session.rate_caps_bps() == (70e6, 70e6)


async def test_the_diff_names_what_changed_and_what_needs_a_restart(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    async with running(a_cfg) as a:
        data_dir = a.config.data_dir
        [port] = free_path_ports(1)
        a_cfg.write_text(a_cfg.read_text().replace('data_dir = "', 'data_dir = "/moved') +
                         f'[[peers]]\nname = "gw-c"\npaths = ["127.0.0.1:{port}"]\n')
        result = a.reload()
        assert result.changes == ["peer gw-c added"]
        # api_socket follows data_dir (DATA_DIR/api.sock) unless set: both wait for a restart.
        assert result.at_restart == ["data_dir (needs a restart)", "api_socket (needs a restart)"]
        assert a.config.data_dir == data_dir and a.config.peer("gw-c") is not None


async def test_reload_and_drain_subcommands_go_through_the_api(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    a = GatewayDaemon(load_config(a_cfg), signals=False)
    await a.start()
    served = asyncio.create_task(a.serve())
    try:
        write_config(a_cfg, "gw-a", pki, [p for _, p in a.config.listen],
                     {"gw-b": [p for _, p in a.config.peers[0].paths]}, "[limits]\nrate_mbps = 50")

        async def run(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(*cli("gateway", *args), env=env(),
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err = await proc.communicate()
            return proc.returncode or 0, out.decode(), err.decode()

        code, out, err = await run("reload", str(a_cfg))
        assert code == 0 and out.strip() == "reload: limits.rate_mbps none -> 50", (out, err)
        assert a.config.limits.rate_cap_bps == 50e6
        code, out, err = await run("reload", "--socket", str(a.config.api_socket))
        assert code == 0 and out.strip() == "reload: no change", (out, err)
        a_cfg.write_text(a_cfg.read_text() + "[transfer]\nstall_seconds = -1\n")
        code, out, err = await run("reload", "--socket", str(a.config.api_socket))  # the daemon refuses it
        assert code == 1 and "transfer.stall_seconds: -1 is not valid" in err, (out, err)
        assert a.config.limits.rate_cap_bps == 50e6, "the running config stays"
        code, out, err = await run("drain", "--socket", str(a.config.api_socket))
        assert code == 0 and out.startswith("draining: 0 transfers"), (out, err)
        await asyncio.wait_for(served, 30)  # the daemon drained and closed
        assert a.draining and not a.config.api_socket.exists()
    finally:
        if not served.done():
            a.request_stop()
            await served
