"""The transfer API's HTTP/1.1 server on a Unix socket (``curl --unix-socket`` works).

HTTP is parsed by h11: a small, pure-Python, dependency-free, sans-IO HTTP/1.1
state machine, so this module only moves bytes between an asyncio stream and it
(aiohttp would bring a whole framework and its C parts for five JSON routes).
Routing and meaning live in the daemon (``routes.py``); this module turns a
request into ``(method, path, headers, body)`` and a ``(status, json)`` back into a
response, with keep-alive, a body size cap and one-line JSON errors. The socket
is created mode 0660 so that the service's group may submit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h11

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
Handler = Callable[[str, str, dict[str, str], Any], Awaitable[tuple[int, Any]]]


class ApiServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of a killed daemon (the listen ports prove we are alone)
        old = os.umask(0o117)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o660)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
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
        try:
            while True:
                request = await self._next_request(conn, reader)
                if request is None:
                    return
                status, payload = await self._dispatch(*request)
                body = (json.dumps(payload) + "\n").encode()
                headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
                writer.write(conn.send(h11.Data(data=body)) or b"")
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, ConnectionError) as exc:
            log.info("API connection dropped: %s", exc)
        finally:
            self._connections.discard(task)
            writer.close()

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
