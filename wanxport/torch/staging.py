"""CUDA tensors cross sites through pinned host memory, chunk by chunk, copies overlapping transfer.

wanxport moves host memory, so a CUDA tensor is staged: its chunks are copied device
-> pinned host on a side stream (which first waits for the producer's stream), each
chunk's copy marked by an event. ``staged_all_reduce`` starts chunk i's cross-site
all-reduce as soon as chunk i's event fires, while chunks i+1.. are still copying,
and copies each reduced chunk back as it arrives. Every site must use the same
``chunk_bytes`` (each chunk is one collective, matched by sequence and size). Other
ops stage the whole tensor (``to_host``) and copy results back (``to_device``), with
the same chunked copies.

The device side is a small object (``CudaCopies``: a side stream and its events),
so the chunking and ordering logic runs in tests without a GPU against a stand-in
that records the order of copies, waits and starts. Where torch has no CUDA, nothing
here touches CUDA state.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future as PyFuture
from typing import Any, Protocol

import torch

__all__ = ["CHUNK_BYTES", "Copies", "CudaCopies", "chunks", "pinned", "staged_all_reduce", "to_device",
           "to_host"]

CHUNK_BYTES = 16 << 20

StartChunk = Callable[[torch.Tensor, int], "PyFuture[Any]"]


class Copies(Protocol):
    """How chunks move between the device and host memory (``CudaCopies`` on a GPU)."""

    def host_buffer(self, like: torch.Tensor) -> torch.Tensor: ...
    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> Any: ...  # returns a marker to ``wait`` on
    def wait(self, marker: Any) -> None: ...
    def to_device(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...
    def finish(self) -> None: ...


class CudaCopies:
    """Chunk copies on a side stream that starts after the producer's (current) stream and
    that the current stream waits for at ``finish``; host buffers are pinned."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.stream.wait_stream(torch.cuda.current_stream(device))  # the producer's writes first

    def host_buffer(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.numel(), dtype=like.dtype, pin_memory=True)

    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> Any:
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return event

    def wait(self, marker: Any) -> None:
        marker.synchronize()

    def to_device(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def finish(self) -> None:
        self.stream.synchronize()  # the host buffers may be reused once this returns
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


def _copies_for(tensor: torch.Tensor) -> Copies:
    if tensor.device.type != "cuda":
        raise ValueError(f"a {tensor.device} tensor: the wanxport backend stages CUDA tensors through host "
                         f"memory and takes CPU tensors as they are")
    return CudaCopies(tensor.device)


def pinned(tensor: torch.Tensor) -> bool:
    """Whether host copies of ``tensor`` are pinned (they are for CUDA tensors)."""
    return tensor.device.type == "cuda"


def chunks(numel: int, itemsize: int, chunk_bytes: int) -> list[slice]:
    """Element ranges of about ``chunk_bytes`` each (at least one element), covering ``numel``."""
    per = max(1, chunk_bytes // max(1, itemsize))
    return [slice(i, min(i + per, numel)) for i in range(0, numel, per)]


def to_host(tensor: torch.Tensor, copies: Copies | None = None,
            chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """A host copy of device ``tensor`` (same shape, contiguous), copied in chunks."""
    copies = copies or _copies_for(tensor)
    flat = tensor.detach().contiguous().view(-1)
    host = copies.host_buffer(flat)
    pieces = chunks(flat.numel(), flat.element_size(), chunk_bytes)
    markers = [copies.to_host(flat[p], host[p]) for p in pieces]
    for marker in markers:
        copies.wait(marker)
    return host.view(tensor.shape)


def to_device(host: torch.Tensor, tensor: torch.Tensor, copies: Copies | None = None,
              chunk_bytes: int = CHUNK_BYTES) -> None:
    """Copy ``host`` (contiguous, ``tensor``'s shape) into device ``tensor``, in chunks."""
    copies = copies or _copies_for(tensor)
    target = tensor.detach()
    flat = target.view(-1) if target.is_contiguous() else torch.empty(
        target.shape, dtype=target.dtype, device=target.device).view(-1)
    source = host.reshape(-1)
    for piece in chunks(flat.numel(), flat.element_size(), chunk_bytes):
        copies.to_device(source[piece], flat[piece])
    copies.finish()
    if not target.is_contiguous():
        target.copy_(flat.view(target.shape))


def staged_all_reduce(tensor: torch.Tensor, start: StartChunk, chunk_bytes: int = CHUNK_BYTES,
                      copies: Copies | None = None) -> None:
    """All-reduce device ``tensor`` in place: ``start(host_chunk, index)`` begins one chunk's
    cross-site all-reduce on host memory (in place) and returns its future. Chunk i starts
    as soon as its copy lands; chunks are started in index order at every site."""
    copies = copies or _copies_for(tensor)
    target = tensor.detach()
    flat = target.view(-1) if target.is_contiguous() else target.contiguous().view(-1)
    host = copies.host_buffer(flat)
    pieces = chunks(flat.numel(), flat.element_size(), chunk_bytes)
    markers = [copies.to_host(flat[p], host[p]) for p in pieces]  # all queued at once on the side stream
    pending = []
    try:
        for index, (piece, marker) in enumerate(zip(pieces, markers, strict=True)):
            copies.wait(marker)  # this chunk is on the host; later chunks keep copying meanwhile
            pending.append(start(host[piece], index))
        for piece, future in zip(pieces, pending, strict=True):
            future.result()
            copies.to_device(host[piece], flat[piece])
    finally:
        copies.finish()
    if flat.data_ptr() != target.data_ptr():
        target.copy_(flat.view(target.shape))
