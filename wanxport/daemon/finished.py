"""Finished transfers on disk: one small state file each, kept for a retention time.

What an operator expects of a long-running gateway: a client can still look a
transfer up (``GET /v1/transfers/ID``) and still get the same transfer for the same
idempotency key hours after it finished, and the daemon's memory does not grow with
the number of transfers it ever finished. So a transfer that finishes is written to
``DATA_DIR/finished/ID.json`` (``durable.write_state``: checksummed, atomic) with a
key index ``DATA_DIR/finished/keys/SHA256(key)`` naming its id; the store keeps only
the most recent few in memory. Records older than ``retention_s`` (or beyond
``max_records``, oldest first) are removed by a sweep that runs at most once per
``SWEEP_EVERY_S`` of finishing transfers, and at start.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .durable import StateCorrupt, read_state, write_state

log = logging.getLogger(__name__)

RETENTION_S = 7 * 24 * 3600.0  # a week: longer than any client retries or polls
MAX_RECORDS = 100_000  # a bound on disk too (~1.5 KB each), whatever the rate
SWEEP_EVERY_S = 600.0
_ID = re.compile(r"[0-9a-f]{16}")  # store.py's ids: os.urandom(8).hex()


def _key_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class FinishedArchive:
    """Finished transfers' records by id and by idempotency key, on disk only."""

    def __init__(self, directory: Path, retention_s: float = RETENTION_S,
                 max_records: int = MAX_RECORDS) -> None:
        self.directory = directory
        self.keys = directory / "keys"
        self.retention_s = retention_s
        self.max_records = max_records
        self.keys.mkdir(parents=True, exist_ok=True)
        self._last_sweep = 0.0

    def put(self, record: dict[str, Any]) -> None:
        """Write (or rewrite) one finished transfer's record, then its key's index."""
        write_state(self.directory / f"{record['id']}.json", record)
        write_state(self.keys / _key_name(record["key"]), record["id"])
        if time.monotonic() - self._last_sweep >= SWEEP_EVERY_S:
            self.sweep()

    def get(self, transfer_id: str) -> dict[str, Any] | None:
        if not _ID.fullmatch(transfer_id):
            return None  # not an id this store made (and never a path)
        try:
            record = read_state(self.directory / f"{transfer_id}.json")
        except StateCorrupt as exc:
            log.warning("finished transfer %s unreadable: %s", transfer_id, exc)
            return None
        return record if isinstance(record, dict) else None

    def get_by_key(self, key: str) -> dict[str, Any] | None:
        try:
            transfer_id = read_state(self.keys / _key_name(key))
        except StateCorrupt as exc:
            log.warning("idempotency key index unreadable: %s", exc)
            return None
        if not isinstance(transfer_id, str):
            return None
        record = self.get(transfer_id)
        return record if record is not None and record.get("key") == key else None

    def newest(self, limit: int, match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Up to ``limit`` records that ``match``, newest first (by when they were written).

        Bounded by the archive's own bound (``max_records``): the directory is listed
        once, and records are read newest first only until ``limit`` of them match."""
        found: list[dict[str, Any]] = []
        for _, path in sorted(self._records(), reverse=True):
            if len(found) >= limit:
                break
            record = self.get(path.stem)
            if record is not None and match(record):
                found.append(record)
        return found

    def sweep(self, now: float | None = None) -> int:
        """Remove records past the retention time or beyond the bound; returns how many.

        Streams the directory: a list of every record (up to ``max_records``, a week of
        transfers) made each sweep's memory peak grow with the archive, so a warm
        daemon's resident memory rose sweep by sweep for a week. Only the records
        beyond the bound are held, the oldest ``excess`` (few: those finished since
        the last sweep)."""
        self._last_sweep = time.monotonic()
        now = time.time() if now is None else now
        removed = kept = 0
        for mtime, path in self._records():
            if now - mtime >= self.retention_s:
                self._remove(path)
                removed += 1
            else:
                kept += 1
        excess = kept - self.max_records
        if excess > 0:
            for _, path in heapq.nsmallest(excess, self._records()):
                self._remove(path)
                removed += 1
        if removed:
            log.info("removed %d finished transfer records (retention %.0f s, at most %d)",
                     removed, self.retention_s, self.max_records)
        return removed

    def _records(self) -> Iterator[tuple[float, Path]]:
        """(mtime, path) of each record, one directory entry at a time."""
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(".json") and entry.is_file():
                    try:
                        yield entry.stat().st_mtime, Path(entry.path)
                    except FileNotFoundError:
                        continue

    def _remove(self, path: Path) -> None:
        try:
            record = read_state(path)
        except StateCorrupt:
            record = None
        if isinstance(record, dict) and isinstance(record.get("key"), str):
            index = self.keys / _key_name(record["key"])
            try:
                if read_state(index) == record.get("id"):
                    index.unlink(missing_ok=True)
            except StateCorrupt:
                index.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
