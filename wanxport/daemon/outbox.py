"""A submission as file pieces, and one transfer over a running session.

A source is a file or a directory on this host; it arrives at the peer as ``dest``
(a relative path; for a directory, every regular file below it keeps its relative
path). Planning happens at submission time, so a missing or unreadable source
fails at once with the reason instead of being retried. Each piece tells the
receiver whether it may overwrite an existing destination.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanxport.control import RESUME_BATCH, ResumeQuery
from wanxport.gateway.files import FilePiece, FileReader
from wanxport.gateway.session import GatewaySession, digest_hex_async
from wanxport.gateway.transfer import send_files

from .inbox import EXISTS, safe_relative
from .store import Submission


class SourceError(ValueError):
    """The submission cannot be sent as given (one line, says why)."""


@dataclass(frozen=True)
class OutgoingPiece(FilePiece):
    overwrite: bool = False
    mode: int | None = None  # the source's st_mode & 0o7777 and mtime: the receiver keeps them
    mtime_ns: int | None = None
    # The transfer's id and the files with data this attempt sends: the receiver's one log
    # line per transfer (``receipts.py``); a receiver that does not know them ignores them.
    transfer: str | None = None
    transfer_files: int = 0

    def meta(self) -> dict[str, Any]:
        extra = {k: v for k, v in (("mode", self.mode), ("mtime_ns", self.mtime_ns),
                                   ("transfer", self.transfer)) if v is not None}
        if self.transfer is not None:
            extra["transfer_files"] = self.transfer_files
        return {**super().meta(), "overwrite": self.overwrite, **extra}


def tagged(pieces: list[OutgoingPiece], transfer: str) -> list[OutgoingPiece]:
    """``pieces`` (those an attempt sends) tagged with their transfer for the receiver."""
    files = len({p.name for p in pieces if p.size})
    return [dataclasses.replace(p, transfer=transfer, transfer_files=files) for p in pieces]


def default_dest(source: str) -> str:
    return Path(source).name


def _files(source: Path) -> list[tuple[Path, str]]:
    """(file, path relative to the source) for a file or every regular file under a directory."""
    if source.is_file():
        return [(source, "")]
    if not source.is_dir():
        raise SourceError(f"source {source}: does not exist or is not a file or directory")
    found: list[tuple[Path, str]] = []
    for root, dirs, names in os.walk(source):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file():
                found.append((path, path.relative_to(source).as_posix()))
    if not found:
        raise SourceError(f"source {source}: the directory holds no files")
    return found


def plan(submission: Submission, piece_bytes: int, first_shard: int = 0) -> list[OutgoingPiece]:
    """The pieces of a submission, shard ids from ``first_shard``; SourceError if unusable."""
    source = Path(submission.source)
    if not source.is_absolute():
        raise SourceError(f"source {source}: give an absolute path (the daemon has its own directory)")
    pieces: list[OutgoingPiece] = []
    for path, rel in _files(source):
        name = safe_relative(f"{submission.dest}/{rel}" if rel else submission.dest)
        if name is None:
            shown = f"{submission.dest}/{rel}" if rel else submission.dest
            raise SourceError(f"dest {shown!r}: not a plain relative path "
                              "(no '..', no names starting with '.')")
        if not os.access(path, os.R_OK):
            raise SourceError(f"source {path}: not readable (permission denied)")
        st = path.stat()
        size = st.st_size
        for offset in range(0, max(size, 1), piece_bytes):
            pieces.append(OutgoingPiece(first_shard + len(pieces), name, path, offset,
                                        min(piece_bytes, size - offset), size, submission.overwrite,
                                        st.st_mode & 0o7777, st.st_mtime_ns))
    return pieces


_query_ids = itertools.count(1)


async def resume(session: GatewaySession, pieces: list[OutgoingPiece], piece_bytes: int
                 ) -> tuple[list[OutgoingPiece], int]:
    """Ask the receiver which pieces it already holds: (the pieces still to send, bytes held).

    Each piece is named by its SHA-256, so the receiver answers by content; a file
    whose every piece is held is complete at the receiver already."""
    reader = FileReader()
    remaining: list[OutgoingPiece] = []
    held_bytes = 0
    try:
        for _, group in itertools.groupby(pieces, key=lambda p: p.name):
            file_pieces = list(group)
            if file_pieces[0].file_size == 0:
                remaining += file_pieces
                continue
            digests = []
            for piece in file_pieces:  # one piece mapped at a time, out of the cache once hashed
                digests.append(await digest_hex_async(reader.view(piece)))
                reader.release(piece)
            held: set[int] = set()
            for first in range(0, len(file_pieces), RESUME_BATCH):
                answer = await session.resume_query(ResumeQuery(
                    next(_query_ids) & 0xFFFFFFFF, file_pieces[0].name, file_pieces[0].file_size,
                    piece_bytes, first, digests[first:first + RESUME_BATCH]))
                held.update(answer.pieces)
            for index, piece in enumerate(file_pieces):
                if index in held:
                    held_bytes += piece.size
                else:
                    remaining.append(piece)
    finally:
        reader.close()
    return remaining, held_bytes


async def send(session: GatewaySession, pieces: list[OutgoingPiece],
               on_report: Callable[[dict[str, Any]], None] | None = None) -> str | None:
    """Send the pieces; None when every file is verified at the peer, else the reason."""
    if not pieces:
        return None  # the receiver held everything
    try:
        result = await send_files(session, list(pieces), show_progress=False)
        verdicts = {session.verdict(p.shard_id) for p in pieces}
        reasons = sorted({r for p in pieces if (r := session.verdict_reason(p.shard_id))})
    finally:
        session.forget(p.shard_id for p in pieces)
    if on_report is not None:
        on_report(result.report)
    if result.ok:
        return None
    if EXISTS in verdicts:
        return "the destination exists at the peer (submit with overwrite to replace it)"
    if reasons:  # the peer said why (protocol 4): "dest evil/x.bin: 'evil' is a symlink; not followed"
        return f"the peer refused: {'; '.join(reasons)}"
    return str(result.report.get("error") or "the peer did not verify every file "
               f"({', '.join(sorted(v or 'no answer' for v in verdicts))})")
