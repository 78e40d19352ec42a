"""The transfer API's HTTP/1.1 server on a Unix socket (``curl --unix-socket`` works).

HTTP is parsed by h11: a small, pure-Python, dependency-free, sans-IO HTTP/1.1
state machine, so this module only moves bytes between an asyncio stream and it
(aiohttp would bring a whole framework and its C parts for five JSON routes).
Routing and meaning live in the daemon (``routes.py``); this module turns a
request into ``(method, path, headers, body)`` and a ``(status, json)`` back into a
response, with keep-alive, a body size cap and one-line JSON errors. The socket
is created mode 0660 so that the service's group may submit.

The Unix socket is read with ``recvmsg`` so that a request can carry descriptors
(``SCM_RIGHTS``): ``wanxport transfer submit`` opens the source as the submitting
user and passes it, so the daemon sends only what that user could read. Each
request's handler learns who asked (``Requester``: ``SO_PEERCRED`` pid, uid, gid)
and gets its descriptors; those it does not keep are closed when it answers.

Optionally the same API also listens on TCP with mutual TLS (``api_tcp``): the
daemon's own certificate serves, a client must present one signed by the gateways'
CA, and only the certificate names in ``api_clients`` may use it (the peers'
gateway certificates come from the same CA and must not submit here); any other
name gets 403. ``curl --cert C.pem --key C.key --cacert ca.pem https://...`` works.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
from cryptography import x509

from wanxport.control.certs import certificate_name

log = logging.getLogger(__name__)

MAX_BODY = 16 << 20  # a directory of many files names each in the submission
ACCEPT_RETRY_S = 0.1
MAX_FDS_PER_MESSAGE = 253  # SCM_MAX_FD: the most descriptors one sendmsg may pass
Handler = Callable[[str, str, dict[str, str], Any, "Requester"], Awaitable[tuple[int, Any]]]


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


@dataclass
class Requester:
    """Who sent a request (``SO_PEERCRED`` on the Unix socket, the certificate on TLS)
    and the descriptors that came with it (``SCM_RIGHTS``, Unix socket only).

    A handler that keeps descriptors takes them (``take_fds``); the server closes
    whatever is left once the request is answered, so no error path leaks one."""

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    certificate: str | None = None
    fds: list[int] = field(default_factory=list)

    def describe(self) -> str:
        if self.certificate is not None:
            return f"certificate {self.certificate!r}"
        return f"uid {self.uid} gid {self.gid} pid {self.pid}"

    def take_fds(self) -> list[int]:
        fds, self.fds = self.fds, []
        return fds

    def close_fds(self) -> None:
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)


class _StreamIO:
    """A TLS connection (asyncio streams): bytes only, never descriptors."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.fds: list[int] = []
        self.lost_fds = False

    async def read(self, size: int) -> bytes:
        return await self.reader.read(size)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


class _UnixIO:
    """A Unix-socket connection read with ``recvmsg``, which asyncio's streams cannot do:
    the descriptors a client passes (``SCM_RIGHTS``) arrive as ancillary data beside the
    request's bytes, close-on-exec from the start."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fds: list[int] = []
        self.lost_fds = False  # the kernel dropped some (MSG_CTRUNC: our limit on open files)
        sock.setblocking(False)

    def peer(self) -> Requester:
        pid, uid, gid = struct.unpack("3i", self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                 struct.calcsize("3i")))
        return Requester(pid=pid, uid=uid, gid=gid)

    async def read(self, size: int) -> bytes:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, ancillary, flags, _ = self.sock.recvmsg(
                    size, socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * 4), socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self.sock.fileno(), _wake, ready)
                try:
                    await ready
                finally:
                    loop.remove_reader(self.sock.fileno())
                continue
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                    self.fds.extend(fds)
            if flags & socket.MSG_CTRUNC:
                self.lost_fds = True
            return data

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.sock.close()


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


Connection = _StreamIO | _UnixIO


class ApiServer:
    def __init__(self, path: Path, handler: Handler, tls: TlsListen | None = None) -> None:
        self.path = path
        self.handler = handler
        self.tls = tls
        self._unix: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
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
        self._unix = bind_unix_socket(self.path)
        self._unix.listen(100)
        self._unix.setblocking(False)
        self._accepting = asyncio.create_task(self._accept_unix(self._unix))
        if self.tls is not None:
            self._tcp = await asyncio.start_server(self._serve_tls, self.tls.host, self.tls.port,
                                                   ssl=self.tls.context())

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._unix is not None:
            self._unix.close()
        if self._tcp is not None:
            self._tcp.close()
        self._unix = self._tcp = self._accepting = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _accept_unix(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listening)
            except OSError as exc:  # out of descriptors, say: the API stays, the client retries
                log.warning("API: cannot accept a connection: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            connection = _UnixIO(sock)
            try:
                requester = connection.peer()
            except OSError as exc:
                log.info("API connection dropped: %s", exc)
                connection.close()
                continue
            self._track(asyncio.create_task(self._serve(connection, requester, None)))

    async def _serve_tls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._track(task)
        name = self._certificate(writer)
        await self._serve(_StreamIO(reader, writer), Requester(certificate=name), self._denied(name))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, connection: Connection, requester: Requester, denied: str | None) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._next_request(conn, connection)
                if request is None:
                    return
                requester.fds = connection.fds
                connection.fds = []
                try:
                    if denied is not None:
                        status, payload = 403, {"error": denied}
                    elif connection.lost_fds:
                        status, payload = 503, {"error": "descriptors lost on the way: the daemon has "
                                                         "too many files open; submit again later"}
                        log.warning("API: a request from %s lost descriptors (too many open files)",
                                    requester.describe())
                    else:
                        status, payload = await self._dispatch(*request, requester)
                finally:
                    requester.close_fds()
                body = (json.dumps(payload) + "\n").encode()
                headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
                await connection.send((conn.send(h11.Response(status_code=status, headers=headers)) or b"")
                                      + (conn.send(h11.Data(data=body)) or b"")
                                      + (conn.send(h11.EndOfMessage()) or b""))
                if denied is not None or connection.lost_fds:
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, ConnectionError) as exc:
            log.info("API connection dropped: %s", exc)
        finally:
            connection.close()

    def _certificate(self, writer: asyncio.StreamWriter) -> str:
        tls = writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        return certificate_name(x509.load_der_x509_certificate(der)) if der else "(none)"

    def _denied(self, name: str) -> str | None:
        """Why a TLS client may not use the API (None: it may)."""
        if self.tls is not None and name in self.tls.clients:
            return None
        log.warning("API over TLS: refused certificate %r (not in api_clients)", name)
        return f"certificate {name!r} is not allowed to use this API (api_clients)"

    async def _next_request(self, conn: h11.Connection, connection: Connection
                            ) -> tuple[str, str, dict[str, str], bytes] | None:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await connection.read(65536)
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

    async def _dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes,
                        requester: Requester) -> tuple[int, Any]:
        payload: Any = None
        if body:
            try:
                payload = json.loads(body)
            except ValueError:
                return 400, {"error": "the request body is not JSON"}
        try:
            return await self.handler(method, target, headers, payload, requester)
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the API
            log.exception("API %s %s failed", method, target)
            return 500, {"error": f"internal error: {exc}"}
