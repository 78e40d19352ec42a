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

Nothing received leaves the peer's directory: every name is reached through descriptors
opened beneath it (``gateway.beneath``), so a destination through a symlink
(``evil -> /outside``) is refused, its pieces drained into scratch memory and answered
``aborted`` with the reason (``dest evil/sub/x.bin: 'evil' is a symlink; not followed``),
which a protocol 4 sender reports as the transfer's failure. The state file, the rename
into place and every unlink work on the destination directory's descriptor too. A
finished file gets the sender's mode masked by the configured umask, the configured
group and the sender's mtime (``gateway.files.ReceivePolicy``); a symlink entry is
recreated only when its target stays inside the tree it came in.

Keys and packet numbers are never written anywhere: a resumed transfer runs in a
new session with new keys.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import stat
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wanxport.control import ResumeHave, ResumeQuery
from wanxport.core.digest import DIGEST_NAME, shard_digest_hex
from wanxport.gateway.beneath import UnsafeName, entry_kind, open_file
from wanxport.gateway.files import (
    FileSink,
    IncomingFile,
    ReceivePolicy,
    SentAttributes,
    describe_os_error,
    drop_cached,
    safe_relative,
)
from wanxport.gateway.session import GatewaySession

from .config import DEFAULT_UMASK
from .desterrors import NO_SPACE_ERRNOS, dest_error, refuses
from .durable import StateCorrupt, read_state, write_state
from .peers import CANCELLED
from .receipts import Receipts

log = logging.getLogger(__name__)

EXISTS = "exists"
STATE_RESERVE_BYTES = 1 << 20  # left free by data pieces: room for the state files


class _Exists(Exception):
    """The destination exists and the sender did not ask to overwrite it."""


@dataclass
class _Partial(IncomingFile):
    """A file being received, with the pieces already verified and recorded."""

    pieces: dict[str, list[Any]] = field(default_factory=dict)  # str(offset) -> [size, digest]
    syncing: Future[None] | None = None  # the latest record on the sync thread

    @property
    def state_name(self) -> str:
        return self.partial.name + ".state"


def partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial")


def _sync_then_record(fd: int, dir_fd: int, state: str, body: dict[str, Any],
                      ranges: list[tuple[int, int]]) -> None:
    """On the sync thread: the pieces' data (the file's mapped pages), then their record,
    then those pieces out of the page cache (clean now, so dropping them is immediate).
    ``fd`` and ``dir_fd`` are this call's own duplicates: closed here."""
    try:
        os.fsync(fd)
        write_state(Path(state), body, dir_fd=dir_fd)
        for offset, size in ranges:
            drop_cached(fd, offset, size)
    finally:
        os.close(fd)
        os.close(dir_fd)


def _reserve(fd: int, offset: int, size: int) -> None:
    """Allocate the blocks of the file's ``[offset, offset+size)`` now, or raise ENOSPC now."""
    if not size:
        return
    st = os.fstatvfs(fd)
    if st.f_bavail * st.f_frsize < size + STATE_RESERVE_BYTES:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    os.posix_fallocate(fd, offset, size)


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


def _digest_range(fd: int, offset: int, size: int) -> str | None:
    """One piece of a file on disk, then dropped from the page cache (a re-verification
    streams through the file, it does not cache it); None where the file holds fewer bytes
    there or cannot be read (the piece is then not held, and is sent again). Read with
    ``pread``, not through a mapping: a page of a mapping that cannot be read (the file
    truncated meanwhile, a hole on a full tmpfs) is a SIGBUS that ends the process, where a
    read is a short count or an error. ``fd`` is this call's own duplicate: closed here."""
    try:
        piece = bytearray(size)
        view, done = memoryview(piece), 0
        while done < size:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                return None
            done += n
        drop_cached(fd, offset, size)
        return shard_digest_hex(piece)
    except OSError as exc:
        log.warning("a piece at offset %d (%d bytes) could not be read back to verify it: %s", offset, size,
                    exc)
        return None
    finally:
        os.close(fd)


def _attributes_body(attributes: SentAttributes) -> dict[str, int]:
    return {k: v for k, v in (("mode", attributes.mode), ("mtime_ns", attributes.mtime_ns)) if v is not None}


