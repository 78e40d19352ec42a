"""The process group's ops on ``wanxport.collective``: each started on the group's loop, in call order.

Every op here is ``start(group, begin)``: ``begin(g)`` runs on the loop thread, takes
every sequence number the op needs right there (one collective, or the point-to-point
calls it makes), and returns the coroutine that finishes it. The caller's thread
waits only for ``begin``, so two ops started one after the other take their numbers
in that order at every rank, and any number of them may be in flight.

The collective layer sees contiguous CPU arrays (``Slot``): a non-contiguous or
CUDA tensor is copied into one first and the result copied back when the op is done
(CUDA through ``staging``). Reductions the collective runs itself (SUM, AVG) keep its
fixed-order sum and compression; the others gather every rank's contribution and
``dtypes.fold`` them in rank order. Point-to-point pieces of collectives (gather,
scatter, all-to-all) use tags above any 32-bit torch tag, so they never pair with
a user's ``send``/``recv``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from wanxport.collective import Group, SyncGroup
from wanxport.torch import dtypes, staging

__all__ = ["Slot", "start"]

GATHER_TAG, SCATTER_TAG, ALL_TO_ALL_TAG = (1 << 40) + 1, (1 << 40) + 2, (1 << 40) + 3
Begin = Callable[[Group], Awaitable[Any]]


def start(group: SyncGroup, begin: Begin) -> Future[Any]:
    """Run ``begin(group.group)`` on the loop now; a future of the coroutine it returns."""
    async def kick() -> asyncio.Future[Any]:
        return asyncio.ensure_future(begin(group.group))

    task = asyncio.run_coroutine_threadsafe(kick(), group.loop).result()
    out: Future[Any] = Future()

    def copy(done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            out.cancel()
        elif done.exception() is not None:
            out.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            out.set_result(done.result())

    group.loop.call_soon_threadsafe(task.add_done_callback, copy)
    return out


class Slot:
    """A tensor as the collective layer takes it: ``work`` is contiguous on the CPU (the
    tensor itself when it already is); ``put_back`` copies a result into the tensor."""

    def __init__(self, tensor: torch.Tensor, *, read: bool = True) -> None:
        self.tensor = tensor
        if tensor.device.type != "cpu":
            self.work = staging.to_host(tensor) if read else torch.empty(
                tensor.shape, dtype=tensor.dtype, pin_memory=staging.pinned(tensor))
        elif tensor.is_contiguous():
            self.work = tensor.detach()
        else:
            self.work = tensor.detach().contiguous() if read else torch.empty(tensor.shape,
                                                                              dtype=tensor.dtype)

    @property
    def array(self) -> Any:
        return dtypes.wire(self.work)

    def put_back(self) -> None:
        if self.work is self.tensor or self.work.data_ptr() == self.tensor.data_ptr():
            return
        if self.tensor.device.type != "cpu":
            staging.to_device(self.work, self.tensor)
        else:
            self.tensor.detach().copy_(self.work)


def _put_back(slots: Sequence[Slot]) -> None:
    for slot in slots:
        slot.put_back()


def _flat_bytes(tensors: Sequence[torch.Tensor]) -> np.ndarray[Any, Any]:
    """The tensors' bytes one after another (contiguous copies), as one uint8 array."""
    if not tensors:
        return np.empty(0, dtype=np.uint8)
    return np.concatenate([dtypes.wire(t.detach().cpu().contiguous()).reshape(-1).view(np.uint8)
                           for t in tensors])


# -- reductions ------------------------------------------------------------------


def all_reduce(group: SyncGroup, tensor: torch.Tensor, name: str, *, compress: str | None,
               timeout: float, root: int | None = None) -> Future[Any]:
    """Reduce ``tensor`` over the group in place (``root``: only that rank's tensor changes)."""
    fast = dtypes.fast_path(name, tensor.dtype)
    compress = dtypes.codec_for(tensor.dtype, compress)
    slot = Slot(tensor)
    writes = root is None or group.site == root
    if fast:
        wide = slot.work.float() if tensor.dtype == torch.bfloat16 else (
            slot.work if writes else slot.work.clone())
        arr = dtypes.summable(dtypes.wire(wide))

        def begin(g: Group) -> Awaitable[Any]:
            handle = g.all_reduce_async(arr, dtypes.FAST[name], compress, timeout)

            async def finish() -> None:
                await handle
                if writes:
                    if wide is not slot.work:
                        slot.work.copy_(wide)
                    slot.put_back()
            return finish()
        return start(group, begin)

    def begin_fold(g: Group) -> Awaitable[Any]:
        gathered = g.all_gather(slot.array, None, timeout)

        async def finish() -> None:
            rows = await gathered
            if writes:
                parts = [dtypes.from_wire(rows[k], tensor.dtype) for k in range(g.size)]
                dtypes.fold(name, parts, slot.work)
                slot.put_back()
        return finish()
    return start(group, begin_fold)


