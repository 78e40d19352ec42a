"""A gateway's peak memory is its own, not its parent's (the flood test's memory budget).

Linux keeps the peak RSS of the image a process replaced across ``exec`` in
``ru_maxrss``; a gateway spawned by a pytest that had grown to 1.3 GB once
reported 1.3 GB against a 1 GiB + 64 MiB budget. ``peak_rss_bytes`` reads the
address space's own high-water mark, so a child of a fat parent reports what
it touched.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

PARENT_BYTES = 512 << 20


def test_a_child_of_a_fat_parent_reports_its_own_peak() -> None:
    fat = np.ones(PARENT_BYTES, dtype=np.uint8)  # resident: every page written
    child = ("import resource; from emulation.baselines.wanxport_app import peak_rss_bytes; "
             "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", child], check=True, capture_output=True, text=True)
    own, inherited = (int(v) for v in out.stdout.split())
    assert fat.sum() == PARENT_BYTES
    assert inherited >= PARENT_BYTES  # the kernel behaviour this guards against
    assert own < PARENT_BYTES // 2, (own, inherited)
