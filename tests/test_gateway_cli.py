"""``wanxport certs / send / recv`` end to end on loopback, and their one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from gateway_helpers import free_path_ports, run, start, stop, wait_listening

from wanxport.control.certs import make_expired_leaf, make_foreign_leaf

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    result = run("certs", str(directory), "--names", "gw-a", "gw-b")
    assert result.returncode == 0, result.stderr
    make_expired_leaf(directory, "gw-old")
    make_foreign_leaf(directory, "gw-evil")
    return directory


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_certs_writes_ca_and_identities(pki: Path) -> None:
    for name in ("ca.pem", "gw-a.pem", "gw-a.key", "gw-b.pem", "gw-b.key"):
        assert (pki / name).is_file()
    assert (pki / "gw-a.key").stat().st_mode & 0o777 == 0o600


def test_certs_bad_name_is_usage_error(tmp_path: Path) -> None:
    result = run("certs", str(tmp_path), "--names", "ca")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_files_arrive_byte_exact_with_report(pki: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(rng.bytes(3_000_001))
    np.save(src / "grad.npy", rng.standard_normal((64, 33)).astype(np.float32))
    (src / "empty").write_bytes(b"")
    out = tmp_path / "out"
    ports = free_path_ports(2)
    assert ports[1] == ports[0] + 1  # consecutive ports, two paths: one UDP port per path
    listen = [a for p in ports for a in ("--listen", f"127.0.0.1:{p}")]
    to = [a for p in ports for a in ("--to", f"127.0.0.1:{p}")]
    recv = start("recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"), *listen,
                 "--out", str(out), "--json")
    try:
        wait_listening(recv, ports[0])
        sent = run("send", "--identity", str(pki / "gw-a"), "--ca", str(pki / "ca.pem"), *to,
                   "--piece", "1MiB", "--json", *(str(src / n) for n in ("blob.bin", "grad.npy", "empty")))
        assert sent.returncode == 0, sent.stderr
        r_out, r_err = recv.communicate(timeout=30)
    finally:
        stop(recv)
    assert recv.returncode == 0, r_err
    for name in ("blob.bin", "grad.npy", "empty"):
        assert sha(out / name) == sha(src / name)
    assert sorted(os.listdir(out)) == ["blob.bin", "empty", "grad.npy"]  # no partial file left
    np.testing.assert_array_equal(np.load(out / "grad.npy"), np.load(src / "grad.npy"))
    for text, role in ((sent.stdout, "sender"), (r_out, "receiver")):
        report = json.loads(text)
        assert report["schema"] == "wanxport.report/1" and report["mode"] == "loopback"
        assert report["role"] == role and report["intact"] is True
        assert report["cipher"] == "aes-256-gcm" and "pacer" in report
        assert report["datagrams_rejected"] == 0 and len(report["paths"]) == 2


@pytest.mark.parametrize("identity,reason", [("gw-evil", "unknown_ca|unknown ca|issuer"),
                                             ("gw-old", "expired")])
def test_bad_sender_certificate_is_refused(pki: Path, tmp_path: Path, identity: str, reason: str) -> None:
    src = tmp_path / "x.bin"
    src.write_bytes(b"secret" * 1000)
    out = tmp_path / "out"
    (port,) = free_path_ports(1)
    recv = start("recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"),
                 "--listen", f"127.0.0.1:{port}", "--out", str(out))
    try:
        wait_listening(recv, port)
        sent = run("send", "--identity", str(pki / identity), "--ca", str(pki / "ca.pem"),
                   "--to", f"127.0.0.1:{port}", str(src))
    finally:
        recv.send_signal(signal.SIGINT)
        _, recv_err = stop(recv)
    recv_lines = [line for line in recv_err.splitlines() if "refused a sender" in line]
    assert len(recv_lines) == 1, recv_err
    recv_line = recv_lines[0]
    assert sent.returncode == 1
    lines = sent.stderr.strip().splitlines()
    assert len(lines) == 1 and "certificate" in lines[0], lines
    assert "certificate" in recv_line and identity in recv_line, recv_line
    assert os.listdir(out) == []  # the receiver wrote nothing


def test_unreachable_receiver_is_one_line(pki: Path, tmp_path: Path) -> None:
    src = tmp_path / "x.bin"
    src.write_bytes(b"x")
    (port,) = free_path_ports(1)
    sent = run("send", "--identity", str(pki / "gw-a"), "--ca", str(pki / "ca.pem"),
               "--to", f"127.0.0.1:{port}", "--control-timeout", "0.5", str(src))
    assert sent.returncode == 1
    lines = sent.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the receiver" in lines[0], lines


def test_port_in_use_and_unwritable_output(pki: Path, tmp_path: Path) -> None:
    import socket

    (port,) = free_path_ports(1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", port))
        result = run("recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"),
                     "--listen", f"127.0.0.1:{port}", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "port in use" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    result = run("recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"),
                 "--listen", f"127.0.0.1:{port}", "--out", str(blocker / "sub"))
    assert result.returncode == 2 and "not writable" in result.stderr
    result = run("send", "--identity", str(tmp_path / "nobody"), "--ca", str(pki / "ca.pem"),
                 "--to", "127.0.0.1:9", str(blocker))
    assert result.returncode == 2 and "certificate" in result.stderr
