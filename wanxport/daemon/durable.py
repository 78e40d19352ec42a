"""Small state files that survive a kill -9 or a power cut, or are known to be lost.

A state file is JSON wrapped with its own SHA-256: ``{"sha256": ..., "body": ...}``.
Writing follows the order a crash cannot tear: write a temporary file in the same
directory, fsync it, rename it over the old one, fsync the directory (so the rename
itself is on disk). Reading checks the digest, so a truncated, zeroed or half-written
file is reported as ``StateCorrupt`` instead of being trusted; callers then rebuild
what the file described from something they can verify.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


class StateCorrupt(ValueError):
    """The state file exists but its checksum or structure is wrong."""


def _digest(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_state(path: Path, body: Any, *, dir_fd: int | None = None) -> None:
    """Replace ``path`` with ``body`` atomically and durably. With ``dir_fd``, ``path`` is a
    name in that directory, and no step follows a symlink (a received file's state)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = json.dumps({"sha256": _digest(body), "body": body}, sort_keys=True).encode()
    nofollow = os.O_NOFOLLOW if dir_fd is not None else 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if dir_fd is not None:
        os.fsync(dir_fd)
    else:
        sync_directory(path.parent)


def read_state(path: Path, *, dir_fd: int | None = None) -> Any | None:
    """The body stored in ``path`` (with ``dir_fd``: that name in it, not through a symlink);
    None when there is no file; StateCorrupt when it is damaged."""
    try:
        if dir_fd is None:
            data = path.read_bytes()
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            with open(fd, "rb") as fh:
                data = fh.read()
    except FileNotFoundError:
        return None
    try:
        wrapped = json.loads(data)
        body, digest = wrapped["body"], wrapped["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateCorrupt(f"{path}: not a state file ({len(data)} bytes, {exc})") from None
    if digest != _digest(body):
        raise StateCorrupt(f"{path}: checksum mismatch")
    return body


def remove_stale_temporaries(directory: Path) -> int:
    """Delete the temporary files a killed process left mid-write (never renamed into place,
    so nothing refers to them); returns how many."""
    removed = 0
    for path in directory.rglob(".*.tmp-*"):
        if path.is_file() and path.name.rsplit(".tmp-", 1)[1].isdigit():
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
