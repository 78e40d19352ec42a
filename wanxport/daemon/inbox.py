"""Where a daemon's received files land: ``DATA_DIR/received/<peer>/<dest>``, resumably.

The same partial-then-rename discipline as ``gateway.files.FileSink`` (a file
appears under its final name only complete and verified), with what a
long-lived gateway adds:

* a destination may be a relative path (a directory transfer), each peer writes
  into its own directory, and an existing destination is refused unless the
  sender's submission said ``overwrite`` (a refused piece is drained into scratch
  memory and answered ``exists``, so the sender learns why instead of waiting);
* partial files survive a crash of either gateway and are resumed. A file being
  received is ``.<name>.partial`` next to its destination, with
  ``.<name>.partial.state`` listing the pieces verified so far (offset, size,
  SHA-256). Durability order: a verified piece's data is synced (fsync, which
  writes the mapped pages back) before the state file that records it is written
  (``durable.write_state``: temporary file, fsync, rename, directory fsync); only
  then are the recorded pieces dropped from the page cache (the file is mapped
  piece by piece, as in ``FileSink``, so a file larger than memory passes through
  a window of the pieces in flight). After a restart the sender
  asks which pieces are held (``ResumeQuery`` with each piece's digest); a piece
  counts as held only when the intact state file records it with that digest, or,
  when the state file is missing, truncated or zeroed (its checksum fails), when
  the partial data itself hashes to the digest: re-verified, never trusted blindly.

A full disk pauses a file, it does not lose it. Each piece's blocks are reserved
(``posix_fallocate``) when the piece opens, not the whole file at once: a sparse
map would turn the native placement's write past the free space into SIGBUS, and a
whole-file reservation would refuse the file before any of it is kept. A piece
that does not fit (with ``STATE_RESERVE_BYTES`` left free, so the state file that
records the pieces already verified can still be written) is received into scratch
memory, ``error`` names ``ENOSPC`` and the session ends with that reason; the
partial file and its state stay, and the sender's retry resumes from them. Any
destination error ends the session the same way, its reason naming the file and the
errno (``desterrors.py`` says which ones the sender waits out and which fail the
transfer: a read-only or forbidden destination).

A sender that cancels a transfer ends the session with the reason ``cancelled``
(``peers.CANCELLED``); the files it was sending (the only ones open here: a peer
sends one transfer at a time) are then removed, partial data and state, instead of
kept for a resume that will not come.

Keys and packet numbers are never written anywhere: a resumed transfer runs in a
new session with new keys.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from wanxport.control import ResumeHave, ResumeQuery
from wanxport.core.digest import DIGEST_NAME, shard_digest_hex
from wanxport.gateway.files import (
    FileError,
    FileSink,
    MappedRange,
    _IncomingFile,
    describe_os_error,
    drop_cached,
)
from wanxport.gateway.session import GatewaySession

from .desterrors import NO_SPACE_ERRNOS, dest_error, refuses
from .durable import StateCorrupt, read_state, sync_directory, write_state
from .peers import CANCELLED
from .receipts import Receipts

log = logging.getLogger(__name__)

EXISTS = "exists"
STATE_RESERVE_BYTES = 1 << 20  # left free by data pieces: room for the state files


def safe_relative(name: object) -> str | None:
    """A relative POSIX path of plain components (no '..', no hidden names), or None."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return None
    parts = PurePosixPath(name).parts
    if not parts or any(p in (".", "..") or p.startswith(".") for p in parts):
        return None
    return "/".join(parts)


@dataclass
class _Partial(_IncomingFile):
    """A file being received, with the pieces already verified and recorded."""

    pieces: dict[str, list[Any]] = field(default_factory=dict)  # str(offset) -> [size, digest]
    syncing: Future[None] | None = None  # the latest record on the sync thread

    @property
    def state_path(self) -> Path:
        return self.partial.with_name(self.partial.name + ".state")


def partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial")


def _sync_then_record(partial: Path, state: Path, body: dict[str, Any],
                      ranges: list[tuple[int, int]]) -> None:
    """On the sync thread: the pieces' data (the file's mapped pages), then their record,
    then those pieces out of the page cache (clean now, so dropping them is immediate)."""
    fd = os.open(partial, os.O_RDONLY)
    try:
        os.fsync(fd)
        write_state(state, body)
        for offset, size in ranges:
            drop_cached(fd, offset, size)
    finally:
        os.close(fd)


