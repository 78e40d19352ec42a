"""CPU seconds per thread role: where a session's CPU goes, per end of a transfer or per rank.

A session's CPU is spread over threads with different jobs, and a per-process
total cannot tell a slow interpreter from a slow pacer. So each thread is
given a role and read on its own clock:

- ``loop``: the thread running the event loop (the core, the control channel,
  the inline data path); it runs inside ``thread_role("loop")``.
- ``release``: the threads that seal and release datagrams (the C pacer's
  release threads, named ``wx-release`` at their creation; data-path workers'
  send threads).
- ``receive``: threads that drain sockets and open and place datagrams (data-path
  workers' receive threads; a native receive thread named ``wx-receive``).
- ``digest``: the CPU spent hashing shards (``hashing()``), whichever thread ran it;
  it is taken out of that thread's own role.
- ``other``: every other thread, threads that ended during the interval, and
  whatever the process did besides (the process's own CPU clock minus the above).

Each live thread's CPU is read from its own CPU clock (the kernel's per-thread
clock for its id, the one ``pthread_getcpuclockid`` names), so the roles of
one interval add up to the process's CPU over it. Reading costs one system call
per thread plus one small file per thread without a claimed role: cheap enough
per step or per transfer, not per packet.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

ROLES = ("loop", "release", "receive", "digest", "other")
#: OS thread names (``/proc/self/task/TID/comm``) that say a native thread's role.
NAME_PREFIXES = (("wx-release", "release"), ("wx-receive", "receive"), ("wx-loop", "loop"),
                 ("wx-digest", "digest"))

_claimed: dict[int, str] = {}  # native thread id -> role, for threads that said what they do
_hashing_ns: dict[int, int] = {}  # native thread id -> CPU ns it spent hashing so far


@contextlib.contextmanager
def thread_role(role: str) -> Iterator[None]:
    """The calling thread does ``role``'s work (one of ``ROLES``) inside the block; after it,
    the thread's earlier role again (an ended thread's id may be reused by another)."""
    if role not in ROLES:
        raise ValueError(f"role: unknown {role!r}; valid: {', '.join(ROLES)}")
    tid = threading.get_native_id()
    earlier = _claimed.get(tid)
    _claimed[tid] = role
    try:
        yield
    finally:
        if earlier is None:
            _claimed.pop(tid, None)
        else:
            _claimed[tid] = earlier


@contextlib.contextmanager
def hashing() -> Iterator[None]:
    """Count the CPU the calling thread spends inside the block as ``digest``."""
    start = time.thread_time_ns()
    try:
        yield
    finally:
        tid = threading.get_native_id()
        _hashing_ns[tid] = _hashing_ns.get(tid, 0) + time.thread_time_ns() - start


@dataclass(frozen=True)
class CpuSnapshot:
    """Every live thread's CPU (ns) and hashing CPU (ns), and the process's CPU (ns) read
    before and after the threads: an interval runs from one snapshot's first reading to the
    next one's last, so it holds every thread's part of it."""

    threads: Mapping[int, int]
    hashed: Mapping[int, int]
    process_first_ns: int
    process_last_ns: int


def snapshot() -> CpuSnapshot:
    """Read every thread's CPU clock now."""
    process_first_ns = time.process_time_ns()
    threads = {}
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        cpu = _thread_ns(tid)
        if cpu is not None:
            threads[tid] = cpu
    return CpuSnapshot(threads, dict(_hashing_ns), process_first_ns, time.process_time_ns())


def roles_between(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds per role over the interval from ``before`` to ``after`` (each >= 0; they
    add up to the process's CPU over the interval)."""
    ns = dict.fromkeys(ROLES, 0)
    for tid, cpu in after.threads.items():
        spent = max(0, cpu - before.threads.get(tid, 0))
        hashed = min(spent, max(0, after.hashed.get(tid, 0) - before.hashed.get(tid, 0)))
        ns[role_of(tid)] += spent - hashed
        ns["digest"] += hashed
    named = sum(ns.values())
    ns["other"] += max(0, process_ns_between(before, after) - named)
    return {role: value / 1e9 for role, value in ns.items()}


def process_ns_between(before: CpuSnapshot, after: CpuSnapshot) -> int:
    """The process's CPU (ns) over the interval, every thread's included."""
    return after.process_last_ns - before.process_first_ns


def role_of(tid: int) -> str:
    """A thread's role: the one it claimed, else the one its OS name says, else ``other``."""
    role = _claimed.get(tid)
    if role is not None:
        return role
    try:
        with open(f"/proc/self/task/{tid}/comm") as fh:
            name = fh.read().strip()
    except OSError:
        return "other"
    for prefix, named in NAME_PREFIXES:
        if name.startswith(prefix):
            return named
    return "other"


def add_roles(total: dict[str, float], part: Mapping[str, float]) -> dict[str, float]:
    """``total`` with ``part`` added role by role (for CPU summed over steps or processes)."""
    for role in ROLES:
        total[role] = total.get(role, 0.0) + part.get(role, 0.0)
    return total


def rounded(roles: Mapping[str, float], digits: int = 6) -> dict[str, float]:
    return {role: round(roles.get(role, 0.0), digits) for role in ROLES}


def cpu_s_per_gb(roles: Mapping[str, float], payload_bytes: int) -> float | None:
    """All roles' CPU per GB (1e9 bytes) of ``payload_bytes``; None with no bytes."""
    if payload_bytes <= 0:
        return None
    return round(sum(roles.values()) / payload_bytes * 1e9, 4)


class RoleMeter:
    """CPU per role accumulated over chosen intervals (``start``/``stop``, e.g. each timed step)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = dict.fromkeys(ROLES, 0.0)
        self._start: CpuSnapshot | None = None

    def start(self) -> None:
        self._start = snapshot()

    def stop(self) -> dict[str, float]:
        """Close the interval; return its roles (added to ``total``)."""
        if self._start is None:
            raise RuntimeError("RoleMeter.stop without start")
        part = roles_between(self._start, snapshot())
        self._start = None
        add_roles(self.total, part)
        return part


class RunningRoles:
    """CPU per role since this object was made, for counters that only go up (a metrics scrape).

    Each ``read`` adds the interval since the previous one, so a role never goes
    down: a thread that ends stops adding to its role, where a fresh interval
    from the start would move its past CPU to ``other``. The process's CPU before
    the object was made counts as ``other``, so the roles add up to the process's
    CPU clock (``process_cpu_seconds_total``). Safe to read from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = snapshot()
        self._total = dict.fromkeys(ROLES, 0.0)
        self._total["other"] = self._last.process_first_ns / 1e9

    def read(self) -> dict[str, float]:
        """Each role's CPU seconds so far."""
        with self._lock:
            now = snapshot()
            add_roles(self._total, roles_between(self._last, now))
            self._last = now
            return dict(self._total)


def _thread_ns(tid: int) -> int | None:
    """The thread's CPU clock (user + system, ns); None once it has ended.

    The clock id is the kernel's per-thread CPU clock for ``tid`` (what glibc's
    ``pthread_getcpuclockid`` returns for a thread of this process)."""
    try:
        return time.clock_gettime_ns(((~tid) << 3) | 6)
    except OSError:
        return None
