"""``wanxport gateway --check``: what ``nginx -t`` is to nginx, for the gateway daemon.

Beyond the syntax (``config.py``), everything the daemon needs from this host that can
be checked without taking it over: the identity (``control.certcheck``: key pair,
chain to the CA, the CA is one, the name is the site, expiry), the ``api_tcp`` TLS
context built from it, that received files can be given to ``recv_group``, and that
every address the daemon will bind (``listen``, ``api_tcp``, ``metrics``) resolves to
an address of this host. The bind test uses port 0, so a running daemon holding the
real ports does not make the check fail.

The daemon makes the identity checks at start too (``service.py``), so a unit whose
``ExecStartPre`` was skipped still fails with the same one line, not a refused
handshake on the far side.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field

from wanxport.control.certcheck import inspect_identity
from wanxport.gateway.config import Address

from .config import ConfigError, DaemonConfig, check_receive_group


@dataclass
class CheckReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_config(config: DaemonConfig) -> CheckReport:
    """Every problem of a config that parsed, each one line."""
    identity = inspect_identity(config.identity, config.ca, config.site)
    report = CheckReport(list(identity.errors), list(identity.warnings))
    for i, address in enumerate(config.listen):
        _check_local(address, socket.SOCK_DGRAM, f"listen[{i}]", report)
    if config.api_tcp is not None:
        _check_local(config.api_tcp, socket.SOCK_STREAM, "api_tcp", report)
        if not identity.errors:
            _check_tls_context(config, report)
    if config.metrics is not None:
        _check_local(config.metrics, socket.SOCK_STREAM, "metrics", report)
    try:
        check_receive_group(config)
    except ConfigError as exc:
        report.errors.append(str(exc))
    return report


def _check_local(address: Address, kind: socket.SocketKind, what: str, report: CheckReport) -> None:
    """``address``'s host resolves, and each address it resolves to can be bound here."""
    host, _ = address
    try:
        infos = socket.getaddrinfo(host, 0, type=kind, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        report.errors.append(f"{what}: host {host!r} does not resolve ({exc.strerror}); "
                             "give an address or name of this host")
        return
    for family, socktype, proto, _, sockaddr in infos:
        with socket.socket(family, socktype, proto) as probe:
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                report.errors.append(f"{what}: {host!r} ({sockaddr[0]}) is not an address of this host "
                                     f"({exc.strerror or exc})")
                return


def _check_tls_context(config: DaemonConfig, report: CheckReport) -> None:
    """The API's TLS listener serves the daemon's identity and trusts the CA for clients."""
    cert = config.identity.with_name(config.identity.name + ".pem")
    key = config.identity.with_name(config.identity.name + ".key")
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(config.ca))
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        report.errors.append(f"api_tcp: TLS cannot use {cert} with the CA {config.ca} ({exc})")
