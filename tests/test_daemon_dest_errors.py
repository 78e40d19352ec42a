"""A destination the receiver refuses to write fails the transfer at both ends, at once.

A read-only file system (a tmpfs this test mounts read-only at the receiver's
``DATA_DIR/received``; root only) and a permission denied (the receiver's file
creation made to raise EACCES in process, since root is never denied) end the
transfer ``failed`` with the errno named at the sender and logged at the receiver,
within two attempts, never as "shutting down". A full disk still pauses
(``test_daemon_full_disk.py``); ``desterrors.classify`` says which is which.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import make_pki, running, two_sites

from wanxport.daemon.desterrors import DestErrorKind, classify
from wanxport.daemon.inbox import Inbox
from wanxport.daemon.store import Submission, Transfer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def read_only_received(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    received = tmp_path / "gw-b-data" / "received"
    received.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(received)], check=True)
    try:
        yield received
    finally:
        subprocess.run(["umount", "-l", str(received)], check=False)


async def final(transfer: Transfer, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while transfer.state not in ("done", "failed", "cancelled", "paused"):
        assert time.monotonic() < deadline, f"still {transfer.state} ({transfer.reason})"
        await asyncio.sleep(0.01)


async def send_one(tmp_path: Path, pki: Path, size: int) -> tuple[Transfer, list[logging.LogRecord]]:
    """The transfer once final, and what was logged until then (not the drain after)."""
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    (tmp_path / "x.bin").write_bytes(b"x" * size)
    handler = Records()
    logging.getLogger("wanxport").addHandler(handler)
    try:
        async with running(a_cfg) as a, running(b_cfg):
            assert a.store is not None
            transfer, _ = a.store.record_submission(Submission("gw-b", str(tmp_path / "x.bin"), "x.bin"), "k")
            a.submitted("gw-b")
            await final(transfer)
            records = list(handler.records)
    finally:
        logging.getLogger("wanxport").removeHandler(handler)
    return transfer, records


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("size", [0, 100_000], ids=["empty", "data"])
async def test_a_read_only_destination_fails_at_both_ends_without_spinning(
        tmp_path: Path, pki: Path, read_only_received: Path, size: int,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wanxport")
    transfer, records = await send_one(tmp_path, pki, size)
    assert transfer.state == "failed", transfer
    assert "dest x.bin: Read-only file system (EROFS)" in (transfer.reason or ""), transfer.reason
    assert transfer.attempts <= 2, f"retried {transfer.attempts} times"
    # The receiver's line: its inbox's for a piece of data, its sink's for an empty file.
    receiver = [r.getMessage() for r in records
                if r.name in ("wanxport.daemon.inbox", "wanxport.gateway.files")]
    assert any("dest x.bin: Read-only file system (EROFS)" in m for m in receiver), receiver
    sender = [r.getMessage() for r in records if r.name == "wanxport.daemon.service"]
    assert any(f"transfer {transfer.id} to gw-b failed" in m and "EROFS" in m for m in sender), sender
    assert not any("shutting down" in r.getMessage() for r in records), "nothing was shutting down"


async def test_permission_denied_fails_with_eacces(tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wanxport.daemon")
    def denied(self: Inbox, *args: object) -> None:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(Inbox, "_open_new", denied)
    transfer, _ = await send_one(tmp_path, pki, 50_000)
    assert transfer.state == "failed" and transfer.attempts == 1, transfer
    assert "dest x.bin: Permission denied (EACCES)" in (transfer.reason or ""), transfer.reason
    receipts = [r.getMessage() for r in caplog.records if r.name == "wanxport.daemon.receipts"]
    assert receipts == [f"transfer {transfer.id} from gw-a failed here: "
                        "dest x.bin: Permission denied (EACCES)"]


def test_which_destination_errors_wait_and_which_fail() -> None:
    def kind(reason: str) -> tuple[DestErrorKind, str, str] | None:
        dest = classify(reason)
        return None if dest is None else (dest.kind, dest.errno_name, dest.verdict)

    assert kind("dest a: Read-only file system (EROFS)") == (DestErrorKind.REFUSED, "EROFS", "fail")
    assert kind("the peer ended the session (dest d/a: Operation not permitted (EPERM))") \
        == (DestErrorKind.REFUSED, "EPERM", "fail")
    assert kind("dest a: no room for 5 bytes at offset 0 in /r: No space left on device (ENOSPC); kept") \
        == (DestErrorKind.NO_SPACE, "ENOSPC", "pause")
    assert kind("a: no room ... Disk quota exceeded (EDQUOT)") \
        == (DestErrorKind.NO_SPACE, "EDQUOT", "pause")  # an older receiver's wording
    assert kind("dest a: Input/output error (EIO) at offset 0") \
        == (DestErrorKind.PASSING, "EIO", "pause")  # may pass: waited out
    assert kind("the peer did not verify every file (integrity-failure)") is None
    assert kind("sendmsg: Operation not permitted (EPERM)") is None  # not a destination's error
