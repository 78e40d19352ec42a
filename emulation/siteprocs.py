"""Processes in namespaces that a runner kills and restarts, reporting on one queue.

Each process leads its own process group (a new session), so SIGKILL of the group takes
the process and anything it started, as losing the machine would. Every JSON line a
process prints lands on one queue shared by all of them, as ``(label, object, arrival
time)``, and its end as ``(label, None, time)``: the runner waits on that queue alone,
with a timeout up to its next scheduled fault, so nothing polls.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from emulation.api import REPO_ROOT
from emulation.hostenv import popen_in

STOP_GRACE_S = 5.0

Line = tuple[str, dict[str, Any] | None, float]


class NamespaceProcess:
    """``argv`` in namespace ``ns``, its own process group, stdout lines onto ``lines``;
    its stderr kept in ``stderr_path`` when given (the run's logs), else in a temporary file."""

    def __init__(self, label: str, ns: str, argv: Sequence[str], lines: queue.Queue[Line],
                 stdin: bool = False, stderr_path: str | None = None) -> None:
        self.label = label
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        self._stderr = open(stderr_path, "w+b") if stderr_path else tempfile.TemporaryFile()  # noqa: SIM115
        self.started_at = time.monotonic()
        self.proc = popen_in(ns, list(argv), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
                             start_new_session=True)
        self.killed_at: float | None = None
        self._lines = lines
        threading.Thread(target=self._read, name=label, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self._lines.put((self.label, obj, time.monotonic()))
        self._lines.put((self.label, None, time.monotonic()))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it ended; its end is on the queue

    def kill(self) -> None:
        """SIGKILL the whole process group now (the process and its children)."""
        self.killed_at = time.monotonic()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stderr_tail(self, lines: int = 3) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-lines:]
        return " | ".join(tail) if tail else "no output"

    def close(self) -> None:
        """Make sure the group is gone (SIGTERM, then SIGKILL) and reap the process."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(STOP_GRACE_S)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill()
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # children it may have left
            except ProcessLookupError:
                pass
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self._stderr.close()
