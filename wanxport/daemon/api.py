"""The transfer API's HTTP/1.1 server on a Unix socket (``curl --unix-socket`` works).

HTTP is parsed by h11: a small, pure-Python, dependency-free, sans-IO HTTP/1.1
state machine, so this module only moves bytes between an asyncio stream and it
(aiohttp would bring a whole framework and its C parts for five JSON routes).
Routing and meaning live in the daemon (``routes.py``); this module turns a
request into ``(method, path, headers, body)`` and a ``(status, json)`` back into a
response, with keep-alive, a body size cap and one-line JSON errors. The socket
is created mode 0660 so that the service's group may submit.

Optionally the same API also listens on TCP with mutual TLS (``api_tcp``): the
daemon's own certificate serves, a client must present one signed by the gateways'
CA, and only the certificate names in ``api_clients`` may use it (the peers'
gateway certificates come from the same CA and must not submit here); any other
name gets 403. ``curl --cert C.pem --key C.key --cacert ca.pem https://...`` works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
from cryptography import x509

from wanxport.control.certs import certificate_name

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
Handler = Callable[[str, str, dict[str, str], Any], Awaitable[tuple[int, Any]]]


@dataclass(frozen=True)
class TlsListen:
    """The API over TCP with mutual TLS: where, with which identity and CA, for whom."""

    host: str
    port: int
    cert: Path
    key: Path
    ca: Path
    clients: frozenset[str]  # certificate names allowed to use the API

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        context.verify_mode = ssl.CERT_REQUIRED  # no certificate from our CA: no handshake
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        return context


def bind_unix_socket(path: Path) -> socket.socket:
    """A listening-ready Unix socket at ``path`` with mode 0660, never more open even for an instant.

    The umask is the process's, so it is set and restored around the ``bind`` alone,
    with no ``await`` between: two daemons starting on one event loop once interleaved
    their set/restore around ``start_unix_server``'s await and left the process at
    umask 0117 (every file created after lost its execute bits).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o117)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o660)
    except BaseException:
        sock.close()
        raise
    return sock


class ApiServer:
    def __init__(self, path: Path, handler: Handler, tls: TlsListen | None = None) -> None:
        self.path = path
        self.handler = handler
        self.tls = tls
        self._server: asyncio.AbstractServer | None = None
        self._tcp: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """The TCP listener's bound address (port 0 in the config picks one)."""
        if self._tcp is None:
            return None
        host, port = self._tcp.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of a killed daemon (the listen ports prove we are alone)
        self._server = await asyncio.start_unix_server(self._serve, sock=bind_unix_socket(self.path))
        if self.tls is not None:
            self._tcp = await asyncio.start_server(self._serve, self.tls.host, self.tls.port,
                                                   ssl=self.tls.context())

    async def close(self) -> None:
        for server in (self._server, self._tcp):
            if server is not None:
                server.close()
        self._server = self._tcp = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER)
        denied = self._denied(writer)
        try:
            while True:
                request = await self._next_request(conn, reader)
                if request is None:
                    return
                if denied is not None:
                    status, payload = 403, {"error": denied}
                else:
                    status, payload = await self._dispatch(*request)
                body = (json.dumps(payload) + "\n").encode()
                headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
                writer.write(conn.send(h11.Data(data=body)) or b"")
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                if denied is not None:
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, ConnectionError) as exc:
            log.info("API connection dropped: %s", exc)
        finally:
            self._connections.discard(task)
            writer.close()

    def _denied(self, writer: asyncio.StreamWriter) -> str | None:
        """Why a TLS client may not use the API (None: it may; Unix-socket clients may)."""
        tls = writer.get_extra_info("ssl_object")
        if tls is None or self.tls is None:
            return None
        der = tls.getpeercert(binary_form=True)
        name = certificate_name(x509.load_der_x509_certificate(der)) if der else "(none)"
        if name in self.tls.clients:
            return None
        log.warning("API over TLS: refused certificate %r (not in api_clients)", name)
        return f"certificate {name!r} is not allowed to use this API (api_clients)"

    async def _next_request(self, conn: h11.Connection, reader: asyncio.StreamReader
                            ) -> tuple[str, str, dict[str, str], bytes] | None:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data and conn.their_state is h11.IDLE:
                    return None
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise h11.RemoteProtocolError("request body too large")
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                return request.method.decode(), request.target.decode(), headers, bytes(body)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes
                        ) -> tuple[int, Any]:
        payload: Any = None
        if body:
            try:
                payload = json.loads(body)
            except ValueError:
                return 400, {"error": "the request body is not JSON"}
        try:
            return await self.handler(method, target, headers, payload)
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the API
            log.exception("API %s %s failed", method, target)
            return 500, {"error": f"internal error: {exc}"}
