"""``wanxport transfer watch ID`` (and ``submit --progress``): one live progress line.

As ``rsync --info=progress2`` shows a whole transfer: bytes the peer holds, percent,
rate, time left, and the state (with its reason when it is not simply active), one
line rewritten in place (``\\r``) until the transfer is final, then the final line. The
rate is measured here from the daemon's ``bytes_done`` over the last few polls (the
daemon reports bytes, not speed); the time left is what remains at that rate.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from wanxport.daemon.client import FINAL_STATES, GatewayClient

RATE_WINDOW_S = 5.0  # the rate is bytes_done's slope over about this long


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--:--"
    seconds = int(seconds + 0.5)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_rate_Bps(rate: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if rate < 1000 or unit == "GB":
            return f"{rate:.2f}{unit}/s"
        rate /= 1000
    raise AssertionError("unreachable")


def progress_line(transfer: dict[str, Any], rate_Bps: float | None) -> str:
    """``  1,234,567,890  45%  112.34MB/s  0:00:12  active``: what the line shows."""
    done, total = int(transfer.get("bytes_done") or 0), int(transfer.get("bytes_total") or 0)
    percent = 100 * done / total if total else (100 if transfer.get("state") == "done" else 0)
    eta = (total - done) / rate_Bps if rate_Bps and total > done else (0 if total and done >= total else None)
    state = str(transfer.get("state"))
    if transfer.get("reason") and state != "active":
        state += f" ({transfer['reason']})"
    rate = format_rate_Bps(rate_Bps) if rate_Bps is not None else "--"
    return f"{done:>15,} {percent:>4.0f}% {rate:>12} {format_eta(eta):>9}  {state}"


class RateMeter:
    """bytes_done's slope over the last ``window_s`` seconds of samples."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> float | None:
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return max(0.0, (d1 - d0) / (t1 - t0)) if t1 > t0 else None


def watch(client: GatewayClient, transfer_id: str, out: TextIO, poll_s: float = 0.5,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Show the transfer's progress line until it is final; returns its final record."""
    meter = RateMeter()
    width = 0
    while True:
        transfer = client.get(transfer_id)
        line = progress_line(transfer, meter.add(clock(), int(transfer.get("bytes_done") or 0)))
        out.write("\r" + line.ljust(width))
        width = len(line)
        out.flush()
        if transfer.get("state") in FINAL_STATES:
            out.write("\n")
            out.flush()
            return transfer
        sleep(poll_s)
