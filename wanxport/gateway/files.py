"""Files as shards: cut on the sending side, placed and renamed on the receiving side.

A file is sent as pieces of ``piece_bytes`` (one shard each), so hashing,
sending and verification overlap and the receiver never hashes a gigabyte
in one go. The sender maps its files read-only; the receiver maps a
``DIR/.<name>.partial-XXXXXXXX`` file of the final size and lets the data
plane place every piece straight into it. Only when every piece of a file
has been verified is it renamed (``os.replace``, atomic) to ``DIR/<name>``,
so a partial file never sits under its final name; on failure partial files
are removed.

The partial file's blocks are reserved (``posix_fallocate``) before it is
mapped: a sparse map on a full disk would turn the native placement's write
into SIGBUS and kill the gateway. A file that does not fit is refused with
``ENOSPC`` named (``FileSink.error``); its pieces are received into scratch
memory (already within the receive budget) and reported aborted, and the
receiving loop ends the session with that reason, so the sender learns it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class FileError(ValueError):
    """A file the user named cannot be sent or written (one line)."""


@dataclass(frozen=True)
class FilePiece:
    shard_id: int
    name: str
    path: Path
    offset: int
    size: int
    file_size: int

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


class FileReader:
    """Read-only maps of the files being sent (no copy into Python memory)."""

    def __init__(self) -> None:
        self._maps: dict[Path, np.memmap[Any, Any]] = {}

    def view(self, piece: FilePiece) -> memoryview:
        mm = self._maps.get(piece.path)
        if mm is None:
            mm = self._maps[piece.path] = np.memmap(piece.path, dtype=np.uint8, mode="r")
        return memoryview(mm[piece.offset:piece.offset + piece.size])

    def close(self) -> None:
        self._maps.clear()


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
    mm: np.memmap[Any, Any] | None
    verified: int = 0
    shards: list[int] = field(default_factory=list)
    failed: bool = False


def describe_os_error(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the errno's name is what operators search for."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc} ({name})" if name else str(exc.strerror or exc)


class FileSink:
    """Receives the pieces of one session's files into partial files, then renames."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, _IncomingFile] = {}
        self.written: list[Path] = []
        self.error: str | None = None  # the first file that could not be written, and why
        self._by_shard: dict[int, str] = {}
        self._refused: set[int] = set()  # shards of such files, received into scratch memory

    def allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        """The data plane's allocator: the piece's slice of its file's map."""
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
        assert incoming.mm is not None
        return incoming.mm[offset:offset + size]

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
            partial.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        mm = np.memmap(partial, dtype=np.uint8, mode="r+", shape=(size,)) if size else None
        incoming = _IncomingFile(name, size, partial, mm)
        self.files[name] = incoming
        return incoming

    def on_piece(self, shard_id: int, ok: bool, size: int) -> tuple[str, list[int]] | None:
        """A piece was verified (or not). When its file is complete (or failed):
        (status, the file's shard ids) to confirm to the sender."""
        if shard_id in self._refused:
            self._refused.discard(shard_id)
            return "aborted", [shard_id]
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
        if incoming.verified < incoming.size:
            return None
        self._finish(incoming)
        return "verified", incoming.shards

    def write_empty(self, name: str, shard_id: int) -> None:
        incoming = self._open(safe_name(name, shard_id), 0)
        incoming.shards.append(shard_id)
        self._finish(incoming)

    def _finish(self, incoming: _IncomingFile) -> None:
        if incoming.mm is not None:
            incoming.mm.flush()
            incoming.mm = None
        final = self.directory / incoming.name
        os.replace(incoming.partial, final)
        del self.files[incoming.name]
        self.written.append(final)
        log.info("received %s (%d bytes)", final, incoming.size)

    def _discard(self, incoming: _IncomingFile) -> None:
        incoming.mm = None
        incoming.partial.unlink(missing_ok=True)
        self.files.pop(incoming.name, None)

    def discard_partials(self) -> None:
        """Remove every file that did not complete (session failed or ended early)."""
        for incoming in list(self.files.values()):
            self._discard(incoming)
