"""Where a daemon's received files land: ``DATA_DIR/received/<peer>/<dest>``.

The same partial-then-rename discipline as ``gateway.files.FileSink`` (a file
appears under its final name only complete and verified), with what a
long-lived gateway adds: a destination may be a relative path (a directory
transfer), each peer writes into its own directory, and an existing
destination is refused unless the sender's submission said ``overwrite``. A
refused piece is drained into scratch memory and answered ``exists``, so the
sender learns why instead of waiting.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from wanxport.gateway.files import FileSink, _IncomingFile

log = logging.getLogger(__name__)

EXISTS = "exists"


def safe_relative(name: object) -> str | None:
    """A relative POSIX path of plain components (no '..', no hidden names), or None."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return None
    parts = PurePosixPath(name).parts
    if not parts or any(p in (".", "..") or p.startswith(".") for p in parts):
        return None
    return "/".join(parts)


class Inbox(FileSink):
    """One session's receiving sink, rooted at the sending peer's directory."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self._refused: set[int] = set()

    def allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        try:
            info = json.loads(meta)
            name = safe_relative(info.get("name"))
            offset, file_size = int(info["offset"]), int(info["file_size"])
            overwrite = bool(info.get("overwrite", False))
        except (ValueError, KeyError, TypeError, AttributeError):
            name = None
        if name is None or not (0 <= offset and offset + size <= file_size):
            log.warning("shard %d: bad file metadata %r; refused", shard_id, meta[:200])
            return self._refuse(shard_id, size)
        incoming = self.files.get(name)
        if incoming is None or incoming.size != file_size:
            if not overwrite and (self.directory / name).exists():
                log.warning("refused %s: it exists and the sender did not ask to overwrite", name)
                return self._refuse(shard_id, size)
            incoming = self._open(name, file_size)
        incoming.shards.append(shard_id)
        self._by_shard[shard_id] = name
        assert incoming.mm is not None
        return incoming.mm[offset:offset + size]

    def _refuse(self, shard_id: int, size: int) -> Any:
        self._refused.add(shard_id)
        return np.empty(size, dtype=np.uint8)

    def on_piece(self, shard_id: int, ok: bool, size: int) -> tuple[str, list[int]] | None:
        if shard_id in self._refused:
            self._refused.discard(shard_id)
            return EXISTS, [shard_id]
        return super().on_piece(shard_id, ok, size)

    def _open(self, name: str, size: int) -> _IncomingFile:
        final = self.directory / name
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f".{final.name}.partial-{os.urandom(4).hex()}")
        mm = np.memmap(partial, dtype=np.uint8, mode="w+", shape=(size,)) if size else None
        if mm is None:
            partial.touch()
        incoming = _IncomingFile(name, size, partial, mm)
        self.files[name] = incoming
        return incoming

    def write_empty(self, name: str, shard_id: int) -> None:
        incoming = self._open(safe_relative(name) or f"shard-{shard_id}", 0)
        incoming.shards.append(shard_id)
        self._finish(incoming)
