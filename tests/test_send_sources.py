"""The sending side's sources: walked without following symlinks, read without mapping.

``wanxport.sources`` opens what a submitter may send (symlinks become entries or counted
skips); ``FileReader`` reads pieces with ``preadv`` and names a change of the source
(a mapping would turn a truncated file into SIGBUS for the whole process).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wanxport.daemon.outbox import HeldSource, OutgoingPiece, plan
from wanxport.daemon.store import Submission
from wanxport.gateway.files import FileReader, SourceChanged, plan_files
from wanxport.sources import inside_tree, open_source

KIB = 1024


def test_a_walk_sends_symlinks_inside_as_entries_and_skips_the_rest(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f.bin").write_bytes(b"f" * 10)
    (tree / "a" / "up").symlink_to("../a/b/f.bin")  # inside
    (tree / "escape").symlink_to("../outside")  # relative, out of the tree
    (tree / "abs").symlink_to("/etc/hostname")  # absolute
    (tree / "loop").symlink_to(".")  # the tree itself
    os.mkfifo(tree / "fifo")  # never opened (it would block)
    opened = open_source(str(tree))
    try:
        entries = {e.rel: e for e in opened.entries}
        assert sorted(entries) == ["a/b/f.bin", "a/up"]
        assert entries["a/up"].fd is None and entries["a/up"].symlink == "../a/b/f.bin"
        assert opened.skipped == {"a symlink pointing outside the source": 3,
                                  "not a regular file, directory or symlink": 1}
    finally:
        opened.close()
    followed = open_source(str(tree / "a"), follow_symlinks=True)
    try:
        assert sorted(e.rel for e in followed.entries) == ["b/f.bin", "up"]
        assert all(e.fd is not None for e in followed.entries)
    finally:
        followed.close()


@pytest.mark.parametrize(("link", "target", "inside"), [
    ("x", "y", True), ("d/x", "../y", True), ("d/x", "../../y", False), ("x", "/y", False),
    ("x", ".", False), ("d/x", "..", False), ("x", "", False)])
def test_inside_tree(link: str, target: str, inside: bool) -> None:
    assert inside_tree(link, target) is inside


def test_piece_meta_carries_mode_mtime_and_source_identity(tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    path.write_bytes(b"m" * 300 * KIB)
    path.chmod(0o640)
    os.utime(path, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    held = HeldSource.adopt(open_source(str(path)), "fd")
    try:
        pieces = plan(Submission("gw-b", str(path), "m.bin"), held, 128 * KIB)
        assert [p.size for p in pieces] == [128 * KIB, 128 * KIB, 44 * KIB]
        meta = pieces[0].meta()
        st = path.stat()
        assert meta["mode"] == 0o640 and meta["mtime_ns"] == 1_700_000_000_123_456_789
        assert meta["source_id"] == "".join(f"{v:016x}" for v in (st.st_dev, st.st_ino, st.st_size,
                                                                   st.st_mtime_ns))
        link = OutgoingPiece(9, "l", tmp_path / "l", 0, 0, 0, symlink="m.bin").meta()
        assert link["symlink"] == "m.bin" and link["file_size"] == 0 and "source_id" not in link
    finally:
        held.close()


async def test_the_reader_names_a_truncation_and_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(os.urandom(512 * KIB))
    pieces = plan_files([path], 128 * KIB)
    reader = FileReader()
    try:
        first = await reader.read(pieces[0])
        assert bytes(first) == path.read_bytes()[:128 * KIB]
        os.truncate(path, 100 * KIB)  # a mapping of piece 1 would now be SIGBUS
        with pytest.raises(SourceChanged, match=r"512 KiB -> 100 KiB"):
            await reader.read(pieces[1])
    finally:
        reader.close()
    path.write_bytes(os.urandom(512 * KIB))
    pieces = plan_files([path], 128 * KIB)
    reader = FileReader()
    try:
        await reader.read(pieces[0])
        mtime = path.stat().st_mtime_ns
        os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
        with pytest.raises(SourceChanged, match=r"modified \(mtime changed\)"):
            reader.check_all()
    finally:
        reader.close()


async def test_the_reader_reuses_its_buffers(tmp_path: Path) -> None:
    path = tmp_path / "r.bin"
    data = os.urandom(1024 * KIB)
    path.write_bytes(data)
    pieces = plan_files([path], 128 * KIB)
    reader = FileReader()
    try:
        seen = set()
        for piece in pieces:
            buffer = await reader.read(piece)
            assert bytes(buffer) == data[piece.offset:piece.offset + piece.size]
            seen.add(buffer.__array_interface__["data"][0])  # where its memory is
            del buffer
            reader.release(piece)
        assert len(seen) == 1, "one buffer, released and read into again"
    finally:
        reader.close()
