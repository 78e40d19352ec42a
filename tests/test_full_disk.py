"""A full disk at the receiver: a small tmpfs as ``--out`` (root only, for the mount).

Without reserving the partial file's blocks, the receiver mapped a sparse file and
the native placement's first write past the free space killed it with SIGBUS,
leaving the sender hanging. Now: the transfer fails at both ends with ENOSPC
named, nothing is reported delivered, no partial file is left behind, the same
receiver goes on serving a transfer that fits, and once space returns the same
file goes through.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_helpers import free_path_ports, run, start, stop, wait_listening

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(out)], check=True)
    try:
        yield out
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


def test_enospc_is_named_at_both_ends_and_the_gateway_keeps_serving(small_disk: Path,
                                                                      tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert run("certs", str(pki), "--names", "gw-a", "gw-b").returncode == 0
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    big.write_bytes(os.urandom(8 << 20))  # twice the disk
    small.write_bytes(os.urandom(100_000))
    port = free_path_ports(1)[0]
    recv = start("recv", "--identity", str(pki / "gw-b"), "--ca", str(pki / "ca.pem"),
                 "--listen", f"127.0.0.1:{port}", "--out", str(small_disk), "--keep", "--json")

    def send(path: Path) -> subprocess.CompletedProcess[str]:
        return run("send", "--identity", str(pki / "gw-a"), "--ca", str(pki / "ca.pem"),
                   "--to", f"127.0.0.1:{port}", "--piece", "1MiB", "--json", str(path), timeout=60)

    try:
        wait_listening(recv, port)
        failed = send(big)
        assert failed.returncode == 1, failed.stderr
        assert "ENOSPC" in failed.stderr and "big.bin" in failed.stderr, failed.stderr
        sender_report = json.loads(failed.stdout)
        assert sender_report["intact"] is False and sender_report["goodput_bps"] == 0
        assert "ENOSPC" in sender_report["error"]
        assert os.listdir(small_disk) == [], "no partial file, nothing under the final name"
        fits = send(small)
        assert fits.returncode == 0, fits.stderr
        assert (small_disk / "small.bin").read_bytes() == small.read_bytes()
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
        again = send(big)
        assert again.returncode == 0, again.stderr
        assert (small_disk / "big.bin").read_bytes() == big.read_bytes()
    finally:
        r_out, r_err = stop(recv)
    assert "ENOSPC" in r_err and "big.bin" in r_err, r_err
    reports = [json.loads(line) for line in r_out.splitlines()]
    assert [r["intact"] for r in reports] == [False, True, True]
    assert reports[0]["files"] == [] and "ENOSPC" in reports[0]["error"]
