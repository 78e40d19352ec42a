"""CPU per thread role (``aio.threadcpu``): each role is the CPU of the threads doing it."""

from __future__ import annotations

import threading
import time

import pytest
from cpu_helpers import busy_in_role, spin

from wanxport.aio import native_io, threadcpu
from wanxport.core.digest import shard_digest
from wanxport.wire import native

BLOCK = bytes(range(256)) * 4096  # 1 MiB


def in_thread(target: object) -> None:
    thread = threading.Thread(target=target)  # type: ignore[arg-type]
    thread.start()
    thread.join()


def test_roles_are_non_negative_and_add_up_to_the_process() -> None:
    before = threadcpu.snapshot()
    spin(0.02)
    after = threadcpu.snapshot()
    roles = threadcpu.roles_between(before, after)
    assert set(roles) == set(threadcpu.ROLES)
    assert all(v >= 0 for v in roles.values())
    process_s = threadcpu.process_ns_between(before, after) / 1e9
    assert sum(roles.values()) == pytest.approx(process_s, abs=1e-6)
    assert roles["other"] >= 0.02  # this thread claimed no role


def test_a_claimed_role_gets_the_threads_cpu_and_is_given_back() -> None:
    """A thread's interval counts under the role it holds when the interval is read."""
    meter = threadcpu.RoleMeter()
    meter.start()
    with busy_in_role("receive", 0.03):
        part = meter.stop()  # the thread is alive: its clock is read under its role
    assert part["receive"] >= 0.03
    assert meter.total == part
    with threadcpu.thread_role("loop"):
        assert threadcpu.role_of(threading.get_native_id()) == "loop"
        with threadcpu.thread_role("release"):
            assert threadcpu.role_of(threading.get_native_id()) == "release"
        assert threadcpu.role_of(threading.get_native_id()) == "loop"
    assert threadcpu.role_of(threading.get_native_id()) == "other"


def test_hashing_counts_as_digest_not_as_the_threads_role() -> None:
    """A loop thread that hashes: the hashing is ``digest``, the rest stays ``loop``."""
    with threadcpu.thread_role("loop"):
        before = threadcpu.snapshot()
        started = time.thread_time()
        with threadcpu.hashing():
            for _ in range(40):
                shard_digest(BLOCK)
        hashed_s = time.thread_time() - started
        spin(0.01)
        roles = threadcpu.roles_between(before, threadcpu.snapshot())
    assert 0.9 * hashed_s <= roles["digest"] <= hashed_s
    assert roles["loop"] >= 0.01
    assert roles["loop"] < 0.01 + roles["digest"]  # the hashing is not counted twice


def test_an_ended_threads_cpu_is_other() -> None:
    """A thread gone before the interval's end can no longer be read by role: the process
    clock still holds its CPU, so it lands in ``other`` and the sum stays whole."""
    before = threadcpu.snapshot()

    def work() -> None:
        with threadcpu.thread_role("release"):
            spin(0.02)

    in_thread(work)
    roles = threadcpu.roles_between(before, threadcpu.snapshot())
    assert roles["release"] == 0.0 and roles["other"] >= 0.02


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="role: unknown 'pacer'"):
        with threadcpu.thread_role("pacer"):
            pass


def test_per_gb_and_rounding() -> None:
    roles = {"loop": 0.5, "release": 0.25, "receive": 0.0, "digest": 0.25, "other": 0.0}
    assert threadcpu.cpu_s_per_gb(roles, 2 * 10**9) == 0.5
    assert threadcpu.cpu_s_per_gb(roles, 0) is None
    assert threadcpu.rounded({"loop": 0.12345678}) == {"loop": 0.123457, "release": 0.0, "receive": 0.0,
                                                      "digest": 0.0, "other": 0.0}


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))
def test_the_pacers_release_thread_is_named_for_its_role() -> None:
    known = set(threadcpu.snapshot().threads)
    pacer = native_io.Pacer(1, burst_ns=0, spin_ns=0)
    try:
        new = set(threadcpu.snapshot().threads) - known
        assert [threadcpu.role_of(tid) for tid in new] == ["release"]
    finally:
        pacer.close()
