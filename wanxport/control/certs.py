"""Certificates for the control channel: a small test PKI and identity loading.

Gateways authenticate each other with certificates issued by one private CA
(mutual TLS), so a deployment needs a CA, one leaf per gateway, and files the
daemon can load. ``make_test_pki`` produces exactly that for tests and labs;
production sites bring their own PKI and only use ``load_identity``.

Leaf certificates carry ``serverAuth`` *and* ``clientAuth`` because either
gateway may dial the other. The SAN always contains ``DNS:<name>`` plus the
loopback addresses, so a loopback test can verify by name or by IP.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_TYPES = ("ec", "ed25519")
_RESERVED_NAMES = ("ca", "ca_key")

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class CertificateError(Exception):
    """A certificate or key is missing, unreadable, or refused by a peer.

    The message is always one line and contains the word "certificate" so an
    operator can tell an authentication failure from a network failure.
    """


def _new_key(key_type: str) -> PrivateKey:
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(f"key_type: {key_type!r} is not valid; use one of {', '.join(KEY_TYPES)}")


def _sign_hash(key: PrivateKey) -> hashes.SHA256 | None:
    # Ed25519 signs the message itself; cryptography requires algorithm=None.
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _write_key(path: Path, key: PrivateKey) -> None:
    """Write a PKCS#8 PEM key readable by its owner only (0600 from creation on)."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _make_ca(
    directory: Path, stem: str, common_name: str, key_type: str, days: int
) -> tuple[x509.Certificate, PrivateKey]:
    key = _new_key(key_type)
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, _sign_hash(key))
    )
    _write_cert(directory / f"{stem}.pem", cert)
    _write_key(directory / f"{stem}.key", key)
    return cert, key


def _make_leaf(
    directory: Path,
    name: str,
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    key_type: str,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> Path:
    key = _new_key(key_type)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(name),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, _sign_hash(ca_key))
    )
    _write_cert(directory / f"{name}.pem", cert)
    _write_key(directory / f"{name}.key", key)
    return directory / name


def _check_name(name: str) -> None:
    if not name or name in _RESERVED_NAMES or "/" in name or name.startswith("."):
        raise ValueError(
            f"names: {name!r} is not a valid gateway name; use a non-empty DNS-like name "
            f"other than {', '.join(_RESERVED_NAMES)}"
        )


def _load_ca(directory: Path) -> tuple[x509.Certificate, PrivateKey]:
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise CertificateError(f"{directory / 'ca.key'}: CA key type is not EC or Ed25519")
    return cert, key


def _key_type_of(key: PrivateKey) -> str:
    return "ed25519" if isinstance(key, ed25519.Ed25519PrivateKey) else "ec"


def make_test_pki(
    directory: str | os.PathLike[str],
    names: list[str],
    *,
    days: int = 365,
    key_type: str = "ec",
) -> dict[str, Path]:
    """Create ``DIR/ca.pem`` + ``DIR/ca.key`` and ``DIR/<name>.pem`` + ``.key`` per name.

    Returns ``{"ca": ca.pem, "ca_key": ca.key, <name>: DIR/<name>}``; the
    per-name value is the identity prefix that ``load_identity`` accepts.
    """
    out = _pki_directory(directory, names, days)
    ca_cert, ca_key = _make_ca(out, "ca", "wanxport test CA", key_type, days)
    now = dt.datetime.now(dt.UTC)
    result: dict[str, Path] = {"ca": out / "ca.pem", "ca_key": out / "ca.key"}
    for name in names:
        result[name] = _make_leaf(
            out, name, ca_cert, ca_key, key_type,
            now - dt.timedelta(minutes=5), now + dt.timedelta(days=days),
        )
    return result


def _pki_directory(directory: str | os.PathLike[str], names: list[str], days: int) -> Path:
    """``directory``, created if need be, once the names and the validity are usable."""
    if days < 1:
        raise ValueError(f"days: {days} is not valid; use a whole number >= 1")
    for name in names:
        _check_name(name)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass
class PkiChanges:
    """What ``issue_certificates`` did in a directory."""

    ca: Path
    ca_created: bool = False
    issued: list[Path] = field(default_factory=list)  # identity prefixes written now
    kept: list[Path] = field(default_factory=list)  # names that already had a certificate
    invalidated: list[Path] = field(default_factory=list)  # certificates of a replaced CA


