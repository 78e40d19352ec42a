"""A client of a gateway daemon's transfer API (HTTP/1.1 + JSON on its Unix socket).

::

    from wanxport.daemon.client import GatewayClient
    gw = GatewayClient("/var/lib/wanxport/api.sock")
    t = gw.submit("site-b", "/data/ckpt/step-1000", key="ckpt-1000")   # same key: same transfer
    t = gw.wait(t["id"])                                               # until done/failed/cancelled
    assert t["state"] == "done", t["reason"]

Standard library only (``http.client`` over an ``AF_UNIX`` socket), so any tool on
the host can drive the daemon without importing the transport. Errors the daemon
reports (4xx/5xx) raise ``ApiError`` with its one-line reason and the status.

``submit`` over the Unix socket opens the source here, as the calling user (a file,
or every file of a directory walked without following symlinks: ``wanxport.sources``),
and passes the descriptors with the request (``SCM_RIGHTS``, at most 253 per
``sendmsg``, so the request's bytes are split into that many segments): the daemon
sends only what this user could read. A file the user cannot read fails here
(``SourceOpenError``), before anything is sent. The descriptors do not outlive the
daemon: after a restart such a transfer is ``needs-resubmit``, and ``wait`` given
``resubmit`` submits it again with the same idempotency key, which continues it.
From another host, ``GatewayClient.over_tls(host, port, "ops.pem", "ops.key",
"ca.pem", "site-a")`` talks to the daemon's ``api_tcp`` listener with mutual TLS.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from wanxport.sources import OpenedSource, SourceOpenError, open_source

FINAL_STATES = ("done", "failed", "cancelled")
MAX_FDS_PER_MESSAGE = 253  # SCM_MAX_FD
DAEMON_AWAY_S = 120.0  # how long ``wait`` keeps asking a daemon that does not answer (a restart)


def _describe(opened: OpenedSource, body: dict[str, Any]) -> dict[str, Any]:
    """The submission's body with the walked entries: each file's descriptor index
    (in the order the descriptors are passed), or its symlink target."""
    entries: list[dict[str, Any]] = []
    index = 0
    for entry in opened.entries:
        if entry.fd is None:
            entries.append({"name": entry.rel, "symlink": entry.symlink})
        else:
            entries.append({"name": entry.rel, "fd": index})
            index += 1
    return {**body, "entries": entries, "fds": index, "skipped": opened.skipped}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class GatewayClient:
    def __init__(self, socket_path: str, timeout_s: float = 30.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._connection: Callable[[], http.client.HTTPConnection] = lambda: _UnixConnection(
            self.socket_path, self.timeout_s)
        self._local = True  # on the daemon's host: pass descriptors, not paths

    @classmethod
    def over_tls(cls, host: str, port: int, cert: str, key: str, ca: str, server_name: str,
                 timeout_s: float = 30.0) -> GatewayClient:
        """A client of the daemon's ``api_tcp`` listener: our certificate (one of its
        ``api_clients``) against its CA, and its certificate checked for ``server_name``
        (the gateway's site name)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        context.load_cert_chain(cert, key)
        client = cls(f"{host}:{port}", timeout_s)

        def connect() -> http.client.HTTPConnection:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
            conn.sock = context.wrap_socket(socket.create_connection((host, port), timeout_s),
                                            server_hostname=server_name)
            return conn

        client._connection = connect
        client._local = False
        return client

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, decoded JSON); OSError when the daemon is not there."""
        conn = self._connection()
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"content-type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return _decoded(response.status, raw)

    def _ok(self, method: str, path: str, body: Any = None) -> Any:
        status, payload = self.request(method, path, body)
        if status >= 400:
            message = payload.get("error") if isinstance(payload, dict) else None
            raise ApiError(status, message or f"HTTP {status}")
        return payload

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._ok("GET", "/v1/status")
        return result

    def submit(self, peer: str, source: str, dest: str | None = None, *, overwrite: bool = False,
               key: str | None = None, follow_symlinks: bool = False) -> dict[str, Any]:
        """Submit a transfer; locally with the source's descriptors (SourceOpenError when
        this user cannot open it), over TLS by path (the daemon opens it under the
        certificate's roots)."""
        body: dict[str, Any] = {"peer": peer, "source": source, "overwrite": overwrite}
        if dest is not None:
            body["dest"] = dest
        if key is not None:
            body["idempotency_key"] = key
        if not self._local:
            body["follow_symlinks"] = follow_symlinks
            result: dict[str, Any] = self._ok("POST", "/v1/transfers", body)
            return result
        if not source.startswith("/"):
            raise SourceOpenError(f"source {source}: give an absolute path (the daemon has its own "
                                  "directory)")
        opened = open_source(source, follow_symlinks=follow_symlinks)
        try:
            status, payload = self._post_with_fds("/v1/transfers", _describe(opened, body), opened.fds())
        finally:
            opened.close()  # the daemon holds its own copies now
        if status >= 400:
            message = payload.get("error") if isinstance(payload, dict) else None
            raise ApiError(status, message or f"HTTP {status}")
        return dict(payload)

    def _post_with_fds(self, path: str, body: dict[str, Any], fds: list[int]) -> tuple[int, Any]:
        """One request over a new Unix connection, its bytes split into one segment per
        batch of descriptors (each ``sendmsg`` carries one batch)."""
        data = json.dumps(body).encode()
        message = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data
        batches = [fds[i:i + MAX_FDS_PER_MESSAGE] for i in range(0, len(fds), MAX_FDS_PER_MESSAGE)]
        segment = math.ceil(len(message) / max(1, len(batches)))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.socket_path)
            try:
                for i, batch in enumerate(batches):
                    chunk = message[i * segment:(i + 1) * segment]
                    sent = socket.send_fds(sock, [chunk], batch)
                    if chunk[sent:]:
                        sock.sendall(chunk[sent:])
                if not batches:
                    sock.sendall(message)
            except BrokenPipeError:
                pass  # the daemon answered before reading it all (a refusal): read why
            response = http.client.HTTPResponse(sock)
            response.begin()
            raw = response.read()
        finally:
            sock.close()
        return _decoded(response.status, raw)

    def get(self, transfer_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._ok("GET", f"/v1/transfers/{transfer_id}")
        return result

    def list(self, state: str | None = None, peer: str | None = None,
             limit: int | None = None) -> list[dict[str, Any]]:
        """Transfers, oldest first: the newest 1,000 (or ``limit``) the daemon knows,
        finished ones included across restarts; ``state``/``peer`` filter."""
        query = {k: v for k, v in (("state", state), ("peer", peer), ("limit", limit)) if v is not None}
        path = "/v1/transfers" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        result: list[dict[str, Any]] = self._ok("GET", path)["transfers"]
        return result

    def reload(self) -> dict[str, Any]:
        """Re-read the daemon's config file (as SIGHUP): {taken, changes, at_restart, error};
        ApiError (422) when the new file is refused."""
        result: dict[str, Any] = self._ok("POST", "/v1/reload")
        return result

    def drain(self) -> dict[str, Any]:
        """Drain the daemon and let it exit (as SIGTERM): {draining, active, drain_seconds}."""
        result: dict[str, Any] = self._ok("POST", "/v1/drain")
        return result

    def cancel(self, transfer_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._ok("POST", f"/v1/transfers/{transfer_id}/cancel")
        return result

    def wait(self, transfer_id: str, timeout_s: float | None = None, poll_s: float = 0.1,
             resubmit: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Poll until the transfer is final; TimeoutError after ``timeout_s``.

        A daemon that restarts meanwhile is waited for (up to ``DAEMON_AWAY_S``); a
        transfer that came back ``needs-resubmit`` is submitted again by ``resubmit``
        (the same submission, same idempotency key), which continues it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        away_since: float | None = None
        while True:
            try:
                transfer = self.get(transfer_id)
                if transfer["state"] == "needs-resubmit" and resubmit is not None:
                    transfer = resubmit()
                away_since = None
            except (OSError, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status != 503:
                    raise
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since > DAEMON_AWAY_S:
                    raise
                time.sleep(poll_s)
                continue
            if transfer["state"] in FINAL_STATES:
                return transfer
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"transfer {transfer_id} still {transfer['state']} after {timeout_s} s")
            time.sleep(poll_s)


def _decoded(status: int, raw: bytes) -> tuple[int, Any]:
    """(status, the body's JSON, None when empty); ApiError when the daemon answered non-JSON."""
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        raise ApiError(status, f"the daemon answered non-JSON: {raw[:100]!r}") from None
