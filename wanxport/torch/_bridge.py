"""The DDP hook's all-reduce into ``wanxport.collective``, returning a ``concurrent.futures.Future``.

The hook starts collectives from torch's threads; the group
runs on its own event loop thread (``join_sync``). Each function here starts one
collective on that loop in call order (the group takes sequence numbers at call time,
so every site must start them in the same order) and returns a future that completes
once the result is in the caller's tensors. CPU tensors are shared with numpy, not
copied; CUDA tensors go through ``staging`` (blocking the caller until done, so the
chunks keep their place in the sequence); bfloat16, which numpy lacks, is reduced in
a float32 copy.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch

from wanxport.collective import SyncGroup
from wanxport.torch import staging

__all__ = ["all_reduce_start", "close", "cross_site_bytes", "done", "size"]


def size(group: SyncGroup) -> int:
    return group.size


def done() -> Future[None]:
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
        return done()
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


def cross_site_bytes(group: SyncGroup) -> int:
    """Collective bytes this site sent plus received so far (the group's last calls, both ways)."""
    return sum(s.sent_bytes + s.received_bytes for s in group.stats())


def close(group: SyncGroup) -> None:
    group.close()
