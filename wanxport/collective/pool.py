"""Message buffers reused from one collective to the next: received (per link) and sent.

A fresh 64 MiB ``np.empty`` per message is 16k page faults and 64 MiB of page zeroing
by the kernel at every step (about half a receiver's CPU in ``wanxport bench``
measures it so). Training steps repeat the same sizes, so a link keeps the buffers
of finished collectives and hands one of the same size to the data plane for the next
message. A buffer goes back only when the group says the collective it belonged to is
over (``release``): results never alias message buffers (sums, decodes and gathers
write into the caller's arrays), so nothing reads it after that.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt

from .message import Call

KEEP_PER_SIZE = 4  # free buffers kept per size (bounds the memory a link holds)

Buffer = npt.NDArray[np.uint8]
Slot = tuple[int, int, int, int]  # (group id, sequence kind, tag, sequence number): one call's messages


def slot_of(call: Call) -> Slot:
    """The call a message belongs to, as every group sharing a session tells them apart."""
    return (call.group, call.kind, call.tag, call.seq)


class ReceivePool:
    def __init__(self) -> None:
        self._free: dict[int, list[Buffer]] = {}
        self._by_shard: dict[int, Buffer] = {}
        self._held: dict[Slot, list[Buffer]] = {}
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

    def hold(self, shard_id: int, slot: Slot) -> None:
        """Shard ``shard_id`` arrived and belongs to the call ``slot``."""
        buffer = self._by_shard.pop(shard_id, None)
        if buffer is not None:
            self._held.setdefault(slot, []).append(buffer)

    def release(self, slot: Slot) -> None:
        """The call ``slot`` is over here: its buffers may take the next messages."""
        for buffer in self._held.pop(slot, []):
            free = self._free.setdefault(buffer.nbytes, [])
            if len(free) < KEEP_PER_SIZE:
                free.append(buffer)


class SendPool:
    """Message buffers for our own sends, reused from one collective to the next.

    Building a fresh 64 MiB message per step costs page faults and zeroing (about
    5x the copy into a warm buffer: 43 vs 9 ms CPU here). A buffer may be written
    again only when both hold: the collective it carried is over here (the local
    reduce read our contribution from it) and every link's send of it ended (the
    data plane no longer reads it: verified, failed or cancelled). ``take`` reclaims
    lazily, so no callback races the worker threads that fill buffers.
    """

    def __init__(self) -> None:
        self._free: dict[int, list[Buffer]] = {}
        self._sending: dict[Slot, dict[int, tuple[Buffer, list[asyncio.Task[None]]]]] = {}  # -> id
        self._over: list[tuple[Buffer, list[asyncio.Task[None]]]] = []
        self.reused = 0

    def take(self, size: int) -> Buffer:
        """A buffer of ``size`` bytes nobody reads any more (contents undefined)."""
        self._reclaim()
        free = self._free.get(size)
        if free:
            self.reused += 1
            return free.pop()
        return np.empty(size, dtype=np.uint8)

    def sending(self, slot: Slot, buffer: Buffer, task: asyncio.Task[None]) -> None:
        """``task`` sends ``buffer`` for the call ``slot`` (one call per link that sends it)."""
        entry = self._sending.setdefault(slot, {}).setdefault(id(buffer), (buffer, []))
        entry[1].append(task)

    def release(self, slot: Slot) -> None:
        """The call ``slot`` is over here; its buffers return once their sends end."""
        self._over.extend(self._sending.pop(slot, {}).values())

    def _reclaim(self) -> None:
        pending = []
        for buffer, tasks in self._over:
            if not all(t.done() for t in tasks):
                pending.append((buffer, tasks))
                continue
            free = self._free.setdefault(buffer.nbytes, [])
            if len(free) < KEEP_PER_SIZE:
                free.append(buffer)
        self._over = pending
