"""A blocking face for code that is not async (training loops, DDP hooks, torch backends).

``join_sync`` starts one event loop in a daemon thread and joins the group on it;
the ``SyncGroup`` methods submit to that loop and block for the result.
``all_reduce_async`` returns a ``SyncHandle`` at once (its sequence number is taken
in call order, as with the async group) whose ``wait()`` blocks and whose
``future`` is a ``concurrent.futures.Future`` (for ``add_done_callback``, e.g. to
complete a ``torch.futures.Future``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any

from wanxport.aio.loop import loop_factory
from wanxport.aio.threadcpu import thread_role

from .group import CallStats, Group, Handle
from .mesh import join


class SyncHandle:
    def __init__(self, future: concurrent.futures.Future[Any], handle: Handle) -> None:
        self.future = future
        self.handle = handle

    def wait(self, timeout: float | None = None) -> Any:
        """The result (the reduced array); raises the collective's error."""
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    @property
    def elapsed_s(self) -> float | None:
        return self.handle.elapsed_s


class SyncGroup:
    """A ``Group`` driven from ordinary threads. ``close()`` on the world's group ends every
    group and the loop; on a group from ``new_group`` it closes that group only."""

    def __init__(self, group: Group, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 owns_loop: bool = True) -> None:
        self.group = group
        self.loop = loop
        self._thread = thread
        self._owns_loop = owns_loop

    @property
    def site(self) -> int:
        return self.group.site

    @property
    def size(self) -> int:
        return self.group.size

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def all_reduce(self, array: Any, op: str = "sum", compress: str | None = None,
                   timeout: float | None = None, name: str | None = None) -> Any:
        return self._call(self.group.all_reduce(array, op, compress, timeout, name))

    def all_reduce_async(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> SyncHandle:
        return self._start(lambda: self.group.all_reduce_async(array, op, compress, timeout, name))

    def _start(self, begin: Any) -> SyncHandle:
        """``begin()`` (a call that returns a ``Handle``) run on the loop now, so its sequence
        number is taken in this thread's call order; its handle wrapped for threads."""
        async def start() -> Handle:
            handle: Handle = begin()
            return handle

        handle = self._call(start())
        return SyncHandle(mirror(self.loop, handle.future), handle)

    def reduce_scatter(self, array: Any, op: str = "sum", compress: str | None = None,
                       timeout: float | None = None, name: str | None = None) -> Any:
        return self._call(self.group.reduce_scatter(array, op, compress, timeout, name))

    def all_gather(self, array: Any, out: Any = None, timeout: float | None = None) -> Any:
        return self._call(self.group.all_gather(array, out, timeout))

    def broadcast(self, array: Any, root: int = 0, timeout: float | None = None) -> Any:
        return self._call(self.group.broadcast(array, root, timeout))

    def barrier(self, timeout: float | None = None) -> None:
        self._call(self.group.barrier(timeout))

    def send(self, array: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        self._call(self.group.send(array, dst, tag, timeout))

    def recv(self, array: Any, src: int, tag: int = 0, timeout: float | None = None) -> Any:
        return self._call(self.group.recv(array, src, tag, timeout))

    def isend(self, array: Any, dst: int, tag: int = 0, timeout: float | None = None) -> SyncHandle:
        return self._start(lambda: self.group.isend(array, dst, tag, timeout))

    def irecv(self, array: Any, src: int, tag: int = 0, timeout: float | None = None) -> SyncHandle:
        return self._start(lambda: self.group.irecv(array, src, tag, timeout))

    def new_group(self, members: list[int], timeout_s: float | None = None) -> SyncGroup | None:
        """``Group.new_group`` on the same loop and sessions (None where this site is no member)."""
        group = self._call(value_of(self.group.new_group, members, timeout_s))
        return None if group is None else SyncGroup(group, self.loop, self._thread, owns_loop=False)

    def refuse(self, op: str, reason: str) -> ValueError:
        """``Group.refuse`` from this thread: the refused call takes its place in the sequence."""
        return self._call(value_of(self.group.refuse, op, reason))  # type: ignore[no-any-return]

    def stats(self) -> list[CallStats]:
        return self._call(value_of(self.group.stats))  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self._owns_loop:
            self._call(self.group.close())
            return
        try:
            self._call(self.group.close())
        finally:
            self._call(_cancel_the_rest())
            stop_loop(self.loop, self._thread)

    def __enter__(self) -> SyncGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _cancel_the_rest() -> None:
    """Tasks the sessions left behind end here, not as warnings when the loop goes."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def value_of(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` as a coroutine, to run a plain call on the group's loop."""
    return fn(*args)


def mirror(loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any]) -> concurrent.futures.Future[Any]:
    """A thread-side future that settles as ``task`` (on ``loop``) does."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def copy_result(done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            future.cancel()
        elif done.exception() is not None:
            future.set_exception(done.exception())
        else:
            future.set_result(done.result())

    loop.call_soon_threadsafe(task.add_done_callback, copy_result)
    return future


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    with thread_role("loop"):  # its CPU counts as the loop's (aio.threadcpu)
        loop.run_forever()


def start_loop(name: str) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """An event loop running in a daemon thread (uvloop when installed: the stdlib loop costs
    the sessions more CPU per datagram), its CPU counted as the ``loop`` role."""
    loop = loop_factory()()
    thread = threading.Thread(target=_run_loop, args=(loop,), name=name, daemon=True)
    thread.start()
    return loop, thread


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10.0)
    if not thread.is_alive():
        loop.close()


def join_sync(site: int, peers: list[str], **kwargs: Any) -> SyncGroup:
    """``join`` from non-async code (same arguments); the group runs on its own loop thread,
    as ``wanxport.aio.loop.run`` gives async callers."""
    loop, thread = start_loop("wanxport-collective")
    try:
        group = asyncio.run_coroutine_threadsafe(join(site, peers, **kwargs), loop).result()
    except BaseException:
        stop_loop(loop, thread)
        raise
    return SyncGroup(group, loop, thread)
