"""Warm sessions and the on-disk path cache."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites
from test_daemon_transfers import call, payload, running

from wanxport.core.warm import PathMemory
from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.durable import write_state
from wanxport.daemon.pathcache import PathCache
from wanxport.gateway.config import format_endpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def test_transfers_share_a_warm_session_and_paths_are_cached(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra="[transfer]\nwarm_seconds = 0.5")
    src = tmp_path / "w.bin"
    payload(src, 32 << 20, 9)
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        results = []
        for name in ("one.bin", "two.bin"):
            t = await call(client, "submit", "gw-b", str(src), name)
            results.append(await call(client, "wait", t["id"], 60))  # type: ignore[index]
        assert [r["state"] for r in results] == ["done", "done"]  # type: ignore[index]
        assert a.dialled == 1, "the second transfer went over the warm session"
        for _ in range(300):  # idle for warm_seconds: the session closes; the next one is new
            if "gw-b" not in a.sessions:
                break
            await asyncio.sleep(0.01)
        assert "gw-b" not in a.sessions
        t = await call(client, "submit", "gw-b", str(src), "three.bin")
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        assert a.dialled == 2


def test_only_validated_paths_are_cached_and_survive_a_restart(tmp_path: Path) -> None:
    from types import SimpleNamespace

    def stats(name: str, state: str, rate: float, rtt: float | None) -> SimpleNamespace:
        return SimpleNamespace(name=name, cc_state=state, bandwidth_bps=rate, min_rtt_s=rtt, srtt_s=rtt)

    paths = [stats("p0", "probe_bw", 9e9, 0.05), stats("p1", "startup", 5e9, 0.03),
             stats("p2", "probe_rtt", 2e9, None)]
    session = SimpleNamespace(stats=lambda: SimpleNamespace(paths=paths))
    addresses = (("10.0.0.2", 7400), ("10.0.1.2", 7400), ("10.0.2.2", 7400))
    cache = PathCache(tmp_path / "path-cache.json")
    assert cache.save("gw-b", addresses, session) == 1  # type: ignore[arg-type]
    again = PathCache(tmp_path / "path-cache.json")  # as after a restart
    assert set(again.entries["gw-b"]) == {"10.0.0.2:7400"}, "a search (Startup) is not a measurement"
    entry = again.entries["gw-b"]["10.0.0.2:7400"]
    assert (entry.rate_bps, entry.min_rtt_s) == (9e9, 0.05) and abs(entry.saved_at - time.time()) < 60


def test_cached_paths_are_offered_to_a_new_session_on_its_clock(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from wanxport.core.config import PathConfig, SessionConfig
    from wanxport.core.session import Session

    path = tmp_path / "path-cache.json"
    cache = PathCache(path)
    now = time.time()
    cache.entries["gw-b"] = {"10.0.0.2:7400": PathMemory(8e9, 0.050, 0.055, now - 60),
                             "10.0.1.2:7400": PathMemory(4e9, 0.030, 0.031, now - 7200)}
    paths = (("10.0.0.2", 7400), ("10.0.1.2", 7400), ("10.0.2.2", 7400))
    core = Session(SessionConfig(paths=tuple(PathConfig(f"p{i}") for i in range(3))))
    session = SimpleNamespace(endpoint=SimpleNamespace(clock=lambda: 100.0),
                              resume_path=lambda path_id, memory: core.resume_path(path_id, memory, 100.0))
    assert cache.resume("gw-b", paths, session) == 1  # type: ignore[arg-type]
    offered = core.paths[0].pending_resume
    assert offered is not None and offered.rate_bps == 8e9
    assert offered.saved_at == pytest.approx(40.0, abs=5), "its age carried over to the session clock"
    assert core.paths[1].pending_resume is None, "older than an hour: the path starts over"
    assert core.paths[2].pending_resume is None, "nothing saved for that path"
    assert cache.resume("gw-c", paths, session) == 0  # type: ignore[arg-type]
    path.write_bytes(b"\0" * 64)  # a zeroed cache is reported and ignored, never trusted
    assert PathCache(path).entries == {}


async def test_a_session_ends_cleanly_after_its_files_were_deleted(pki: Path, tmp_path: Path) -> None:
    """The receiver counts each file's bytes as it lands: a file the operator deleted
    before the session ended is not stat()ed again (FileNotFoundError stopped the
    receive loop, so the next session was never answered), and a warm session keeps
    no per-file list."""
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra="[transfer]\nwarm_seconds = 0.5")
    src = tmp_path / "w.bin"
    payload(src, 1 << 20, 11)
    received = tmp_path / "gw-b-data" / "received" / "gw-a"
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        for name in ("one.bin", "two.bin"):
            t = await call(client, "submit", "gw-b", str(src), name)
            assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
            (received / name).unlink()
        assert b.listener is not None
        (inbox,) = b.inboxes.values()  # the one warm session's
        assert (inbox.written_count, inbox.written_bytes, inbox.written) == (2, 2 << 20, [])
        for _ in range(300):  # idle for warm_seconds: the session ends with its files gone
            if "gw-b" not in a.sessions:
                break
            await asyncio.sleep(0.01)
        assert "gw-b" not in a.sessions
        t = await call(client, "submit", "gw-b", str(src), "three.bin")
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        assert (received / "three.bin").stat().st_size == 1 << 20


async def test_a_restarted_daemon_resumes_cached_paths_or_drops_moved_ones(pki: Path, tmp_path: Path) -> None:
    """The path cache as a restarted daemon finds it: path 0's entry matches any loopback round
    trip, path 1's describes a 1 s route. The new session resumes path 0 and drops path 1."""
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "r.bin"
    payload(src, 8 << 20, 5)
    a_config = load_config(a_cfg)
    peer = a_config.peer("gw-b")
    assert peer is not None
    cache = PathCache(a_config.data_dir / "path-cache.json")
    now = time.time()
    cache.entries["gw-b"] = {format_endpoint(peer.paths[0]): PathMemory(400e6, 1e-6, 1.0, now - 30),
                             format_endpoint(peer.paths[1]): PathMemory(400e6, 1.0, 1.0, now - 30)}
    a_config.data_dir.mkdir(parents=True)
    write_state(cache.path, {p: {a: dataclasses.asdict(e) for a, e in paths.items()}
                             for p, paths in cache.entries.items()})
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        t = await call(client, "submit", "gw-b", str(src))
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        session = a.sessions["gw-b"]  # still warm
        stats = session.stats().paths
        assert [(p.resumes, p.resumes_dropped) for p in stats] == [(1, 0), (0, 1)]


async def test_a_rate_capped_gateway_sends_no_faster_than_the_cap(pki: Path, tmp_path: Path) -> None:
    """[limits] rate_mbps caps every path's sending rate: two 60 Mb/s paths over loopback,
    where an uncapped transfer runs at a Gb/s or more."""
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra="[limits]\nrate_mbps = 60")
    src = tmp_path / "c.bin"
    size = 12 << 20
    payload(src, size, 6)
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        t = await call(client, "submit", "gw-b", str(src))
        done = await call(client, "wait", t["id"], 60)
        assert done["state"] == "done", done  # type: ignore[index]
        stats = done["stats"]  # type: ignore[index]
        session = a.sessions["gw-b"]
        assert [p.pacing_rate_bps <= 60e6 for p in session.stats().paths] == [True, True]
    elapsed = stats["elapsed_s"]
    assert elapsed >= size * 8 / 120e6, stats
    for path in stats["paths"]:
        assert path["payload_bytes"] * 8 / elapsed <= 60e6, stats
