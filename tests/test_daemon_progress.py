"""A transfer's progress as a client sees it: bytes held across interrupts and resumes,
goodput of what was sent, ``stalled`` with a reason, cancel cleaning up the receiver,
and ``transfer watch``'s live line.

The sender's paths are capped (``[limits] rate_mbps``) so that a transfer is still
running when the test acts on it; no rate is asserted.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import make_pki, running, two_sites
from gateway_helpers import cli, env

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.service import GatewayDaemon
from wanxport.daemon.watch import RateMeter, progress_line, watch

pytestmark = pytest.mark.timeout(90)

CHECKPOINT = 1 << 20
SLOW = f'[limits]\nrate_mbps = 40\n[transfer]\ncheckpoint_bytes = "{CHECKPOINT}"\ndrain_seconds = 0.3'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def source(tmp_path: Path, mib: int = 24) -> Path:
    path = tmp_path / "big.bin"
    path.write_bytes(__import__("random").Random(9).randbytes(mib << 20))
    return path


def view(daemon: GatewayDaemon, transfer_id: str) -> dict[str, Any]:
    assert daemon.store is not None
    transfer = daemon.store.get(transfer_id)
    assert transfer is not None
    return {**transfer.to_json(), "bytes_done": daemon.progress(transfer)}


def held(daemon: GatewayDaemon, transfer_id: str) -> int:
    done: int = view(daemon, transfer_id)["bytes_done"]
    return done


async def test_cancel_removes_the_receivers_partial_data_and_keeps_bytes_done(pki: Path,
                                                                              tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=SLOW)
    src = source(tmp_path)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(src))
        partial = b.config.received_dir / "gw-a" / ".big.bin.partial"
        state = partial.with_name(partial.name + ".state")
        await until(lambda: state.exists() and held(a, t["id"]) >= 2 * CHECKPOINT,
                    "two pieces recorded at the receiver")
        cancelled = await asyncio.to_thread(client.cancel, t["id"])
        await until(lambda: view(a, t["id"])["state"] == "cancelled", "cancelled")
        await until(lambda: not partial.exists() and not state.exists(),
                    "the receiver removed the partial data")
        record = await asyncio.to_thread(client.get, t["id"])
        assert record["state"] == "cancelled" and record["bytes_done"] >= 2 * CHECKPOINT, (cancelled, record)
        assert not (b.config.received_dir / "gw-a" / "big.bin").exists()


async def test_bytes_done_survive_an_interrupt_and_goodput_counts_only_what_was_sent(
        pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=SLOW)
    src = source(tmp_path)
    async with running(b_cfg) as b:
        async with running(a_cfg) as a:  # drained mid-transfer (drain_seconds 0.3)
            client = GatewayClient(str(a.config.api_socket))
            t = await asyncio.to_thread(client.submit, "gw-b", str(src), key="resume-me")
            await until(lambda: held(a, t["id"]) >= 4 * CHECKPOINT, "4 pieces sent")
        assert a.store is not None
        interrupted = a.store.get(t["id"])
        assert interrupted is not None and interrupted.state == "queued", interrupted
        assert interrupted.reason == "interrupted by shutdown"
        kept = interrupted.bytes_done
        assert kept >= 4 * CHECKPOINT, "bytes_done is what the peer holds, not reset by the interrupt"
        async with running(a_cfg) as a:
            client = GatewayClient(str(a.config.api_socket))
            waiting = await asyncio.to_thread(client.get, t["id"])
            # Its descriptors went with the process: kept bytes still count while it waits.
            assert waiting["state"] == "needs-resubmit" and waiting["bytes_done"] == kept, waiting
            again = await asyncio.to_thread(client.submit, "gw-b", str(src), key="resume-me")
            assert again["id"] == t["id"], again
            done = await asyncio.to_thread(client.wait, t["id"], 60)
    assert done["state"] == "done" and done["attempts"] == 2, done
    assert done["bytes_done"] == done["bytes_total"] == src.stat().st_size
    stats = done["stats"]
    assert stats["skipped_bytes"] >= kept - 2 * CHECKPOINT, "the resume found what was recorded"
    assert stats["payload_bytes"] == done["bytes_total"] - stats["skipped_bytes"], "only this run's bytes"
    assert stats["goodput_bps"] == pytest.approx(stats["payload_bytes"] * 8 / stats["elapsed_s"], rel=0.01)
    assert (b.config.received_dir / "gw-a" / "big.bin").read_bytes() == src.read_bytes()


async def test_no_progress_for_stall_seconds_shows_stalled_with_the_reason(
        pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=SLOW)
    src = source(tmp_path)
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(src))
        await until(lambda: view(a, t["id"])["state"] == "active" and held(a, t["id"]) > 0, "sending")
        frozen = a.progress(a.store.get(t["id"]))  # type: ignore[union-attr,arg-type]
        real_progress = a.progress
        monkeypatch.setattr(a, "progress", lambda transfer: frozen)  # the peer acknowledges nothing more
        now = time.monotonic()
        a.check_stalls(now)
        a.check_stalls(now + a.config.stall_s - 1)
        assert view(a, t["id"])["state"] == "active", "not yet"
        a.check_stalls(now + a.config.stall_s)
        stalled = await asyncio.to_thread(client.get, t["id"])
        assert stalled["state"] == "stalled", stalled
        assert stalled["reason"].startswith("no progress for 60 s: peer gw-b acknowledges nothing (paths "), \
            stalled
        assert view(a, t["id"])["updated"] == stalled["updated"], "checked again: nothing to write"
        a.check_stalls(now + a.config.stall_s + 5)
        assert view(a, t["id"])["updated"] == stalled["updated"]
        monkeypatch.setattr(a, "progress", real_progress)
        await until(lambda: a.progress(a.store.get(t["id"])) != frozen, "bytes move again")  # type: ignore[union-attr,arg-type]
        a.check_stalls(now + a.config.stall_s + 1)
        again = await asyncio.to_thread(client.get, t["id"])
        assert again["state"] in ("active", "done") and again["reason"] is None, again
        await asyncio.to_thread(client.wait, t["id"], 60)


def test_the_progress_line_shows_bytes_percent_rate_and_time_left() -> None:
    meter = RateMeter(window_s=5.0)
    assert meter.add(0.0, 0) is None
    assert meter.add(2.0, 20_000_000) == 10_000_000.0
    line = progress_line({"state": "active", "bytes_done": 20_000_000, "bytes_total": 80_000_000}, 1e7)
    assert line.split() == ["20,000,000", "25%", "10.00MB/s", "0:00:06", "active"]
    waiting = progress_line({"state": "queued", "reason": "waiting for peer gw-b", "bytes_done": 0,
                             "bytes_total": 10}, None)
    assert waiting.split()[:4] == ["0", "0%", "--", "--:--:--"]
    assert waiting.endswith("queued (waiting for peer gw-b)")


async def test_transfer_watch_follows_a_transfer_to_the_end(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=SLOW)
    src = source(tmp_path, 8)
    async with running(a_cfg) as a:
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(src))  # queued: gw-b is not up yet
        proc = await asyncio.create_subprocess_exec(
            *cli("transfer", "--socket", str(a.config.api_socket), "watch", t["id"]), env=env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        # The watcher has drawn its first line before the peer exists, however slowly it
        # started, so the transfer's run is rewritten in place after it (not only its end).
        first = await asyncio.wait_for(proc.stderr.readexactly(2), 60)
        async with running(b_cfg):
            out, rest = await asyncio.wait_for(proc.communicate(), 60)
            err = first + rest
            buffer = io.StringIO()
            final = await asyncio.to_thread(watch, client, t["id"], buffer, 0)
    assert final["state"] == "done" and buffer.getvalue().endswith("done\n")
    assert proc.returncode == 0, err
    updates = err.decode().split("\r")
    assert updates[-1].split()[:2] == [f"{8 << 20:,}", "100%"] and updates[-1].rstrip().endswith("done")
    assert len(updates) >= 3, "a line rewritten in place while it ran"
    assert '"state": "done"' in out.decode()


async def test_a_peer_whose_data_plane_died_shows_stalled_unreachable_at_once(pki: Path,
                                                                               tmp_path: Path) -> None:
    """The peer's data plane stops (its control channel lives on, as a killed peer's does
    for its resume window): the transfer does not wait stall_seconds to say so."""
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=SLOW)
    src = source(tmp_path)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        t = await asyncio.to_thread(client.submit, "gw-b", str(src))
        await until(lambda: view(a, t["id"])["state"] == "active" and held(a, t["id"]) > 0, "sending")
        b.sessions["gw-a"].endpoint.abort()  # gone without a word
        await until(lambda: view(a, t["id"])["state"] != "active", "not active with frozen bytes")
        record = await asyncio.to_thread(client.get, t["id"])
        assert a.config.stall_s == 60
        assert record["state"] == "stalled" and "peer gw-b unreachable (paths " in record["reason"], record
        await asyncio.to_thread(client.cancel, t["id"])


async def test_a_cancel_while_the_peer_is_away_removes_its_partial_data_once_it_is_back(
        pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=SLOW)
    src = source(tmp_path)
    async with running(a_cfg) as a:
        async with running(b_cfg) as b:
            client = GatewayClient(str(a.config.api_socket))
            t = await asyncio.to_thread(client.submit, "gw-b", str(src))
            partial = b.config.received_dir / "gw-a" / ".big.bin.partial"
            state = partial.with_name(partial.name + ".state")
            await until(lambda: state.exists() and held(a, t["id"]) >= 2 * CHECKPOINT,
                        "pieces at the receiver")
        await until(lambda: view(a, t["id"])["state"] == "queued", "the peer went away: queued again")
        assert partial.exists() and state.exists(), "kept for a resume"
        cancelled = await asyncio.to_thread(client.cancel, t["id"])
        assert cancelled["state"] == "cancelled" and cancelled["attempts"] == 1
        async with running(b_cfg):  # back: the cancel reaches it
            await until(lambda: not partial.exists() and not state.exists(), "the partial data removed")
            assert view(a, t["id"])["state"] == "cancelled"
