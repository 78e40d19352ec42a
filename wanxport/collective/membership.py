"""An elastic group's membership, agreed through the job's own c10d store.

The store (torch's ``TCPStore`` on the control network, or any object with the
c10d ``Store`` methods ``set``/``get``/``add``/``check``/``compare_set``) holds one
record, the current epoch: its number, the sorted live sites, the sites it
admits, the first step it applies to, and how many join requests it has
answered. A change is a compare-and-set from the epoch a site read to the next
one, so exactly one proposal for each number wins and every site adopts the
highest: the store's atomic operations are the only consensus there is.

Several groups may share one record (``own_prefix`` keeps each group's other keys
apart): the groups of a site's local ranks, which must lose and admit sites at the
same steps.

A joining site takes a ticket (``add`` on a counter) and files its index under
it; the survivors answer tickets in order and record the last one answered in
the epoch, so a ticket is answered once, by one agreed epoch, however many
survivors saw it.

The store being unreachable stops this site: every operation is retried until
it answers (each failure counted and logged), so a site cut off from the store
waits; it never decides alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import GroupEnded

log = logging.getLogger("wanxport.collective.elastic")

STORE_RETRY_S = 0.5  # between attempts while the store does not answer
POLL_S = 0.05  # between reads while waiting for an epoch another site proposes
END_RECORD_S = 5.0  # how long a leaving site tries to record the group's end


class Store(Protocol):
    """The c10d store methods membership uses (``torch.distributed.Store`` has them)."""

    def set(self, key: str, value: str | bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...
    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes: ...


@dataclass(frozen=True)
class Epoch:
    """One agreed membership: ``members`` (sorted site indices) from step ``start`` on
    (-1: at once); ``admitted``: the sites it lets in (they receive the state); ``answered``:
    the last join ticket it answered."""

    number: int
    members: tuple[int, ...]
    start: int = -1
    admitted: tuple[int, ...] = ()
    answered: int = 0

    def encode(self) -> bytes:
        return json.dumps({"number": self.number, "members": list(self.members), "start": self.start,
                           "admitted": list(self.admitted), "answered": self.answered}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Epoch:
        try:
            data = json.loads(raw)
            members = tuple(sorted(int(m) for m in data["members"]))
            admitted = tuple(sorted(int(m) for m in data["admitted"]))
            return cls(int(data["number"]), members, int(data["start"]), admitted, int(data["answered"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"the store's epoch record is not one ({exc}): {raw[:80]!r}") from None


class Membership:
    """This site's view of the store: read, propose and adopt epochs; file and read join tickets.

    Store calls block (a TCPStore is a socket client), so they run on one thread of their
    own, one at a time, and the event loop keeps serving the sessions meanwhile."""

    def __init__(self, store: Store, prefix: str, site_name: str, own_prefix: str | None = None) -> None:
        self.store = store
        self.prefix = prefix
        self.own_prefix = prefix if own_prefix is None else own_prefix  # this group's keys (``formed``)
        self.site_name = site_name
        self.store_failures = 0  # store operations that failed (each retried)
        self.waiting_for_store = False
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wanxport-elastic-store")

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the store's thread, retried until the store answers."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                result = await loop.run_in_executor(self._thread, fn, *args)
            except Exception as exc:  # noqa: BLE001 - any store failure is "unreachable": wait
                self.store_failures += 1
                if not self.waiting_for_store:
                    log.warning("site %s: the store does not answer (%s: %s: %s); waiting for it",
                                self.site_name, what, type(exc).__name__, exc)
                self.waiting_for_store = True
                await asyncio.sleep(STORE_RETRY_S)
                continue
            if self.waiting_for_store:
                log.warning("site %s: the store answers again", self.site_name)
            self.waiting_for_store = False
            return result

    def _key(self, name: str) -> str:
        return self.prefix + name

    async def read(self) -> Epoch | None:
        """The current epoch (None before the group first formed)."""
        key = self._key("epoch")
        raw = await self._call("read epoch", lambda: self.store.get(key) if self.store.check([key]) else b"")
        return Epoch.decode(raw) if raw else None

    async def propose(self, expected: Epoch | None, proposal: Epoch) -> Epoch:
        """Replace ``expected`` by ``proposal`` unless another site changed it first; the epoch
        the store holds afterwards (ours or the winner's)."""
        old = b"" if expected is None else expected.encode()
        raw = await self._call("propose epoch", self.store.compare_set, self._key("epoch"), old,
                               proposal.encode())
        return Epoch.decode(raw)

    async def formed(self) -> bool:
        """Whether this group has formed (every configured site joined it once): a process
        that finds it so is a restart, not a first start."""
        key = self.own_prefix + "formed"
        return bool(await self._call("read whether the group formed", self.store.check, [key]))

    async def mark_formed(self) -> None:
        await self._call("record that the group formed", self.store.set, self.own_prefix + "formed", "1")

    async def newer_than(self, number: int) -> Epoch:
        """Wait (polling the store) for an epoch numbered above ``number``; ``GroupEnded`` once
        the members have closed the group (nobody is left to propose one)."""
        while True:
            current = await self.read()
            if current is not None and current.number > number:
                return current
            ended = await self.ended()
            if ended is not None:
                raise GroupEnded(f"site {self.site_name}: the group ended: its members closed it at epoch "
                                 f"{ended[0]}, step {ended[1]}; there is nothing left to join")
            await asyncio.sleep(POLL_S)

    async def mark_reached(self, ticket: int, site: int) -> None:
        """Record that ``site`` has a session with the site that took ``ticket`` (in this group:
        the groups sharing the record each set up their own sessions)."""
        key = f"{self.own_prefix}reached/{ticket}/{site}"
        await self._call("record a joiner reached", self.store.set, key, "1")

    async def reached_by(self, ticket: int, members: tuple[int, ...]) -> bool:
        """Whether every one of ``members`` has recorded a session with the site of ``ticket``."""
        keys = [f"{self.own_prefix}reached/{ticket}/{m}" for m in members]
        return bool(await self._call("read whether a joiner is reached", self.store.check, keys))

    async def mark_ended(self, epoch: int, step: int) -> None:
        """Record that every member of ``epoch`` closed the group after ``step``: a site still
        waiting to be admitted learns that no one will answer it."""
        record = json.dumps({"epoch": epoch, "step": step})
        loop = asyncio.get_running_loop()
        try:  # one bounded try: a site leaving does not wait for a store that does not answer
            async with asyncio.timeout(END_RECORD_S):
                await loop.run_in_executor(self._thread, self.store.set, self._key("ended"), record)
        except Exception as exc:  # noqa: BLE001 - any store failure: a joiner then waits as before
            self.store_failures += 1
            log.warning("site %s: could not record the group's end in the store (%s: %s)", self.site_name,
                        type(exc).__name__, exc)

    async def ended(self) -> tuple[int, int] | None:
        """(epoch, step) at which the members closed the group; None while it runs."""
        key = self._key("ended")
        raw = await self._call("read the group's end", lambda: self.store.get(key) if self.store.check([key])
                               else b"")
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return int(data["epoch"]), int(data["step"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"the store's end record is not one ({exc}): {raw[:80]!r}") from None

    async def file_ticket(self, site: int) -> int:
        """Ask to be admitted: this site's ticket, filed under its number."""
        ticket = int(await self._call("take a join ticket", self.store.add, self._key("tickets"), 1))
        await self._call("file the join ticket", self.store.set, self._key(f"ticket/{ticket}"), str(site))
        return ticket

    async def tickets(self, after: int) -> list[tuple[int, int]]:
        """(ticket, site) of the tickets after ``after``, in order, up to the first not filed yet."""
        last = int(await self._call("read the join tickets", self.store.add, self._key("tickets"), 0))
        out = []
        for ticket in range(after + 1, last + 1):
            key = self._key(f"ticket/{ticket}")

            def site_of(key: str = key) -> bytes:
                return self.store.get(key) if self.store.check([key]) else b""
            raw = await self._call("read a join ticket", site_of)
            if not raw:
                break
            out.append((ticket, int(raw)))
        return out
