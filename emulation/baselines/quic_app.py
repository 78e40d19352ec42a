"""Sender and receiver of the ``aioquic`` baseline: one QUIC connection, one stream.

    python -m emulation.baselines.quic_app recv '<json spec>'   # in gateway b
    python -m emulation.baselines.quic_app send '<json spec>'   # in gateway a

Same runner protocol as ``tcp_app`` (JSON lines; the sender waits for "go";
the receiver answers one byte on the stream when the payload is in). The
stream starts with the same 16-byte (offset, length) header. The receiver makes
a throw-away self-signed certificate (``cryptography``) at start; the sender
does not verify it, since authentication is not what this baseline measures.

Tuning: flow-control windows (connection and stream) of the requested buffer
size, datagrams as large as the path MTU allows, the requested congestion
control (aioquic has reno and cubic), large UDP socket buffers. The sender
keeps at most one window of unacknowledged data buffered in aioquic, so memory
stays bounded whatever the payload size.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import socket
import sys
import time
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent, StreamDataReceived
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from emulation.baselines import payload
from emulation.baselines.tcp_app import HEADER, Slice, emit, run_async_role

ALPN = ["wanxport-baseline"]
UDP_BUFFER = 16 << 20


def self_signed(path_prefix: str) -> tuple[str, str]:
    """Write a fresh EC certificate and key; return their file names."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "baseline")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_file, key_file = f"{path_prefix}.crt", f"{path_prefix}.key"
    with open(cert_file, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_file, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return cert_file, key_file


def configuration(spec: dict[str, Any], is_client: bool) -> QuicConfiguration:
    window = int(spec["window"])
    return QuicConfiguration(
        is_client=is_client, alpn_protocols=ALPN, max_data=window, max_stream_data=window,
        max_datagram_size=int(spec["datagram"]),
        congestion_control_algorithm=spec.get("cc") or "cubic",
        idle_timeout=600.0,
    )


def _enlarge(transport: Any) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UDP_BUFFER)


# -- receiver ----------------------------------------------------------------


class Receiver(QuicConnectionProtocol):
    """Hashes the stream as it arrives; answers one byte when it is complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slice = Slice()
        self.t_first: float | None = None
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def quic_event_received(self, event: QuicEvent) -> None:
        if not isinstance(event, StreamDataReceived) or self.done.done():
            return
        if self.t_first is None:
            self.t_first = time.monotonic()
        self.slice.take(memoryview(event.data))
        if self.slice.complete:
            self.done.set_result(time.monotonic())
            self._quic.send_stream_data(event.stream_id, b"\x01", end_stream=True)
            self.transmit()


async def receive(spec: dict[str, Any]) -> None:
    config = configuration(spec, is_client=False)
    config.load_cert_chain(*self_signed(spec["cert_prefix"]))
    accepted: asyncio.Future[Receiver] = asyncio.get_running_loop().create_future()

    def create(*args: Any, **kwargs: Any) -> Receiver:
        proto = Receiver(*args, **kwargs)
        if not accepted.done():
            accepted.set_result(proto)
        return proto

    server = await serve(spec.get("bind", "0.0.0.0"), spec["port"], configuration=config,
                         create_protocol=create)
    _enlarge(server._transport)
    emit({"event": "listening"})
    proto: Receiver | None = None
    try:
        proto = await accepted
        t_end = await proto.done
        await asyncio.sleep(0)  # let the answer byte go out before reporting
        emit(_recv_report(proto, t_end))
        await asyncio.sleep(1.0)  # the sender closes; give the answer time to arrive
    except asyncio.CancelledError:
        emit(_recv_report(proto, None))
    finally:
        server.close()


def _recv_report(proto: Receiver | None, t_end: float | None) -> dict[str, Any]:
    if proto is None:
        return {"event": "done", "complete": False, "t_first": None, "t_end": None, "bytes": 0,
                "slices": []}
    return {"event": "done", "complete": t_end is not None, "t_first": proto.t_first,
            "t_end": t_end, "bytes": proto.slice.received, "slices": [proto.slice.summary(None)]}


# -- sender ------------------------------------------------------------------


class Sender(QuicConnectionProtocol):
    """Wakes the writer on every datagram (acknowledgements free window) and counts losses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wake = asyncio.Event()
        self.answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost_bytes = 0
        loss = self._quic._loss
        original = loss._on_packets_lost

        def counting(**kw: Any) -> None:
            self.lost_bytes += sum(p.sent_bytes for p in kw["packets"] if p.is_ack_eliciting)
            original(**kw)

        loss._on_packets_lost = counting  # type: ignore[method-assign]  # count, then recover

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        super().datagram_received(data, addr)
        self.wake.set()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived) and event.data and not self.answered.done():
            self.answered.set_result(None)


async def send(spec: dict[str, Any]) -> None:
    config = configuration(spec, is_client=True)
    config.verify_mode = False  # type: ignore[assignment]  # ssl.CERT_NONE == 0
    async with connect(spec["dst"], spec["port"], configuration=config,
                       create_protocol=Sender) as proto:
        assert isinstance(proto, Sender)
        _enlarge(proto._transport)
        emit({"event": "ready"})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        t0 = time.monotonic()
        hasher = hashlib.sha256()
        finished = False
        try:
            await _write(proto, spec, hasher)
            await proto.answered
            finished = True
        except asyncio.CancelledError:
            pass
        active_s = time.monotonic() - t0  # it had data to send until answered or stopped
        rtt = proto._quic._loss._rtt_smoothed
        emit({"event": "done", "t0": t0, "finished": finished,
              "slices": [{"src": None, "offset": 0, "length": spec["size"],
                          "sha256": hasher.hexdigest(), "active_s": round(active_s, 4),
                          "info": {"rtt_us": int(rtt * 1e6), "lost_bytes": proto.lost_bytes}}]})
        proto.close()


async def _write(proto: Sender, spec: dict[str, Any], hasher: Any) -> None:
    quic = proto._quic
    stream_id = quic.get_next_available_stream_id()
    quic.send_stream_data(stream_id, HEADER.pack(0, spec["size"]))
    limit = int(spec["window"])
    for chunk in payload.chunks(spec["seed"], 0, spec["size"]):
        sender = quic._streams[stream_id].sender
        while sender._buffer_stop - sender._buffer_start > limit:
            proto.wake.clear()
            await proto.wake.wait()
        hasher.update(chunk)
        quic.send_stream_data(stream_id, bytes(chunk))
        proto.transmit()
    quic.send_stream_data(stream_id, b"", end_stream=True)
    proto.transmit()


def main(argv: list[str]) -> int:
    return run_async_role(argv, receive, send)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
