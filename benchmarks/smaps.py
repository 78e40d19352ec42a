"""A process's anonymous memory by mapping, from ``/proc/PID/smaps``.

RssAnon says *that* a daemon grew; the mapping says *where*, which tracemalloc cannot
for native memory: ``[heap]`` is glibc's main arena (malloc on the main thread, which
includes every Python object over 512 bytes); unnamed mappings hold pymalloc's arenas
(the small Python objects), glibc's thread arenas (malloc on worker threads: the pacer,
receive and sync threads, ``asyncio.to_thread``), large ``malloc``s (rings, numpy
buffers) and thread stacks (the kernel merges neighbours, so one mapping may hold
several); a file's private dirty pages (``.so`` data, relocations) count as anonymous too.
The per-mapping diff names the one that grew.
"""

from __future__ import annotations

from pathlib import Path


def anon_by_mapping(pid: int | str = "self", sizes: dict[str, int] | None = None) -> dict[str, int]:
    """Anonymous KiB of each mapping, keyed by "start name" (a mapping keeps its start as
    it grows, e.g. ``[heap]``); each mapping's size (KiB) goes into ``sizes`` if given."""
    out: dict[str, int] = {}
    key = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):  # a mapping's header: range perms offset dev inode [name]
            name = fields[5] if len(fields) > 5 else "anon"
            start, end = fields[0].split("-")
            key = f"{start} {name}"
            if sizes is not None:
                sizes[key] = (int(end, 16) - int(start, 16)) >> 10
        elif fields[0] == "Anonymous:":
            out[key] = out.get(key, 0) + int(fields[1])
    return out


def kind(key: str) -> str:
    """The mapping kind of an ``anon_by_mapping`` key."""
    name = key.split(" ", 1)[1]
    return name if name == "anon" or name.startswith("[") else "file " + Path(name).name


def by_kind(mappings: dict[str, int]) -> dict[str, int]:
    """``anon_by_mapping``'s KiB summed per mapping kind (see ``kind``)."""
    out: dict[str, int] = {}
    for key, kib in mappings.items():
        out[kind(key)] = out.get(kind(key), 0) + kib
    return out


def diff(before: dict[str, int], after: dict[str, int], top: int = 10) -> list[tuple[int, str]]:
    """The ``top`` largest changes (KiB, key), largest growth first; unchanged left out."""
    changes = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in before.keys() | after.keys()),
                     reverse=True)
    return [(delta, key) for delta, key in changes if delta][:top]
