"""The receiving sinks on their own: refusals through symlinks, and a resumed file's mode
and mtime (the daemon's inbox and the one-shot ``recv``)."""

from __future__ import annotations

import json
import os
import random
import stat
from pathlib import Path

from wanxport.control import ResumeQuery
from wanxport.core.digest import DIGEST_NAME, shard_digest_hex
from wanxport.daemon.durable import write_state
from wanxport.daemon.inbox import Inbox, partial_path
from wanxport.gateway.files import FileSink, ReceivePolicy

PIECE = 1 << 16
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


def test_a_piece_opening_after_the_one_shot_sink_ended_leaves_no_file_behind(tmp_path: Path) -> None:
    """Once the session ended and its partial files were removed, a piece still in flight
    is drained into scratch memory: a partial file created now would never be finished
    or removed."""
    sink = FileSink(tmp_path)
    sink.allocate(0, 10, _meta("a.bin", 20))
    sink.discard_partials()
    assert list(tmp_path.iterdir()) == []
    scratch = sink.allocate(1, 10, _meta("a.bin", 20))
    scratch[:] = 1
    assert sink.on_piece(1, True, 10) == ("aborted", [1])
    assert list(tmp_path.iterdir()) == []


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
