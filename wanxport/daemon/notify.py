"""systemd's notify protocol, spoken directly (no libsystemd).

With ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace) and, when the unit sets ``WatchdogSec=``, ``WATCHDOG_USEC``.
A state is one datagram of ``KEY=VALUE`` lines. Without ``NOTIFY_SOCKET`` every call
is a no-op, so the daemon runs the same under systemd, in a test, or by hand.

The watchdog is fed from a task on the event loop itself, at half the interval: a
loop blocked for longer than ``WatchdogSec`` stops the pings and systemd restarts
the service, which is the point.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = ("\0" + address[1:]) if address.startswith("@") else (address or None)
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 else None

    def send(self, *states: str) -> None:
        if self.address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto("\n".join(states).encode(), self.address)
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", self.address, exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    async def feed_watchdog(self) -> None:
        """Ping WATCHDOG=1 at half the interval for as long as the loop runs (cancel to stop)."""
        if self.watchdog_s is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s / 2)
