"""Is this identity usable, before a peer finds out? The checks ``gateway --check`` and a start make.

A wrong key, a garbage CA file, an expired or misnamed certificate once passed every
local check and surfaced only as a refused handshake on the far side (or as a traceback
per dial here). ``inspect_identity`` reads the files the way the TLS stack will and
returns every problem as one line that names the file and what is wrong with it:

* the CA file holds PEM certificates, and the first one is a CA (basicConstraints CA:TRUE);
* the certificate and the key parse, and the key is the certificate's (same public key);
* the certificate chains to the CA file (signatures checked with ``cryptography``,
  through any intermediates in the certificate file or the CA file);
* the certificate's name (``certs.certificate_name``, what peers check) is the site;
* the certificate and the CA are inside their validity: expired or not yet valid is an
  error, expiring within ``EXPIRY_WARNING_DAYS`` a warning.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

from .certs import certificate_name

EXPIRY_WARNING_DAYS = 14
MAX_CHAIN = 8  # certificates between the leaf and the CA, at most: a loop guard


@dataclass
class IdentityReport:
    """What is wrong (errors: the identity cannot be used) and what will be (warnings)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    not_after: dt.datetime | None = None  # the identity's expiry, when the certificate parsed


def inspect_identity(prefix: str | os.PathLike[str], ca: str | os.PathLike[str], site: str,
                     now: dt.datetime | None = None) -> IdentityReport:
    """Check identity ``PREFIX`` (``PREFIX.pem`` + ``PREFIX.key``) against ``ca`` and ``site``."""
    now = now or dt.datetime.now(dt.UTC)
    report = IdentityReport()
    base = Path(prefix)
    pem, key_path, ca_path = base.with_name(base.name + ".pem"), base.with_name(base.name + ".key"), Path(ca)
    authorities = _certificates(ca_path, "ca", report)
    if authorities:
        _check_is_ca(ca_path, authorities[0], report)
        _check_validity(f"ca: {ca_path}", authorities[0], now, report)
    chain = _certificates(pem, "identity", report)
    key = _private_key(key_path, report)
    if not chain:
        return report
    leaf = chain[0]
    report.not_after = leaf.not_valid_after_utc
    if key is not None and _spki(key.public_key()) != _spki(leaf.public_key()):
        report.errors.append(f"identity: {key_path} is not the key of {pem} (a different key pair); "
                             "give the key the certificate was issued for")
    name = certificate_name(leaf)
    if name != site:
        report.errors.append(f"identity: {pem} names {name!r}, not the site {site!r}; peers know this "
                             "gateway by its certificate's name, so use the certificate issued for the site")
    _check_validity(f"identity: {pem}", leaf, now, report)
    if authorities:
        problem = _chain_problem(leaf, chain[1:], authorities)
        if problem:
            report.errors.append(f"identity: {pem} does not chain to the CA in {ca_path} ({problem})")
    return report


def _read(path: Path, what: str, report: IdentityReport) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        report.errors.append(f"{what}: {path} does not exist; give an existing file "
                             "(`wanxport certs pki` writes test ones)")
    except OSError as exc:
        report.errors.append(f"{what}: {path} is not readable ({exc.strerror or exc})")
    return None


def _certificates(path: Path, what: str, report: IdentityReport) -> list[x509.Certificate]:
    data = _read(path, what, report)
    if data is None:
        return []
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        report.errors.append(f"{what}: {path} is not a PEM certificate ({_first_line(exc)})")
        return []


def _private_key(path: Path, report: IdentityReport) -> PrivateKeyTypes | None:
    data = _read(path, "identity", report)
    if data is None:
        return None
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        report.errors.append(f"identity: {path} is encrypted; the daemon needs an unencrypted key")
    except (ValueError, UnsupportedAlgorithm) as exc:
        report.errors.append(f"identity: {path} is not a PEM private key ({_first_line(exc)})")
    return None


def _check_is_ca(path: Path, cert: x509.Certificate, report: IdentityReport) -> None:
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        report.errors.append(f"ca: {path} holds {certificate_name(cert)!r}, which is not a CA "
                             "certificate (no basicConstraints CA:TRUE); give the CA that issued the "
                             "gateways' certificates")


def _check_validity(what: str, cert: x509.Certificate, now: dt.datetime, report: IdentityReport) -> None:
    if now < cert.not_valid_before_utc:
        report.errors.append(f"{what} is not valid before {_date(cert.not_valid_before_utc)}")
    elif now > cert.not_valid_after_utc:
        report.errors.append(f"{what} expired on {_date(cert.not_valid_after_utc)}")
    elif cert.not_valid_after_utc - now < dt.timedelta(days=EXPIRY_WARNING_DAYS):
        report.warnings.append(f"{what} expires on {_date(cert.not_valid_after_utc)} "
                               f"(in {days_left(cert.not_valid_after_utc, now):.1f} days); renew it")


def _chain_problem(leaf: x509.Certificate, intermediates: list[x509.Certificate],
                   authorities: list[x509.Certificate]) -> str | None:
    """None when ``leaf`` is signed, through ``intermediates`` or ``authorities``, by a
    certificate in ``authorities``; else why not (one phrase)."""
    pool = intermediates + authorities
    cert = leaf
    for _ in range(MAX_CHAIN):
        issuers = [c for c in pool if c.subject == cert.issuer and c is not cert]
        if not issuers:
            return f"its issuer {cert.issuer.rfc4514_string()!r} is not in it"
        signer = next((c for c in issuers if _signed_by(cert, c)), None)
        if signer is None:
            return f"the signature of {certificate_name(cert)!r} does not verify with its issuer's key"
        if any(signer is a for a in authorities):
            return None
        cert = signer
    return f"the chain is longer than {MAX_CHAIN} certificates"


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def days_left(not_after: dt.datetime, now: dt.datetime) -> float:
    return (not_after - now).total_seconds() / 86400


def _date(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
