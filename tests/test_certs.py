"""Test PKI generation and identity loading (wanxport.control.certs)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID
from gateway_helpers import run

from wanxport.control.certs import (
    CertificateError,
    certificate_name,
    load_identity,
    make_expired_leaf,
    make_foreign_leaf,
    make_test_pki,
)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_pki_files_modes_and_extensions(tmp_path: Path) -> None:
    pki = make_test_pki(tmp_path, ["gw-a", "gw-b"])
    assert pki["ca"] == tmp_path / "ca.pem"
    for key in (tmp_path / "ca.key", tmp_path / "gw-a.key", tmp_path / "gw-b.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ca = _cert(pki["ca"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf = _cert(tmp_path / "gw-a.pem")
    assert leaf.issuer == ca.subject
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gw-a"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku and ExtendedKeyUsageOID.CLIENT_AUTH in eku
    assert certificate_name(leaf) == "gw-a"
    assert load_identity(pki["gw-b"]) == (tmp_path / "gw-b.pem", tmp_path / "gw-b.key")


def test_ed25519_option(tmp_path: Path) -> None:
    make_test_pki(tmp_path, ["gw"], key_type="ed25519")
    assert isinstance(_cert(tmp_path / "gw.pem").public_key(), ed25519.Ed25519PublicKey)


def test_expired_and_foreign_leaves(tmp_path: Path) -> None:
    make_test_pki(tmp_path, ["gw"])
    ca = _cert(tmp_path / "ca.pem")
    expired = _cert(Path(str(make_expired_leaf(tmp_path, "old")) + ".pem"))
    assert expired.issuer == ca.subject
    assert expired.not_valid_after_utc < dt.datetime.now(dt.UTC)
    foreign = _cert(Path(str(make_foreign_leaf(tmp_path, "evil")) + ".pem"))
    assert foreign.issuer != ca.subject


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key_type"):
        make_test_pki(tmp_path, ["gw"], key_type="rsa")
    with pytest.raises(ValueError, match="names"):
        make_test_pki(tmp_path, ["ca"])


def test_load_identity_names_the_missing_file(tmp_path: Path) -> None:
    make_test_pki(tmp_path, ["gw"])
    with pytest.raises(CertificateError, match=r"certificate: .*nope\.pem does not exist"):
        load_identity(tmp_path / "nope")
    (tmp_path / "gw.key").unlink()
    with pytest.raises(CertificateError, match=r"gw\.key does not exist"):
        load_identity(tmp_path / "gw")


def test_load_identity_unreadable(tmp_path: Path) -> None:
    make_test_pki(tmp_path, ["gw"])
    (tmp_path / "gw.key").unlink()
    (tmp_path / "gw.key").mkdir()  # unreadable as a file, even for root
    with pytest.raises(CertificateError, match=r"gw\.key is not readable"):
        load_identity(tmp_path / "gw")


def _verifies(ca: Path, cert: Path) -> bool:
    """``openssl verify -CAfile ca cert`` where openssl is installed, else the same check
    (signature by the CA) with cryptography."""
    openssl = shutil.which("openssl")
    if openssl is not None:
        return subprocess.run([openssl, "verify", "-CAfile", str(ca), str(cert)],
                              capture_output=True, timeout=30).returncode == 0
    try:
        _cert(cert).verify_directly_issued_by(_cert(ca))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def test_certs_adds_names_with_the_existing_ca_and_keeps_existing_ones(tmp_path: Path) -> None:
    first = run("certs", str(tmp_path), "--names", "site-a", "site-b")
    assert first.returncode == 0, first.stderr
    ca_before = (tmp_path / "ca.pem").read_bytes()
    site_a = (tmp_path / "site-a.pem").read_bytes()
    second = run("certs", str(tmp_path), "--names", "site-c", "site-a")
    assert second.returncode == 0 and second.stderr == "", second
    assert (tmp_path / "ca.pem").read_bytes() == ca_before, "the CA was not replaced"
    assert (tmp_path / "site-a.pem").read_bytes() == site_a, "an existing name keeps its certificate"
    assert f"{tmp_path / 'site-a'}.pem  kept: it exists already" in second.stdout
    assert f"{tmp_path / 'site-c'}.pem  {tmp_path / 'site-c'}.key" in second.stdout
    assert "the existing CA signed the new names" in second.stdout
    for name in ("site-a", "site-b", "site-c"):
        assert _verifies(tmp_path / "ca.pem", tmp_path / f"{name}.pem"), name
    assert stat.S_IMODE((tmp_path / "site-c.key").stat().st_mode) == 0o600


def test_certs_force_replaces_the_ca_and_names_what_it_invalidates(tmp_path: Path) -> None:
    assert run("certs", str(tmp_path), "--names", "site-a", "site-b").returncode == 0
    ca_before = (tmp_path / "ca.pem").read_bytes()
    forced = run("certs", str(tmp_path), "--names", "site-b", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "ca.pem").read_bytes() != ca_before
    [warning] = forced.stderr.strip().splitlines()
    assert warning.startswith("wanxport certs: warning: replaced the CA"), warning
    assert str(tmp_path / "site-a.pem") in warning and "site-b.pem" not in warning, warning
    assert not _verifies(tmp_path / "ca.pem", tmp_path / "site-a.pem"), "invalidated, as the warning says"
    assert _verifies(tmp_path / "ca.pem", tmp_path / "site-b.pem"), "issued again with the new CA"


def test_certs_refuses_a_ca_it_cannot_sign_with(tmp_path: Path) -> None:
    make_test_pki(tmp_path, ["site-a"])
    (tmp_path / "ca.key").unlink()  # a site that keeps its CA key elsewhere
    result = run("certs", str(tmp_path), "--names", "site-b")
    assert result.returncode == 2 and not (tmp_path / "site-b.pem").exists()
    [line] = result.stderr.strip().splitlines()
    assert f"{tmp_path / 'ca.key'} does not exist" in line and "--force" in line, line
