"""The daemon's transfer API, two gateways in one process over loopback paths."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites

from wanxport.client import ApiError, GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.service import GatewayDaemon

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


@asynccontextmanager
async def running(config: Path) -> AsyncIterator[GatewayDaemon]:
    daemon = GatewayDaemon(load_config(config), signals=False)
    await daemon.start()
    try:
        yield daemon
    finally:
        daemon.request_stop()
        await daemon.serve()


async def call(client: GatewayClient, method: str, *args: object, **kwargs: object) -> object:
    """The blocking client, off the loop both daemons run on."""
    return await asyncio.to_thread(getattr(client, method), *args, **kwargs)


def payload(path: Path, size: int, seed: int) -> str:
    data = __import__("random").Random(seed).randbytes(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


async def test_submit_file_and_directory_arrive_verified(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "src"
    (src / "ckpt" / "shards").mkdir(parents=True)
    digest = payload(src / "model.bin", 3 << 20, 1)
    payload(src / "ckpt" / "shards" / "0.pt", 200_000, 2)
    (src / "ckpt" / "empty").write_bytes(b"")
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        one = await call(client, "submit", "gw-b", str(src / "model.bin"), key="k1")
        two = await call(client, "submit", "gw-b", str(src / "ckpt"), "run-7/ckpt")
        for t in (one, two):
            done = await call(client, "wait", t["id"], 60)  # type: ignore[index]
            assert done["state"] == "done", done  # type: ignore[index]
        inbox = b.config.received_dir / "gw-a"
        assert hashlib.sha256((inbox / "model.bin").read_bytes()).hexdigest() == digest
        assert (inbox / "run-7/ckpt/shards/0.pt").read_bytes() == (src / "ckpt/shards/0.pt").read_bytes()
        assert (inbox / "run-7/ckpt/empty").read_bytes() == b""
        assert not [p for p in inbox.rglob(".*")], "no partial file left behind"
        listed = await call(client, "list")
        assert [t["id"] for t in listed] == [one["id"], two["id"]]  # type: ignore[index,union-attr]
        assert done["bytes_done"] == done["bytes_total"] == 200_000  # type: ignore[index]


async def test_same_key_is_one_transfer_across_a_restart(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "x.bin"
    payload(src, 1 << 20, 3)
    async with running(a_cfg) as a:  # the peer is away: the transfer stays queued
        client = GatewayClient(str(a.config.api_socket))
        first = await call(client, "submit", "gw-b", str(src), key="ckpt-1000")
        again = await call(client, "submit", "gw-b", str(src), key="ckpt-1000")
        assert again["id"] == first["id"]  # type: ignore[index]
        with pytest.raises(ApiError) as conflict:
            await call(client, "submit", "gw-b", str(src), "other-name", key="ckpt-1000")
        assert conflict.value.status == 409
        queued = await call(client, "get", first["id"])  # type: ignore[index]
        assert queued["state"] == "queued" and "waiting for peer gw-b" in (queued["reason"] or "")  # type: ignore[index]
    async with running(a_cfg) as a, running(b_cfg) as b:  # restarted: the key and the queue survived
        client = GatewayClient(str(a.config.api_socket))
        third = await call(client, "submit", "gw-b", str(src), key="ckpt-1000")
        assert third["id"] == first["id"]  # type: ignore[index]
        done = await call(client, "wait", first["id"], 60)  # type: ignore[index]
        assert done["state"] == "done"  # type: ignore[index]
        assert len(await call(client, "list")) == 1  # type: ignore[arg-type]
        assert (b.config.received_dir / "gw-a" / "x.bin").read_bytes() == src.read_bytes()


async def test_bad_submissions_fail_at_once_with_the_reason(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    async with running(a_cfg) as a:
        client = GatewayClient(str(a.config.api_socket))
        cases = [(("gw-b", str(tmp_path / "missing")), 422, "does not exist"),
                 (("gw-z", str(tmp_path)), 400, "not a configured peer"),
                 (("gw-b", "relative/path"), 422, "absolute path"),
                 (("gw-b", str(a_cfg), "../escape"), 422, "not a plain relative path")]
        for args, status, text in cases:
            with pytest.raises(ApiError) as err:
                await call(client, "submit", *args)
            assert err.value.status == status and text in str(err.value), (args, err.value)
        assert await call(client, "list") == []
        status_code, body = await call(client, "request", "POST", "/v1/transfers", {"peer": "gw-b", "x": 1})  # type: ignore[misc]
        assert status_code == 400 and "x: unknown field" in body["error"]


async def test_existing_destination_refused_unless_overwrite(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "w.bin"
    payload(src, 300_000, 4)
    async with running(a_cfg) as a, running(b_cfg) as b:
        existing = b.config.received_dir / "gw-a" / "w.bin"
        existing.parent.mkdir(parents=True)
        existing.write_bytes(b"old")
        client = GatewayClient(str(a.config.api_socket))
        refused = await call(client, "submit", "gw-b", str(src))
        refused = await call(client, "wait", refused["id"], 60)  # type: ignore[index]
        assert refused["state"] == "failed" and "exists at the peer" in refused["reason"]  # type: ignore[index]
        assert existing.read_bytes() == b"old"
        replaced = await call(client, "submit", "gw-b", str(src), overwrite=True)
        replaced = await call(client, "wait", replaced["id"], 60)  # type: ignore[index]
        assert replaced["state"] == "done", replaced  # type: ignore[index]
        assert existing.read_bytes() == src.read_bytes()


async def test_cancel_a_queued_transfer_and_status(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    src = tmp_path / "c.bin"
    payload(src, 1000, 5)
    async with running(a_cfg) as a:
        client = GatewayClient(str(a.config.api_socket))
        status = await call(client, "status")
        assert status["site"] == "gw-a" and status["protocol_version"] >= 1  # type: ignore[index]
        assert os.stat(a.config.api_socket).st_mode & 0o777 == 0o660
        t = await call(client, "submit", "gw-b", str(src))
        cancelled = await call(client, "cancel", t["id"])  # type: ignore[index]
        assert cancelled["state"] == "cancelled"  # type: ignore[index]
        with pytest.raises(ApiError) as again:
            await call(client, "cancel", t["id"])  # type: ignore[index]
        assert again.value.status == 409
        with pytest.raises(ApiError) as missing:
            await call(client, "get", "nope")
        assert missing.value.status == 404
