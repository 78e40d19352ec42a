"""The Python API over loopback: arrays into preallocated buffers, bytes, refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from gateway_helpers import free_path_ports

from wanxport.api import connect, listen
from wanxport.control import CertificateError
from wanxport.control.certs import make_foreign_leaf, make_test_pki
from wanxport.core.events import ShardAcknowledged

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    make_foreign_leaf(directory, "gw-evil")
    return directory


async def test_arrays_and_bytes_arrive_in_place(pki: Path) -> None:
    first_port, second_port = free_path_ports(2)
    assert second_port == first_port + 1  # consecutive ports, two paths: one UDP port per path
    paths = [f"127.0.0.1:{first_port}", f"127.0.0.1:{second_port}"]
    rng = np.random.default_rng(7)
    grads = rng.standard_normal((256, 1024)).astype(np.float32)
    blob = rng.bytes(123_457)
    async with listen(pki / "gw-b", pki / "ca.pem", paths) as server:
        out = np.empty_like(grads)
        server.expect(0, out)  # before the session: placed by the data plane
        async with connect(pki / "gw-a", pki / "ca.pem", paths) as sender:
            async with await server.accept() as receiver:
                assert sender.peer_name == "gw-b" and receiver.peer_name == "gw-a"
                late = bytearray(len(blob))
                receiver.expect(1, late)
                assert await sender.send(grads, step=3, name="layer0") == 0
                first = await receiver.receive()
                assert await sender.send(blob) == 1
                second = await receiver.receive()
    assert first.array is out and first.ok and first.step == 3 and first.name == "layer0"
    np.testing.assert_array_equal(out, grads)
    assert second.tobytes() == blob and bytes(late) == blob
    assert receiver.datagrams_rejected == 0


async def test_array_without_buffer_keeps_dtype_and_shape(pki: Path) -> None:
    paths = [f"127.0.0.1:{p}" for p in free_path_ports(1)]
    data = np.arange(3 * 5 * 7, dtype=np.int64).reshape(3, 5, 7)[:, ::2]  # not contiguous
    async with listen(pki / "gw-b", pki / "ca.pem", paths) as server:
        sender = await connect(pki / "gw-a", pki / "ca.pem", paths)
        async with sender, await server.accept() as receiver:
            await sender.send(data, shard_id=42)
            shard = await receiver.receive()
    assert shard.shard_id == 42 and shard.array.dtype == np.int64
    np.testing.assert_array_equal(shard.array, data)


async def test_foreign_certificate_is_refused_by_both(pki: Path) -> None:
    paths = [f"127.0.0.1:{p}" for p in free_path_ports(1)]
    async with listen(pki / "gw-b", pki / "ca.pem", paths) as server:
        with pytest.raises(CertificateError, match="certificate"):
            await connect(pki / "gw-evil", pki / "ca.pem", paths)
        refused = await server.rejections.get()
    assert "certificate" in str(refused) and "gw-evil" in str(refused)


async def test_send_succeeds_when_the_verdict_outruns_the_data_plane_ack(
        pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver that leaves right after its verdict may end the session before the sender
    processed the data plane's acknowledgement: the verdict (sent only once the shard is
    verified) answers for both. Here the sender never sees a data-plane acknowledgement."""
    paths = [f"127.0.0.1:{p}" for p in free_path_ports(2)]
    data = np.random.default_rng(3).bytes(2_000_000)
    async with listen(pki / "gw-b", pki / "ca.pem", paths) as server:
        async with await connect(pki / "gw-a", pki / "ca.pem", paths) as sender:
            endpoint = sender.session.endpoint
            on_event = endpoint._on_event

            def drop_acknowledgements(event: object) -> None:
                if not isinstance(event, ShardAcknowledged):
                    on_event(event)

            monkeypatch.setattr(endpoint, "_on_event", drop_acknowledgements)

            async def receive_and_leave() -> bytes:
                async with await server.accept() as receiver:
                    return (await receiver.receive()).tobytes()

            sent, got = await asyncio.gather(sender.send(data), receive_and_leave())
    assert sent == 0 and got == data
