"""The pacer's rings stay small in memory on a path that carries a datagram now and then.

A ring is ``capacity * slot_size`` bytes (32 MiB with the endpoint's defaults) of
``malloc``: pages become resident only when a slot on them is written. A path that
queues one datagram at a time (a receiver's acknowledgements and probes) used to
walk the whole ring, one new page per datagram, so a warm session's RssAnon grew
for hours (the one-hour soak's receiver: ~0.3 MiB a minute).
A path carrying bulk data made its ring resident streak by streak, each longer run
without the ring emptying touching pages further on: the soak's sender crept towards
the bound for hours. Such a ring is made resident whole, once, early.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wanxport.aio.native_io import Pacer
from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

ROOT = Path(__file__).resolve().parent.parent
CAPACITY, SLOT = 8192, 4096  # one slot per page: each new slot touched is a new resident page
DATAGRAMS = 3000  # 11.7 MiB of slots if each one took the next slot


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def test_one_datagram_at_a_time_reuses_the_same_slots() -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setblocking(False)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.connect(sink.getsockname())
    pacer = Pacer(1, capacity=CAPACITY, slot_size=SLOT)
    try:
        pacer.set_path(0, out)
        datagram = bytes(200)
        assert pacer.enqueue(0, datagram, stride=len(datagram)) == 1 and pacer.wait_idle(5.0)
        before = rss_anon_kib()
        received = 0
        for _ in range(DATAGRAMS):
            assert pacer.enqueue(0, datagram, stride=len(datagram)) == 1
            assert pacer.wait_idle(5.0)
            try:
                while True:
                    sink.recv(2048)
                    received += 1
            except BlockingIOError:
                pass
        grown = rss_anon_kib() - before
    finally:
        pacer.close()
        out.close()
        sink.close()
    assert received > 0 and pacer.closed
    assert grown < 2048, f"RssAnon grew {grown} KiB over {DATAGRAMS} single datagrams"


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


# In a fresh process: in a long-lived one (the test suite) glibc may hand the ring a
# chunk an earlier test freed, already resident, and the step would not show.
SCRIPT_PREAMBLE = """
import socket
from pathlib import Path
from wanxport.aio.native_io import Pacer

def rss_anon_kib():
    return next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines()
                if l.startswith("RssAnon:"))

sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sink.bind(("127.0.0.1", 0))
sink.settimeout(5.0)
out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
out.connect(sink.getsockname())
"""


def run_fresh(script: str) -> list[int]:
    """Run a measurement after SCRIPT_PREAMBLE in a fresh interpreter; the integers it prints."""
    source = (SCRIPT_PREAMBLE + script).replace("CAPACITY", str(CAPACITY)).replace("SLOT", str(SLOT))
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return [int(x) for x in proc.stdout.split()]


BULK_RING = """
pacer = Pacer(1, capacity=CAPACITY, slot_size=SLOT)
pacer.set_path(0, out)
pacer.set_rate(0, 10e6)  # 200-byte datagrams queue up: each burst is one streak
datagram = bytes(200)
before = rss_anon_kib()
assert pacer.enqueue(0, datagram * 100, stride=len(datagram)) == 100 and pacer.wait_idle(5.0)
stepped = rss_anon_kib() - before
for streak in (500, 1000, 2000):
    assert pacer.enqueue(0, datagram * streak, stride=len(datagram)) == streak
    assert pacer.wait_idle(10.0)
print(stepped, rss_anon_kib() - before - stepped)
pacer.close()
"""


@pytest.mark.skipif(not _kernel_at_least(5, 14), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_a_bulk_path_makes_its_ring_resident_once_then_stays_flat() -> None:
    """A streak of queued datagrams takes the ring to its bound in one step; longer
    streaks later touch nothing new (before, each record streak added pages)."""
    stepped, later = run_fresh(BULK_RING)
    ring_kib = CAPACITY * SLOT // 1024
    assert stepped >= 0.9 * ring_kib, f"a 100-datagram streak made {stepped} of {ring_kib} KiB resident"
    assert later < 1024, f"RssAnon grew another {later} KiB over longer streaks"


WARM_RING = """
pacer = Pacer(2, capacity=CAPACITY, slot_size=SLOT)
pacer.set_path(0, out)
pacer.set_rate(0, 1e5)  # 200-byte datagrams: 2 ms apart, so most are still queued below
datagrams = [bytes([i]) * 200 for i in range(20)]
assert pacer.enqueue(0, b"".join(datagrams), stride=200) == 20
before = rss_anon_kib()
pacer.make_resident()
warmed = rss_anon_kib() - before
got = [sink.recv(2048) for _ in range(20)]
for streak in (500, 2000):  # bulk streaks afterwards touch nothing new
    assert pacer.enqueue(0, bytes(200) * streak, stride=200) == streak
pacer.set_rate(0, 0)
assert pacer.wait_idle(10.0)
print(warmed, rss_anon_kib() - before - warmed, int(got == datagrams))
pacer.close()
"""


@pytest.mark.skipif(not _kernel_at_least(5, 14), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_make_resident_faults_in_every_ring_at_once_and_keeps_queued_data() -> None:
    """What a benchmark calls before its clock starts: both paths' rings (one idle)
    become resident in one call, the datagrams queued meanwhile leave intact and in
    order, and later bulk streaks add no pages."""
    warmed, later, intact = run_fresh(WARM_RING)
    ring_kib = CAPACITY * SLOT // 1024
    assert warmed >= 0.9 * 2 * ring_kib, f"make_resident made {warmed} of {2 * ring_kib} KiB resident"
    assert later < 1024, f"RssAnon grew another {later} KiB after make_resident"
    assert intact == 1
