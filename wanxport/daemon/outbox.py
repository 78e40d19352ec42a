"""A submission as file pieces, and one transfer over a running session.

A source is a file or a directory on this host; it arrives at the peer as ``dest``
(a relative path; for a directory, every regular file below it keeps its relative
path). It is opened when it is submitted (``wanxport.sources``: by the submitter,
whose descriptors the daemon receives, or by the daemon) and held open until the
transfer is final (``HeldSource``), so a missing or unreadable source fails at once
with the reason, and what is sent is the file that was opened, whatever is renamed
over its path meanwhile. Each piece tells the receiver whether it may overwrite an
existing destination, and carries the file's mode, mtime and source identity.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanxport.control import RESUME_BATCH, ResumeQuery
from wanxport.gateway.files import FilePiece, FileReader, SourceFile, file_pieces, safe_relative
from wanxport.gateway.session import GatewaySession, digest_hex_async
from wanxport.gateway.transfer import send_files
from wanxport.sources import OpenedSource, inside_tree

from .inbox import EXISTS
from .store import Submission

log = logging.getLogger(__name__)


class SourceError(ValueError):
    """The submission cannot be sent as given (one line, says why)."""


@dataclass(frozen=True)
class OutgoingPiece(FilePiece):
    overwrite: bool = False
    symlink: str | None = None  # a symlink entry (zero size): its relative target
    # The transfer's id and the files with data this attempt sends: the receiver's one log
    # line per transfer (``receipts.py``); a receiver that does not know them ignores them.
    transfer: str | None = None
    transfer_files: int = 0

    def meta(self) -> dict[str, Any]:
        meta = {**super().meta(), "overwrite": self.overwrite}
        if self.source is not None:
            meta.update(mode=self.source.mode, mtime_ns=self.source.identity[3],
                        source_id=self.source.source_id)
        if self.symlink is not None:
            meta["symlink"] = self.symlink
        if self.transfer is not None:
            meta.update(transfer=self.transfer, transfer_files=self.transfer_files)
        return meta


def tagged(pieces: list[OutgoingPiece], transfer: str) -> list[OutgoingPiece]:
    """``pieces`` (those an attempt sends) tagged with their transfer for the receiver."""
    files = len({p.name for p in pieces if p.size})
    return [dataclasses.replace(p, transfer=transfer, transfer_files=files) for p in pieces]


@dataclass(frozen=True)
class SourceItem:
    """One entry of a held source: an open regular file, or a symlink entry."""

    rel: str
    file: SourceFile | None
    symlink: str | None = None


@dataclass
class HeldSource:
    """A transfer's source, open from its submission until it is final: the files the
    submitter opened and passed (``kind`` "fd"), or that the daemon opened itself
    ("path"), each with the identity it had then."""

    label: str
    kind: str
    items: list[SourceItem]
    skipped: dict[str, int] = field(default_factory=dict)

    @classmethod
    def adopt(cls, opened: OpenedSource, kind: str) -> HeldSource:
        items = []
        for entry in opened.entries:
            label = f"{opened.path}/{entry.rel}" if entry.rel else opened.path
            file = SourceFile.of(entry.fd, label) if entry.fd is not None else None
            items.append(SourceItem(entry.rel, file, entry.symlink))
        return cls(opened.path, kind, items, dict(opened.skipped))

    def close(self) -> None:
        for item in self.items:
            if item.file is not None:
                os.close(item.file.fd)
        self.items = []


def outside_roots(source: HeldSource, roots: tuple[Path, ...]) -> str | None:
    """Why ``source`` may not be sent from under ``roots`` (None: it may).

    Each open file is judged by the path the kernel holds for it (``/proc/self/fd``),
    which no symlink in the name the submitter gave can bend, and by its type."""
    if not roots:
        return "no send_roots are configured, so nothing may be sent from this host"
    for item in source.items:
        if item.file is None:
            if item.symlink is None or not inside_tree(item.rel, item.symlink):
                return f"source {source.label}/{item.rel}: a symlink pointing outside the source"
            continue
        real = os.readlink(f"/proc/self/fd/{item.file.fd}")
        if not stat.S_ISREG(os.fstat(item.file.fd).st_mode):
            return f"source {item.file.label}: not a regular file"
        if not any(_under(real, root) for root in roots):
            return (f"source {item.file.label} (really {real}): not under send_roots "
                    f"({', '.join(str(r) for r in roots)})")
    return None


def _under(path: str, root: Path) -> bool:
    return os.path.commonpath([path, str(root)]) == str(root)


def default_dest(source: str) -> str:
    return Path(source).name


def plan(submission: Submission, source: HeldSource, piece_bytes: int, first_shard: int = 0
         ) -> list[OutgoingPiece]:
    """The pieces of a submission's held source, shard ids from ``first_shard``; SourceError
    if a destination name is unusable."""
    pieces: list[OutgoingPiece] = []
    for item in source.items:
        rel = item.rel
        name = safe_relative(f"{submission.dest}/{rel}" if rel else submission.dest)
        if name is None:
            shown = f"{submission.dest}/{rel}" if rel else submission.dest
            raise SourceError(f"dest {shown!r}: not a plain relative path "
                              "(no '..', no names starting with '.')")
        path = Path(f"{source.label}/{rel}" if rel else source.label)
        size = item.file.identity[2] if item.file is not None else 0  # a symlink entry: size 0
        pieces += file_pieces(first_shard + len(pieces), name, path, size, piece_bytes, OutgoingPiece,
                              source=item.file, overwrite=submission.overwrite, symlink=item.symlink)
    return pieces


def protocol_version(session: GatewaySession) -> int:
    """The control protocol the session negotiated (3 before sessions knew it)."""
    return int(getattr(session, "protocol_version", 3))


def sendable(session: GatewaySession, pieces: list[OutgoingPiece]) -> tuple[list[OutgoingPiece], int]:
    """(the pieces this peer can take, how many symlink entries it cannot): symlink
    entries go only to a peer of protocol 4 or later, one of 3 would write an empty file."""
    if protocol_version(session) >= 4:
        return pieces, 0
    kept = [p for p in pieces if p.symlink is None]
    return kept, len(pieces) - len(kept)


_query_ids = itertools.count(1)


async def resume(session: GatewaySession, pieces: list[OutgoingPiece], piece_bytes: int,
                 sent_ids: dict[str, str] | None = None) -> tuple[list[OutgoingPiece], int]:
    """Ask the receiver which pieces it already holds: (the pieces still to send, bytes held).

    Each piece is named by its digest, so the receiver answers by content; a file
    whose every piece is held is complete at the receiver already. Only a file whose
    source identity is the one an earlier attempt sent (``sent_ids``, by file name) is
    asked about: pieces of another version of the file are never reused, even where
    some of its bytes happen to be the same."""
    reader = FileReader()
    remaining: list[OutgoingPiece] = []
    held_bytes = 0
    try:
        for _, group in itertools.groupby(pieces, key=lambda p: p.name):
            file_pieces = list(group)
            head = file_pieces[0]
            if head.file_size == 0 or not _same_version(head, sent_ids):
                remaining += file_pieces
                continue
            digests = []
            for piece in file_pieces:  # one piece read at a time, out of the cache once hashed
                digests.append(await digest_hex_async(await reader.read(piece)))
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


def _same_version(piece: OutgoingPiece, sent_ids: dict[str, str] | None) -> bool:
    if piece.source is None or sent_ids is None:
        return True
    return sent_ids.get(piece.name) == piece.source.source_id


def source_ids(pieces: list[OutgoingPiece]) -> dict[str, str]:
    """Each file's source identity by its name at the peer (what ``resume`` keys on)."""
    return {p.name: p.source.source_id for p in pieces if p.source is not None}


async def send(session: GatewaySession, pieces: list[OutgoingPiece],
               on_report: Callable[[dict[str, Any]], None] | None = None) -> str | None:
    """Send the pieces; None when every file is verified at the peer, else the reason."""
    pieces, symlinks = sendable(session, pieces)
    if symlinks:
        log.info("%d symlink entries not sent: the peer speaks control protocol %d (symlinks "
                 "need 4)", symlinks, protocol_version(session))
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
