"""One daemon per data_dir: a second one refuses in one line naming the holder, and leaves it be."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from daemon_helpers import NotifyListener, make_pki, running, start_daemon, two_sites, write_config
from gateway_helpers import free_path_ports, run

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.service import DaemonError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_a_second_daemon_on_the_same_data_dir_refuses_and_the_first_keeps_its_api(
        pki: Path, tmp_path: Path) -> None:
    first_cfg, _ = two_sites(tmp_path, pki)
    second_cfg = write_config(tmp_path / "second.toml", "gw-a", pki, free_path_ports(2), {})
    config = load_config(first_cfg)
    assert load_config(second_cfg).data_dir == config.data_dir, "the same data_dir, other ports"
    notify = NotifyListener(tmp_path / "notify.sock")
    first = start_daemon(first_cfg, notify)
    try:
        assert notify.next().get("READY") == "1"
        second = run("gateway", str(second_cfg), timeout=30)
        assert second.returncode == 2, second
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {first.pid}" in lines[0] and str(config.data_dir) in lines[0], lines[0]
        assert "Traceback" not in second.stderr
        assert config.api_socket.exists(), "the second daemon left the first one's socket alone"
        assert GatewayClient(str(config.api_socket)).status()["site"] == "gw-a"
        assert (config.data_dir / "lock").read_text().strip() == str(first.pid)
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
        notify.close()


async def test_the_lock_goes_with_the_daemon_and_with_a_failed_start(pki: Path, tmp_path: Path) -> None:
    """In one process too: a second start on the same data_dir fails while the first runs;
    after the first closes (or a start fails for another reason) the next start succeeds."""
    a_cfg, _ = two_sites(tmp_path, pki)
    async with running(a_cfg) as daemon:
        with pytest.raises(DaemonError, match=r"is in use by another wanxport gateway \(pid \d+"):
            async with running(a_cfg):
                pass
        assert daemon.api is not None and load_config(a_cfg).api_socket.exists()
    async with running(a_cfg) as again:
        assert again.lock.path.exists()
