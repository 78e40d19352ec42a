"""CUDA tensors cross sites through pinned host memory, chunk by chunk, copies overlapping transfer.

wanxport moves host memory, so a CUDA tensor is staged: chunk i+1 is copied device
-> pinned host (on a side stream) while chunk i is being all-reduced between sites,
and each reduced chunk is copied back as soon as it arrives. Every site must use the
same ``chunk_bytes`` (each chunk is one collective, matched by sequence and size).

No GPU exists on the machines this is developed on: the test is skipped there with
the reason, and the CPU path never imports CUDA state.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future as PyFuture

import torch

__all__ = ["CHUNK_BYTES", "staged_all_reduce"]

CHUNK_BYTES = 16 << 20

StartChunk = Callable[[torch.Tensor, int], "PyFuture[None]"]


def _chunks(numel: int, itemsize: int, chunk_bytes: int) -> list[slice]:
    per = max(1, chunk_bytes // itemsize)
    return [slice(i, min(i + per, numel)) for i in range(0, numel, per)]


def staged_all_reduce(tensor: torch.Tensor, start: StartChunk, chunk_bytes: int = CHUNK_BYTES) -> None:
    """All-reduce CUDA ``tensor`` in place: ``start(host_chunk, index)`` begins one chunk's cross-site
    all-reduce on pinned host memory (in place) and returns its future."""
    flat = tensor.view(-1)
    host = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
    stream = torch.cuda.Stream(device=tensor.device)
    stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the producer's writes first
    pieces = _chunks(flat.numel(), flat.element_size(), chunk_bytes)
    copied = []
    with torch.cuda.stream(stream):
        for piece in pieces:
            host[piece].copy_(flat[piece], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            copied.append(event)
    pending = []
    for index, (piece, event) in enumerate(zip(pieces, copied, strict=True)):
        event.synchronize()  # this chunk is on the host; later chunks keep copying meanwhile
        pending.append(start(host[piece], index))
    try:
        with torch.cuda.stream(stream):
            for piece, future in zip(pieces, pending, strict=True):
                future.result()
                flat[piece].copy_(host[piece], non_blocking=True)
    finally:
        stream.synchronize()
    torch.cuda.current_stream(tensor.device).wait_stream(stream)
