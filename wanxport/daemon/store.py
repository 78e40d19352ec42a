"""The transfer queue: every submission, its state, and its idempotency key, on disk.

A submission carries an idempotency key (the client's, or one made up for it): the
same key submitted again returns the transfer it made the first time, whether that
one is queued, running, done or failed, and whether the daemon restarted in between
(the key and the queue live in ``DATA_DIR/transfers.json``, written durably by
``durable.write_state`` after every change of state). The same key with different
parameters is a conflict, never a silent second transfer. On start, a transfer that
was active when the daemon stopped is queued again: the receiver keeps what it got.
A paused transfer (the peer's disk was full; the daemon retries it with backoff) is
queued again at start too: the wait it was in does not outlive the process. A
transfer whose source was a descriptor the submitter passed (``source_kind`` "fd")
cannot be queued again by itself, since no descriptor survives the process: at
start it becomes ``needs-resubmit`` (event restart_without_source), and a submission
with its key and the same parameters attaches fresh descriptors and queues it again
(event resubmit), continuing from what the receiver holds. Every change of state is
an event of ``lifecycle.py``'s table (``fire``), so an illegal one is an error, not a
silent change.

A transfer that finishes (done, failed, cancelled) moves to ``finished.FinishedArchive``
(one file each under ``DATA_DIR/finished/``, kept for a week): lookups by id and by key
still find it, while memory holds only the unfinished transfers plus the
``keep_finished`` most recent finished ones, and ``transfers.json`` only the
unfinished. So the daemon's memory and the cost of each state change stay flat
however many transfers it has finished.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .durable import StateCorrupt, read_state, write_state
from .finished import FinishedArchive
from .lifecycle import FINAL as FINAL_STATES
from .lifecycle import IllegalTransition, TransferEvent, TransferState, legal_move, next_state

log = logging.getLogger(__name__)

STATES = tuple(s.value for s in TransferState)
FINAL = tuple(s.value for s in FINAL_STATES)
KEEP_FINISHED = 100  # in memory; older finished ones are read from disk
LIST_LIMIT = 1000  # records a listing returns by default (the newest)


class SubmitConflict(ValueError):
    """The idempotency key is already used by a submission with other parameters."""


@dataclass(frozen=True)
class Submission:
    """What the client asks for; the idempotency key compares these fields."""

    peer: str
    source: str
    dest: str
    overwrite: bool = False


@dataclass
class Transfer:
    id: str
    key: str
    submission: Submission
    state: str = "queued"
    reason: str | None = None
    bytes_total: int = 0
    bytes_done: int = 0
    attempts: int = 0
    stats: dict[str, Any] | None = None  # tally.py: elapsed, goodput, bytes per path (when done)
    source_kind: str = "path"  # "fd": descriptors the submitter passed; "path": the daemon opens it
    requester: str = ""  # who submitted it (uid/pid, or the api_tcp certificate), for the logs
    follow_symlinks: bool = False  # rsync -L, for a source the daemon walks ("path")
    api_client: str | None = None  # the api_tcp certificate name whose roots apply ("path" only)
    source_ids: dict[str, str] | None = None  # file name -> source identity an attempt sent
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("submission"))
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Transfer:
        raw = dict(raw)
        submission = Submission(raw.pop("peer"), raw.pop("source"), raw.pop("dest"),
                                bool(raw.pop("overwrite")))
        return cls(submission=submission, **raw)


class TransferStore:
    """Transfers by id and by idempotency key, persisted on every change.

    ``transfers`` holds the unfinished ones and the most recent finished ones;
    ``get``/``get_by_key`` also find older finished ones in the archive.
    """

    def __init__(self, path: Path, keep_finished: int = KEEP_FINISHED,
                 archive: FinishedArchive | None = None) -> None:
        self.path = path
        self.keep_finished = keep_finished
        self.archive = archive if archive is not None else FinishedArchive(path.parent / "finished")
        self.transfers: dict[str, Transfer] = {}
        self._by_key: dict[str, str] = {}
        self._finished: dict[str, None] = {}  # ids of finished transfers in memory, oldest first
        self.on_final: Callable[[Transfer], None] | None = None  # e.g. close its source
        self._load()

    def _load(self) -> None:
        try:
            body = read_state(self.path)
        except StateCorrupt as exc:
            # The queue cannot be rebuilt from anything else: keep the damaged file for
            # the operator and start empty, loudly.
            aside = self.path.with_name(self.path.name + f".corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("transfer queue lost: %s (kept as %s)", exc, aside)
            return
        for raw in body or []:
            transfer = Transfer.from_json(raw)
            if transfer.state not in FINAL:  # the daemon stopped while it ran or waited
                event = (TransferEvent.RESTART_WITHOUT_SOURCE if transfer.source_kind == "fd"
                         else TransferEvent.RESTART)
                was = transfer.state
                transfer.state = next_state(TransferState(was), event).value
                if transfer.state == TransferState.NEEDS_RESUBMIT.value and was != transfer.state:
                    # its descriptors went with the old process
                    transfer.reason = ("the daemon restarted and the source's descriptors are gone: "
                                       "submit it again with the same idempotency key")
                    log.warning("transfer %s is needs-resubmit: %s", transfer.id, transfer.reason)
            self.transfers[transfer.id] = transfer
            self._by_key[transfer.key] = transfer.id
        finished = [t for t in self.transfers.values() if t.state in FINAL]
        for transfer in sorted(finished, key=lambda t: t.updated):
            # A crash after archiving but before the rewrite: archiving again is harmless.
            self.archive.put(transfer.to_json())
            self.transfers.pop(transfer.id)
            self._by_key.pop(transfer.key, None)
        if finished:
            self.save()
        self.archive.sweep()

    def _prune(self) -> None:
        """Drop the oldest finished transfers beyond ``keep_finished`` from memory
        (they are in the archive)."""
        while len(self._finished) > self.keep_finished:
            oldest = next(iter(self._finished))
            del self._finished[oldest]
            transfer = self.transfers.pop(oldest)
            if self._by_key.get(transfer.key) == oldest:
                del self._by_key[transfer.key]

    def save(self) -> None:
        """``transfers.json``: the unfinished transfers only (the archive has the rest)."""
        write_state(self.path, [t.to_json() for t in self.transfers.values() if t.state not in FINAL])

    def record_submission(self, submission: Submission, key: str | None) -> tuple[Transfer, bool]:
        """(the transfer, True when it is new). SubmitConflict on a reused key."""
        existing = self.get_by_key(key) if key is not None else None
        if existing is not None:
            if existing.submission != submission:
                raise SubmitConflict(f"idempotency key {key!r} was used for another submission "
                                     f"({existing.id})")
            return existing, False
        transfer_id = os.urandom(8).hex()
        transfer = Transfer(transfer_id, key or transfer_id, submission)
        self.transfers[transfer_id] = transfer
        self._by_key[transfer.key] = transfer_id
        self.save()
        return transfer, True

    def get_by_key(self, key: str) -> Transfer | None:
        transfer_id = self._by_key.get(key)
        if transfer_id is not None:
            return self.transfers[transfer_id]
        record = self.archive.get_by_key(key)
        return None if record is None else Transfer.from_json(record)

    def get(self, transfer_id: str) -> Transfer | None:
        transfer = self.transfers.get(transfer_id)
        if transfer is not None:
            return transfer
        record = self.archive.get(transfer_id)
        return None if record is None else Transfer.from_json(record)

    def fire(self, transfer: Transfer, event: TransferEvent, **changes: Any) -> Transfer:
        """Move ``transfer`` by ``event`` (IllegalTransition if its state cannot take it),
        change its other fields, and persist."""
        state = next_state(TransferState(transfer.state), event)
        return self.update(transfer, state=state.value, **changes)

    def update(self, transfer: Transfer, **changes: Any) -> Transfer:
        """Change a transfer's fields (state, reason, bytes) and persist; a new state must
        be a move of the lifecycle table (IllegalTransition otherwise)."""
        if "state" in changes and changes["state"] != transfer.state:
            if changes["state"] not in STATES:
                raise ValueError(f"state {changes['state']!r}")
            if not legal_move(TransferState(transfer.state), TransferState(changes["state"])):
                raise IllegalTransition(f"transfer {transfer.id}: {transfer.state} -> {changes['state']} "
                                        "is not a move of the lifecycle table")
        for name, value in changes.items():
            setattr(transfer, name, value)
        transfer.updated = time.time()
        self._finished.pop(transfer.id, None)
        if transfer.state in FINAL:
            if self.on_final is not None:
                self.on_final(transfer)
            self.archive.put(transfer.to_json())  # on disk before it leaves transfers.json
            self.transfers[transfer.id] = transfer  # one read back from the archive, too
            self._by_key[transfer.key] = transfer.id
            self._finished[transfer.id] = None  # the newest finished one
            self._prune()
        self.save()
        return transfer

    def history(self, limit: int = LIST_LIMIT, state: str | None = None,
                peer: str | None = None) -> list[Transfer]:
        """The newest ``limit`` transfers (unfinished ones and the archive's), oldest first,
        optionally only those in ``state`` or to ``peer``: what ``transfer list`` shows,
        across restarts."""
        def wanted(record: dict[str, Any]) -> bool:
            return (state in (None, record.get("state"))) and (peer in (None, record.get("peer")))

        found = {t.id: t for t in self.transfers.values() if wanted(t.to_json())}
        if state is None or state in FINAL:
            for record in self.archive.newest(limit, wanted):
                if record["id"] not in found:
                    found[record["id"]] = Transfer.from_json(record)
        return sorted(found.values(), key=lambda t: t.created)[-limit:]

    def queued(self) -> list[Transfer]:
        return sorted((t for t in self.transfers.values() if t.state == "queued"), key=lambda t: t.created)
