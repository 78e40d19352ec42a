"""Receive buffers a link reuses from one collective to the next.

A fresh 64 MiB ``np.empty`` per message is 16k page faults and 64 MiB of page zeroing
by the kernel at every step (about half a receiver's CPU in ``wanxport bench``, see
docs/results/cpu.md). Training steps repeat the same sizes, so a link keeps the buffers
of finished collectives and hands one of the same size to the data plane for the next
message. A buffer goes back only when the group says the collective it belonged to is
over (``release``): results never alias message buffers (sums, decodes and gathers
write into the caller's arrays), so nothing reads it after that.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

KEEP_PER_SIZE = 4  # free buffers kept per size (bounds the memory a link holds)

Buffer = npt.NDArray[np.uint8]


class ReceivePool:
    def __init__(self) -> None:
        self._free: dict[int, list[Buffer]] = {}
        self._by_shard: dict[int, Buffer] = {}
        self._held: dict[int, list[Buffer]] = {}  # by collective sequence number
        self.reused = 0

    def allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        """The data plane's allocator: a buffer of ``size`` bytes for incoming shard ``shard_id``."""
        free = self._free.get(size)
        if free:
            buffer = free.pop()
            self.reused += 1
        else:
            buffer = np.empty(size, dtype=np.uint8)
        self._by_shard[shard_id] = buffer
        return buffer

    def hold(self, shard_id: int, seq: int) -> None:
        """Shard ``shard_id`` arrived and belongs to collective ``seq``."""
        buffer = self._by_shard.pop(shard_id, None)
        if buffer is not None:
            self._held.setdefault(seq, []).append(buffer)

    def release(self, seq: int) -> None:
        """Collective ``seq`` is over here: its buffers may take the next messages."""
        for buffer in self._held.pop(seq, []):
            free = self._free.setdefault(buffer.nbytes, [])
            if len(free) < KEEP_PER_SIZE:
                free.append(buffer)
