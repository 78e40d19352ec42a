"""What an operator reads at INFO: a line per transfer at both ends, a WARNING for a peer
away for long, path changes summarised (at most a line per path per minute)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import make_pki, running, two_sites

from wanxport.aio.ratelog import RateLimitedLog
from wanxport.daemon import service
from wanxport.daemon.client import GatewayClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


async def test_one_line_per_transfer_submitted_and_finished_at_both_ends(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wanxport.daemon")
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 300_000)
    (src / "b.bin").write_bytes(b"b" * 200_000)
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(src), "run/ckpt")
        done = await asyncio.to_thread(client.wait, t["id"], 60)
        assert done["state"] == "done", done
    sent = messages(caplog, "wanxport.daemon.routes") + messages(caplog, "wanxport.daemon.service")
    assert sum(m.startswith(f"transfer {t['id']} submitted by uid ") and f": {src} -> gw-b:run/ckpt (" in m
               for m in sent) == 1, sent
    finished = [m for m in sent if m.startswith(f"transfer {t['id']} to gw-b done: 488.28 KiB in ")]
    assert len(finished) == 1 and finished[0].endswith("b/s)"), sent
    received = [m for m in messages(caplog, "wanxport.daemon.receipts") if t["id"] in m]
    assert len(received) == 1, received
    assert received[0].startswith(f"received transfer {t['id']} from gw-a: 2 files, 488.28 KiB in "), received


async def test_a_peer_away_for_long_is_a_warning_once_and_its_return_too(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="wanxport.daemon")
    monkeypatch.setattr(service, "PEER_UNREACHABLE_WARN_S", 0.5)
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    (tmp_path / "x.bin").write_bytes(b"x" * 1000)
    async with running(a_cfg) as a:
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(tmp_path / "x.bin"))
        while not any(r.levelno == logging.WARNING and "unreachable" in r.message for r in caplog.records):
            await asyncio.sleep(0.05)
        async with running(b_cfg):
            done = await asyncio.to_thread(client.wait, t["id"], 60)
            assert done["state"] == "done"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and r.name == "wanxport.daemon.service"]
    away = [w for w in warnings if w.startswith("peer gw-b unreachable for ")]
    assert len(away) == 1 and "its transfers wait" in away[0], warnings
    assert sum(w.startswith("peer gw-b reachable again after ") for w in warnings) == 1, warnings


class FakeLoop:
    """A clock and a scheduler the test advances by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, Any]] = []

    def later(self, delay_s: float, callback: Any) -> None:
        self.due.append((self.now + delay_s, callback))

    def advance(self, to: float) -> None:
        self.now = to
        for entry in [d for d in self.due if d[0] <= to]:
            self.due.remove(entry)
            entry[1]()


def test_path_changes_are_summarised_one_line_per_path_per_minute(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.ratelog")
    loop = FakeLoop()
    limited = RateLimitedLog(logging.getLogger("test.ratelog"), 60.0, clock=lambda: loop.now,
                             schedule=loop.later)
    states = ["active", "degraded"]
    for i in range(200):  # a flap every 0.5 s for 100 s on p0; p1 changes once
        loop.advance(i * 0.5)
        limited.log("p0", logging.INFO, "path %s: %s -> %s", "p0", states[i % 2], states[(i + 1) % 2])
        if i == 10:
            limited.log("p1", logging.INFO, "path %s: %s -> %s", "p1", "active", "failed")
    loop.advance(200.0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "path p0: active -> degraded",
        "path p1: active -> failed",
        # At 60 s the latest of the 119 changes held since, then the latest of the next 80 at
        # 120 s (nothing more came): the log ends on the path's current state.
        "path p0: degraded -> active (118 more changes in the last 60 s not logged)",
        "path p0: degraded -> active (79 more changes in the last 60 s not logged)",
    ], lines
