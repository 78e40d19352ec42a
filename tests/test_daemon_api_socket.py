"""The transfer API's Unix socket: mode 0660 from its first instant, and the process umask untouched.

Two daemons started at once on one event loop (the simultaneous-dial tests do)
used to interleave their umask set/restore around an ``await`` and leave the
whole process at umask 0117: every file created afterwards, a compiled test
binary among them, had no execute bits.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from wanxport.daemon.api import ApiServer


async def _never(*_: object) -> object:
    raise AssertionError("no request is made")


async def test_concurrent_starts_leave_the_umask_and_make_0660_sockets(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        servers = [ApiServer(tmp_path / f"api{i}.sock", _never) for i in range(4)]
        await asyncio.gather(*(server.start() for server in servers))
        try:
            assert os.umask(0o022) == 0o022
            for server in servers:
                assert os.stat(server.path).st_mode & 0o777 == 0o660
        finally:
            await asyncio.gather(*(server.close() for server in servers))
    finally:
        os.umask(before)
