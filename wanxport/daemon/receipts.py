"""The receiving end's log of whole transfers: one line each, not one per file.

The sender tags each piece with its transfer's id and how many files (with data) it
sends in this attempt (``OutgoingPiece.transfer``, ``transfer_files`` in the piece's
meta; a sender that does not tag is simply not summarised). As files land, the count
for their transfer grows; when it is complete the receiver logs one INFO line with the
files, bytes, seconds and rate, so an operator sees at the receiving site what arrived
without a line per file of a checkpoint directory. A transfer whose files were still
arriving when the session ended is logged once with why (the peer's cancel, a lost
session: its partial files wait for a resume), and one whose destination failed is
logged with the error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wanxport.units import format_rate, format_size

log = logging.getLogger(__name__)


@dataclass
class _Incoming:
    transfer: str
    files: int  # files with data the sender sends in this attempt
    started: float
    landed: int = 0
    bytes: int = 0
    failed: bool = False


class Receipts:
    """Incoming transfers of one session from ``peer``, by the id their pieces carry."""

    def __init__(self, peer: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.peer = peer
        self.clock = clock
        self._by_name: dict[str, _Incoming] = {}  # file being received -> its transfer
        self._open: dict[str, _Incoming] = {}

    def piece(self, name: str, meta: dict[str, Any]) -> None:
        """A piece of ``name`` opened here, with its meta (the tag, if any)."""
        transfer, files = meta.get("transfer"), meta.get("transfer_files")
        if not isinstance(transfer, str) or type(files) is not int or files < 1:
            return
        entry = self._open.get(transfer)
        if entry is None:
            entry = self._open[transfer] = _Incoming(transfer[:32], files, self.clock())
        self._by_name[name] = entry

    def landed(self, name: str, size: int) -> None:
        """``name`` is complete and in place."""
        entry = self._by_name.pop(name, None)
        if entry is None:
            return
        entry.landed += 1
        entry.bytes += size
        if entry.landed >= entry.files:
            self._open.pop(entry.transfer, None)
            elapsed = max(self.clock() - entry.started, 1e-6)
            log.info("received transfer %s from %s: %d files, %s in %.2f s (%s)", entry.transfer, self.peer,
                     entry.landed, format_size(entry.bytes), elapsed, format_rate(entry.bytes * 8 / elapsed))

    def failed(self, name: str, error: str, final: bool) -> None:
        """Writing ``name`` failed: its transfer stops here with ``error`` (``final``: the
        sender fails it; else it pauses and retries, as for a full disk)."""
        entry = self._by_name.get(name)
        if entry is not None and not entry.failed:
            entry.failed = True
            log.warning("transfer %s from %s %s here: %s", entry.transfer, self.peer,
                        "failed" if final else "paused", error)

    def ended(self, reason: str) -> None:
        """The session ended: say so for each transfer still arriving."""
        for entry in self._open.values():
            if not entry.failed:
                log.info("transfer %s from %s: %d of %d files landed when the session ended (%s)",
                         entry.transfer, self.peer, entry.landed, entry.files, reason)
        self._open.clear()
        self._by_name.clear()
