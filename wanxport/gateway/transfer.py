"""Files over a gateway session: the sending and the receiving loop, and their reports."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanxport.control import ShardAnnounce

from .files import FileError, FilePiece, FileReader, FileSink, SentAttributes, SourceChanged
from .progress import ProgressMonitor
from .report import session_report
from .session import GatewaySession, SessionFailed, digest_hex_async

log = logging.getLogger(__name__)


@dataclass
class SendResult:
    ok: bool
    report: dict[str, Any]


@dataclass
class ReceiveResult:
    ok: bool
    files: list[Path] = field(default_factory=list)  # empty when the sink keeps no names
    file_count: int = 0
    error: str | None = None
    report: dict[str, Any] = field(default_factory=dict)


class ReadWindow:
    """Bytes of the files being sent that are read (mapped, hashed) but not acknowledged yet.

    A piece is read only once its bytes fit under ``limit``, and they are released
    when the receiver acknowledged it. Without this the sender hashed every piece
    up front, so a file larger than memory was read (and cached) ahead of the
    transfer as a whole. The receiver accepts no more than its credit in flight
    anyway, so the default limit (its credit plus one piece, hashed ready for
    the next free slot) costs no throughput.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.aborted = False
        self._changed = asyncio.Event()

    async def acquire(self, size: int) -> None:
        """Until ``size`` more bytes fit (one piece always does) or the window is aborted."""
        while not self.aborted and self.used and self.used + size > self.limit:
            self._changed.clear()
            await self._changed.wait()
        self.used += size
        self.peak = max(self.peak, self.used)

    def release(self, size: int) -> None:
        self.used -= size
        self._changed.set()

    def abort(self) -> None:
        """A send failed: wake the reader, which then stops."""
        self.aborted = True
        self._changed.set()


async def send_files(session: GatewaySession, pieces: list[FilePiece], *,
                     show_progress: bool | None = None, window_bytes: int | None = None) -> SendResult:
    """Send every piece; True when the receiver confirmed every file in place.

    At most ``window_bytes`` (default: the receiver's credit plus one piece) are
    read ahead of the receiver's acknowledgements (``ReadWindow``)."""
    wall_start = time.perf_counter()
    total = sum(p.size for p in pieces)
    reader = FileReader()
    largest = max((p.size for p in pieces), default=0)
    window = ReadWindow(window_bytes or session.peer_credit_bytes + largest)
    monitor = ProgressMonitor("sending", total, session.acked_bytes,
                              origin=session.totals.started, show=show_progress)
    monitor.start()
    tasks: list[asyncio.Task[bool]] = []

    def failed(task: asyncio.Task[bool]) -> bool:
        return task.done() and not task.cancelled() and task.exception() is not None

    def note_failure(task: asyncio.Task[bool]) -> None:
        if failed(task):
            window.abort()

    def acked(piece: FilePiece) -> None:
        reader.release(piece)
        window.release(piece.size)

    try:
        for piece in pieces:
            announce_fields: dict[str, Any] = {"name": piece.name}
            if piece.size == 0:  # no data shard carries its meta: the announcement does
                entry = SentAttributes.of(piece.meta())
                announce = ShardAnnounce(piece.shard_id, 0, "0" * 64, 0, **announce_fields, mode=entry.mode,
                                         mtime_ns=entry.mtime_ns, symlink=entry.symlink)
                tasks.append(asyncio.create_task(session.announce_empty(announce)))
                continue
            await window.acquire(piece.size)
            first_failed = next((t for t in tasks if failed(t)), None)
            if first_failed is not None:
                await first_failed  # the session failed: its reason, and no further reading
            buffer = await reader.read(piece)
            digest = await digest_hex_async(buffer)
            announce = ShardAnnounce(piece.shard_id, piece.size, digest, 0, **announce_fields)
            task = asyncio.create_task(session.send_shard(piece.shard_id, buffer, announce, piece.meta(),
                                                          on_acked=functools.partial(acked, piece)))
            del buffer
            task.add_done_callback(note_failure)
            tasks.append(task)
        reader.check_all()  # every piece is read: was it all one version of each file?
        verdicts = await asyncio.gather(*tasks)
        error = None
    except SourceChanged as exc:
        log.warning("%s", exc)
        verdicts, error = [], str(exc)
    except SessionFailed as exc:
        verdicts, error = [], str(exc)
    finally:
        for task in tasks:
            task.cancel()
        await monitor.stop()
    ok = error is None and len(verdicts) == len(pieces) and all(verdicts)
    stats = session.totals
    completion = ((stats.last_ack or time.monotonic()) - stats.first_submit
                  if stats.first_submit is not None else 0.0)
    report = session_report(session, payload_bytes=total, delivered_bytes=total if ok else 0,
                            completion_s=completion, intact=ok, wall_s=time.perf_counter() - wall_start,
                            timeline=monitor.timeline, files=sorted({p.name for p in pieces}),
                            error=error)
    report["read_window"] = {"limit_bytes": window.limit, "peak_bytes": window.peak}
    reader.close()
    return SendResult(ok, report)


