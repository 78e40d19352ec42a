"""Files as shards: cut on the sending side, placed and renamed on the receiving side.

A file is sent as pieces of ``piece_bytes`` (one shard each), so hashing,
sending and verification overlap and the receiver never hashes a gigabyte
in one go. The receiver creates a ``DIR/.<name>.partial-XXXXXXXX`` file of
the final size and lets the data plane place every piece straight into it.
Only when every piece of a file has been verified is it renamed
(``os.replace``, atomic) to ``DIR/<name>``, so a partial file never sits
under its final name; on failure partial files are removed.

Files may be larger than memory, so neither end holds a whole file: the sender
reads each piece into a buffer of its own (``FileReader``; never a mapping, whose
pages past a truncated end would be SIGBUS), the receiver maps each piece on its
own (``MappedRange``) while it is in flight, and their pages are
dropped from the page cache once they are no longer needed (``drop_cached``):
the sender's after the receiver acknowledged the piece, the receiver's once
the piece is written back. What is resident per transfer is then bounded by
the pieces in flight (the receive budget) instead of growing with the file,
and the page cache does not fill up behind the window, pushing out what other
processes on the host use.

The partial file's blocks are reserved (``posix_fallocate``) before it is
mapped: a sparse map on a full disk would turn the native placement's write
into SIGBUS and kill the gateway. A file that does not fit is refused with
``ENOSPC`` named (``FileSink.error``); its pieces are received into scratch
memory (already within the receive budget) and reported aborted, and the
receiving loop ends the session with that reason, so the sender learns it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import mmap
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class FileError(ValueError):
    """A file the user named cannot be sent or written (one line)."""


Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def identity_of(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class SourceFile:
    """One open file being sent, with the identity it had when the send was planned.

    The descriptor is whoever opened it's (the daemon's submission, or ``FileReader``
    for a path); ``FileReader`` compares the identity before every piece it reads and
    at the end, so a file that shrinks, grows, is rewritten or replaced fails its
    transfer with the change named instead of reaching the peer half old, half new."""

    fd: int
    identity: Identity
    mode: int  # st_mode & 0o7777
    label: str  # the path, for messages

    @classmethod
    def of(cls, fd: int, label: str) -> SourceFile:
        st = os.fstat(fd)
        return cls(fd, identity_of(st), stat.S_IMODE(st.st_mode), label)

    @property
    def source_id(self) -> str:
        """Hex of the identity: pieces of another version of the file never match it."""
        return "".join(f"{part:016x}" for part in self.identity)


SOURCE_CHANGED = "source changed during the send"


class SourceChanged(FileError):
    """The file being sent changed under the send (one line naming the change)."""


def describe_change(label: str, before: Identity, now: Identity) -> str | None:
    """What changed between two identities of a source (None: nothing)."""
    if now == before:
        return None
    if now[:2] != before[:2]:
        what = "replaced (another file at that path)"
    elif now[2] != before[2]:
        what = f"{format_size(before[2])} -> {format_size(now[2])}"
    else:
        what = "modified (mtime changed)"
    return f"{SOURCE_CHANGED}: {label}: {what}"


def format_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True)
class FilePiece:
    shard_id: int
    name: str
    path: Path
    offset: int
    size: int
    file_size: int
    source: SourceFile | None = None  # already open (else ``FileReader`` opens ``path``)

    def meta(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "file_size": self.file_size}


def plan_files(paths: list[Path], piece_bytes: int) -> list[FilePiece]:
    """Pieces of every file in order; an empty file is one zero-size piece."""
    pieces: list[FilePiece] = []
    names: set[str] = set()
    for path in paths:
        if not path.is_file():
            raise FileError(f"{path}: not a readable file")
        if not os.access(path, os.R_OK):
            raise FileError(f"{path}: not readable (permission denied)")
        name = path.name
        if name in names:
            raise FileError(f"{path}: another file is also named {name!r}; names must be unique")
        names.add(name)
        size = path.stat().st_size
        for offset in range(0, max(size, 1), piece_bytes):
            pieces.append(FilePiece(len(pieces), name, path, offset, min(piece_bytes, size - offset), size))
    return pieces


class MappedRange:
    """``size`` bytes of ``path`` from ``offset``, mapped on their own (shared, so writes
    through ``array`` go to the file).

    ``evict`` takes the pages out of this process at once, whoever still holds a view
    (the data plane, a received shard on its way to the application): a shared file
    mapping loses nothing by it, a later access faults the same bytes back in. The
    virtual range itself goes with the last reference."""

    def __init__(self, path: Path, offset: int, size: int, *, writable: bool = False) -> None:
        skew = offset % mmap.ALLOCATIONGRANULARITY
        with open(path, "r+b" if writable else "rb") as fh:
            self._mm = mmap.mmap(fh.fileno(), size + skew, offset=offset - skew,
                                 access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        self.array: np.ndarray[Any, Any] = np.frombuffer(self._mm, dtype=np.uint8, count=size, offset=skew)

    def evict(self) -> None:
        self._mm.madvise(mmap.MADV_DONTNEED)


def drop_cached(fd: int, offset: int, size: int) -> None:
    """Ask the kernel to drop ``[offset, offset+size)`` of ``fd``'s file from the page cache.

    Clean pages go at once; dirty ones are only queued for write-back (so the
    receiver calls this after its data is synced). Pages still mapped somewhere
    stay. A hint: a file system that ignores it costs page cache, not correctness."""
    if size > 0:
        os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)


class FileReader:
    """The pieces of the files being sent, each read into its own buffer while in flight.

    ``read`` copies one piece with ``preadv`` into a buffer (hashed, then sent from
    it); ``release`` returns the buffer for the next piece and drops the piece's pages
    from the page cache once the receiver acknowledged it. The file is never mapped:
    a mapped page past a truncated end is SIGBUS, which would end the whole process
    and every transfer in it, while a short ``pread`` is an error for one transfer.
    Buffers are reused, so a sender that releases what was acknowledged and reads
    ahead by a bounded window holds that window of memory, whatever the file's size.
    """

    def __init__(self) -> None:
        self._sources: dict[Path, SourceFile] = {}  # by path: those given, and those opened here
        self._owned: list[int] = []  # descriptors opened here (closed by ``close``)
        self._buffers: dict[tuple[int, int], np.ndarray[Any, Any]] = {}  # (shard, offset) in flight
        self._free: list[np.ndarray[Any, Any]] = []

    def source(self, piece: FilePiece) -> SourceFile:
        """The piece's open file: the one it carries, or ``path`` opened now (as the
        user of ``wanxport send``, who named it), whose identity is then the one every
        later piece must see."""
        if piece.source is not None:
            if piece.path not in self._sources:
                self._sources[piece.path] = piece.source
                _read_piece_by_piece(piece.source.fd)
            return piece.source
        known = self._sources.get(piece.path)
        if known is not None:
            return known
        try:
            fd = os.open(piece.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise FileError(f"{piece.path}: cannot open ({describe_os_error(exc)})") from None
        self._owned.append(fd)
        opened = self._sources[piece.path] = SourceFile.of(fd, str(piece.path))
        _read_piece_by_piece(fd)
        if opened.identity[2] != piece.file_size:
            planned = (*opened.identity[:2], piece.file_size, opened.identity[3])
            raise SourceChanged(describe_change(opened.label, planned, opened.identity) or "")
        return opened

    def check(self, piece: FilePiece) -> None:
        """SourceChanged when the piece's file is no longer the one planned."""
        _check(self.source(piece))

    def check_all(self) -> None:
        """SourceChanged when any file read so far is no longer the one planned (at the
        end of a send: a change after a file's last piece was read is one too)."""
        for source in self._sources.values():
            _check(source)

    async def read(self, piece: FilePiece) -> np.ndarray[Any, Any]:
        """The piece's bytes, read now (on a worker thread: a cold disk must not stall the
        event loop), the next piece's asked for ahead; SourceChanged when the file changed
        or ends early."""
        self.check(piece)
        source = self.source(piece)
        buffer = self._buffer(piece.size)
        try:
            done = await asyncio.to_thread(_pread_into, source.fd, buffer, piece.offset)
        except BaseException:
            self._free.append(_whole(buffer))
            raise
        if done < piece.size:
            self._free.append(_whole(buffer))
            now = identity_of(os.fstat(source.fd))
            raise SourceChanged(describe_change(source.label, source.identity, now) or
                                f"{SOURCE_CHANGED}: {source.label}: it ends at "
                                f"{format_size(piece.offset + done)}, planned "
                                f"{format_size(piece.file_size)}")
        os.posix_fadvise(source.fd, piece.offset + piece.size, piece.size, os.POSIX_FADV_WILLNEED)
        self._buffers[(piece.shard_id, piece.offset)] = buffer
        return buffer

    def _buffer(self, size: int) -> np.ndarray[Any, Any]:
        for i, buffer in enumerate(self._free):
            if len(buffer) >= size:
                return self._free.pop(i)[:size]
        # Anonymous pages of our own rather than numpy's, which asks for transparent huge
        # pages: their first use cost 2.4 CPU-s per GiB here (compaction), 4 KiB pages 0.6.
        # Not populated here: that would stall the event loop; ``preadv`` faults them in on
        # its worker thread.
        return np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)

    def release(self, piece: FilePiece) -> None:
        """The piece is no longer needed: its buffer is free, its pages leave the cache."""
        buffer = self._buffers.pop((piece.shard_id, piece.offset), None)
        if buffer is not None:
            self._free.append(_whole(buffer))
        source = self._sources.get(piece.path) if piece.source is None else piece.source
        if source is not None:
            drop_cached(source.fd, piece.offset, piece.size)

    def close(self) -> None:
        for fd in self._owned:
            os.close(fd)
        self._owned.clear()
        self._sources.clear()
        self._buffers.clear()
        self._free.clear()


