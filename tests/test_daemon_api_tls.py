"""The transfer API over TCP with mutual TLS: allowed client certificates only."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites
from test_daemon_transfers import call, payload, running

from wanxport.daemon.client import ApiError, GatewayClient
from wanxport.daemon.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _client(pki: Path, port: int, name: str) -> GatewayClient:
    return GatewayClient.over_tls("127.0.0.1", port, str(pki / f"{name}.pem"), str(pki / f"{name}.key"),
                                  str(pki / "ca.pem"), "gw-a", timeout_s=10)


async def test_submit_over_mtls_and_refuse_other_certificates(pki: Path, tmp_path: Path) -> None:
    # gw-c plays the operator's client certificate, sending from its own root; gw-a may use
    # the API but has no roots (it may look, not send); gw-b (the peer) is from the same CA
    # but not allowed.
    outbox = tmp_path / "ops-outbox"
    outbox.mkdir()
    extra = (f'api_tcp = "127.0.0.1:0"\napi_clients = ["gw-c", "gw-a"]\n'
             f'[api_client_roots]\ngw-c = ["{outbox}"]')
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=extra)
    src = outbox / "t.bin"
    payload(src, 1 << 20, 2)
    elsewhere = tmp_path / "e.bin"
    payload(elsewhere, 1000, 3)
    async with running(a_cfg) as a, running(b_cfg):
        assert a.api is not None and a.api.tcp_address is not None
        port = a.api.tcp_address[1]
        ops = _client(pki, port, "gw-c")
        t = await call(ops, "submit", "gw-b", str(src), key="tls-1")
        assert (await call(ops, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        assert [x["id"] for x in await call(ops, "list")] == [t["id"]]  # type: ignore[index, union-attr]
        for client, source, why in [(ops, elsewhere, "not under send_roots"),
                                    (_client(pki, port, "gw-a"), src, "'gw-a' has no roots")]:
            with pytest.raises(ApiError) as refused:
                await call(client, "submit", "gw-b", str(source))
            assert refused.value.status == 403 and why in str(refused.value), refused.value
        with pytest.raises(ApiError) as refused:
            await call(_client(pki, port, "gw-b"), "list")
        assert refused.value.status == 403 and "'gw-b' is not allowed" in str(refused.value)
        # No client certificate at all: the TLS handshake itself fails.
        bare = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        import asyncio
        with pytest.raises((ssl.SSLError, ConnectionError)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=bare,
                                                           server_hostname="gw-a")
            writer.write(b"GET /v1/status HTTP/1.1\r\nhost: gw\r\n\r\n")
            await writer.drain()
            if not await reader.read(100):
                raise ConnectionError("closed without an answer")
        # The Unix socket keeps working for local tools.
        assert (await call(GatewayClient(str(a.config.api_socket)), "status"))["site"] == "gw-a"  # type: ignore[index]


def test_api_tcp_needs_an_allowlist(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki, extra='api_tcp = "127.0.0.1:0"')
    with pytest.raises(ConfigError, match="api_clients: missing; api_tcp needs"):
        load_config(a_cfg)