def _reserve(partial: Path, offset: int, size: int) -> None:
    """Allocate the blocks of ``partial[offset:offset+size]`` now, or raise ENOSPC now."""
    if not size:
        return
    fd = os.open(partial, os.O_RDWR)
    try:
        st = os.fstatvfs(fd)
        if st.f_bavail * st.f_frsize < size + STATE_RESERVE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, offset, size)
    finally:
        os.close(fd)


def _describe_failure(name: str, offset: int, size: int, directory: Path, exc: OSError) -> str:
    """The reason a destination write failed, as the sender will read it (``desterrors``):
    a refusing errno says so plainly; a full disk says how much did not fit, and that the
    pieces received so far wait for the retry."""
    if refuses(exc):
        return dest_error(name, exc)
    if exc.errno in NO_SPACE_ERRNOS:
        return (f"dest {name}: no room for {size} bytes at offset {offset} in {directory}: "
                f"{describe_os_error(exc)}; the pieces received are kept for a resume")
    return f"{dest_error(name, exc)} at offset {offset}; the pieces received are kept for a resume"


def _digest_range(path: Path, offset: int, size: int) -> str:
    """One piece of a file on disk, read through its own mapping, then dropped from the
    page cache (a re-verification streams through the file, it does not cache it)."""
    digest = shard_digest_hex(MappedRange(path, offset, size).array)
    fd = os.open(path, os.O_RDONLY)
    try:
        drop_cached(fd, offset, size)
    finally:
        os.close(fd)
    return digest


