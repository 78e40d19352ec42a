"""The scheduler: every policy decision about which data goes on which path, and when.

The session asks the scheduler, once per fill round and per path: is the
round's view of the transfer fresh (``refresh``), in which order are the ready
paths filled (``order``), should this path wait (``hold``), and which chunk does
it carry next (``next_chunk``: a retransmission, new data, or a hedged copy).
The session does the mechanics (windows, pacing, packets, timers).

A scheduler composes parts from ``wanxport.core.scheduling``: a path order, the
tail (detection and water-filling cutoff), stripes and hedging. Schedulers are
registered by name, like congestion controllers; the registered ones compose:

==============================  ================  ====================  ==========================  ========
name                            order             tail                  stripes                     hedging
==============================  ================  ====================  ==========================  ========
earliest-arrival (default)      expected arrival  water-filling cutoff  ``stripe_chunks``, single   in the
                                                                        chunks in the tail          tail
round-robin (naive baseline)    rotating          none                  ``stripe_chunks`` always    none
earliest-arrival-no-hedge       expected arrival  water-filling cutoff  as earliest-arrival         none
earliest-arrival-no-cutoff      expected arrival  detected, no cutoff   as earliest-arrival         in the
                                                                                                    tail
earliest-arrival-no-stripes     expected arrival  water-filling cutoff  none (one chunk a run)      in the
                                                                                                    tail
==============================  ================  ====================  ==========================  ========

The last three are ablations: each leaves one part of the default out. Every
earliest-arrival variant sends a small message that fits a path's window as one
burst on the path that lands it first (``burst_path``, ``core.scheduling.burst``);
round-robin never does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum

from wanxport.core.config import SessionConfig
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.scheduling.burst import burst_path
from wanxport.core.scheduling.hedge import Hedger
from wanxport.core.scheduling.order import ExpectedArrivalOrder, PathOrder, RotatingOrder
from wanxport.core.scheduling.stripes import Stripes
from wanxport.core.scheduling.tail import Tail
from wanxport.core.sent_packets import Chunk


class ChunkKind(Enum):
    NEW = "new"
    RETRANSMISSION = "retransmission"
    HEDGE = "hedge"  # a second copy of a chunk still in flight on another path


class Scheduler(ABC):
    """What the session asks; one instance per session, over the session's ``OutgoingData``."""

    name: str

    @property
    @abstractmethod
    def remaining_bytes(self) -> int:
        """Bytes still to be sent at least once or re-sent."""

    @abstractmethod
    def refresh(self, paths: list[Path], now: float) -> bool:
        """A fill round starts. True: data became free for any path (fill them all)."""

    @abstractmethod
    def order(self, ready: list[Path], now: float) -> list[Path]:
        """The paths ready to send, in the order they should be filled."""

    @abstractmethod
    def hold(self, path: Path, now: float) -> float | None:
        """None: ``path`` may take data now; else it waits, to be asked again at that time.

        A path that waits gives back its reserved data (the session calls ``release``).
        """

    @abstractmethod
    def next_chunk(self, path: Path, now: float, paths: list[Path]) -> tuple[Chunk, ChunkKind] | None:
        """The next chunk ``path`` carries, or None: it has nothing to send."""

    def burst_path(self, ready: list[Path], now: float, paths: list[Path]) -> Path | None:
        """The path of ``ready`` that takes every byte waiting as one burst (a small message,
        ``core.scheduling.burst``), or None: the ordinary fill. None unless a scheduler bursts."""
        return None

    @abstractmethod
    def release(self, path_id: int) -> bool:
        """The path takes no new data for now (failed, or held): hand what it reserved to others.

        Returns whether any data became free.
        """

    @abstractmethod
    def forget_shard(self, shard_id: int) -> None:
        """The shard is done: drop whatever the scheduler still holds of it."""

    @abstractmethod
    def data_requeued(self) -> None:
        """Lost data went back to the retransmission queue."""


