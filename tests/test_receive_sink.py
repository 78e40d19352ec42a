"""The receiving sinks on their own: refusals through symlinks, and a resumed file's mode
and mtime (the daemon's inbox and the one-shot ``recv``)."""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import random
import stat
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from wanxport.aio import native_io
from wanxport.control import ResumeQuery
from wanxport.core.digest import DIGEST_NAME, shard_digest_hex
from wanxport.daemon.durable import write_state
from wanxport.daemon.inbox import Inbox, partial_path
from wanxport.gateway.files import POPULATE_CHUNK, FileSink, MappedRange, ReceivePolicy
from wanxport.wire.native import NATIVE_AVAILABLE

PIECE = 1 << 16
PAGE = mmap.PAGESIZE
OLD_MTIME_NS = 1_000_000_000_123_456_789


def _meta(name: str, size: int, **extra: object) -> bytes:
    return json.dumps({"name": name, "offset": 0, "file_size": size, **extra}).encode()


def test_the_one_shot_sink_does_not_write_through_a_symlinked_name(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.bin").symlink_to(outside)
    sink = FileSink(out)
    scratch = sink.allocate(0, 10, _meta("x.bin", 10))
    scratch[:] = 1
    assert sink.on_piece(0, True, 10) == ("aborted", [0])
    assert sink.error is not None and "'x.bin' is a symlink; not followed" in sink.error
    assert outside.read_bytes() == b"keep" and os.path.islink(out / "x.bin")


def test_the_inbox_refuses_an_empty_entry_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "in").mkdir()
    (tmp_path / "in/evil").symlink_to(tmp_path / "outside")
    inbox = Inbox(tmp_path / "in")
    assert inbox.write_empty("evil/empty", 3) == "aborted"
    assert inbox.reasons == {3: "dest evil/empty: 'evil' is a symlink; not followed"}
    assert list((tmp_path / "outside").iterdir()) == []


async def test_a_resumed_file_gets_the_mode_and_mtime_its_state_recorded(tmp_path: Path) -> None:
    """A receiver killed after the last piece and before the rename: the resume finds every
    piece held and renames the file, with the attributes the first pieces brought."""
    data = random.Random(4).randbytes(3 * PIECE)
    digests = [shard_digest_hex(data[o:o + PIECE]) for o in range(0, len(data), PIECE)]
    partial = partial_path(tmp_path / "run/model.bin")
    partial.parent.mkdir()
    partial.write_bytes(data)
    write_state(partial.with_name(partial.name + ".state"),
                {"size": len(data), "digest": DIGEST_NAME,
                 "pieces": {str(i * PIECE): [PIECE, d] for i, d in enumerate(digests)},
                 "attributes": {"mode": 0o640, "mtime_ns": OLD_MTIME_NS}})
    inbox = Inbox(tmp_path, ReceivePolicy(0o007))
    have = await inbox.answer(ResumeQuery(1, "run/model.bin", len(data), PIECE, 0, digests))
    assert have.pieces == [0, 1, 2]
    st = (tmp_path / "run/model.bin").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o640, OLD_MTIME_NS)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model.bin"]


async def test_a_partial_behind_a_symlink_is_never_read_for_a_resume(tmp_path: Path) -> None:
    """Pieces planted outside (a partial and a state claiming them) are not held through a link."""
    data = random.Random(5).randbytes(2 * PIECE)
    digests = [shard_digest_hex(data[o:o + PIECE]) for o in range(0, len(data), PIECE)]
    planted = tmp_path / "outside"
    planted.mkdir()
    (planted / ".x.bin.partial").write_bytes(data)
    write_state(planted / ".x.bin.partial.state", {"size": len(data), "digest": DIGEST_NAME,
                                                    "pieces": {str(i * PIECE): [PIECE, d]
                                                               for i, d in enumerate(digests)}})
    (tmp_path / "in").mkdir()
    (tmp_path / "in/evil").symlink_to(planted)
    have = await Inbox(tmp_path / "in").answer(ResumeQuery(1, "evil/x.bin", len(data), PIECE, 0, digests))
    assert have.pieces == []
    assert sorted(p.name for p in planted.iterdir()) == [".x.bin.partial", ".x.bin.partial.state"]


def _resident(array: np.ndarray) -> int:
    """Bytes of ``array``'s mapping present in this process's page tables (``Rss`` in smaps):
    the pages a write into it will find without a fault."""
    address = array.ctypes.data
    with open("/proc/self/smaps") as fh:
        inside = False
        for line in fh:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= address < high
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("the array's mapping is not in /proc/self/smaps")


def _partial_file(tmp_path: Path, size: int, content: bytes = b"") -> int:
    """A partial file as a sink makes one: its blocks reserved, ``content`` at its start."""
    fd = os.open(tmp_path / "partial.bin", os.O_RDWR | os.O_CREAT)
    os.posix_fallocate(fd, 0, size)
    os.pwrite(fd, content, 0)
    return fd


@pytest.mark.skipif(not NATIVE_AVAILABLE, reason="the native module is not built")
def test_a_received_range_is_faulted_in_ahead_of_its_data_and_keeps_its_bytes(tmp_path: Path) -> None:
    """The receive then writes into mapped pages instead of faulting on the event loop's thread."""
    size = 4 * POPULATE_CHUNK + 12345  # several steps and a partial last one
    content = random.Random(3).randbytes(PAGE * 3 + 100)  # what a resumed piece may hold already
    fd = _partial_file(tmp_path, size, content)
    try:
        fresh = MappedRange(fd, 0, size, writable=True)
        assert _resident(fresh.array) < size // 4
        fresh.populate()
        assert _resident(fresh.array) >= size - PAGE
        assert bytes(fresh.array[:len(content)]) == content  # populating changes no byte
        assert not fresh.array[len(content):].any()
        evicted = MappedRange(fd, 0, size, writable=True)
        evicted.evict()
        evicted.populate()  # a range already evicted (its piece arrived) is left alone
        assert _resident(evicted.array) < size // 4
    finally:
        os.close(fd)


@pytest.mark.skipif(not NATIVE_AVAILABLE, reason="the native module is not built")
async def test_the_sink_faults_a_piece_in_on_a_worker_thread_when_it_maps_it(tmp_path: Path) -> None:
    size = 3 * POPULATE_CHUNK
    sink = FileSink(tmp_path)
    ran_on: list[int] = []
    real = native_io.populate_write

    def watched(buffer: object) -> bool:
        ran_on.append(threading.get_native_id())
        return real(buffer)  # type: ignore[arg-type]

    with mock.patch.object(native_io, "populate_write", watched):
        array = sink.allocate(0, size, _meta("f.bin", size))
        for _ in range(200):
            if len(ran_on) == 3:
                break
            await asyncio.sleep(0.01)
    assert len(ran_on) == 3 and threading.get_native_id() not in ran_on
    assert _resident(array) >= size - PAGE
    sink.discard_partials()