class Inbox(FileSink):
    """One session's receiving sink, rooted at the sending peer's directory."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, keep_names=False)  # a warm session lands thousands of files
        self._refused: set[int] = set()
        self._no_space: set[int] = set()  # pieces a full disk refused (received into scratch)
        self._announcement: Any = None
        self.resumed_bytes = 0  # held at a resume query (not sent again)
        self.reverified_bytes = 0  # of which were hashed again because the state file was bad
        self._syncer: ThreadPoolExecutor | None = None
        self._session: GatewaySession | None = None
        self.receipts = Receipts(directory.name)  # one log line per incoming transfer

    def bind(self, session: GatewaySession) -> None:
        """Answer the session's resume queries and learn its pieces' digests."""
        self._announcement = session.announcement
        self._session = session
        session.resume_handler = self.answer

    def allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        try:
            info = json.loads(meta)
            name = safe_relative(info.get("name"))
            offset, file_size = int(info["offset"]), int(info["file_size"])
            overwrite = bool(info.get("overwrite", False))
        except (ValueError, KeyError, TypeError, AttributeError):
            name = None
        if name is None or not (0 <= offset and offset + size <= file_size):
            log.warning("shard %d: bad file metadata %r; refused", shard_id, meta[:200])
            return self._refuse(shard_id, size)
        self.receipts.piece(name, info)
        incoming = self.files.get(name)
        try:
            if incoming is None or incoming.size != file_size:
                if not overwrite and (self.directory / name).exists():
                    log.warning("refused %s: it exists and the sender did not ask to overwrite", name)
                    return self._refuse(shard_id, size)
                incoming = self._open(name, file_size)
            _reserve(incoming.partial, offset, size)
        except OSError as exc:
            return self._no_room(shard_id, name, offset, size, exc)
        incoming.shards.append(shard_id)
        self._by_shard[shard_id] = name
        incoming.offsets[shard_id] = offset
        return self._map(shard_id, incoming, offset, size)

    def _refuse(self, shard_id: int, size: int) -> Any:
        self._refused.add(shard_id)
        return np.empty(size, dtype=np.uint8)

    def _no_room(self, shard_id: int, name: str, offset: int, size: int, exc: OSError) -> Any:
        """A piece that cannot be stored: into scratch memory, reported aborted (the
        session then ends with ``error``); the pieces already kept stay for a resume."""
        self._fail_dest(name, exc, _describe_failure(name, offset, size, self.directory, exc))
        self._no_space.add(shard_id)
        return np.empty(size, dtype=np.uint8)

    def _fail_dest(self, name: str, exc: OSError, error: str) -> None:
        """The first destination error ends the session with its reason (``receive_files``)."""
        if self.error is None:
            self.error = error
            log.error("%s", error)
            self.receipts.failed(name, error, final=refuses(exc))

    def settled(self) -> bool:
        """No piece is still landing in a file (those that fit are kept: a resume skips them)."""
        return not self._by_shard

    def on_piece(self, shard_id: int, ok: bool, size: int) -> tuple[str, list[int]] | None:
        if shard_id in self._refused:
            self._refused.discard(shard_id)
            return EXISTS, [shard_id]
        if shard_id in self._no_space:
            self._no_space.discard(shard_id)
            return "aborted", [shard_id]
        name = self._by_shard.get(shard_id)
        incoming = self.files.get(name) if name is not None else None
        if ok and isinstance(incoming, _Partial) and shard_id in incoming.offsets:
            announce = self._announcement(shard_id) if self._announcement is not None else None
            if announce is not None:
                self._record(incoming, [(incoming.offsets.pop(shard_id), size, announce.digest)])
        return super().on_piece(shard_id, ok, size)

    def _written(self, incoming: _IncomingFile, shard_id: int, size: int) -> None:
        """Nothing yet: a piece leaves the page cache once its record is durable (``_record``)."""

    def _record(self, incoming: _Partial, pieces: list[tuple[int, int, str]]) -> None:
        """Make verified pieces durable: their data first, then the state naming them.

        The syncs take tens of milliseconds per piece, so they run on a worker thread
        while the event loop receives the next piece. At most one record is outstanding:
        the next one waits for it (stalling the loop, which holds back the sender's
        acknowledgements), so the data acknowledged but not recorded stays within about
        one checkpoint plus the pieces in progress, however slow the disk.
        """
        self._synced(incoming)
        for offset, size, digest in pieces:
            incoming.pieces[str(offset)] = [size, digest]
        body = {"size": incoming.size, "digest": DIGEST_NAME, "pieces": dict(incoming.pieces)}
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wanxport-inbox-sync")
        incoming.syncing = self._syncer.submit(_sync_then_record, incoming.partial, incoming.state_path, body,
                                               [(offset, size) for offset, size, _ in pieces])

    def _synced(self, incoming: _IncomingFile) -> None:
        """Until the file's last state write is done (before it is renamed or removed)."""
        if isinstance(incoming, _Partial) and incoming.syncing is not None:
            try:
                incoming.syncing.result()
            except OSError as exc:
                log.warning("%s: recording a piece failed (%s); it would be sent again",
                            incoming.partial, exc)
            incoming.syncing = None

    def _open(self, name: str, size: int) -> _IncomingFile:
        """A new partial file (a stale one of the same name is replaced: the sender did
        not ask to resume it)."""
        final = self.directory / name
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(final)
        partial.with_name(partial.name + ".state").unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, size)
        incoming = _Partial(name, size, partial, fd)
        self.files[name] = incoming
        return incoming

    def _finish(self, incoming: _IncomingFile) -> None:
        self._synced(incoming)
        super()._finish(incoming)
        if isinstance(incoming, _Partial):
            incoming.state_path.unlink(missing_ok=True)
        sync_directory((self.directory / incoming.name).parent)
        self.receipts.landed(incoming.name, incoming.size)

    def _discard(self, incoming: _IncomingFile) -> None:
        self._synced(incoming)
        super()._discard(incoming)
        if isinstance(incoming, _Partial):
            incoming.state_path.unlink(missing_ok=True)

    def discard_partials(self) -> None:
        """The session ended: keep every partial file and its state for a resume, unless
        the sender ended it to cancel its transfer (then they go)."""
        reason = self._session.end_reason if self._session is not None else None
        if self._session is not None and self._session.peer_reason == CANCELLED:
            self._remove_cancelled()
        for incoming in self.files.values():
            log.info("kept %s for a resume (%d of %d bytes verified)", incoming.partial,
                     incoming.verified, incoming.size)
            incoming.close()
        self.files.clear()
        self.receipts.ended(reason or "the session ended")
        if self._syncer is not None:
            self._syncer.shutdown(wait=False)  # queued records still complete
            self._syncer = None

    def _remove_cancelled(self) -> None:
        """The sender cancelled the transfer these files belong to: remove their partial
        data and state files (after any state write in flight, which would recreate one)."""
        for incoming in list(self.files.values()):
            self._discard(incoming)
            log.info("removed %s: the sender cancelled its transfer (%d of %d bytes were held)",
                     incoming.partial, incoming.verified, incoming.size)

    def write_empty(self, name: str, shard_id: int) -> None:
        safe = safe_relative(name) or f"shard-{shard_id}"
        try:
            incoming = self._open(safe, 0)
        except OSError as exc:
            self._fail_dest(safe, exc, _describe_failure(safe, 0, 0, self.directory, exc))
            raise FileError(self.error or str(exc)) from None
        incoming.shards.append(shard_id)
        self._finish(incoming)

    # -- resume ------------------------------------------------------------------

    async def answer(self, query: ResumeQuery) -> ResumeHave:
        """The pieces of ``query`` this gateway holds, by content (see the module doc)."""
        name = safe_relative(query.name)
        if name is None:
            return ResumeHave(query.query_id, [])
        batch = []
        for i, digest in enumerate(query.digest):
            offset = (query.first_piece + i) * query.piece_bytes
            batch.append((query.first_piece + i, offset, min(query.piece_bytes, query.file_size - offset),
                          digest))
        final = self.directory / name
        if name not in self.files and final.is_file():
            return ResumeHave(query.query_id, await self._complete_already(final, query, batch))
        incoming = self.files.get(name)
        if incoming is None or incoming.size != query.file_size:
            incoming = self._reopen(name, query.file_size)
        if not isinstance(incoming, _Partial) or incoming.fd is None:
            return ResumeHave(query.query_id, [])
        trusted = self._trusted_state(incoming)
        held: list[int] = []
        recorded: list[tuple[int, int, str]] = []
        for index, offset, size, digest in batch:
            if incoming.pieces.get(str(offset)) == [size, digest]:
                held.append(index)  # recorded earlier in this session
                continue
            if trusted is not None:
                ok = trusted.get(str(offset)) == [size, digest]
            else:
                ok = await asyncio.to_thread(_digest_range, incoming.partial, offset, size) == digest
                self.reverified_bytes += size if ok else 0
            if ok:
                held.append(index)
                recorded.append((offset, size, digest))
                incoming.verified += size
                self.resumed_bytes += size
        if recorded:
            self._record(incoming, recorded)
            if incoming.syncing is not None:
                await asyncio.wrap_future(incoming.syncing)  # answered once recorded
        if incoming.verified >= incoming.size:
            self._finish(incoming)
        return ResumeHave(query.query_id, held)

    def _reopen(self, name: str, size: int) -> _IncomingFile | None:
        """The partial file a crashed session left, mapped again (None: there is none)."""
        partial = partial_path(self.directory / name)
        try:
            if partial.stat().st_size != size:
                return None
        except FileNotFoundError:
            return None
        incoming = _Partial(name, size, partial, os.open(partial, os.O_RDWR))
        self.files[name] = incoming
        return incoming

    def _trusted_state(self, incoming: _Partial) -> dict[str, list[Any]] | None:
        """The state file's pieces, or None when it cannot be trusted (its data is
        then re-verified by hashing)."""
        try:
            body = read_state(incoming.state_path)
        except StateCorrupt as exc:
            log.warning("%s; re-verifying %s by its pieces' digests", exc, incoming.partial)
            return None
        if not isinstance(body, dict) or body.get("size") != incoming.size:
            return None
        if body.get("digest") != DIGEST_NAME:  # written by a version with another digest
            log.info("%s records another digest; re-verifying its pieces", incoming.state_path)
            return None
        pieces = body.get("pieces")
        return pieces if isinstance(pieces, dict) else None

    async def _complete_already(self, final: Path, query: ResumeQuery,
                                batch: list[tuple[int, int, int, str]]) -> list[int]:
        """A destination that exists: held only when this query covers the whole file and
        every piece matches (the receiver renamed it, the sender never heard)."""
        if query.first_piece != 0 or batch[-1][1] + batch[-1][2] != query.file_size or \
                final.stat().st_size != query.file_size:
            return []
        for _, offset, size, digest in batch:
            if await asyncio.to_thread(_digest_range, final, offset, size) != digest:
                return []
        self.resumed_bytes += query.file_size
        return [index for index, _, _, _ in batch]
