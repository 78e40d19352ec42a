"""Names below a directory, opened without following a symlink anywhere on the way.

A receiving gateway writes where a peer's piece metadata says, below its receive
directory. Checking a path string and then opening it would resolve it twice, and a
symlink put in between (``received/<peer>/evil -> /outside``, by anyone who can write
there) would carry the write out of the directory. So every step here works on file
descriptors: a destination's directory is opened component by component relative to
the receive directory's descriptor, and each file in it (the partial, its state file,
the rename into place) relative to that directory's descriptor, never by a path string
again. A symlink anywhere, a ``..`` or an absolute name is refused with the component
named (``UnsafeName``), not followed.

Where the kernel has ``openat2`` (Linux 5.6), the directory is opened in one call with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``, the kernel's own guarantee. Python has no
wrapper for it, so it is called through ``syscall(2)``; a kernel (or a seccomp filter)
without it answers ``ENOSYS``, and then each component is opened with ``O_NOFOLLOW |
O_DIRECTORY`` relative to its parent's descriptor, which gives the same guarantee one
step at a time. The walk is also how missing directories are created (``mkdir``
relative to the parent) and how a refusal learns which component was the symlink.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())  # the generic syscall table
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafeName(ValueError):
    """A destination that would leave its directory or pass through a symlink (one line)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """``openat2(dir_fd, path, how)`` through libc's ``syscall``; ``available`` turns False
    at the first ENOSYS (tests turn it off to exercise the walk)."""

    def __init__(self) -> None:
        self.available = _OPENAT2 is not None
        self._libc: ctypes.CDLL | None = None

    def __call__(self, dir_fd: int, path: str, flags: int) -> int:
        if self._libc is None:
            self._libc = ctypes.CDLL(None, use_errno=True)
            self._libc.syscall.restype = ctypes.c_long
        how = _OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        fd = self._libc.syscall(_OPENAT2, ctypes.c_int(dir_fd), os.fsencode(path), ctypes.byref(how),
                                ctypes.c_size_t(ctypes.sizeof(how)))
        if fd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOSYS:
                self.available = False
            raise OSError(code, os.strerror(code), path)
        return int(fd)


openat2 = _Openat2()


def split(name: str) -> tuple[list[str], str]:
    """``name``'s directories and its last component, every one a plain name."""
    if not name or name.startswith("/"):
        raise UnsafeName(f"{name!r} is absolute or empty; give a path relative to the receive directory")
    parts = name.split("/")
    _check_plain(parts)
    return parts[:-1], parts[-1]


def _check_plain(parts: list[str]) -> None:
    for part in parts:
        if part in ("", ".", "..") or "/" in part:
            raise UnsafeName(f"{part!r} is not a plain name; no '..', '.', '/' or empty components")
        if "\0" in part:
            raise UnsafeName(f"{part!r} holds a NUL byte")


def open_directory(root_fd: int, parts: list[str], *, create: bool) -> int:
    """A new descriptor of the directory ``parts`` below ``root_fd`` (created when missing
    and ``create``); UnsafeName names the component that is a symlink or not a directory;
    FileNotFoundError when it is missing and not ``create``."""
    _check_plain(parts)
    if not parts:
        return os.dup(root_fd)
    if openat2.available:
        try:
            return openat2(root_fd, "/".join(parts), DIR_FLAGS)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.ENOENT, errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                raise
    return _walk(root_fd, parts, create)


def _walk(root_fd: int, parts: list[str], create: bool) -> int:
    """One component at a time, each relative to its parent's descriptor, never following one."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)  # the process umask applies, as for mkdir(1)
                except FileExistsError:
                    pass  # made meanwhile (another session): opened, and checked, below
                child = _open_step(fd, part)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                _refuse(fd, part)
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_step(parent: int, part: str) -> int:
    try:
        return os.open(part, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _refuse(parent, part)
        raise


def _refuse(parent: int, part: str) -> None:
    """Raise UnsafeName saying what ``part`` is, when it is not a directory."""
    kind = entry_kind(parent, part)
    if kind == "symlink":
        raise UnsafeName(f"{part!r} is a symlink; not followed")
    if kind is not None and kind != "directory":
        raise UnsafeName(f"{part!r} is a {kind}, not a directory")


def entry_kind(dir_fd: int, name: str) -> str | None:
    """What ``name`` in ``dir_fd`` is ("file", "directory", "symlink", "special file"), without
    following it; None when there is nothing by that name."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    return "file" if stat.S_ISREG(mode) else "special file"


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """``name`` in ``dir_fd``, never through a symlink (UnsafeName says so)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeName(f"{name!r} is a symlink; not followed") from None
        raise


def link_target_inside(parts: list[str], target: str, tree_depth: int) -> bool:
    """Does a symlink in directory ``parts`` pointing at ``target`` stay inside the tree made
    of the first ``tree_depth`` components of ``parts``, resolved lexically (as the link is
    read, components by name; an absolute target never does)?"""
    if not target or target.startswith("/") or "\0" in target:
        return False
    where = list(parts)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if len(where) <= tree_depth:
                return False
            where.pop()
        else:
            where.append(part)
    return True  # the tree's own components were never popped
