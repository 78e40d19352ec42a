"""Re-verifying a received piece reads the file, not a mapping of it: a piece past the end
of a file truncated meanwhile is "not held" (sent again), where touching a mapping past the
end would end the daemon with SIGBUS."""

from __future__ import annotations

import os
from pathlib import Path

from wanxport.core.digest import shard_digest_hex
from wanxport.daemon.inbox import _digest_range


def test_a_piece_is_digested_and_one_past_the_end_is_not_held(tmp_path: Path) -> None:
    data = os.urandom(3 * 4096 + 100)
    path = tmp_path / "partial"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _digest_range(os.dup(fd), 4096, 8192) == shard_digest_hex(data[4096:12288])
        os.truncate(path, 4096 + 10)  # truncated while the daemon holds it open
        assert _digest_range(os.dup(fd), 4096, 8192) is None
        assert _digest_range(os.dup(fd), 0, 4096) == shard_digest_hex(data[:4096])
    finally:
        os.close(fd)
