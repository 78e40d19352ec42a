"""The daemon as systemd runs it: notify sequence, reload, drain (the unit files: test_deploy_units.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from daemon_helpers import NotifyListener, log_of, make_pki, start_daemon, two_sites
from gateway_helpers import free_path_ports

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.durable import read_state

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def notify(tmp_path: Path):  # type: ignore[no-untyped-def]
    listener = NotifyListener(tmp_path / "notify.sock")
    yield listener
    listener.close()


def _bound(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def test_notify_sequence_ready_reload_stopping(pki: Path, tmp_path: Path, notify: NotifyListener) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    config = load_config(a_cfg)
    proc = start_daemon(a_cfg, notify, WATCHDOG_USEC="200000")
    try:
        ready = notify.next()
        assert ready.get("READY") == "1", ready
        # READY means ready: every port bound and the API answering, right now.
        assert all(_bound(port) for _, port in config.listen)
        assert GatewayClient(str(config.api_socket)).status()["site"] == "gw-a"
        proc.send_signal(signal.SIGHUP)
        reloading = notify.next()
        assert reloading.get("RELOADING") == "1"
        assert abs(int(reloading["MONOTONIC_USEC"]) - time.monotonic_ns() // 1000) < 30_000_000
        assert notify.next().get("READY") == "1"
        proc.send_signal(signal.SIGTERM)
        assert notify.next().get("STOPPING") == "1"
        assert proc.wait(30) == 0
    finally:
        _stop(proc)
    watchdog = [m for m in notify.messages if m == {"WATCHDOG": "1"}]
    assert watchdog, "WATCHDOG=1 comes from the event loop while it runs"
    assert not config.api_socket.exists(), "the API socket is removed at exit"


def test_bad_reload_keeps_the_running_config(pki: Path, tmp_path: Path, notify: NotifyListener) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    good = a_cfg.read_text()
    proc = start_daemon(a_cfg, notify)
    try:
        assert notify.next().get("READY") == "1"
        client = GatewayClient(str(load_config(a_cfg).api_socket))
        a_cfg.write_text(good + "\n[limits]\nconcurrent_transfers = -3\n")
        proc.send_signal(signal.SIGHUP)
        assert notify.next().get("RELOADING") == "1" and notify.next().get("READY") == "1"
        refused = [line for line in log_of(a_cfg).splitlines() if "reload refused" in line]
        assert len(refused) == 1 and "limits.concurrent_transfers: -3 is not valid" in refused[0]
        assert [p["name"] for p in client.status()["peers"]] == ["gw-b"]
        [port] = free_path_ports(1)
        a_cfg.write_text(good + f'[[peers]]\nname = "gw-c"\npaths = ["127.0.0.1:{port}"]\n')
        proc.send_signal(signal.SIGHUP)
        assert notify.next().get("RELOADING") == "1" and notify.next().get("READY") == "1"
        assert [p["name"] for p in client.status()["peers"]] == ["gw-b", "gw-c"]
        assert "reload: peer gw-c added" in log_of(a_cfg)
    finally:
        assert _stop(proc) == 0


def test_sigterm_drain_finishes_or_checkpoints_within_the_deadline(
        pki: Path, tmp_path: Path, notify: NotifyListener) -> None:
    """The receiver is frozen (SIGSTOP) mid-transfer: the sender's drain cannot finish the
    transfer, so it must give up at drain_seconds, exit 0, and keep the transfer queued."""
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra="[transfer]\ndrain_seconds = 1")
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(64 << 20))
    b_notify = NotifyListener(tmp_path / "b-notify.sock")
    receiver = start_daemon(b_cfg, b_notify)
    sender = start_daemon(a_cfg, notify)
    try:
        assert notify.next().get("READY") == "1" and b_notify.next().get("READY") == "1"
        client = GatewayClient(str(load_config(a_cfg).api_socket))
        transfer = client.submit("gw-b", str(src))
        deadline = time.monotonic() + 30
        while client.get(transfer["id"])["state"] != "active":
            assert time.monotonic() < deadline, client.get(transfer["id"])
            time.sleep(0.01)
        receiver.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        sender.send_signal(signal.SIGTERM)
        assert notify.next().get("STOPPING") == "1"
        assert sender.wait(30) == 0
        elapsed = time.monotonic() - started
        assert elapsed < 1 + 10, f"drain took {elapsed:.1f} s with a 1 s deadline"
    finally:
        receiver.send_signal(signal.SIGCONT)
        _stop(sender)
        _stop(receiver)
        b_notify.close()
    [stored] = [t for t in read_state(load_config(a_cfg).data_dir / "transfers.json")
                if t["id"] == transfer["id"]]
    assert stored["state"] == "queued" and stored["reason"] == "interrupted by shutdown", stored


def test_sigterm_lets_a_transfer_in_flight_finish(pki: Path, tmp_path: Path, notify: NotifyListener) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra="[transfer]\ndrain_seconds = 60")
    src = tmp_path / "mid.bin"
    src.write_bytes(os.urandom(32 << 20))
    receiver = start_daemon(b_cfg)
    sender = start_daemon(a_cfg, notify)
    try:
        assert notify.next().get("READY") == "1"
        client = GatewayClient(str(load_config(a_cfg).api_socket))
        transfer = client.submit("gw-b", str(src))
        while client.get(transfer["id"])["state"] == "queued":
            time.sleep(0.01)
        sender.send_signal(signal.SIGTERM)
        assert sender.wait(60) == 0
    finally:
        _stop(sender)
        _stop(receiver)
    data_dir = load_config(a_cfg).data_dir
    assert read_state(data_dir / "transfers.json") == [], "a finished transfer leaves the queue file"
    stored = read_state(data_dir / "finished" / f"{transfer['id']}.json")  # for its archive
    assert stored["state"] == "done", stored
    assert (load_config(b_cfg).received_dir / "gw-a" / "mid.bin").read_bytes() == src.read_bytes()


def test_transfer_cli_verbs(pki: Path, tmp_path: Path, notify: NotifyListener) -> None:
    from gateway_helpers import run

    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "cli.bin"
    src.write_bytes(os.urandom(1 << 20))
    receiver = start_daemon(b_cfg)
    sender = start_daemon(a_cfg, notify)
    try:
        assert notify.next().get("READY") == "1"
        done = run("transfer", "--config", str(a_cfg), "submit", "gw-b", str(src), "--key", "k", "--wait")
        assert done.returncode == 0, done
        transfer = json.loads(done.stdout)
        assert transfer["state"] == "done" and transfer["bytes_done"] == 1 << 20
        status = run("transfer", "--socket", str(load_config(a_cfg).api_socket), "status", transfer["id"])
        assert status.returncode == 0 and json.loads(status.stdout)["id"] == transfer["id"]
        listed = run("transfer", "--config", str(a_cfg), "list")
        assert [t["id"] for t in json.loads(listed.stdout)] == [transfer["id"]]
        again = run("transfer", "--config", str(a_cfg), "submit", "gw-b", str(src), "--key", "k")
        assert json.loads(again.stdout)["id"] == transfer["id"]
        missing = run("transfer", "--config", str(a_cfg), "submit", "gw-b", str(tmp_path / "nope"))
        assert missing.returncode == 2 and "No such file or directory" in missing.stderr
        cancel = run("transfer", "--config", str(a_cfg), "cancel", transfer["id"])
        assert cancel.returncode == 1 and "already done" in cancel.stderr
    finally:
        _stop(sender)
        _stop(receiver)
    nobody = run("transfer", "--socket", str(tmp_path / "none.sock"), "list")
    assert nobody.returncode == 1 and "no gateway answers" in nobody.stderr