class ComposedScheduler(Scheduler):
    """A scheduler made of parts; ``None`` leaves a part out (see the module's table)."""

    def __init__(self, name: str, outgoing: OutgoingData, *, order: PathOrder, tail: Tail | None,
                 stripe_chunks: int, hedger: Hedger | None, bursts: bool = False) -> None:
        self.name = name
        self.bursts = bursts
        self.outgoing = outgoing
        self.path_order = order
        self.tail = tail
        self.stripes = Stripes(outgoing)
        self.stripe_chunks = stripe_chunks
        self.hedger = hedger

    @property
    def remaining_bytes(self) -> int:
        return self.outgoing.remaining_bytes + self.stripes.reserved_bytes

    @property
    def in_tail(self) -> bool:
        return self.tail is not None and self.tail.in_tail

    def refresh(self, paths: list[Path], now: float) -> bool:
        tail = self.tail
        if tail is None or not tail.due(now):
            return False
        entered = tail.update([p for p in paths if p.usable], now, self.remaining_bytes)
        # In the tail each chunk goes where it lands first, not where a stripe put it.
        return entered and self.stripes.release_all()

    def order(self, ready: list[Path], now: float) -> list[Path]:
        return self.path_order.order(ready, now)

    def burst_path(self, ready: list[Path], now: float, paths: list[Path]) -> Path | None:
        if not self.bursts or self.outgoing.retransmit_bytes:
            return None  # lost data is re-sent at the controllers' pace (a loss may be a full queue)
        return burst_path(ready, paths, now, self.remaining_bytes)

    def hold(self, path: Path, now: float) -> float | None:
        tail = self.tail
        if tail is None or not tail.holds(path, now, self.remaining_bytes):
            return None
        # The cutoff moves with the tail, and a stale one could exclude every path
        # forever: look again shortly with a fresh one.
        tail.mark_stale()
        return now + tail.recheck_s

    def next_chunk(self, path: Path, now: float, paths: list[Path]) -> tuple[Chunk, ChunkKind] | None:
        chunk = self.outgoing.next_retransmission(path.mss)
        if chunk is not None:
            return chunk, ChunkKind.RETRANSMISSION
        stripe_len = 0 if self.in_tail else self.stripe_chunks * path.mss
        chunk = self.stripes.next_chunk(path.path_id, path.mss, stripe_len)
        if chunk is not None:
            return chunk, ChunkKind.NEW
        if self.hedger is not None and self.in_tail and not self.remaining_bytes:
            chunk = self.hedger.next_chunk(path, now, paths, self.outgoing)
            if chunk is not None:
                return chunk, ChunkKind.HEDGE
        return None

    def release(self, path_id: int) -> bool:
        return self.stripes.release(path_id)

    def forget_shard(self, shard_id: int) -> None:
        self.stripes.forget_shard(shard_id)
        if self.hedger is not None:
            self.hedger.forget_shard(shard_id)

    def data_requeued(self) -> None:
        if self.tail is not None:
            self.tail.mark_stale()


SchedulerFactory = Callable[[SessionConfig, OutgoingData], Scheduler]
_REGISTRY: dict[str, SchedulerFactory] = {}


def register_scheduler(name: str, factory: SchedulerFactory) -> None:
    _REGISTRY[name] = factory


def create_scheduler(name: str, config: SessionConfig, outgoing: OutgoingData) -> Scheduler:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown scheduler {name!r}; valid: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return factory(config, outgoing)


def available_schedulers() -> list[str]:
    return sorted(_REGISTRY)


def _earliest_arrival(name: str, *, water_fill: bool = True, stripes: bool = True,
                      hedge: bool = True) -> SchedulerFactory:
    def factory(config: SessionConfig, outgoing: OutgoingData) -> Scheduler:
        return ComposedScheduler(
            name, outgoing, order=ExpectedArrivalOrder(),
            tail=Tail(config.pacing_horizon_s, water_fill=water_fill),
            stripe_chunks=config.stripe_chunks if stripes else 0,
            hedger=Hedger() if hedge else None, bursts=True)
    return factory


def _round_robin(config: SessionConfig, outgoing: OutgoingData) -> Scheduler:
    return ComposedScheduler("round-robin", outgoing, order=RotatingOrder(), tail=None,
                             stripe_chunks=config.stripe_chunks, hedger=None)


register_scheduler("earliest-arrival", _earliest_arrival("earliest-arrival"))
register_scheduler("round-robin", _round_robin)
register_scheduler("earliest-arrival-no-hedge", _earliest_arrival("earliest-arrival-no-hedge", hedge=False))
register_scheduler("earliest-arrival-no-cutoff",
                   _earliest_arrival("earliest-arrival-no-cutoff", water_fill=False))
register_scheduler("earliest-arrival-no-stripes",
                   _earliest_arrival("earliest-arrival-no-stripes", stripes=False))
