"""Baseline: the same loopback transfer over one aioquic QUIC stream, same mutual TLS.

A receiver child process (this module as ``__main__``, see ``bench.child``) runs
an aioquic server that demands a client certificate from the test CA
(``control.tlsauth``), hashes the one stream it receives and answers with the
digest; this process sends the seeded payload and compares. Both sides run
on uvloop, each in its own process, as in the wanxport loopback bench, so
the comparison is like for like. Completion runs from the connection being
established to the digest arriving.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection

from wanxport.aio.loop import run
from wanxport.bench.child import module_command
from wanxport.control.certs import make_test_pki
from wanxport.control.link import make_configuration
from wanxport.control.tlsauth import install_client_auth
from wanxport.report import PathReport, build_report

CHUNK = 1 << 20
MAX_QUEUED = 4 << 20
POLL_S = 0.001
START_TIMEOUT_S = 30.0


class _Receiver(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hash = hashlib.sha256()
        self._bytes = 0

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            self._hash.update(event.data)
            self._bytes += len(event.data)
            if event.end_stream:
                answer = json.dumps({"sha256": self._hash.hexdigest(), "bytes": self._bytes}).encode()
                self._quic.send_stream_data(event.stream_id, answer, end_stream=True)
                self.transmit()


class _Sender(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buffer = b""

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            self._buffer += event.data
            if event.end_stream and not self.answer.done():
                self.answer.set_result(self._buffer)
        elif isinstance(event, events.ConnectionTerminated) and not self.answer.done():
            self.answer.set_exception(ConnectionError(f"aioquic connection ended: {event.reason_phrase}"))


async def _serve(pki: Path) -> None:
    config = make_configuration(is_client=False, cert=pki / "b.pem", key=pki / "b.key",
                                ca=pki / "ca.pem", idle_timeout_s=30.0)

    def create_protocol(quic: QuicConnection, stream_handler: Any = None) -> _Receiver:
        install_client_auth(quic, pki / "ca.pem")
        return _Receiver(quic, stream_handler)

    server = await serve("127.0.0.1", 0, configuration=config, create_protocol=create_protocol)
    port = server._transport.get_extra_info("sockname")[1]
    sys.stdout.write(json.dumps({"port": port}) + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent is done
    server.close()


async def _send(pki: Path, port: int, payload: bytes) -> tuple[float, dict[str, Any]]:
    config = make_configuration(is_client=True, cert=pki / "a.pem", key=pki / "a.key", ca=pki / "ca.pem",
                                idle_timeout_s=30.0, server_name="b")
    config.max_stream_data = config.max_data = 64 << 20
    async with connect("127.0.0.1", port, configuration=config, create_protocol=_Sender) as client:
        assert isinstance(client, _Sender)
        start = time.monotonic()
        quic = client._quic
        stream = quic.get_next_available_stream_id()
        view = memoryview(payload)
        for offset in range(0, len(payload), CHUNK):
            quic.send_stream_data(stream, bytes(view[offset:offset + CHUNK]),
                                  end_stream=offset + CHUNK >= len(payload))
            client.transmit()
            # aioquic trims its send buffer from the front on every ACK (a copy of
            # what is left), so keep little queued or the baseline turns quadratic.
            while _queued(quic, stream) > MAX_QUEUED:
                await asyncio.sleep(POLL_S)
        answer = json.loads(await client.answer)
        return time.monotonic() - start, answer


def _queued(quic: QuicConnection, stream: int) -> int:
    """Bytes aioquic still holds for ``stream`` (sent but unacknowledged, or unsent)."""
    return len(quic._streams[stream].sender._buffer)


def run_aioquic_bench(size: int, seed: int = 1) -> dict[str, Any]:
    """One aioquic transfer of ``size`` seeded random bytes on loopback; the v1 report."""
    from wanxport.bench.transfer import random_payload

    wall_start = time.perf_counter()
    payload = random_payload(size, seed)
    expected = hashlib.sha256(payload).hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        make_test_pki(pki, ["a", "b"])
        child = subprocess.Popen(module_command("wanxport_lab.aioquic_bench", str(pki)),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        try:
            assert child.stdout is not None and child.stdin is not None
            ready, _, _ = select.select([child.stdout], [], [], START_TIMEOUT_S)
            if not ready:
                raise TimeoutError("the aioquic receiver process did not start")
            port = int(json.loads(child.stdout.readline())["port"])
            completion, answer = run(_send(pki, port, payload))
        finally:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    intact = answer.get("sha256") == expected and answer.get("bytes") == size
    return build_report(
        scenario="loopback-1x-quic", mode="loopback", transport="aioquic", payload_bytes=size,
        completion_s=completion, ideal_s=None, intact=intact, wall_s=time.perf_counter() - wall_start,
        paths=[PathReport("lo0", size, 0, None, "active")], delivered_bytes=size if intact else 0,
        cipher="tls1.3-quic", pacer=None, datagrams_rejected=0,
    )


if __name__ == "__main__":
    run(_serve(Path(sys.argv[1])))
