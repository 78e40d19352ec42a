"""The receiving half of a session: accepted DATA and repair symbols in, checked shards out.

The session dispatches frames and owns the paths; everything between "these bytes of
shard S arrived" and "shard S goes to the application with its verdict" is here:
placing the bytes, DATA that overtook its SHARD_OPEN (``core.early``), digests that
follow their shard (``core.late_digest``), the erasure code's rebuilds
(``core.fec_receive``), and the hand-over that returns the verdict and credit to the
peer. Kept apart so each half can be read (and changed) without the other.
"""

from __future__ import annotations

from wanxport.core.counters import ShardCounters
from wanxport.core.early import EarlyData
from wanxport.core.events import Event, ShardFilled, ShardReceived
from wanxport.core.fec_receive import FecReceiver, rebuilt_acks
from wanxport.core.incoming import IncomingData
from wanxport.core.late_digest import LateDigests
from wanxport.core.shards import IncomingShard
from wanxport.core.stall import StallWatch
from wanxport.core.transmitter import Transmitter
from wanxport.wire.frames import CreditFrame, DataFrame, RepairFrame, ShardDoneFrame, ShardOpenFrame


class Reception:
    """Shard frames in, ``ShardFilled``/``ShardReceived`` events and SHARD_DONE/CREDIT out."""

    def __init__(self, incoming: IncomingData, counters: ShardCounters, stall: StallWatch,
                 tx: Transmitter, events: list[Event], defer_verification: bool) -> None:
        self.incoming = incoming
        self.counters = counters
        self.defer_verification = defer_verification
        self._stall = stall
        self._tx = tx
        self._events = events
        self.fec = FecReceiver()
        self.early = EarlyData()  # DATA that overtook its shard's SHARD_OPEN
        self.late = LateDigests(incoming)  # digests of shards opened unhashed

    def on_open(self, frame: ShardOpenFrame, now: float) -> str | None:
        """A SHARD_OPEN; returns why it breaks the protocol, or None."""
        opening = frame.shard_id not in self.incoming.shards
        if not self.incoming.open(frame):
            return self.incoming.refusal
        if not self.late.opened(frame.shard_id):
            return self.late.refusal
        if opening:
            self._stall.progress(now)
        for held in self.early.release(frame.shard_id):
            if not self.on_data(held, now):  # acknowledged, so it must fit
                return (f"DATA [{held.offset}, {held.offset + held.length}) sent before shard "
                        f"{frame.shard_id} was opened lies outside its {frame.size} bytes")
        return None

    def on_digest(self, shard_id: int, digest: bytes, now: float) -> str | None:
        """A SHARD_DIGEST for a shard opened unhashed; returns why it breaks the protocol, or None."""
        if not self.late.learn(shard_id, digest):
            return self.late.refusal
        if shard_id in self.incoming.shards:
            self.check_complete(self.incoming.shards[shard_id], now)
        return None

    def on_data(self, frame: DataFrame, now: float) -> bool:
        verdict = self.incoming.accepts(frame.shard_id, frame.offset, frame.length)
        if verdict is None:
            return True
        if not verdict:
            if frame.shard_id not in self.incoming.shards and self.early.hold(frame):
                return True  # acknowledged: placed when its SHARD_OPEN arrives (core.early)
            self.counters.data_dropped += 1
            return False
        self.place(self.incoming.shards[frame.shard_id], frame.offset, frame.data, frame.length, now)
        return True

    def place(self, shard: IncomingShard, offset: int, data: bytes | memoryview | None, length: int,
               now: float) -> None:
        """Accepted DATA ``[offset, offset + length)`` of an open shard (``data=None``: placed by
        the native data path, or virtual): record it, let the erasure code see it, finish."""
        new_bytes = shard.place(offset, data, length, now)
        if new_bytes:
            self.incoming.placed_total += new_bytes
            self._stall.progress(now)
        if shard.shard_id in self.fec.blocks or shard.shard_id in self.fec.repaired:
            self._confirm_rebuilt(shard, self.fec.on_data(shard, offset, length, new_bytes, now))
        self.check_complete(shard, now)

    def on_repair(self, frame: RepairFrame, now: float) -> None:
        """A repair symbol: rebuild its block's lost data once it holds k symbols (core.fec_receive)."""
        verdict = self.incoming.accepts(frame.shard_id, 0, 0)  # the block's range: core.fec_receive
        if not verdict:
            if verdict is False:
                self.counters.data_dropped += 1
            return
        shard = self.incoming.shards[frame.shard_id]
        self._stall.progress(now)
        self._confirm_rebuilt(shard, self.fec.on_repair(frame, shard, now))
        self.check_complete(shard, now)

    def _confirm_rebuilt(self, shard: IncomingShard, rebuilt: list[tuple[int, int]]) -> None:
        """Tell the sender which bytes were rebuilt (a complete shard's SHARD_DONE says it all)."""
        if rebuilt and not shard.complete:
            self._tx.control.extend(rebuilt_acks(shard.shard_id, rebuilt))

    def check_complete(self, shard: IncomingShard, now: float) -> None:
        if shard.checkable and not shard.verifying:
            if self.defer_verification and shard.buffer is not None and shard.digest is not None:
                shard.verifying = True
                self._events.append(ShardFilled(shard.shard_id, shard.buffer, shard.digest, now))
            else:
                self._hand_over(shard, self.incoming.finish(shard, now), now)

    def received_prefix(self, shard_id: int) -> int:
        """How many bytes from the start of an incoming shard are in (0 if unknown).

        They are never written again, so a driver may hash them while the rest
        arrives (``defer_verification``).
        """
        shard = self.incoming.shards.get(shard_id)
        return 0 if shard is None else shard.received_prefix

    def shard_verified(self, shard_id: int, ok: bool, now: float) -> None:
        """The driver's verdict on a ``ShardFilled`` shard: ``ok`` when its digest matched.

        A verdict for a shard that is not awaiting one (unknown, already handed
        over) is ignored.
        """
        shard = self.incoming.shards.get(shard_id)
        if shard is None or not shard.verifying:
            return
        self._hand_over(shard, self.incoming.release(shard, ok, now), now)

    def _hand_over(self, shard: IncomingShard, status: int, now: float) -> None:
        """A checked shard goes to the application, its verdict and our credit to the peer."""
        self._events.append(ShardReceived(shard.shard_id, shard.size, shard.meta,
                                          shard.verified is True, now, shard.digest))
        self.counters.shards_received += 1
        self.counters.bytes_received += shard.size
        self._stall.progress(now)
        self.fec.forget_shard(shard.shard_id)
        self._tx.control.append(ShardDoneFrame(shard.shard_id, status))
        self._tx.control.append(CreditFrame(self.incoming.budget.limit))
