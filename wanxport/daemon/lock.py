"""One daemon per ``data_dir``: an exclusive ``flock`` on ``DATA_DIR/lock`` for the daemon's life.

Two daemons sharing a ``data_dir`` would share its queue, its received files and its API
socket: the second one's start replaced the first one's socket and its exit deleted it,
leaving the first running with no API. The lock is taken before anything else in the
directory is touched, so the second daemon stops before it can do any of that.

``flock`` rather than a pid file alone: the kernel drops the lock when the holder dies
(even by ``kill -9``), so a stale file never blocks a restart, and no pid reuse can fool
it. The holder's pid is written into the file only so that the refusal can name it.
The file is left in place at exit: unlinking a lock file races with a daemon that has just
opened it (both would then hold a lock, on different inodes).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "lock"


class DataDirBusy(Exception):
    """Another live process holds the ``data_dir`` lock (the message names its pid)."""


class DataDirLock:
    """The held lock on ``DATA_DIR/lock``; ``release`` (or process exit) drops it."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write our pid; DataDirBusy when another process holds it,
        OSError when the file cannot be opened."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise DataDirBusy(f"data_dir: {self.path.parent} is in use by another wanxport gateway "
                              f"(pid {holder}, holding {self.path}); one daemon per data_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    """The holder's pid as it wrote it ("unknown" in the instant before it has)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else "unknown"
