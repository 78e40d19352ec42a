"""Telling a peer about transfers cancelled while no session carried them.

A transfer cancelled while it runs ends its session with the goodbye ``cancelled``,
and the receiver removes the partial files open in that session (``inbox.py``). One
cancelled while queued or paused, after an attempt that may have left partial files
at the peer, has no session to carry that goodbye: it waits here, per peer, until the
next session. Then the peer is made to open those files (a resume query names each:
the receiver opens a partial file it is asked about, whatever the digest says) and
the session ends with the goodbye, so the peer removes them. The session is redialled
for what else there is to do; the peer's own transfers on it are queued again and
resume (``peers.RETRY_REASONS``). What waits here does not outlive the process: after
a restart, such partial files stay at the peer, as they did before.
"""

from __future__ import annotations

import itertools
import logging

from wanxport.control import ResumeQuery
from wanxport.gateway.session import GatewaySession

from .peers import CANCELLED

log = logging.getLogger(__name__)

_query_ids = itertools.count(0x8000_0000)  # apart from the sending path's (outbox.py)
_NO_DIGEST = "0" * 64  # matches no piece: the query only opens the file at the peer


class UnsentCancels:
    """Cancelled transfers whose partial files a peer may hold, by peer: each as the
    files (name at the peer -> size) it sends, named when it was cancelled, while its
    source was still open."""

    def __init__(self, piece_bytes: int) -> None:
        self.piece_bytes = piece_bytes
        self._pending: dict[str, list[dict[str, int]]] = {}

    def add(self, peer: str, files: dict[str, int]) -> None:
        self._pending.setdefault(peer, []).append(files)

    def waiting(self, peer: str) -> bool:
        return bool(self._pending.get(peer))

    async def send(self, session: GatewaySession) -> bool:
        """Deliver the peer's waiting cancels over ``session`` (then closed); False when
        there were none."""
        pending = self._pending.pop(session.peer_name, [])
        if not pending:
            return False
        files: dict[str, int] = {}
        for cancelled in pending:
            files.update(cancelled)
        for name, size in files.items():
            await session.resume_query(ResumeQuery(next(_query_ids) & 0xFFFFFFFF, name, size,
                                                   self.piece_bytes, 0, [_NO_DIGEST]))
        await session.close(CANCELLED)
        log.info("told %s about %d cancelled transfers (%d files to remove)", session.peer_name,
                 len(pending), len(files))
        return True
