"""What the ``"wanxport"`` process group hands torch: its ``Work``, its options, and checks of op arguments.

torch's ``_create_work_from_future`` would swallow a failed future's error in
``wait()``; ``OpWork`` raises it (``CollectiveError`` naming the member) and answers
``result()`` with the op's output tensors, as gloo's work does. ``WanxportOptions``
is a ``c10d`` backend options object, so DeviceMesh (which reads ``_timeout``) and
``new_group(pg_options=...)`` take it as they take gloo's or NCCL's. ``compression``
sets, for the calling thread, the codec of the SUM/AVG all-reduces it starts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import Work
from torch.futures import Future

from wanxport.torch.config import SiteConfig
from wanxport.torch.rendezvous import PORTS_PER_RANK

__all__ = ["OpWork", "WanxportOptions", "after", "codec_in_use", "compression", "same", "same_dtype",
           "split_into", "split_rows"]


_local = threading.local()


@contextlib.contextmanager
def compression(codec: str | None) -> Iterator[None]:
    """Within the block, SUM/AVG all-reduces on a ``"wanxport"`` group travel as ``codec``
    (``None``, ``"bf16"``, ``"int8"``), with an error-feedback residual per tensor."""
    previous = getattr(_local, "codec", None)
    _local.codec = codec
    try:
        yield
    finally:
        _local.codec = previous


def codec_in_use() -> str | None:
    """The codec ``compression`` set for this thread (None: uncompressed)."""
    return getattr(_local, "codec", None)


class WanxportOptions(_C10dBackend.Options):
    """``pg_options`` of a wanxport group: the site's config (default: ``WANXPORT_TORCH_CONFIG``),
    this rank's index in its site (default: ``LOCAL_RANK``), its ports per path, and the
    group's timeout (``_timeout``, which DeviceMesh passes on to ``new_group``)."""

    def __init__(self, config: SiteConfig | None = None, *, local_rank: int | None = None,
                 ports_per_rank: int = PORTS_PER_RANK, timeout: timedelta = timedelta(minutes=30)) -> None:
        super().__init__("wanxport", timeout)
        self.config = config
        self.local_rank = local_rank
        self.ports_per_rank = ports_per_rank


class OpWork(Work):
    """An op in flight (see the module docstring); ``value``: its output tensors."""

    def __init__(self, pending: concurrent.futures.Future[Any] | None, future: Future[Any],
                 value: Any) -> None:
        super().__init__()
        self._pending = pending
        self._future = future
        self._value = value

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if timeout else 0.0
        if self._pending is not None and seconds > 0:
            concurrent.futures.wait([self._pending], seconds)
            if not self._pending.done():
                raise RuntimeError(f"wanxport: the op did not complete within {seconds:g} s")
        self._future.wait()  # raises the op's error
        return True

    def get_future(self) -> Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        if self._pending is None or not self._pending.done():
            return None
        return self._pending.exception()

    def result(self) -> list[torch.Tensor]:
        """The op's output tensors (gloo's ``Work.result()``), once it completed."""
        self.wait()
        value = self._value
        if value is None:
            return []
        if isinstance(value, torch.Tensor):
            return [value]
        return [t for row in value for t in (row if isinstance(row, list) else [row])]


def same(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> None:
    for t in tensors:
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise ValueError(f"every tensor must have {like.numel()} {like.dtype} elements, "
                             f"got {t.numel()} {t.dtype}")


def same_dtype(tensors: Sequence[torch.Tensor]) -> None:
    if len({t.dtype for t in tensors}) > 1:
        raise ValueError(f"the tensors must share one dtype, got {sorted({str(t.dtype) for t in tensors})}")


def split_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.detach().copy_(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()


def split_rows(tensor: torch.Tensor, splits: list[int], n: int, what: str) -> list[torch.Tensor]:
    rows = tensor.shape[0] if tensor.dim() else 1
    sizes = list(splits) if splits else [rows // n] * n
    if len(sizes) != n or sum(sizes) != rows or (not splits and rows % n):
        raise ValueError(f"all_to_all_single: the {what}'s {rows} rows do not split as "
                         f"{splits or 'equal parts'} over {n} ranks")
    return list(torch.split(tensor, sizes)) if tensor.dim() else [tensor]


def after(future: concurrent.futures.Future[Any],
          then: Callable[[], None]) -> concurrent.futures.Future[Any]:
    """A future that completes once ``future`` has and ``then()`` ran (or failed)."""
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(finished: concurrent.futures.Future[Any]) -> None:
        if finished.exception() is not None:
            out.set_exception(finished.exception())
            return
        try:
            then()
        except Exception as exc:  # noqa: BLE001 - the op's error, through its Work
            out.set_exception(exc)
        else:
            out.set_result(None)

    future.add_done_callback(done)
    return out
