"""A full disk at a daemon's receiver pauses the transfer; it completes once space returns.

A small tmpfs this test mounts (and unmounts, also on failure) is the receiver's
``DATA_DIR/received``. The file does not fit: the receiver keeps the pieces it
verified in staging (``.<name>.partial`` and its state file), the sender's transfer
is ``paused`` with ``ENOSPC`` in its reason and nothing reported delivered; then the
tmpfs grows and the daemon's own retry completes the transfer byte-exact, sending
again only what the receiver had not written (plus at most one checkpoint). Root
only, for the mount.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_helpers import make_pki, running, two_sites

from wanxport.daemon.durable import read_state
from wanxport.daemon.store import Submission, Transfer

pytestmark = pytest.mark.timeout(120)

CHECKPOINT = 1 << 20
SIZE = 12 * CHECKPOINT + 4321  # the last piece is short
DISK_MIB = 6


@pytest.fixture
def small_received(tmp_path: Path) -> Iterator[Path]:
    """gw-b's received directory on a 6 MiB tmpfs."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    received = tmp_path / "gw-b-data" / "received"
    received.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(received)], check=True)
    try:
        yield received
    finally:
        subprocess.run(["umount", "-l", str(received)], check=False)


async def state_written(path: Path, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while (state := read_state(path)) is None:
        assert time.monotonic() < deadline, f"no state file {path} within {timeout_s} s"
        await asyncio.sleep(0.05)
    return state


async def until(transfer: Transfer, states: tuple[str, ...], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while transfer.state not in states:
        assert time.monotonic() < deadline, f"still {transfer.state} ({transfer.reason})"
        await asyncio.sleep(0.01)


def written_pieces(partial: Path, source: bytes) -> int:
    """Bytes of whole pieces the partial file holds exactly as the source has them."""
    data = partial.read_bytes()
    return sum(min(CHECKPOINT, SIZE - o) for o in range(0, SIZE, CHECKPOINT)
               if data[o:o + CHECKPOINT] == source[o:o + CHECKPOINT])


async def test_full_disk_pauses_keeps_the_partial_and_resumes_once_space_returns(
        tmp_path: Path, small_received: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wanxport.daemon")
    pki = make_pki(tmp_path / "pki")
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra=f'[transfer]\ncheckpoint_bytes = "{CHECKPOINT}"')
    source = np.random.default_rng(16).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (tmp_path / "big.bin").write_bytes(source)
    async with running(a_cfg) as a, running(b_cfg) as b:
        assert b.config.received_dir == small_received
        assert a.store is not None
        submission = Submission("gw-b", str(tmp_path / "big.bin"), "big.bin")
        transfer, _ = a.store.record_submission(submission, "full-disk")
        a.submitted("gw-b")
        await until(transfer, ("paused", "done", "failed"))
        assert transfer.state == "paused", transfer
        assert "ENOSPC" in (transfer.reason or "") and "big.bin" in (transfer.reason or ""), transfer.reason
        assert transfer.bytes_done == 0 and transfer.stats is None, "nothing reported delivered"
        receiver = [r.getMessage() for r in caplog.records if r.name == "wanxport.daemon.receipts"]
        assert any(m.startswith(f"transfer {transfer.id} from gw-a paused here: dest big.bin: no room")
                   for m in receiver), receiver
        inbox = small_received / "gw-a"
        assert not (inbox / "big.bin").exists(), "no file under its final name"
        partial = inbox / ".big.bin.partial"
        # The state records are written by the receiver's sync thread, which finishes those
        # queued when the session ended on its own: on a busy host, after the sender paused.
        state = await state_written(partial.with_name(partial.name + ".state"))
        recorded = sum(size for size, _ in state["pieces"].values())
        written = written_pieces(partial, source)
        assert written >= 2 * CHECKPOINT and recorded >= 2 * CHECKPOINT, (written, recorded)
        # Space returns: the daemon's own retry (backoff from 1 s) completes the transfer.
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_received)], check=True)
        await until(transfer, ("done", "failed", "cancelled"))
    assert transfer.state == "done", transfer
    got = (inbox / "big.bin").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(source).hexdigest(), "end-to-end SHA-256"
    assert not list(inbox.rglob(".*partial*")), "no partial or state file left"
    assert transfer.stats is not None
    resent = SIZE - transfer.stats["skipped_bytes"]
    print(f"\nwritten before the pause {written}, recorded {recorded}, sent after it {resent}, "
          f"attempts {transfer.attempts}")
    assert transfer.attempts >= 2
    assert transfer.stats["skipped_bytes"] >= recorded, "every recorded piece was resumed"
    assert resent <= (SIZE - written) + CHECKPOINT, "only what was not written is sent again"