class Inbox(FileSink):
    """One session's receiving sink, rooted at the sending peer's directory."""

    def __init__(self, directory: Path, policy: ReceivePolicy | None = None,
                 skipped: Counter[str] | None = None) -> None:
        # A warm session lands thousands of files: no per-file list (keep_names).
        super().__init__(directory, keep_names=False, policy=policy or ReceivePolicy(DEFAULT_UMASK),
                         skipped=skipped)
        # Pieces refused (received into scratch memory) -> their answer: EXISTS, or "aborted"
        # for a full disk or an unsafe destination.
        self._answers: dict[int, str] = {}
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
        # After the session ended what is kept stays as it is: a piece still in flight
        # that opened its file anew would unlink the partial and state kept for the resume.
        if self._ended:
            self.reasons[shard_id] = "the session ended"
            return self._refuse(shard_id, size, "aborted")
        try:
            info = json.loads(meta)
            name = safe_relative(info.get("name"))
            offset, file_size = int(info["offset"]), int(info["file_size"])
            overwrite = bool(info.get("overwrite", False))
            attributes = SentAttributes.of(info)
        except (ValueError, KeyError, TypeError, AttributeError):
            name = None
        if name is None or not (0 <= offset and offset + size <= file_size):
            log.warning("shard %d: bad file metadata %r; refused", shard_id, meta[:200])
            self.reasons[shard_id] = "bad file metadata (a plain relative name, offset and file_size)"
            return self._refuse(shard_id, size, "aborted")
        self.receipts.piece(name, info)
        incoming = self.files.get(name)
        try:
            if incoming is None or incoming.size != file_size:
                incoming = self._open_new(name, file_size, attributes, overwrite)
            incoming.attributes = attributes  # every piece says the same; a resumed file learns it here
            assert incoming.fd is not None
            _reserve(incoming.fd, offset, size)
        except _Exists:
            log.warning("refused %s: it exists and the sender did not ask to overwrite", name)
            return self._refuse(shard_id, size)
        except UnsafeName as exc:
            self.reasons[shard_id] = f"dest {name}: {exc}"
            log.warning("refused %s", self.reasons[shard_id])
            return self._refuse(shard_id, size, "aborted")
        except OSError as exc:
            return self._no_room(shard_id, name, offset, size, exc)
        incoming.shards.append(shard_id)
        self._by_shard[shard_id] = name
        incoming.offsets[shard_id] = offset
        return self._map(shard_id, incoming, offset, size)

    def _refuse(self, shard_id: int, size: int, status: str = EXISTS) -> Any:
        self._answers[shard_id] = status
        return np.empty(size, dtype=np.uint8)

    def _no_room(self, shard_id: int, name: str, offset: int, size: int, exc: OSError) -> Any:
        """A piece that cannot be stored: into scratch memory, reported aborted (the
        session then ends with ``error``); the pieces already kept stay for a resume."""
        self._fail_dest(name, exc, _describe_failure(name, offset, size, self.directory, exc))
        return self._refuse(shard_id, size, "aborted")

    def _fail_dest(self, name: str, exc: OSError, error: str) -> None:
        """The first destination error ends the session with its reason (``receive_files``)."""
        if self.error is None:
            self.error = error
            log.error("%s", error)
            self.receipts.failed(name, error, final=refuses(exc))

    def settled(self) -> bool:
        """No piece is still landing in a file (those that fit are kept: a resume skips them).

        Settled means recorded too: the records still being written go to disk first, so
        once the sender hears the transfer paused, a resume skips every piece kept."""
        if self._by_shard:
            return False
        for incoming in self.files.values():
            self._synced(incoming)
        return True

    def on_piece(self, shard_id: int, ok: bool, size: int) -> tuple[str, list[int]] | None:
        refused = self._answers.pop(shard_id, None)
        if refused is not None:
            return refused, [shard_id]
        name = self._by_shard.get(shard_id)
        incoming = self.files.get(name) if name is not None else None
        if ok and isinstance(incoming, _Partial) and shard_id in incoming.offsets:
            announce = self._announcement(shard_id) if self._announcement is not None else None
            if announce is not None:
                self._record(incoming, [(incoming.offsets.pop(shard_id), size, announce.digest)])
        return super().on_piece(shard_id, ok, size)

    def _written(self, incoming: IncomingFile, shard_id: int, size: int) -> None:
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
        body = {"size": incoming.size, "digest": DIGEST_NAME, "pieces": dict(incoming.pieces),
                "attributes": _attributes_body(incoming.attributes)}
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wanxport-inbox-sync")
        assert incoming.fd is not None and incoming.dir_fd is not None
        incoming.syncing = self._syncer.submit(_sync_then_record, os.dup(incoming.fd),
                                               os.dup(incoming.dir_fd), incoming.state_name, body,
                                               [(offset, size) for offset, size, _ in pieces])

    def _synced(self, incoming: IncomingFile) -> None:
        """Until the file's last state write is done (before it is renamed or removed)."""
        if isinstance(incoming, _Partial) and incoming.syncing is not None:
            try:
                incoming.syncing.result()
            except OSError as exc:
                log.warning("%s: recording a piece failed (%s); it would be sent again",
                            incoming.partial, exc)
            incoming.syncing = None

    def _open_new(self, name: str, size: int, attributes: SentAttributes, overwrite: bool) -> IncomingFile:
        """A new partial file (a stale one of the same name is replaced: the sender did
        not ask to resume it). _Exists when the destination exists and ``overwrite`` is off."""
        dir_fd, leaf = self._directory_of(name, create=True)
        try:
            if not overwrite and entry_kind(dir_fd, leaf) not in (None, "symlink"):
                raise _Exists(name)
            self._replaceable(dir_fd, leaf)
            partial = f".{leaf}.partial"
            for stale in (partial + ".state", partial):
                try:
                    os.unlink(stale, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
            return self._create(name, size, attributes, dir_fd, partial)
        except BaseException:
            os.close(dir_fd)
            raise

    def _create(self, name: str, size: int, attributes: SentAttributes, dir_fd: int,
                partial: str) -> IncomingFile:
        """The partial file, sized but not reserved: each piece reserves its own blocks."""
        fd = open_file(dir_fd, partial, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            os.ftruncate(fd, size)
        except OSError:
            os.close(fd)
            raise
        incoming = _Partial(name, size, (self.directory / name).with_name(partial), fd, dir_fd, attributes)
        self.files[name] = incoming
        return incoming

    def _open(self, name: str, size: int, attributes: SentAttributes) -> IncomingFile:
        return self._open_new(name, size, attributes, overwrite=True)

    def _finish(self, incoming: IncomingFile) -> None:
        self._synced(incoming)
        assert incoming.dir_fd is not None
        dir_fd = os.dup(incoming.dir_fd)  # the file's own is closed once it is in place
        try:
            super()._finish(incoming)
            if isinstance(incoming, _Partial):
                try:
                    os.unlink(incoming.state_name, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.receipts.landed(incoming.name, incoming.size)

    def _discard(self, incoming: IncomingFile) -> None:
        self._synced(incoming)
        if isinstance(incoming, _Partial) and incoming.dir_fd is not None:
            try:
                os.unlink(incoming.state_name, dir_fd=incoming.dir_fd)
            except FileNotFoundError:
                pass
        super()._discard(incoming)

    def discard_partials(self) -> None:
        """The session ended: keep every partial file and its state for a resume, unless
        the sender ended it to cancel its transfer (then they go)."""
        self._ended = True
        reason = self._session.end_reason if self._session is not None else None
        if self._session is not None and self._session.peer_reason == CANCELLED:
            self._remove_cancelled()
        for incoming in self.files.values():
            log.info("kept %s for a resume (%d of %d bytes verified)", incoming.partial,
                     incoming.verified, incoming.size)
            incoming.close()  # a record still queued works on its own descriptors
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

    def write_empty(self, name: str, shard_id: int, attributes: SentAttributes | None = None) -> str:
        """As ``FileSink.write_empty``, below the peer's directory with relative names."""
        attributes = attributes or SentAttributes()
        relative = safe_relative(name) or f"shard-{shard_id}"
        try:
            if attributes.symlink is not None:
                self._link(relative, attributes.symlink)
                return "verified"
            incoming = self._open(relative, 0, attributes)
        except (OSError, UnsafeName) as exc:
            return self._refuse_empty(shard_id, relative, exc)
        incoming.shards.append(shard_id)
        self._finish(incoming)
        return "verified"

    # -- resume ------------------------------------------------------------------

    async def answer(self, query: ResumeQuery) -> ResumeHave:
        """The pieces of ``query`` this gateway holds, by content (see the module doc)."""
        name = safe_relative(query.name)
        if name is None or self._ended:  # (ended: the sender asks again on its next session)
            return ResumeHave(query.query_id, [])
        batch = []
        for i, digest in enumerate(query.digest):
            offset = (query.first_piece + i) * query.piece_bytes
            batch.append((query.first_piece + i, offset, min(query.piece_bytes, query.file_size - offset),
                          digest))
        incoming = self.files.get(name)
        if incoming is None or incoming.size != query.file_size:
            try:
                dir_fd, leaf = self._directory_of(name, create=False)
            except FileNotFoundError:
                return ResumeHave(query.query_id, [])
            except (OSError, UnsafeName) as exc:
                log.warning("resume of %s: nothing held (%s)", name, exc)
                return ResumeHave(query.query_id, [])
            try:
                if incoming is None and entry_kind(dir_fd, leaf) == "file":
                    complete = await self._complete_already(dir_fd, leaf, query, batch)
                    return ResumeHave(query.query_id, complete)
                incoming = self._reopen(name, dir_fd, query.file_size)
            finally:
                os.close(dir_fd)
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
                ok = await asyncio.to_thread(_digest_range, os.dup(incoming.fd), offset, size) == digest
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

    def _reopen(self, name: str, dir_fd: int, size: int) -> IncomingFile | None:
        """The partial file a crashed session left, mapped again (None: there is none).
        The sender's mode and mtime come back from its state file."""
        partial = partial_path(self.directory / name)
        try:
            fd = open_file(dir_fd, partial.name, os.O_RDWR)
        except (FileNotFoundError, UnsafeName):
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            os.close(fd)
            return None
        incoming = _Partial(name, size, partial, fd, os.dup(dir_fd))
        try:
            body = read_state(Path(incoming.state_name), dir_fd=dir_fd)
        except (StateCorrupt, OSError):
            body = None
        if isinstance(body, dict) and isinstance(body.get("attributes"), dict):
            incoming.attributes = SentAttributes.of(body["attributes"])
        self.files[name] = incoming
        return incoming

    def _trusted_state(self, incoming: _Partial) -> dict[str, list[Any]] | None:
        """The state file's pieces, or None when it cannot be trusted (its data is
        then re-verified by hashing)."""
        try:
            body = read_state(Path(incoming.state_name), dir_fd=incoming.dir_fd)
        except StateCorrupt as exc:
            log.warning("%s; re-verifying %s by its pieces' digests", exc, incoming.partial)
            return None
        except OSError as exc:
            log.warning("%s: state file unreadable (%s); re-verifying by its pieces' digests",
                        incoming.partial, exc)
            return None
        if not isinstance(body, dict) or body.get("size") != incoming.size:
            return None
        if body.get("digest") != DIGEST_NAME:  # written by a version with another digest
            log.info("%s records another digest; re-verifying its pieces", incoming.partial)
            return None
        pieces = body.get("pieces")
        return pieces if isinstance(pieces, dict) else None

    async def _complete_already(self, dir_fd: int, leaf: str, query: ResumeQuery,
                                batch: list[tuple[int, int, int, str]]) -> list[int]:
        """A destination that exists: held only when this query covers the whole file and
        every piece matches (the receiver renamed it, the sender never heard)."""
        if query.first_piece != 0 or batch[-1][1] + batch[-1][2] != query.file_size:
            return []
        try:
            fd = open_file(dir_fd, leaf, os.O_RDONLY)
        except (OSError, UnsafeName):
            return []
        try:
            if os.fstat(fd).st_size != query.file_size:
                return []
            for _, offset, size, digest in batch:
                if await asyncio.to_thread(_digest_range, os.dup(fd), offset, size) != digest:
                    return []
        finally:
            os.close(fd)
        self.resumed_bytes += query.file_size
        return [index for index, _, _, _ in batch]