def _read_piece_by_piece(fd: int) -> None:
    """No read-ahead of the kernel's own: it grows to tens of MiB on a sequential reader,
    all of it cached beyond the send window; ``FileReader.read`` asks for one piece ahead."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def _pread_into(fd: int, buffer: np.ndarray[Any, Any], offset: int) -> int:
    """Fill ``buffer`` from ``offset``; the bytes read (fewer only at the file's end)."""
    view, done = memoryview(buffer), 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


def _whole(buffer: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The pool's buffer a piece's slice was cut from."""
    return buffer.base if isinstance(buffer.base, np.ndarray) else buffer


def _check(source: SourceFile) -> None:
    change = describe_change(source.label, source.identity, identity_of(os.fstat(source.fd)))
    if change is not None:
        raise SourceChanged(change)


def safe_name(name: object, shard_id: int) -> str:
    """A plain file name inside the output directory, never a path out of it."""
    if (isinstance(name, str) and name and name == os.path.basename(name) and name not in (".", "..")
            and "\0" not in name and not name.startswith(".")):
        return name
    log.warning("shard %d: file name %r is not a plain name; using shard-%d", shard_id, name, shard_id)
    return f"shard-{shard_id}"


def check_output_dir(directory: Path) -> None:
    """Fail early (one line) when files cannot be written into ``directory``."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".wanxport-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise FileError(f"--out {directory}: not writable ({exc.strerror or exc})") from None


@dataclass
class _IncomingFile:
    name: str
    size: int
    partial: Path
    fd: int | None  # the partial file, open for syncs and page-cache hints (None once closed)
    verified: int = 0
    shards: list[int] = field(default_factory=list)
    failed: bool = False
    offsets: dict[int, int] = field(default_factory=dict)  # shard id -> offset in the file
    behind: list[tuple[int, int]] = field(default_factory=list)  # verified, write-back started

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def describe_os_error(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the errno's name is what operators search for."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc} ({name})" if name else str(exc.strerror or exc)


class FileSink:
    """Receives the pieces of one session's files into partial files, then renames.

    Each finished file is counted (``written_count``, ``written_bytes``) as it lands, so
    the session's report never ``stat()``s a file the receiver may have moved or deleted
    since. ``keep_names=False`` (the daemon's warm sessions, which last for thousands of
    files) keeps no per-file list at all: ``written`` stays empty.
    """

    def __init__(self, directory: Path, *, keep_names: bool = True) -> None:
        self.directory = directory
        self.files: dict[str, _IncomingFile] = {}
        self.written: list[Path] = []
        self.written_count = 0
        self.written_bytes = 0
        self._keep_names = keep_names
        self.error: str | None = None  # the first file that could not be written, and why
        self._by_shard: dict[int, str] = {}
        self._maps: dict[int, MappedRange] = {}  # shard id -> its piece, mapped while it arrives
        self._refused: set[int] = set()  # shards of such files, received into scratch memory

    def allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        """The data plane's allocator: the piece's range of its partial file, mapped alone."""
        try:
            info = json.loads(meta)
            name = safe_name(info.get("name"), shard_id)
            offset, file_size = int(info["offset"]), int(info["file_size"])
        except (ValueError, KeyError, TypeError, AttributeError):
            name, offset, file_size = f"shard-{shard_id}", 0, size
        if not (0 <= offset and offset + size <= file_size):
            name, offset, file_size = f"shard-{shard_id}", 0, size
        incoming = self.files.get(name)
        if incoming is None or incoming.size != file_size:
            try:
                incoming = self._open(name, file_size)
            except OSError as exc:
                self.error = self.error or (f"{name}: cannot store {file_size} bytes in {self.directory}: "
                                            f"{describe_os_error(exc)}")
                log.error("%s", self.error)
                self._refused.add(shard_id)
                return np.empty(size, dtype=np.uint8)
        incoming.shards.append(shard_id)
        self._by_shard[shard_id] = name
        incoming.offsets[shard_id] = offset
        return self._map(shard_id, incoming, offset, size)

    def _map(self, shard_id: int, incoming: _IncomingFile, offset: int, size: int) -> Any:
        mapped = self._maps[shard_id] = MappedRange(incoming.partial, offset, size, writable=True)
        return mapped.array

    def _unmap(self, shard_id: int) -> None:
        """The piece arrived (verified or not): its pages leave this process now."""
        mapped = self._maps.pop(shard_id, None)
        if mapped is not None:
            mapped.evict()

    def settled(self) -> bool:
        """After ``error``: may the session end now? Here at once (its partial files are
        removed anyway); a sink that keeps them for a resume waits for pieces in flight."""
        return True

    def _open(self, name: str, size: int) -> _IncomingFile:
        partial = self.directory / f".{name}.partial-{os.urandom(4).hex()}"
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)  # every block now, or ENOSPC now (not SIGBUS later)
        except OSError:
            os.close(fd)
            partial.unlink(missing_ok=True)
            raise
        incoming = _IncomingFile(name, size, partial, fd)
        self.files[name] = incoming
        return incoming

    def _written(self, incoming: _IncomingFile, shard_id: int, size: int) -> None:
        """A verified piece: start its write-back now and drop it from the page cache
        once written (the pieces behind it, advised again one piece later)."""
        offset = incoming.offsets.pop(shard_id, None)
        if incoming.fd is None or offset is None:
            return
        for earlier in incoming.behind:
            drop_cached(incoming.fd, *earlier)
        incoming.behind = [(offset, size)]
        drop_cached(incoming.fd, offset, size)

    def on_piece(self, shard_id: int, ok: bool, size: int) -> tuple[str, list[int]] | None:
        """A piece was verified (or not). When its file is complete (or failed):
        (status, the file's shard ids) to confirm to the sender."""
        if shard_id in self._refused:
            self._refused.discard(shard_id)
            return "aborted", [shard_id]
        self._unmap(shard_id)
        name = self._by_shard.pop(shard_id, None)
        if name is None:
            return None
        incoming = self.files.get(name)
        if incoming is None:  # its file already failed
            return "integrity-failure", [shard_id]
        if not ok:
            incoming.failed = True
            self._discard(incoming)
            return "integrity-failure", incoming.shards
        incoming.verified += size
        self._written(incoming, shard_id, size)
        if incoming.verified < incoming.size:
            return None
        self._finish(incoming)
        return "verified", incoming.shards

    def write_empty(self, name: str, shard_id: int) -> None:
        incoming = self._open(safe_name(name, shard_id), 0)
        incoming.shards.append(shard_id)
        self._finish(incoming)

    def _finish(self, incoming: _IncomingFile) -> None:
        if incoming.fd is not None:
            os.fsync(incoming.fd)  # the pieces' mapped pages, written before the rename
            drop_cached(incoming.fd, 0, incoming.size)
            incoming.close()
        final = self.directory / incoming.name
        os.replace(incoming.partial, final)
        del self.files[incoming.name]
        self.written_count += 1
        self.written_bytes += incoming.size
        if self._keep_names:
            self.written.append(final)
        log.info("received %s (%d bytes)", final, incoming.size)

    def _discard(self, incoming: _IncomingFile) -> None:
        incoming.close()
        incoming.partial.unlink(missing_ok=True)
        self.files.pop(incoming.name, None)

    def discard_partials(self) -> None:
        """Remove every file that did not complete (session failed or ended early)."""
        for incoming in list(self.files.values()):
            self._discard(incoming)
