"""A source (a file or a directory tree) opened for sending, without following symlinks.

Whoever opens the source decides what may be sent: ``wanxport transfer submit`` opens
it as the submitting user and passes the descriptors to the daemon (so the kernel
applied that user's permissions, not the daemon's), and the daemon opens it itself
only for a submitter whose permissions are its own. Either way the walk is the same:

* a regular file is opened ``O_RDONLY | O_NOFOLLOW`` relative to its directory's
  descriptor (``dir_fd``), so no component renamed or swapped for a symlink during
  the walk leads anywhere else;
* a symlink inside the tree is not followed: it becomes a symlink entry when its
  target is relative and stays inside the tree, else it is skipped with a counted
  reason; ``follow_symlinks`` (``rsync -L``) follows it instead, once per file
  (a loop of directory links is walked once);
* anything else (a device, a FIFO, a socket) is skipped with a counted reason.

Standard library only: the client imports it.
"""

from __future__ import annotations

import os
import posixpath
import resource
import stat
from dataclasses import dataclass, field

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO must not block
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SourceOpenError(ValueError):
    """The source cannot be opened as given (one line naming the file and why)."""


@dataclass
class SourceEntry:
    """One file of the source: ``rel`` is its path below the source ("" for a file
    source); ``fd`` an open descriptor of a regular file, or None for a symlink entry."""

    rel: str
    fd: int | None
    symlink: str | None = None


@dataclass
class OpenedSource:
    path: str
    entries: list[SourceEntry] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> how many entries

    def fds(self) -> list[int]:
        return [e.fd for e in self.entries if e.fd is not None]

    def close(self) -> None:
        for fd in self.fds():
            os.close(fd)
        self.entries.clear()

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def raise_open_file_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit (a submission holds
    one descriptor per file of its source, in the client and then in the daemon, and the
    usual soft limit is 1024); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return hard


def _error(path: str, exc: OSError) -> SourceOpenError:
    return SourceOpenError(f"source {path}: cannot open ({exc.strerror or exc})")


def open_source(path: str, *, follow_symlinks: bool = False) -> OpenedSource:
    """The source's files, open; SourceOpenError when it cannot be read as this process."""
    opened = OpenedSource(path)
    try:
        fd = os.open(path, (OPEN_FLAGS & ~os.O_NOFOLLOW) if follow_symlinks else OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the source itself is a symlink
            raise SourceOpenError(f"source {path}: is a symbolic link; name its target, or "
                                  "follow it (--follow-symlinks)") from None
        raise _error(path, exc) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.set_blocking(fd, True)
            opened.entries.append(SourceEntry("", fd))
            return opened
        if not stat.S_ISDIR(st.st_mode):
            raise SourceOpenError(f"source {path}: not a regular file or a directory")
        _walk(fd, "", opened, follow_symlinks, {(st.st_dev, st.st_ino)})
    except BaseException:
        os.close(fd)
        opened.close()
        raise
    os.close(fd)
    if not opened.entries:
        opened.close()
        raise SourceOpenError(f"source {path}: the directory holds no files"
                              + (f" ({describe_skipped(opened.skipped)})" if opened.skipped else ""))
    return opened


def describe_skipped(skipped: dict[str, int]) -> str:
    return ", ".join(f"{count} skipped: {reason}" for reason, count in sorted(skipped.items()))


def _walk(dir_fd: int, rel: str, opened: OpenedSource, follow: bool, seen: set[tuple[int, int]]) -> None:
    """Every entry of the directory open as ``dir_fd`` (at ``rel`` below the source), sorted."""
    with os.scandir(dir_fd) as scan:
        names = sorted(entry.name for entry in scan)
    for name in names:
        child = f"{rel}/{name}" if rel else name
        label = f"{opened.path}/{child}"
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if not follow:
                    _symlink_entry(dir_fd, name, child, opened)
                    continue
                st = os.stat(name, dir_fd=dir_fd)
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    opened.skip("a directory already walked (a symlink loop)")
                    continue
                sub = os.open(name, DIR_FLAGS & ~(os.O_NOFOLLOW if follow else 0), dir_fd=dir_fd)
                try:
                    _walk(sub, child, opened, follow, seen | {(st.st_dev, st.st_ino)})
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, OPEN_FLAGS & ~(os.O_NOFOLLOW if follow else 0), dir_fd=dir_fd)
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
                    os.close(fd)
                    opened.skip("not a regular file")
                    continue
                os.set_blocking(fd, True)
                opened.entries.append(SourceEntry(child, fd))
            else:
                opened.skip("not a regular file, directory or symlink")
        except FileNotFoundError:
            opened.skip("removed during the walk")
        except OSError as exc:
            raise _error(label, exc) from None


def _symlink_entry(dir_fd: int, name: str, child: str, opened: OpenedSource) -> None:
    """A symlink entry when its target stays inside the tree, else a counted skip."""
    target = os.readlink(name, dir_fd=dir_fd)
    if inside_tree(child, target):
        opened.entries.append(SourceEntry(child, None, target))
    else:
        opened.skip("a symlink pointing outside the source")


def inside_tree(link_rel: str, target: str) -> bool:
    """Does the relative symlink at ``link_rel`` (below the tree's root) point inside it?"""
    if not target or target.startswith("/") or "\0" in target:
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link_rel), target))
    return resolved != ".." and not resolved.startswith("../") and resolved != "."
