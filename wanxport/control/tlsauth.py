"""Mutual certificate authentication on top of aioquic's TLS 1.3.

aioquic (read and tested at 1.7.2) verifies the *server's* certificate
when ``verify_mode=CERT_REQUIRED`` on a client, but a server neither asks
for a client certificate nor verifies one: its ``verify_mode`` is ignored
and its ``Context._request_client_certificate`` is a private test switch.
A client that sends an empty Certificate message is even accepted. For
gateway-to-gateway authentication both sides must prove their identity, so
this module installs, per connection, the missing half:

* the server requests a certificate (CertificateRequest in the handshake);
* before expecting the client's Finished, it requires a certificate, checks
  dates, chain to the trusted CA and the ``clientAuth`` usage, and raises a
  TLS alert otherwise, so the handshake fails and the client is told why.

aioquic has already checked the client's CertificateVerify signature at that
point, i.e. that the client holds the key of the certificate it presented.

It also rewrites the alert texts of the client's server check so that every
refusal says which side's certificate was refused. These hooks reach into
private aioquic attributes; ``install_*`` fail loudly if they are missing.

aioquic reads the CA file at every verification, with pyOpenSSL: a CA file that
became unreadable or garbage raised ``OpenSSL.crypto.Error`` out of the datagram
handler, a traceback per dial. Both verifications (ours of the client, aioquic's of
the server) turn it into a TLS internal_error alert that ends that handshake, and
one ERROR line per CA file and problem, until a verification with it succeeds again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from aioquic import tls
from aioquic._buffer import Buffer
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from OpenSSL import crypto

from .certs import CertificateError, certificate_name

log = logging.getLogger(__name__)
CRYPTO_ERROR_BASE = 0x100
_CERT_ALERTS = {
    tls.AlertDescription.bad_certificate,
    tls.AlertDescription.unsupported_certificate,
    tls.AlertDescription.certificate_revoked,
    tls.AlertDescription.certificate_expired,
    tls.AlertDescription.certificate_unknown,
    tls.AlertDescription.unknown_ca,
    tls.AlertDescription.certificate_required,
}


class AlertCertificateRequired(tls.Alert):
    description = tls.AlertDescription.certificate_required


_broken_ca_files: dict[str, str] = {}  # CA file -> the problem already logged for it


@contextmanager
def ca_file_errors(cafile: str | None) -> Iterator[None]:
    """Around a verification with ``cafile``: a CA file pyOpenSSL cannot load becomes one
    ERROR line (once per file and problem) and an internal_error alert for this handshake."""
    try:
        yield
    except crypto.Error as exc:
        detail = _openssl_detail(exc)
        if _broken_ca_files.get(str(cafile)) != detail:
            _broken_ca_files[str(cafile)] = detail
            log.error("CA file %s cannot be loaded (%s): every session handshake fails until it is "
                      "fixed (`wanxport gateway --check CONFIG` names the problem)", cafile, detail)
        raise tls.AlertInternalError("the gateway's CA file cannot be loaded") from None
    _broken_ca_files.pop(str(cafile), None)


def _openssl_detail(exc: crypto.Error) -> str:
    """The reasons of OpenSSL's error queue (``[(library, function, reason), ...]``)."""
    queue = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    return "; ".join(str(entry[-1]) for entry in queue) or str(exc)


def _check_client_certificate(context: tls.Context, cafile: str) -> None:
    cert: x509.Certificate | None = context._peer_certificate
    if cert is None:
        raise AlertCertificateRequired("client certificate required but none was sent")
    try:
        with ca_file_errors(cafile):
            tls.verify_certificate(
                certificate=cert, chain=context._peer_certificate_chain, cafile=cafile
            )
    except tls.Alert as exc:
        if exc.description == tls.AlertDescription.internal_error:
            raise
        raise type(exc)(f"client certificate {certificate_name(cert)!r} refused: {exc}") from None
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        raise tls.AlertBadCertificate(
            f"client certificate {certificate_name(cert)!r} refused: not valid for clientAuth"
        )


def _require_attr(obj: object, name: str) -> None:
    if not hasattr(obj, name):
        raise RuntimeError(
            f"aioquic internals changed ({type(obj).__name__}.{name} missing); "
            "mutual TLS cannot be enforced with this aioquic version"
        )


def install_client_auth(connection: QuicConnection, cafile: Path) -> None:
    """Make a *server-side* connection demand and verify a client certificate."""
    _require_attr(connection, "_initialize")
    initialize: Callable[[bytes], None] = connection._initialize

    def initialize_with_client_auth(peer_cid: bytes) -> None:
        initialize(peer_cid)
        context = connection.tls
        for name in ("_request_client_certificate", "_server_expect_finished", "_peer_certificate"):
            _require_attr(context, name)
        context._request_client_certificate = True
        expect_finished: Callable[[], None] = context._server_expect_finished

        def verify_then_expect_finished() -> None:
            _check_client_certificate(context, str(cafile))
            expect_finished()

        context._server_expect_finished = verify_then_expect_finished  # type: ignore[method-assign]

    connection._initialize = initialize_with_client_auth  # type: ignore[method-assign]


def install_server_check_wording(connection: QuicConnection) -> None:
    """Make a *client-side* connection's certificate alerts name the server's certificate."""
    _require_attr(connection, "_initialize")
    initialize: Callable[[bytes], None] = connection._initialize

    def initialize_with_wording(peer_cid: bytes) -> None:
        initialize(peer_cid)
        context = connection.tls
        _require_attr(context, "_client_handle_certificate_verify")
        _require_attr(context, "_cafile")
        handle = context._client_handle_certificate_verify

        def handle_with_wording(input_buf: Buffer) -> None:
            try:
                with ca_file_errors(context._cafile):
                    handle(input_buf)
            except tls.Alert as exc:
                if exc.description in _CERT_ALERTS:
                    raise type(exc)(f"server certificate refused: {exc}") from None
                raise

        context._client_handle_certificate_verify = handle_with_wording  # type: ignore[method-assign]

    connection._initialize = initialize_with_wording  # type: ignore[method-assign]


def peer_certificate_name(connection: QuicConnection) -> str:
    """Name proven by the peer's (already verified) certificate."""
    cert: x509.Certificate | None = connection.tls._peer_certificate
    if cert is None:
        raise CertificateError("peer presented no certificate")
    return certificate_name(cert)


def crypto_error(error_code: int, reason: str, where: str) -> Exception | None:
    """Map a QUIC CRYPTO_ERROR close (TLS alert) to a one-line exception, else None."""
    if not CRYPTO_ERROR_BASE <= error_code < CRYPTO_ERROR_BASE + 0x100:
        return None
    alert = error_code - CRYPTO_ERROR_BASE
    try:
        alert_name = tls.AlertDescription(alert).name
    except ValueError:
        alert_name = f"alert {alert}"
    detail = f"{alert_name}: {reason}" if reason else alert_name
    if alert in _CERT_ALERTS or "certificate" in reason.lower():
        return CertificateError(f"{where}: TLS certificate check failed ({detail})")
    return ConnectionError(f"{where}: TLS handshake failed ({detail})")
