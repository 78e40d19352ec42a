"""The pacer's ring and pacing clock in plain C, apart from its thread and its Python glue.

tests/c/test_pacer_ring.c checks the release schedule with times as numbers
(exact, unlike measuring the thread); building it here with no Python headers
and no -pthread, and reading the symbols the object needs, is what holds
pacer_ring.c to "no Python, no threads, no sockets".
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "ext" / "datapath"
CC = shutil.which("gcc") or shutil.which("cc")
FLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{EXT}"]

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (gcc or cc) on PATH")


def compile_c(*args: str) -> subprocess.CompletedProcess[str]:
    assert CC is not None
    return subprocess.run([CC, *FLAGS, *args], capture_output=True, text=True, timeout=120)


def test_ring_and_clock_schedule(tmp_path: Path) -> None:
    exe = tmp_path / "test_pacer_ring"
    source = ROOT / "tests" / "c" / "test_pacer_ring.c"
    built = compile_c(str(source), str(EXT / "pacer_ring.c"), "-o", str(exe))
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout


def test_ring_needs_only_the_allocator(tmp_path: Path) -> None:
    obj = tmp_path / "pacer_ring.o"
    built = compile_c("-c", str(EXT / "pacer_ring.c"), "-o", str(obj))
    assert built.returncode == 0, built.stderr
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm on PATH")
    listed = subprocess.run([nm, "-u", str(obj)], capture_output=True, text=True, check=True, timeout=60)
    needed = {line.split()[-1] for line in listed.stdout.splitlines() if line.strip()}
    assert needed <= {"malloc", "calloc", "free", "memcpy", "memset"}, needed


def test_release_thread_builds_without_python_headers() -> None:
    built = compile_c("-fsyntax-only", str(EXT / "pacer_thread.c"))
    assert built.returncode == 0, built.stderr
