"""A program started in a gateway namespace that reports JSON lines on stdout.

The experiment runner talks to baseline senders and receivers only through
these lines (and "go" on the sender's stdin), so a reader thread per program
turns stdout into a queue the runner can wait on with a timeout; nothing
polls and nothing sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from emulation.api import REPO_ROOT, Gateways
from emulation.errors import EmulationError

STOP_GRACE_S = 5.0


class Program:
    """``python -m <module> <role> <json spec>`` in one gateway."""

    def __init__(self, emu: Gateways, side: str, module: str, role: str,
                 spec: dict[str, Any], stdin: bool = False) -> None:
        self.label = f"{module.rsplit('.', 1)[-1]} {role} in {side}"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        self._stderr = tempfile.TemporaryFile()
        self.proc = emu.popen(
            side, [sys.executable, "-m", module, role, json.dumps(spec)],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name=self.label, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no output"

    def expect(self, event: str, timeout_s: float) -> dict[str, Any] | None:
        """The next line whose ``event`` is ``event``; None if ``timeout_s`` passes first.

        Raises EmulationError when the program exits without sending it.
        """
        stop = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, stop - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                self.proc.wait()
                raise EmulationError(f"{self.label} exited ({self.proc.returncode}) before "
                                     f"'{event}': {self.stderr_tail()}")
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("event") == event:
                return obj  # type: ignore[no-any-return]

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def interrupt(self) -> None:
        """SIGTERM: the program reports what it has and exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Make sure the program is gone (SIGTERM, then SIGKILL) and reap it."""
        self.interrupt()
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self._stderr.close()
