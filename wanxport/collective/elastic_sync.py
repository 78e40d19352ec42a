"""An elastic group driven from ordinary threads (training loops, the DDP hook).

As ``sync``: one event loop in a daemon thread runs the group; the methods submit
to it and block. ``all_reduce_async`` takes its place in the sequence in the
caller's order and returns a handle whose ``future`` is a
``concurrent.futures.Future``, as ``SyncGroup``'s does, so the DDP hook takes
either group.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any

from .calls import CallStats
from .elastic import ElasticGroup
from .elastic_join import elastic_join
from .elastic_state import StateHolder
from .membership import Epoch
from .sync import mirror, start_loop, stop_loop, value_of


class ElasticHandle:
    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self.future = future

    def wait(self, timeout: float | None = None) -> Any:
        """The result; raises the call's error (``MembershipChanged`` among them)."""
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()


class ElasticSyncGroup:
    """``ElasticGroup`` from threads: ``boundary``, ``all_reduce`` and its async form."""

    def __init__(self, group: ElasticGroup, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread) -> None:
        self.group = group
        self.loop = loop
        self._thread = thread

    @property
    def site(self) -> int:
        return self.group.site

    @property
    def size(self) -> int:
        """Live sites in the current epoch (an "avg" divides by it)."""
        return self.group.size

    @property
    def members(self) -> tuple[int, ...]:
        return self.group.members

    @property
    def epoch(self) -> Epoch:
        return self.group.epoch

    @property
    def changes(self) -> int:
        return self.group.changes

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def boundary(self, step: int, state: StateHolder) -> int:
        return int(self._call(self.group.boundary(step, state)))

    def all_reduce(self, array: Any, op: str = "sum", compress: str | None = None,
                   timeout: float | None = None, name: str | None = None) -> Any:
        return self._call(self.group.all_reduce(array, op, compress, timeout, name))

    def all_reduce_async(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> ElasticHandle:
        async def start() -> asyncio.Future[Any]:
            return self.group.all_reduce_async(array, op, compress, timeout, name)

        return ElasticHandle(mirror(self.loop, self._call(start())))

    def refuse(self, op: str, reason: str) -> ValueError:
        return self._call(value_of(self.group.refuse, op, reason))  # type: ignore[no-any-return]

    def stats(self) -> list[CallStats]:
        """The calls of the current epoch's group."""
        group = self.group.group
        return [] if group is None else group.stats()

    def close(self) -> None:
        try:
            self._call(self.group.close())
        finally:
            stop_loop(self.loop, self._thread)

    def __enter__(self) -> ElasticSyncGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def elastic_join_sync(store: Any, site: int, peers: list[str], **kwargs: Any) -> ElasticSyncGroup:
    """``elastic_join`` from non-async code (same arguments), on its own loop thread."""
    loop, thread = start_loop("wanxport-elastic")
    try:
        group = asyncio.run_coroutine_threadsafe(elastic_join(store, site, peers, **kwargs), loop).result()
    except BaseException:
        stop_loop(loop, thread)
        raise
    return ElasticSyncGroup(group, loop, thread)
