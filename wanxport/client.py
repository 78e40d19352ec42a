"""A client of a gateway daemon's transfer API (HTTP/1.1 + JSON on its Unix socket).

::

    from wanxport.client import GatewayClient
    gw = GatewayClient("/var/lib/wanxport/api.sock")
    t = gw.submit("site-b", "/data/ckpt/step-1000", key="ckpt-1000")   # same key: same transfer
    t = gw.wait(t["id"])                                               # until done/failed/cancelled
    assert t["state"] == "done", t["reason"]

Standard library only (``http.client`` over an ``AF_UNIX`` socket), so any tool on
the host can drive the daemon without importing the transport. Errors the daemon
reports (4xx/5xx) raise ``ApiError`` with its one-line reason and the status.
From another host, ``GatewayClient.over_tls(host, port, "ops.pem", "ops.key",
"ca.pem", "site-a")`` talks to the daemon's ``api_tcp`` listener with mutual TLS.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

FINAL_STATES = ("done", "failed", "cancelled")


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
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            raise ApiError(response.status, f"the daemon answered non-JSON: {raw[:100]!r}") from None

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
               key: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"peer": peer, "source": source, "overwrite": overwrite}
        if dest is not None:
            body["dest"] = dest
        if key is not None:
            body["idempotency_key"] = key
        result: dict[str, Any] = self._ok("POST", "/v1/transfers", body)
        return result

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

    def wait(self, transfer_id: str, timeout_s: float | None = None, poll_s: float = 0.1) -> dict[str, Any]:
        """Poll until the transfer is final; TimeoutError after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            transfer = self.get(transfer_id)
            if transfer["state"] in FINAL_STATES:
                return transfer
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"transfer {transfer_id} still {transfer['state']} after {timeout_s} s")
            time.sleep(poll_s)