def reduce_scatter(group: SyncGroup, flat: torch.Tensor, outputs: Sequence[torch.Tensor], name: str, *,
                   timeout: float, bool_bytes: bool = True) -> Future[Any]:
    """Part k of 1-D ``flat`` (``group.size`` equal parts, each ``outputs`` one after another),
    reduced over the group, into rank k's ``outputs``. ``flat`` is the caller's to lose.
    ``bool_bytes``: a bool sum keeps its byte counts (gloo's list form) or becomes 0/1
    (gloo's single-tensor form)."""
    n, k = group.size, group.site
    per = flat.numel() // n
    slots = [Slot(o, read=False) for o in outputs]

    def place(part: torch.Tensor) -> None:
        offset = 0
        for slot in slots:
            count = slot.work.numel()
            target, source = slot.work.reshape(-1), part[offset:offset + count]
            dtypes.copy_exact(target, source) if bool_bytes else target.copy_(source)
            offset += count
        _put_back(slots)

    if dtypes.fast_path(name, flat.dtype):
        wide = flat.float() if flat.dtype == torch.bfloat16 else flat
        arr = dtypes.summable(dtypes.wire(wide))

        def begin(g: Group) -> Awaitable[Any]:
            scattered = g.reduce_scatter(arr, dtypes.FAST[name], None, timeout)

            async def finish() -> None:
                await scattered
                part = wide[k * per:(k + 1) * per]
                place(part if part.dtype == flat.dtype else part.to(flat.dtype))
            return finish()
        return start(group, begin)

    def begin_fold(g: Group) -> Awaitable[Any]:
        gathered = g.all_gather(dtypes.wire(flat), None, timeout)

        async def finish() -> None:
            rows = await gathered
            parts = [dtypes.from_wire(rows[r], flat.dtype)[k * per:(k + 1) * per] for r in range(n)]
            own = torch.empty(per, dtype=flat.dtype)
            dtypes.fold(name, parts, own)
            place(own)
        return finish()
    return start(group, begin_fold)


# -- data movement ---------------------------------------------------------------


def broadcast(group: SyncGroup, tensor: torch.Tensor, root: int, *, timeout: float) -> Future[Any]:
    slot = Slot(tensor)

    def begin(g: Group) -> Awaitable[Any]:
        sent = g.broadcast(slot.array, root, timeout)

        async def finish() -> None:
            await sent
            slot.put_back()
        return finish()
    return start(group, begin)


def all_gather_bytes(group: SyncGroup, inputs: Sequence[torch.Tensor],
                     outputs: Sequence[Sequence[torch.Tensor]], *, timeout: float) -> Future[Any]:
    """Rank r's ``inputs`` into ``outputs[r]`` at every rank (one all-gather of their bytes)."""
    flat = _flat_bytes(inputs)
    slots = [[Slot(o, read=False) for o in row] for row in outputs]

    def begin(g: Group) -> Awaitable[Any]:
        gathered = g.all_gather(flat, None, timeout)

        async def finish() -> None:
            rows = await gathered
            for r, row in enumerate(slots):
                offset = 0
                for slot in row:
                    size = slot.work.numel() * slot.work.element_size()
                    dtypes.wire(slot.work).reshape(-1).view(np.uint8)[:] = rows[r][offset:offset + size]
                    offset += size
                _put_back(row)
        return finish()
    return start(group, begin)


def barrier(group: SyncGroup, *, timeout: float) -> Future[Any]:
    return start(group, lambda g: g.barrier(timeout))


# -- point-to-point and the collectives built on it ------------------------------


def _joined(handles: list[Any], slots: Sequence[Slot]) -> Awaitable[Any]:
    async def finish() -> None:
        await asyncio.gather(*handles)
        _put_back(slots)
    return finish()


def send(group: SyncGroup, tensor: torch.Tensor, dst: int, tag: int, *, timeout: float) -> Future[Any]:
    slot = Slot(tensor)
    return start(group, lambda g: _joined([g.isend(slot.array, dst, tag, timeout)], []))


def recv(group: SyncGroup, tensor: torch.Tensor, src: int, tag: int, *, timeout: float) -> Future[Any]:
    slot = Slot(tensor, read=False)
    return start(group, lambda g: _joined([g.irecv(slot.array, src, tag, timeout)], [slot]))


def gather(group: SyncGroup, tensor: torch.Tensor, outputs: Sequence[torch.Tensor], root: int, *,
           timeout: float) -> Future[Any]:
    """Rank r's ``tensor`` into ``outputs[r]`` at ``root`` (the others' ``outputs`` are empty)."""
    mine = Slot(tensor)
    slots = [Slot(o, read=False) for o in outputs]

    def begin(g: Group) -> Awaitable[Any]:
        if g.site != root:
            return _joined([g.isend(mine.array, root, GATHER_TAG, timeout)], [])
        slots[root].work.copy_(mine.work)
        return _joined([g.irecv(slots[r].array, r, GATHER_TAG, timeout) for r in range(g.size) if r != root],
                       slots)
    return start(group, begin)


def scatter(group: SyncGroup, output: torch.Tensor, inputs: Sequence[torch.Tensor], root: int, *,
            timeout: float) -> Future[Any]:
    """``inputs[r]`` at ``root`` into rank r's ``output``."""
    out = Slot(output, read=False)
    slots = [Slot(t) for t in inputs]

    def begin(g: Group) -> Awaitable[Any]:
        if g.site != root:
            return _joined([g.irecv(out.array, root, SCATTER_TAG, timeout)], [out])
        out.work.copy_(slots[root].work)
        return _joined([g.isend(slots[r].array, r, SCATTER_TAG, timeout) for r in range(g.size) if r != root],
                       [out])
    return start(group, begin)


def all_to_all(group: SyncGroup, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *,
               timeout: float) -> Future[Any]:
    """``inputs[r]`` of every rank q into rank r's ``outputs[q]``."""
    outs = [Slot(o, read=False) for o in outputs]
    ins = [Slot(t) for t in inputs]

    def begin(g: Group) -> Awaitable[Any]:
        me = g.site
        handles = []
        for peer in range(g.size):
            if peer != me:
                handles.append(g.isend(ins[peer].array, peer, ALL_TO_ALL_TAG, timeout))
                handles.append(g.irecv(outs[peer].array, peer, ALL_TO_ALL_TAG, timeout))
        outs[me].work.copy_(ins[me].work)
        return _joined(handles, outs)
    return start(group, begin)