async def receive_files(session: GatewaySession, sink: FileSink, *,
                        show_progress: bool | None = None) -> ReceiveResult:
    """Receive until the sender says goodbye; files land in ``sink.directory``."""
    wall_start = time.perf_counter()
    monitor = ProgressMonitor("receiving", 0, lambda: session.totals.bytes_received,
                              origin=session.totals.started, show=show_progress)
    monitor.start()
    last: list[float] = []
    failures: list[str] = []

    async def data() -> None:
        while True:
            shard = await session.receive()
            last[:] = [shard.at]
            result = sink.on_piece(shard.shard_id, shard.ok, len(shard.data))
            if sink.error is not None and (result is None or result[0] != "verified"):
                # A file does not fit: end the session with the reason (no "aborted" verdict
                # first, which the sender could take as the whole answer), once the pieces
                # still landing in files are in (``settled``), so a resume keeps them.
                if sink.settled():
                    raise FileError(sink.error)
                continue
            if result is not None:
                status, shard_ids = result
                reason = sink.reasons.pop(shard.shard_id, None)
                if status != "verified":
                    failures.append(f"shard {shard.shard_id}: {reason or status}")
                for shard_id in shard_ids:
                    await session.complete(shard_id, status, reason)
            if sink.error is not None and sink.settled():
                raise FileError(sink.error)

    async def empty() -> None:
        while True:
            announce = await session.next_empty()
            status = sink.write_empty(announce.name or "", announce.shard_id,
                                      SentAttributes(announce.mode, announce.mtime_ns, announce.symlink))
            reason = sink.reasons.pop(announce.shard_id, None)
            if status != "verified":
                failures.append(f"shard {announce.shard_id}: {reason or status}")
            await session.complete(announce.shard_id, status, reason)

    tasks = [asyncio.create_task(data()), asyncio.create_task(empty())]
    error: str | None = None
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            exc = task.exception()
            if isinstance(exc, SessionFailed) and session.failure is None:
                continue  # the sender said goodbye: the normal end
            error = str(exc)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await monitor.stop()
        incomplete = [f.name for f in sink.files.values()]
        sink.discard_partials()
    if sink.error is not None:
        error = sink.error
        await session.close(error)  # the sender's transfer fails with this reason
    if incomplete and error is None:
        error = f"the session ended before {', '.join(sorted(incomplete))} arrived"
    ok = error is None and not failures
    delivered = sink.written_bytes  # counted as each file landed: it may be gone by now
    start = session.totals.started
    report = session_report(session, payload_bytes=delivered, delivered_bytes=delivered,
                            completion_s=(last[0] - start) if last else 0.0, intact=ok,
                            wall_s=time.perf_counter() - wall_start, timeline=monitor.timeline,
                            files=[p.name for p in sink.written],
                            error=error or ("; ".join(failures) if failures else None))
    return ReceiveResult(ok, list(sink.written), sink.written_count,
                         error or ("; ".join(failures) or None), report)
