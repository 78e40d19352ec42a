"""``wanxport gateway --check`` is ``nginx -t``: every unusable identity, CA or address is
one line and exit 2; an expiring certificate is a warning line and exit 0; the daemon
refuses to start with the same line, and warns at its default level about expiry."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from daemon_helpers import NotifyListener, make_pki, running, two_sites, write_config
from gateway_helpers import cli, env, free_path_ports, run

from wanxport.cli import main
from wanxport.control.certs import make_expired_leaf
from wanxport.daemon.certwatch import expiry_warning, watch_expiry

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def forge_leaf(pki: Path, name: str, not_after: dt.datetime) -> Path:
    """``pki/<name>`` (.pem + .key) signed by ``pki``'s CA, valid until ``not_after``."""
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_after - dt.timedelta(days=60)).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (pki / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (pki / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    return pki / name


def config_for(tmp_path: Path, site: str, identity: Path, ca: Path, listen: str | None = None) -> Path:
    """A config of ``site`` with ``identity`` and ``ca`` (and a given ``listen`` host:port)."""
    [port] = free_path_ports(1)
    lines = [f'site = "{site}"', f'identity = "{identity}"', f'ca = "{ca}"',
             f'listen = ["{listen or f"127.0.0.1:{port}"}"]', f'data_dir = "{tmp_path / "data"}"']
    path = tmp_path / "gw.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    """``wanxport gateway --check CONFIG``: exit status, stderr lines, stdout."""
    status = main(["gateway", "--check", str(config)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert all(line.startswith("wanxport gateway: ") for line in lines), lines
    return status, lines, out


def only_error(lines: list[str]) -> str:
    errors = [line for line in lines if not line.startswith("wanxport gateway: warning: ")]
    assert len(errors) == 1, lines
    return errors[0]


def test_a_good_config_is_ok(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, out = check(config_for(tmp_path, "gw-a", pki / "gw-a", pki / "ca.pem"), capsys)
    assert status == 0 and lines == [] and ": ok (site gw-a: 1 paths" in out


def test_a_key_of_another_certificate(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(pki / "gw-a.pem", tmp_path / "mixed.pem")
    shutil.copy(pki / "gw-b.key", tmp_path / "mixed.key")
    status, lines, out = check(config_for(tmp_path, "gw-a", tmp_path / "mixed", pki / "ca.pem"), capsys)
    assert status == 2 and out == ""
    assert f"{tmp_path / 'mixed.key'} is not the key of {tmp_path / 'mixed.pem'}" in only_error(lines)


def test_a_garbage_ca_file(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("this is not a certificate\n")
    status, lines, _ = check(config_for(tmp_path, "gw-a", pki / "gw-a", garbage), capsys)
    assert status == 2
    assert f"ca: {garbage} is not a PEM certificate" in only_error(lines)


def test_an_expired_identity(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = tmp_path / "pki"
    shutil.copytree(pki, own)
    make_expired_leaf(own, "gw-old")
    status, lines, _ = check(config_for(tmp_path, "gw-old", own / "gw-old", own / "ca.pem"), capsys)
    assert status == 2
    assert f"identity: {own / 'gw-old.pem'} expired on " in only_error(lines)


def test_an_identity_named_other_than_the_site(pki: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = check(config_for(tmp_path, "gw-a", pki / "gw-b", pki / "ca.pem"), capsys)
    assert status == 2
    assert "names 'gw-b', not the site 'gw-a'" in only_error(lines)


def test_a_leaf_certificate_as_the_ca(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = check(config_for(tmp_path, "gw-a", pki / "gw-a", pki / "gw-b.pem"), capsys)
    assert status == 2
    assert any(f"ca: {pki / 'gw-b.pem'} holds 'gw-b', which is not a CA certificate" in line
               for line in lines), lines
    assert any("does not chain to the CA" in line for line in lines), lines  # and so gw-a is unverified


def test_an_identity_from_another_ca(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = make_pki(tmp_path / "other")
    status, lines, _ = check(config_for(tmp_path, "gw-a", other / "gw-a", pki / "ca.pem"), capsys)
    assert status == 2
    assert "does not chain to the CA in" in only_error(lines)


def test_an_unresolvable_listen_host(pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(tmp_path, "gw-a", pki / "gw-a", pki / "ca.pem", listen="no-such-host.invalid:7400")
    status, lines, _ = check(config, capsys)
    assert status == 2
    assert "listen[0]: host 'no-such-host.invalid' does not resolve" in only_error(lines)


def test_a_listen_address_of_another_host(pki: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(tmp_path, "gw-a", pki / "gw-a", pki / "ca.pem", listen="192.0.2.1:7400")
    status, lines, _ = check(config, capsys)
    assert status == 2
    assert "listen[0]: '192.0.2.1' (192.0.2.1) is not an address of this host" in only_error(lines)


def test_the_api_tcp_and_metrics_addresses_are_checked_too(pki: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(tmp_path, "gw-a", pki / "gw-a", pki / "ca.pem")
    good = config.read_text()
    config.write_text(good + 'api_tcp = "127.0.0.1:0"\napi_clients = ["ops"]\nmetrics = "127.0.0.1:0"\n')
    status, lines, _ = check(config, capsys)
    assert status == 0 and lines == [], lines  # the TLS context serves the identity, the hosts are ours
    config.write_text(good + 'api_tcp = "192.0.2.7:8443"\napi_clients = ["ops"]\n'
                             'metrics = "no-such-host.invalid:9464"\n')
    status, lines, _ = check(config, capsys)
    assert status == 2 and len(lines) == 2, lines
    assert "api_tcp: '192.0.2.7' (192.0.2.7) is not an address of this host" in lines[0]
    assert "metrics: host 'no-such-host.invalid' does not resolve" in lines[1]


def test_an_identity_expiring_within_14_days_is_a_warning(pki: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    own = tmp_path / "pki"
    shutil.copytree(pki, own)
    forge_leaf(own, "gw-soon", dt.datetime.now(dt.UTC) + dt.timedelta(days=7))
    status, lines, out = check(config_for(tmp_path, "gw-soon", own / "gw-soon", own / "ca.pem"), capsys)
    assert status == 0 and ": ok (site gw-soon" in out
    [warning] = lines
    assert warning.startswith(f"wanxport gateway: warning: identity: {own / 'gw-soon.pem'} expires on ")
    assert "(in 7.0 days)" in warning or "(in 6.9 days)" in warning, warning


def test_the_daemon_refuses_to_start_with_the_line_check_prints(pki: Path, tmp_path: Path) -> None:
    shutil.copy(pki / "gw-a.pem", tmp_path / "mixed.pem")
    shutil.copy(pki / "gw-b.key", tmp_path / "mixed.key")
    config = config_for(tmp_path, "gw-a", tmp_path / "mixed", pki / "ca.pem")
    result = run("gateway", str(config), timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"{tmp_path / 'mixed.key'} is not the key of" in line, line
    assert not (tmp_path / "data").exists(), "refused before it touched its data_dir"


def test_expiry_warnings_name_the_days_left(pki: Path, tmp_path: Path) -> None:
    own = tmp_path / "pki"
    shutil.copytree(pki, own)
    now = dt.datetime.now(dt.UTC)
    assert expiry_warning(own / "gw-a.pem", now) is None  # 30 days left
    soon = expiry_warning(own / "gw-a.pem", now + dt.timedelta(days=20))
    assert soon is not None and "expires in 10.0 days" in soon
    expired = make_expired_leaf(own, "gw-old").with_suffix(".pem")
    gone = expiry_warning(expired, now)
    assert gone is not None and "expired 1.0 days ago" in gone and "peers refuse new sessions" in gone


async def test_the_running_daemon_warns_each_interval(pki: Path, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The daily look re-reads the identity in use: here one that expired meanwhile."""
    own = tmp_path / "pki"
    shutil.copytree(pki, own)
    expired = make_expired_leaf(own, "gw-old").with_suffix(".pem")
    caplog.set_level(logging.WARNING, logger="wanxport.daemon.certwatch")
    task = asyncio.create_task(watch_expiry(lambda: expired, interval_s=0.001))
    try:
        while not caplog.records:
            await asyncio.sleep(0.001)  # yields to the watcher until its first look logs
    finally:
        task.cancel()
    assert caplog.records[0].levelno == logging.WARNING and "expired" in caplog.records[0].getMessage()


def test_the_start_warns_at_the_default_level(pki: Path, tmp_path: Path) -> None:
    """Without -v (WARNING, as the unit runs it): an identity expiring in 7 days is logged."""
    own = tmp_path / "pki"
    shutil.copytree(pki, own)
    forge_leaf(own, "gw-soon", dt.datetime.now(dt.UTC) + dt.timedelta(days=7))
    config = write_config(tmp_path / "soon.toml", "gw-soon", own, free_path_ports(1), {})
    notify = NotifyListener(tmp_path / "notify.sock")
    with open(tmp_path / "soon.log", "w") as log:
        proc = subprocess.Popen(cli("gateway", str(config)), stderr=log, stdout=subprocess.DEVNULL,
                                env={**env(), "NOTIFY_SOCKET": str(notify.path)})
    try:
        assert notify.next().get("READY") == "1"
    finally:
        proc.terminate()
        proc.wait(30)
        notify.close()
    warnings = [line for line in (tmp_path / "soon.log").read_text().splitlines() if " WARNING " in line]
    assert any(f"identity: {own / 'gw-soon.pem'} expires on" in line for line in warnings), warnings


async def test_a_ca_file_broken_while_running_is_one_error_line_not_a_traceback_per_dial(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """aioquic reads the CA file at each handshake: one garbled under a running daemon once
    raised OpenSSL.crypto.Error out of the datagram handler on every dial."""
    own = tmp_path / "pki"
    shutil.copytree(pki, own)
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    a_cfg.write_text(a_cfg.read_text().replace(str(pki / "ca.pem"), str(own / "ca.pem")))
    caplog.set_level(logging.INFO)
    async with running(a_cfg):
        (own / "ca.pem").write_text("garbled\n")
        async with running(b_cfg):
            def refused() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "CA file cannot be loaded" in r.getMessage()
                        and r.name != "wanxport.control.tlsauth"]
            def tracebacks() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
            while len(refused()) < 3 and not tracebacks():  # until several handshakes failed
                await asyncio.sleep(0.01)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["wanxport.control.tlsauth"], [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert f"CA file {own / 'ca.pem'} cannot be loaded (no certificate or crl found)" in message
    assert errors[0].exc_info is None
