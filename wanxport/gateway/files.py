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

The receiver reaches every file through descriptors opened beneath its directory
(``beneath``: no symlink followed, no ``..``), maps pieces through the partial
file's descriptor and renames relative to the directory's, so a symlink planted
in the receive directory never carries a write out of it. A finished file gets
the mode and mtime the sender gave (``SentAttributes``, protocol 4) under the
receiver's ``ReceivePolicy`` before its rename; a partial file is 0600 until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import mmap
import os
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import numpy as np

from .beneath import DIR_FLAGS, UnsafeName, entry_kind, link_target_inside, open_directory, open_file, split

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


Piece = TypeVar("Piece", bound=FilePiece)


def file_pieces(shard_id: int, name: str, path: Path, size: int, piece_bytes: int,
                kind: Callable[..., Piece], **fields: Any) -> list[Piece]:
    """The pieces of one file of ``size`` bytes, shard ids from ``shard_id``; an empty file
    is one zero-size piece. The one planner of both senders: ``kind`` and ``fields`` give
    the piece its sender's type and fields (the daemon's ``OutgoingPiece``)."""
    return [kind(shard_id + index, name, path, offset, min(piece_bytes, size - offset), size, **fields)
            for index, offset in enumerate(range(0, max(size, 1), piece_bytes))]


def plan_files(paths: list[Path], piece_bytes: int) -> list[FilePiece]:
    """Pieces of every file in order (``file_pieces``)."""
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
        pieces += file_pieces(len(pieces), name, path, path.stat().st_size, piece_bytes, FilePiece)
    return pieces


class MappedRange:
    """``size`` bytes of ``source`` (a path, or an open descriptor) from ``offset``, mapped on
    their own (shared, so writes through ``array`` go to the file).

    A receiver maps through the descriptor it opened beneath its directory (``beneath``), so
    no path is resolved again. ``evict`` takes the pages out of this process at once, whoever
    still holds a view (the data plane, a received shard on its way to the application): a
    shared file mapping loses nothing by it, a later access faults the same bytes back in.
    The virtual range itself goes with the last reference."""

    def __init__(self, source: Path | int, offset: int, size: int, *, writable: bool = False) -> None:
        skew = offset % mmap.ALLOCATIONGRANULARITY
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        if isinstance(source, int):
            self._mm = mmap.mmap(source, size + skew, offset=offset - skew, access=access)
        else:
            with open(source, "r+b" if writable else "rb") as fh:
                self._mm = mmap.mmap(fh.fileno(), size + skew, offset=offset - skew, access=access)
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
        # Private, not ``mmap``'s default of shared: a shared anonymous page lives in shmem,
        # whose first touch costs two to three times a private one's (page-cache insertion
        # and accounting on top of the zeroing) and whose unmapping removes it from that
        # cache again. Not populated here: that would stall the event loop; ``preadv``
        # faults them in on its worker thread.
        return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS),
                             dtype=np.uint8)

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


def safe_relative(name: object) -> str | None:
    """A relative POSIX path of plain components (no '..', no hidden names), or None.

    The one check of a name a peer or a submitter gives for a file it writes: the
    one-shot receiver takes plain names only (``safe_name``), the daemon relative paths."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return None
    parts = PurePosixPath(name).parts
    if not parts or any(p in (".", "..") or p.startswith(".") for p in parts):
        return None
    return "/".join(parts)


def safe_name(name: object, shard_id: int) -> str:
    """A plain file name inside the output directory, never a path out of it."""
    plain = safe_relative(name) if isinstance(name, str) and "/" not in name else None
    if plain is not None:
        return plain
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


@dataclass(frozen=True)
class ReceivePolicy:
    """What a received regular file is left with, so that the people who should read it can.

    Its permission bits are the sender's (piece meta ``mode``; 0666 from a sender that
    does not say, as a protocol 3 one) masked by ``umask``; setuid, setgid and sticky bits
    are never kept (the file belongs to the receiving gateway's user, not the sender's).
    ``group_id``: the file's group (``fchown``), else the process's own group.
    """

    umask: int = 0o022
    group_id: int | None = None

    def mode(self, sent: int | None) -> int:
        return (0o666 if sent is None else sent & 0o777) & ~self.umask


def process_umask() -> int:
    """This process's umask (reading it means setting it: set back at once)."""
    current = os.umask(0o022)
    os.umask(current)
    return current


