"""The transfer queue: every submission, its state, and its idempotency key, on disk.

A submission carries an idempotency key (the client's, or one made up for it): the
same key submitted again returns the transfer it made the first time, whether that
one is queued, running, done or failed, and whether the daemon restarted in between
(the key and the queue live in ``DATA_DIR/transfers.json``, written durably by
``durable.write_state`` after every change of state). The same key with different
parameters is a conflict, never a silent second transfer. On start, a transfer that
was active when the daemon stopped is queued again: the receiver keeps what it got.
A paused transfer (the peer's disk was full; the daemon retries it with backoff) is
queued again at start too: the wait it was in does not outlive the process.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .durable import StateCorrupt, read_state, write_state

log = logging.getLogger(__name__)

STATES = ("queued", "active", "paused", "done", "failed", "cancelled")
FINAL = ("done", "failed", "cancelled")
KEEP_FINISHED = 1000  # a client polls a transfer it submitted well before a thousand more finish


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
    """Transfers by id and by idempotency key, persisted on every change."""

    def __init__(self, path: Path, keep_finished: int = KEEP_FINISHED) -> None:
        self.path = path
        self.keep_finished = keep_finished
        self.transfers: dict[str, Transfer] = {}
        self._by_key: dict[str, str] = {}
        self._finished: dict[str, None] = {}  # ids of finished transfers, oldest first
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
            if transfer.state in ("active", "paused"):
                transfer.state = "queued"  # the daemon stopped while it ran or waited: run it again
            self.transfers[transfer.id] = transfer
            self._by_key[transfer.key] = transfer.id
        for transfer in sorted(self.transfers.values(), key=lambda t: t.updated):
            if transfer.state in FINAL:
                self._finished[transfer.id] = None
        self._prune()

    def _prune(self) -> None:
        """Forget the oldest finished transfers beyond ``keep_finished``."""
        while len(self._finished) > self.keep_finished:
            oldest = next(iter(self._finished))
            del self._finished[oldest]
            transfer = self.transfers.pop(oldest)
            self._by_key.pop(transfer.key, None)

    def save(self) -> None:
        write_state(self.path, [t.to_json() for t in self.transfers.values()])

    def submit(self, submission: Submission, key: str | None) -> tuple[Transfer, bool]:
        """(the transfer, True when it is new). SubmitConflict on a reused key."""
        if key is not None and key in self._by_key:
            existing = self.transfers[self._by_key[key]]
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
        return None if transfer_id is None else self.transfers[transfer_id]

    def get(self, transfer_id: str) -> Transfer | None:
        return self.transfers.get(transfer_id)

    def update(self, transfer: Transfer, **changes: Any) -> Transfer:
        """Change a transfer's fields (state, reason, bytes) and persist."""
        if "state" in changes and changes["state"] not in STATES:
            raise ValueError(f"state {changes['state']!r}")
        for name, value in changes.items():
            setattr(transfer, name, value)
        transfer.updated = time.time()
        self._finished.pop(transfer.id, None)
        if transfer.state in FINAL:
            self._finished[transfer.id] = None  # the newest finished one
            self._prune()
        self.save()
        return transfer

    def queued(self) -> list[Transfer]:
        return sorted((t for t in self.transfers.values() if t.state == "queued"), key=lambda t: t.created)