def issue_certificates(
    directory: str | os.PathLike[str],
    names: list[str],
    *,
    days: int = 365,
    key_type: str = "ec",
    force: bool = False,
) -> PkiChanges:
    """``wanxport certs DIR --names ...``: add names to the PKI in ``DIR``, never replacing it.

    A CA already in ``DIR`` (``ca.pem`` + ``ca.key``) signs the new names, so every
    certificate it signed before stays valid; a name that already has a certificate keeps
    it. Only ``force`` starts over: a new CA, the names issued anew, and the certificates
    in ``DIR`` the old CA signed listed in ``invalidated`` (they no longer verify). No CA
    there: one is created, as ``make_test_pki`` does. CertificateError (one line) when the
    CA there cannot sign (its key is missing or unreadable).
    """
    out = _pki_directory(directory, names, days)
    changes = PkiChanges(ca=out / "ca.pem")
    has_ca = (out / "ca.pem").exists() or (out / "ca.key").exists()
    if has_ca and not force:
        ca_cert, ca_key = _existing_ca(out)
    else:
        if has_ca:
            changes.invalidated = _signed_by_ca(out, exclude=set(names))
        ca_cert, ca_key = _make_ca(out, "ca", "wanxport test CA", key_type, days)
        changes.ca_created = True
    now = dt.datetime.now(dt.UTC)
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    for name in names:
        if not force and ((out / f"{name}.pem").exists() or (out / f"{name}.key").exists()):
            changes.kept.append(out / name)
            continue
        changes.issued.append(_make_leaf(out, name, ca_cert, ca_key, key_type,
                                         now - dt.timedelta(minutes=5), not_after))
    return changes


def _existing_ca(directory: Path) -> tuple[x509.Certificate, PrivateKey]:
    """The CA in ``directory``, able to sign; CertificateError naming what is missing."""
    for stem in ("ca.pem", "ca.key"):
        if not (directory / stem).is_file():
            raise CertificateError(
                f"{directory / stem} does not exist, so the CA certificate in {directory} cannot sign "
                "new names; give its certificate and key, or --force to replace the CA (which "
                "invalidates every certificate it signed)")
    try:
        return _load_ca(directory)
    except (OSError, ValueError, TypeError) as exc:
        raise CertificateError(f"{directory / 'ca.pem'} / ca.key: cannot load the CA ({exc})") from None


def _signed_by_ca(directory: Path, exclude: set[str]) -> list[Path]:
    """The certificates in ``directory`` (but ``exclude``'s) that its current CA signed."""
    try:
        ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    except (OSError, ValueError):
        return []  # no readable CA: nothing verifies against it now either
    signed = []
    for path in sorted(directory.glob("*.pem")):
        if path.name == "ca.pem" or path.stem in exclude:
            continue
        try:
            x509.load_pem_x509_certificate(path.read_bytes()).verify_directly_issued_by(ca_cert)
        except (OSError, ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
            continue
        signed.append(path)
    return signed


def make_expired_leaf(directory: str | os.PathLike[str], name: str) -> Path:
    """Issue ``DIR/<name>`` from the CA in ``DIR`` whose validity ended yesterday."""
    _check_name(name)
    out = Path(directory)
    ca_cert, ca_key = _load_ca(out)
    now = dt.datetime.now(dt.UTC)
    return _make_leaf(
        out, name, ca_cert, ca_key, _key_type_of(ca_key),
        now - dt.timedelta(days=30), now - dt.timedelta(days=1),
    )


def make_foreign_leaf(directory: str | os.PathLike[str], name: str) -> Path:
    """Issue ``DIR/<name>`` from a fresh, unrelated CA (``DIR/foreign-ca.pem``).

    A peer trusting only ``DIR/ca.pem`` must refuse it: same name, wrong issuer.
    """
    _check_name(name)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _make_ca(out, "foreign-ca", "unrelated CA", "ec", 365)
    now = dt.datetime.now(dt.UTC)
    return _make_leaf(
        out, name, ca_cert, ca_key, "ec",
        now - dt.timedelta(minutes=5), now + dt.timedelta(days=365),
    )


def _readable(path: Path, what: str) -> Path:
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except FileNotFoundError:
        raise CertificateError(f"{what}: {path} does not exist") from None
    except OSError as exc:
        raise CertificateError(f"{what}: {path} is not readable ({exc.strerror})") from None
    return path


def load_identity(prefix: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Resolve identity ``X`` to ``(X.pem, X.key)``, checking both can be read."""
    base = Path(prefix)
    cert = _readable(base.with_name(base.name + ".pem"), "certificate")
    key = _readable(base.with_name(base.name + ".key"), "certificate key")
    return cert, key


def check_ca_file(path: str | os.PathLike[str]) -> Path:
    """Fail early, in one line, when the trusted-CA file cannot be read."""
    return _readable(Path(path), "CA certificate")


def certificate_name(cert: x509.Certificate) -> str:
    """The gateway name a certificate proves: its first SAN DNS name, else its CN."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
        if dns:
            return str(dns[0])
    except x509.ExtensionNotFound:
        pass
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else ""