@dataclass(frozen=True)
class SentAttributes:
    """What the sender said about a file besides its bytes (protocol 4): piece meta keys
    ``mode`` (st_mode & 0o7777), ``mtime_ns`` and, for a symlink entry, ``symlink`` (its
    target). A value of the wrong type or range is ignored, as if not sent."""

    mode: int | None = None
    mtime_ns: int | None = None
    symlink: str | None = None

    @classmethod
    def of(cls, info: dict[str, Any]) -> SentAttributes:
        mode, mtime_ns, target = info.get("mode"), info.get("mtime_ns"), info.get("symlink")
        return cls(mode if type(mode) is int and 0 <= mode <= 0o7777 else None,
                   mtime_ns if type(mtime_ns) is int and 0 <= mtime_ns < 2**63 else None,
                   target if isinstance(target, str) and target else None)


@dataclass
class IncomingFile:
    """A file being received: where its partial lies, which shards it is made of and how far
    it is verified. A sink subclasses it for what it keeps besides (the daemon's resumable
    partials)."""

    name: str  # relative to the sink's directory
    size: int
    partial: Path  # where the partial file is, for messages only: it is reached through dir_fd
    fd: int | None  # the partial file, open for syncs and page-cache hints (None once closed)
    dir_fd: int | None = None  # the directory it lands in, opened beneath the sink's (``beneath``)
    attributes: SentAttributes = field(default_factory=SentAttributes)
    verified: int = 0
    shards: list[int] = field(default_factory=list)
    failed: bool = False
    offsets: dict[int, int] = field(default_factory=dict)  # shard id -> offset in the file
    behind: list[tuple[int, int]] = field(default_factory=list)  # verified, write-back started

    @property
    def leaf(self) -> str:
        """Its final name in ``dir_fd``."""
        return self.name.rsplit("/", 1)[-1]

    def close(self) -> None:
        for fd in (self.fd, self.dir_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dir_fd = None


def describe_os_error(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the errno's name is what operators search for."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc} ({name})" if name else str(exc.strerror or exc)


SYMLINK_OUTSIDE = "symlink-outside"  # a symlink entry whose target leaves the transfer: skipped


class FileSink:
    """Receives the pieces of one session's files into partial files, then renames.

    Every file is reached through descriptors opened beneath ``directory``
    (``beneath``): a name that would pass through a symlink is refused, not followed.
    Each finished file gets its mode and mtime (``SentAttributes``, under ``policy``)
    before it is renamed into place, and is counted (``written_count``, ``written_bytes``)
    as it lands, so the session's report never ``stat()``s a file the receiver may have
    moved or deleted since. ``keep_names=False`` (the daemon's warm sessions, which last
    for thousands of files) keeps no per-file list at all: ``written`` stays empty.
    ``reasons``: why a shard was answered other than ``verified``, for the sender.
    ``skipped``: entries not recreated, by reason (``SYMLINK_OUTSIDE``).
    """

    def __init__(self, directory: Path, *, keep_names: bool = True, policy: ReceivePolicy | None = None,
                 skipped: Counter[str] | None = None) -> None:
        self.directory = directory
        self.policy = policy or ReceivePolicy(process_umask())
        self.files: dict[str, IncomingFile] = {}
        self.written: list[Path] = []
        self.written_count = 0
        self.written_bytes = 0
        self._keep_names = keep_names
        self.error: str | None = None  # the first file that could not be written, and why
        self.reasons: dict[int, str] = {}
        self.skipped: Counter[str] = Counter() if skipped is None else skipped
        self._by_shard: dict[int, str] = {}
        self._maps: dict[int, MappedRange] = {}  # shard id -> its piece, mapped while it arrives
        self._refused: set[int] = set()  # shards of such files, received into scratch memory
        # The session ended (``discard_partials``): a piece still in flight that opens now
        # is drained into scratch memory, never a file nobody will finish or remove.
        self._ended = False

    def allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        """The data plane's allocator: the piece's range of its partial file, mapped alone."""
        if self._ended:
            self._refused.add(shard_id)
            return np.empty(size, dtype=np.uint8)
        try:
            info = json.loads(meta)
            name = safe_name(info.get("name"), shard_id)
            offset, file_size = int(info["offset"]), int(info["file_size"])
            attributes = SentAttributes.of(info)
        except (ValueError, KeyError, TypeError, AttributeError):
            name, offset, file_size, attributes = f"shard-{shard_id}", 0, size, SentAttributes()
        if not (0 <= offset and offset + size <= file_size):
            name, offset, file_size = f"shard-{shard_id}", 0, size
        incoming = self.files.get(name)
        if incoming is None or incoming.size != file_size:
            try:
                incoming = self._open(name, file_size, attributes)
            except (OSError, UnsafeName) as exc:
                why = str(exc) if isinstance(exc, UnsafeName) else describe_os_error(exc)
                self.error = self.error or (f"{name}: cannot store {file_size} bytes in {self.directory}: "
                                            f"{why}")
                log.error("%s", self.error)
                self._refused.add(shard_id)
                return np.empty(size, dtype=np.uint8)
        incoming.shards.append(shard_id)
        self._by_shard[shard_id] = name
        incoming.offsets[shard_id] = offset
        return self._map(shard_id, incoming, offset, size)

    def _map(self, shard_id: int, incoming: IncomingFile, offset: int, size: int) -> Any:
        assert incoming.fd is not None
        mapped = self._maps[shard_id] = MappedRange(incoming.fd, offset, size, writable=True)
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

    def _directory_of(self, name: str, *, create: bool) -> tuple[int, str]:
        """A descriptor of the directory ``name`` lands in (opened beneath ``directory``,
        created when ``create``), and its last component. UnsafeName names the symlink."""
        parts, leaf = split(name)
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)
        root = os.open(self.directory, DIR_FLAGS)
        try:
            return open_directory(root, parts, create=create), leaf
        finally:
            os.close(root)

    def _replaceable(self, dir_fd: int, leaf: str) -> None:
        """UnsafeName unless ``leaf`` is absent or a file (a rename replaces it)."""
        kind = entry_kind(dir_fd, leaf)
        if kind == "symlink":
            raise UnsafeName(f"{leaf!r} is a symlink; not followed")
        if kind not in (None, "file"):
            raise UnsafeName(f"{leaf!r} is a {kind}; not replaced")

    def _open(self, name: str, size: int, attributes: SentAttributes) -> IncomingFile:
        dir_fd, leaf = self._directory_of(name, create=True)
        try:
            self._replaceable(dir_fd, leaf)
            partial = f".{leaf}.partial-{os.urandom(4).hex()}"
            return self._create(name, size, attributes, dir_fd, partial)
        except BaseException:
            os.close(dir_fd)
            raise

    def _create(self, name: str, size: int, attributes: SentAttributes, dir_fd: int,
                partial: str) -> IncomingFile:
        """A new partial file ``partial`` in ``dir_fd`` of ``size`` bytes, every block reserved
        now (or ENOSPC now, not SIGBUS later); 0600 until it is complete."""
        fd = open_file(dir_fd, partial, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
        except OSError:
            os.close(fd)
            os.unlink(partial, dir_fd=dir_fd)
            raise
        incoming = IncomingFile(name, size, (self.directory / name).with_name(partial), fd, dir_fd,
                                 attributes)
        self.files[name] = incoming
        return incoming

    def _written(self, incoming: IncomingFile, shard_id: int, size: int) -> None:
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

    def write_empty(self, name: str, shard_id: int, attributes: SentAttributes | None = None) -> str:
        """A zero-size entry: an empty file, or a symlink entry. The status for the sender
        (a refusal's reason in ``reasons``)."""
        attributes = attributes or SentAttributes()
        name = safe_name(name, shard_id)
        try:
            if attributes.symlink is not None:
                self._link(name, attributes.symlink)
                return "verified"
            incoming = self._open(name, 0, attributes)
        except (OSError, UnsafeName) as exc:
            return self._refuse_empty(shard_id, name, exc)
        incoming.shards.append(shard_id)
        self._finish(incoming)
        return "verified"

    def _refuse_empty(self, shard_id: int, name: str, exc: OSError | UnsafeName) -> str:
        why = str(exc) if isinstance(exc, UnsafeName) else describe_os_error(exc)
        self.reasons[shard_id] = f"dest {name}: {why}"
        log.warning("refused %s", self.reasons[shard_id])
        return "aborted"

    def _link(self, name: str, target: str) -> None:
        """Recreate a symlink entry, only when its target (read lexically from the link's
        directory) stays inside the tree it was sent in: its first directory below ours,
        or ours for a link at the top. Else skipped: counted and logged, not an error."""
        dir_fd, leaf = self._directory_of(name, create=True)
        try:
            parts = split(name)[0]
            if not link_target_inside(parts, target, min(1, len(parts))):
                self.skipped[SYMLINK_OUTSIDE] += 1
                log.warning("skipped symlink %s -> %s: its target leaves the transfer's directory",
                            name, target)
                return
            if entry_kind(dir_fd, leaf) == "directory":
                raise UnsafeName(f"{leaf!r} is a directory; not replaced")
            temporary = f".{leaf}.partial-{os.urandom(4).hex()}"
            os.symlink(target, temporary, dir_fd=dir_fd)
            os.replace(temporary, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.written_count += 1
        if self._keep_names:
            self.written.append(self.directory / name)
        log.info("received %s (a symlink to %s)", self.directory / name, target)

    def _settle(self, incoming: IncomingFile) -> None:
        """The complete partial file: its pages on disk, then its mode, group and mtime
        (last: nothing writes it afterwards)."""
        if incoming.fd is None:
            return
        os.fsync(incoming.fd)  # the pieces' mapped pages, written before the rename
        drop_cached(incoming.fd, 0, incoming.size)
        if self.policy.group_id is not None:
            os.fchown(incoming.fd, -1, self.policy.group_id)
        os.fchmod(incoming.fd, self.policy.mode(incoming.attributes.mode))
        if incoming.attributes.mtime_ns is not None:
            os.utime(incoming.fd, ns=(time.time_ns(), incoming.attributes.mtime_ns))

    def _finish(self, incoming: IncomingFile) -> None:
        self._settle(incoming)
        assert incoming.dir_fd is not None
        os.replace(incoming.partial.name, incoming.leaf, src_dir_fd=incoming.dir_fd,
                   dst_dir_fd=incoming.dir_fd)
        incoming.close()
        del self.files[incoming.name]
        self.written_count += 1
        self.written_bytes += incoming.size
        final = self.directory / incoming.name
        if self._keep_names:
            self.written.append(final)
        # A warm daemon's sessions land thousands of files: it logs whole transfers instead.
        level = logging.INFO if self._keep_names else logging.DEBUG
        log.log(level, "received %s (%d bytes)", final, incoming.size)

    def _discard(self, incoming: IncomingFile) -> None:
        if incoming.dir_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(incoming.partial.name, dir_fd=incoming.dir_fd)
        incoming.close()
        self.files.pop(incoming.name, None)

    def discard_partials(self) -> None:
        """Remove every file that did not complete (session failed or ended early)."""
        self._ended = True
        for incoming in list(self.files.values()):
            self._discard(incoming)
