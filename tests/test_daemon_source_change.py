"""A source that changes during its send fails that transfer, never the daemon.

The sender reads each piece with ``preadv`` (a truncated file is a short read, not
SIGBUS, which would end this very test process) and compares the source's identity
(device, inode, size, mtime) before each piece and at the end. The send is slowed
(a rate cap and a small receive budget, so only a few pieces are read ahead) so that
the change lands mid-send, while the same daemon sends another file to a third site.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_helpers import make_pki, running, write_config
from gateway_helpers import free_path_ports

from wanxport.daemon.client import GatewayClient

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20
SIZE = 12 * MIB
SLOW = '[limits]\nrate_mbps = 24\nmemory_budget = "1MiB"\n[transfer]\ncheckpoint_bytes = "256KiB"'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def call(client: GatewayClient, method: str, *args: object, **kwargs: object) -> dict:  # type: ignore[type-arg]
    return await asyncio.to_thread(getattr(client, method), *args, **kwargs)  # type: ignore[no-any-return]


def three_sites(tmp_path: Path, pki: Path) -> tuple[Path, Path, Path]:
    """gw-a sending to gw-b and gw-c (each of those knows only gw-a)."""
    a, b, c = (free_path_ports(2) for _ in range(3))
    return (write_config(tmp_path / "a.toml", "gw-a", pki, a, {"gw-b": b, "gw-c": c}, SLOW),
            write_config(tmp_path / "b.toml", "gw-b", pki, b, {"gw-a": a}, SLOW),
            write_config(tmp_path / "c.toml", "gw-c", pki, c, {"gw-a": a}, SLOW))


def random_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def truncate(path: Path) -> bytes:
    os.truncate(path, 3 * MIB)
    return path.read_bytes()


def rewrite(path: Path) -> bytes:
    """Same size and inode, other bytes, a new mtime."""
    before = path.stat().st_mtime_ns
    data = random_bytes(99, SIZE)
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(before + 10**9, before + 10**9))
    return data


async def _until(condition: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    """Until ``condition()`` holds (the transfer's own progress, polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(condition):
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(("change", "named"), [(truncate, "12 MiB -> 3 MiB"),
                                                (rewrite, "modified (mtime changed)")])
async def test_a_source_changed_mid_send_fails_only_its_transfer(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        change: Callable[[Path], bytes], named: str) -> None:
    caplog.set_level(logging.INFO)
    a_cfg, b_cfg, c_cfg = three_sites(tmp_path, pki)
    src, other = tmp_path / "ckpt.bin", tmp_path / "other.bin"
    src.write_bytes(random_bytes(1, SIZE))
    other_data = random_bytes(2, SIZE)
    other.write_bytes(other_data)
    async with running(a_cfg) as a, running(b_cfg) as b, running(c_cfg) as c:
        client = GatewayClient(str(a.config.api_socket))
        changing = await call(client, "submit", "gw-b", str(src))
        untouched = await call(client, "submit", "gw-c", str(other))
        await _until(lambda: client.get(changing["id"])["bytes_done"] >= 2 * MIB, "progress")
        assert (await call(client, "get", changing["id"]))["state"] == "active"
        new_data = change(src)
        failed = await call(client, "wait", changing["id"], 60)
        assert failed["state"] == "failed" and "source changed during the send" in failed["reason"], failed
        assert named in failed["reason"], failed["reason"]
        done = await call(client, "wait", untouched["id"], 60)
        assert done["state"] == "done", done
        assert (c.config.received_dir / "gw-a" / "other.bin").read_bytes() == other_data
        logs = [r.getMessage() for r in caplog.records]
        failed_line = f"transfer {changing['id']} to gw-b failed: source changed"
        assert any(m.startswith(failed_line) for m in logs), logs
        assert any(m.startswith(f"transfer {changing['id']} from gw-a: 0 of 1 files landed when the session "
                                "ended (cancelled: source changed during the send") for m in logs), \
            "the receiver logs the reason"
        assert any(m.startswith("session with gw-a ended by gw-a (cancelled: source changed during the send")
                   for m in logs), logs
        # The changed file again, as a new transfer: none of the old pieces is reused.
        again = await call(client, "submit", "gw-b", str(src), key="again")
        again = await call(client, "wait", again["id"], 60)
        assert again["state"] == "done", again
        assert again["stats"]["skipped_bytes"] == 0
        assert sum(inbox.resumed_bytes for inbox in b.inboxes.values()) == 0
        received = (b.config.received_dir / "gw-a" / "ckpt.bin").read_bytes()
        assert hashlib.sha256(received).digest() == hashlib.sha256(new_data).digest()
