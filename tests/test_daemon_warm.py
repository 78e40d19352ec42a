"""Warm sessions and the on-disk path cache."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites
from test_daemon_transfers import call, payload, running

from wanxport.client import GatewayClient
from wanxport.core.warm import PathMemory
from wanxport.daemon.pathcache import PathCache

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
            if "gw-b" not in a.outgoing:
                break
            await asyncio.sleep(0.01)
        assert "gw-b" not in a.outgoing
        t = await call(client, "submit", "gw-b", str(src), "three.bin")
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        assert a.dialled == 2


def test_only_validated_paths_are_cached_and_survive_a_restart(tmp_path: Path) -> None:
    from types import SimpleNamespace

    def stats(name: str, state: str, rate: float, rtt: float | None) -> SimpleNamespace:
        return SimpleNamespace(name=name, cc_state=state, bandwidth_bps=rate, min_rtt_s=rtt, srtt_s=rtt)

    paths = [stats("p0", "probe_bw", 9e9, 0.05), stats("p1", "startup", 5e9, 0.03),
             stats("p2", "probe_rtt", 2e9, None)]
    session = SimpleNamespace(endpoint=SimpleNamespace(session=SimpleNamespace(
        stats=lambda: SimpleNamespace(paths=paths))))
    addresses = (("10.0.0.2", 7400), ("10.0.1.2", 7400), ("10.0.2.2", 7400))
    cache = PathCache(tmp_path / "path-cache.json")
    assert cache.save("gw-b", addresses, session) == 1  # type: ignore[arg-type]
    again = PathCache(tmp_path / "path-cache.json")  # as after a restart
    assert set(again.entries["gw-b"]) == {"10.0.0.2:7400"}, "a search (Startup) is not a measurement"
    entry = again.entries["gw-b"]["10.0.0.2:7400"]
    assert (entry.rate_bps, entry.min_rtt_s) == (9e9, 0.05) and abs(entry.saved_at - time.time()) < 60


def test_careful_resume_plan_follows_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "path-cache.json"
    cache = PathCache(path)
    now = time.time()
    cache.entries["gw-b"] = {"10.0.0.2:7400": PathMemory(8e9, 0.050, 0.055, now - 60),
                             "10.0.1.2:7400": PathMemory(4e9, 0.030, 0.031, now - 7200)}
    paths = (("10.0.0.2", 7400), ("10.0.1.2", 7400), ("10.0.2.2", 7400))
    assert cache.resume_plan("gw-b", paths, [0.052, 0.030, 0.010], now) == [4e9, 0.0, 0.0], \
        "half the saved rate on the same route; an hour-old entry and an unknown path start over"
    assert cache.resume_plan("gw-b", paths, [0.039, 0.03, None], now)[0] == 0.0, "22 % lower: another route"
    assert cache.resume_plan("gw-b", paths, [0.067, 0.03, None], now)[0] == 0.0, "RTT above 1.2 x srtt"
    assert cache.resume_plan("gw-c", paths, [0.05, 0.03, 0.01], now) == [0.0, 0.0, 0.0]
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
        assert b.inbox is not None
        assert (b.inbox.written_count, b.inbox.written_bytes, b.inbox.written) == (2, 2 << 20, [])
        for _ in range(300):  # idle for warm_seconds: the session ends with its files gone
            if "gw-b" not in a.outgoing:
                break
            await asyncio.sleep(0.01)
        assert "gw-b" not in a.outgoing
        t = await call(client, "submit", "gw-b", str(src), "three.bin")
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        assert (received / "three.bin").stat().st_size == 1 << 20
