"""Files over a gateway session: the sending and the receiving loop, and their reports."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanxport.control import ShardAnnounce

from .files import FileError, FilePiece, FileReader, FileSink
from .progress import ProgressMonitor, acked_bytes
from .report import session_report
from .session import GatewaySession, SessionFailed, sha256_hex_async

log = logging.getLogger(__name__)


@dataclass
class SendResult:
    ok: bool
    report: dict[str, Any]


@dataclass
class ReceiveResult:
    ok: bool
    files: list[Path] = field(default_factory=list)
    error: str | None = None
    report: dict[str, Any] = field(default_factory=dict)


async def send_files(session: GatewaySession, pieces: list[FilePiece], *,
                     show_progress: bool | None = None) -> SendResult:
    """Send every piece; True when the receiver confirmed every file in place."""
    wall_start = time.perf_counter()
    total = sum(p.size for p in pieces)
    reader = FileReader()
    monitor = ProgressMonitor("sending", total, lambda: acked_bytes(session.endpoint),
                              origin=session.stats.started, show=show_progress)
    monitor.start()
    tasks: list[asyncio.Task[bool]] = []
    try:
        for piece in pieces:
            announce_fields: dict[str, Any] = {"name": piece.name}
            if piece.size == 0:
                announce = ShardAnnounce(piece.shard_id, 0, "0" * 64, 0, **announce_fields)
                tasks.append(asyncio.create_task(session.announce_empty(announce)))
                continue
            view = reader.view(piece)
            digest = await sha256_hex_async(view)
            announce = ShardAnnounce(piece.shard_id, piece.size, digest, 0, **announce_fields)
            tasks.append(asyncio.create_task(session.send_shard(piece.shard_id, view, announce,
                                                                piece.meta())))
        verdicts = await asyncio.gather(*tasks)
        error = None
    except SessionFailed as exc:
        verdicts, error = [], str(exc)
    finally:
        for task in tasks:
            task.cancel()
        await monitor.stop()
    ok = error is None and len(verdicts) == len(pieces) and all(verdicts)
    stats = session.stats
    completion = ((stats.last_ack or time.monotonic()) - stats.first_submit
                  if stats.first_submit is not None else 0.0)
    report = session_report(session, payload_bytes=total, delivered_bytes=total if ok else 0,
                            completion_s=completion, intact=ok, wall_s=time.perf_counter() - wall_start,
                            timeline=monitor.timeline, files=sorted({p.name for p in pieces}),
                            error=error)
    reader.close()
    return SendResult(ok, report)


async def receive_files(session: GatewaySession, sink: FileSink, *,
                        show_progress: bool | None = None) -> ReceiveResult:
    """Receive until the sender says goodbye; files land in ``sink.directory``."""
    wall_start = time.perf_counter()
    monitor = ProgressMonitor("receiving", 0, lambda: session.stats.bytes_received,
                              origin=session.stats.started, show=show_progress)
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
                if status != "verified":
                    failures.append(f"shard {shard.shard_id}: {status}")
                for shard_id in shard_ids:
                    await session.complete(shard_id, status)
            if sink.error is not None and sink.settled():
                raise FileError(sink.error)

    async def empty() -> None:
        while True:
            announce = await session.next_empty()
            sink.write_empty(announce.name or "", announce.shard_id)
            await session.complete(announce.shard_id, "verified")

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
    delivered = sum(p.stat().st_size for p in sink.written)
    start = session.stats.started
    report = session_report(session, payload_bytes=delivered, delivered_bytes=delivered,
                            completion_s=(last[0] - start) if last else 0.0, intact=ok,
                            wall_s=time.perf_counter() - wall_start, timeline=monitor.timeline,
                            files=[p.name for p in sink.written],
                            error=error or ("; ".join(failures) if failures else None))
    return ReceiveResult(ok, list(sink.written), error or ("; ".join(failures) or None), report)
