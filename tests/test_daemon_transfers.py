"""The daemon's transfer API, two gateways in one process over loopback paths."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from daemon_helpers import make_pki, running, two_sites

from wanxport.daemon.client import ApiError, GatewayClient
from wanxport.sources import SourceOpenError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


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
        for _ in range(2000):  # until the first dial failed (a condition, with a deadline)
            queued = await call(client, "get", first["id"])  # type: ignore[index]
            if queued["reason"]:  # type: ignore[index]
                break
            await asyncio.sleep(0.01)
        assert queued["state"] == "queued" and "waiting for peer gw-b" in queued["reason"]  # type: ignore[index]
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
        # The client opens the source itself: what it cannot open never reaches the daemon.
        for source in (str(tmp_path / "missing"), "relative/path"):
            with pytest.raises(SourceOpenError):
                await call(client, "submit", "gw-b", source)
        cases = [(("gw-z", str(tmp_path)), 400, "not a configured peer"),
                 (("gw-b", str(a_cfg), "../escape"), 422, "not a plain relative path")]
        for args, status, text in cases:
            with pytest.raises(ApiError) as err:
                await call(client, "submit", *args)
            assert err.value.status == status and text in str(err.value), (args, err.value)
        # A path alone (root may: its rights are the daemon's) is opened by the daemon.
        for source, status, text in [(str(tmp_path / "missing"), 422, "No such file"),
                                     ("relative/path", 400, "absolute path")]:
            code, body = await call(client, "request", "POST", "/v1/transfers",  # type: ignore[misc]
                                    {"peer": "gw-b", "source": source})
            assert code == status and text in body["error"], (source, body)
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


def _free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_reload_adds_and_removes_a_path_while_a_transfer_runs(pki: Path, tmp_path: Path) -> None:
    from daemon_helpers import write_config
    from gateway_helpers import free_path_ports

    a0, a1, b0, b1, b2 = free_path_ports(5)
    a_cfg = write_config(tmp_path / "a.toml", "gw-a", pki, [a0, a1], {"gw-b": [b0, b1]})
    b_cfg = write_config(tmp_path / "b.toml", "gw-b", pki, [b0, b1], {"gw-a": [a0, a1]})
    src = tmp_path / "r.bin"
    digest = payload(src, 96 << 20, 6)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        first = await call(client, "submit", "gw-b", str(src), "first.bin")
        while a.store.get(first["id"]).state != "active":  # type: ignore[index,union-attr]
            await asyncio.sleep(0.005)
        write_config(b_cfg, "gw-b", pki, [b0, b2], {"gw-a": [a0, a1]})
        write_config(a_cfg, "gw-a", pki, [a0, a1], {"gw-b": [b0, b2]})
        assert a.store.get(first["id"]).state == "active"  # type: ignore[index,union-attr]
        b.reload()
        a.reload()
        assert not _free(b2), "the added path is bound at once"
        assert not _free(b1), "the removed path stays with the session that uses it"
        done = await call(client, "wait", first["id"], 90)  # type: ignore[index]
        assert done["state"] == "done" and done["attempts"] == 1, done  # type: ignore[index]
        inbox = b.config.received_dir / "gw-a"
        assert hashlib.sha256((inbox / "first.bin").read_bytes()).hexdigest() == digest
        for _ in range(1000):  # the session ends once A's queue is empty; then b1 is released
            if _free(b1):
                break
            await asyncio.sleep(0.01)
        assert _free(b1), "the removed path's port is closed once no session uses it"
        second = await call(client, "submit", "gw-b", str(src), "second.bin")
        done = await call(client, "wait", second["id"], 90)  # type: ignore[index]
        assert done["state"] == "done", done  # type: ignore[index]
        assert hashlib.sha256((inbox / "second.bin").read_bytes()).hexdigest() == digest
        by_path = {p["name"]: p["payload_bytes"] for p in done["stats"]["paths"]}  # type: ignore[index]
        assert by_path["p1"] > 0, f"the new path carried data: {by_path}"
        assert b.config.listen == (("127.0.0.1", b0), ("127.0.0.1", b2))
