"""Tensors into ``wanxport.collective`` calls, each returning a ``concurrent.futures.Future``.

The hook and the process group start collectives from torch's threads; the group
runs on its own event loop thread (``join_sync``). Each function here starts one
collective on that loop in call order (the group takes sequence numbers at call time,
so every site must start them in the same order) and returns a future that completes
once the result is in the caller's tensors. CPU tensors are shared with numpy, not
copied; CUDA tensors go through ``staging`` (blocking the caller until done, so the
chunks keep their place in the sequence); bfloat16, which numpy lacks, is reduced in
a float32 copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

import torch

from wanxport.collective import SyncGroup
from wanxport.torch import staging

__all__ = ["all_gather_start", "all_reduce_start", "barrier_start", "broadcast_start", "check_gather",
           "check_scatter", "close", "cross_site_bytes", "reduce_scatter_start", "size"]


def size(group: SyncGroup) -> int:
    return group.size


def _submit(group: SyncGroup, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
    return asyncio.run_coroutine_threadsafe(coro, group.loop)


def _done() -> Future[None]:
    finished: Future[None] = Future()
    finished.set_result(None)
    return finished


def all_reduce_start(group: SyncGroup, tensor: torch.Tensor, *, op: str = "sum", compress: str | None = None,
                     timeout: float | None = None, name: str | None = None) -> Future[Any]:
    """Reduce ``tensor`` in place over the group's sites."""
    if tensor.is_cuda:
        staging.staged_all_reduce(tensor, lambda chunk, i: all_reduce_start(
            group, chunk, op=op, compress=compress, timeout=timeout,
            name=None if name is None else f"{name}/{i}"))
        return _done()
    if tensor.dtype == torch.bfloat16:
        wide = tensor.float()
        inner = group.all_reduce_async(wide, op, compress, timeout, name).future
        out: Future[Any] = Future()

        def narrow(done: Future[Any]) -> None:
            if done.exception() is not None:
                out.set_exception(done.exception())
                return
            tensor.copy_(wide)
            out.set_result(tensor)

        inner.add_done_callback(narrow)
        return out
    return group.all_reduce_async(tensor, op, compress, timeout, name).future


def broadcast_start(group: SyncGroup, tensor: torch.Tensor, *, root: int,
                    timeout: float | None) -> Future[Any]:
    return _submit(group, group.group.broadcast(tensor, root, timeout))


def all_gather_start(group: SyncGroup, tensor: torch.Tensor, outputs: list[torch.Tensor], *,
                     timeout: float | None) -> Future[Any]:
    """Site k's ``tensor`` into ``outputs[k]`` at every site (each the input's size and dtype)."""
    check_gather(group, tensor, outputs)

    async def gather() -> None:
        gathered = await group.group.all_gather(tensor, None, timeout)
        for k, out in enumerate(outputs):
            out.detach().numpy().reshape(-1)[:] = gathered[k].reshape(-1)

    return _submit(group, gather())


def reduce_scatter_start(group: SyncGroup, flat: torch.Tensor, output: torch.Tensor, *, op: str,
                         timeout: float | None) -> Future[Any]:
    """Part k of 1-D ``flat`` (``group.size`` equal parts), reduced over the sites, into site k's ``output``.
    ``flat`` is the caller's to lose: the collective reduces in it."""
    check_scatter(group, flat, output)

    async def scatter() -> None:
        part = await group.group.reduce_scatter(flat, op, None, timeout)
        output.detach().numpy().reshape(-1)[:] = part

    return _submit(group, scatter())


def check_gather(group: SyncGroup, tensor: torch.Tensor, outputs: list[torch.Tensor]) -> None:
    """ValueError unless ``outputs`` are ``group.size`` tensors of the input's size and dtype."""
    if len(outputs) != group.size or any(o.numel() != tensor.numel() or o.dtype != tensor.dtype
                                         for o in outputs):
        raise ValueError(f"all_gather: need {group.size} outputs of {tensor.numel()} {tensor.dtype} elements")


def check_scatter(group: SyncGroup, flat: torch.Tensor, output: torch.Tensor) -> None:
    """ValueError unless 1-D ``flat`` is ``group.size`` times ``output`` (same dtype)."""
    if flat.numel() != output.numel() * group.size or flat.dtype != output.dtype:
        raise ValueError(f"reduce_scatter: the input must be {group.size} x the output's "
                         f"{output.numel()} {output.dtype} elements, got {flat.numel()} {flat.dtype}")


def barrier_start(group: SyncGroup, *, timeout: float | None) -> Future[Any]:
    return _submit(group, group.group.barrier(timeout))


def cross_site_bytes(group: SyncGroup) -> int:
    """Collective bytes this site sent plus received so far (the group's last calls, both ways)."""
    return sum(s.sent_bytes + s.received_bytes for s in group.stats())


def close(group: SyncGroup) -> None:
    group.close()
