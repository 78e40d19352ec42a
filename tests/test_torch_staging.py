"""CUDA staging without a GPU: the chunking and ordering logic against a stand-in for the device.

``staging`` takes its device side as an object (``CudaCopies`` on a GPU); here a
stand-in copies at once and records every copy, wait, start and finish, so the
order the GPU path relies on is checked on any machine: every device-to-host copy
is queued before the first wait (copies overlap the transfers), chunk i's
collective starts only after chunk i's copy is waited for and in index order, a
chunk is copied back only once its collective is done, and the side stream is
finished last, also when a chunk fails. The real CUDA path runs in
tests/test_torch_cuda.py (skipped without a GPU) and benchmarks/torch_cuda_check.sh.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

torch = pytest.importorskip("torch",
                            reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from wanxport.torch import staging  # noqa: E402
from wanxport.torch.ops import Slot  # noqa: E402


class RecordingCopies:
    """Copies now; ``log`` holds (what, first element) in call order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def host_buffer(self, like: Any) -> Any:
        return torch.empty(like.numel(), dtype=like.dtype)

    def to_host(self, src: Any, dst: Any) -> int:
        dst.copy_(src)
        self.log.append(("to_host", self._start(src)))
        return self._start(src)

    def wait(self, marker: int) -> None:
        self.log.append(("wait", marker))

    def to_device(self, src: Any, dst: Any) -> None:
        dst.copy_(src)
        self.log.append(("to_device", self._start(dst)))

    def finish(self) -> None:
        self.log.append(("finish", -1))

    def _start(self, view: Any) -> int:
        return (view.data_ptr() - self.base) // view.element_size()

    base = 0


def doubling(log: list[tuple[str, int]], fail_at: int | None = None) -> Any:
    """A chunk's "cross-site all-reduce" of two equal sites: it doubles the chunk."""
    def start(chunk: Any, index: int) -> Future[None]:
        log.append(("start", index))
        done: Future[None] = Future()
        if index == fail_at:
            done.set_exception(RuntimeError(f"chunk {index} failed"))
        else:
            chunk.mul_(2)
            done.set_result(None)
        return done
    return start


def test_chunks_cover_the_tensor_in_pieces_of_about_chunk_bytes() -> None:
    pieces = staging.chunks(10_000, 4, 4096)
    assert [p.stop - p.start for p in pieces] == [1024] * 9 + [784]
    assert staging.chunks(0, 4, 4096) == []
    assert staging.chunks(3, 8, 1) == [slice(0, 1), slice(1, 2), slice(2, 3)]


def test_staged_all_reduce_overlaps_copies_and_keeps_chunk_order() -> None:
    device_tensor = torch.arange(10_000, dtype=torch.float32)
    copies = RecordingCopies()
    copies.base = device_tensor.data_ptr()
    staging.staged_all_reduce(device_tensor, doubling(copies.log), chunk_bytes=4096, copies=copies)
    assert torch.equal(device_tensor, torch.arange(10_000, dtype=torch.float32) * 2)
    kinds = [k for k, _ in copies.log]
    assert kinds[:10] == ["to_host"] * 10  # every chunk's copy queued before the first wait
    starts = [i for k, i in copies.log if k == "start"]
    assert starts == list(range(10))
    for index in range(10):
        assert copies.log.index(("wait", index * 1024)) < copies.log.index(("start", index))
        assert copies.log.index(("start", index)) < copies.log.index(("to_device", index * 1024))
    assert copies.log[-1] == ("finish", -1)


def test_a_failed_chunk_raises_and_the_side_stream_is_still_finished() -> None:
    device_tensor = torch.ones(4096)
    copies = RecordingCopies()
    copies.base = device_tensor.data_ptr()
    with pytest.raises(RuntimeError, match="chunk 1 failed"):
        staging.staged_all_reduce(device_tensor, doubling(copies.log, fail_at=1), chunk_bytes=4096,
                                  copies=copies)
    assert copies.log[-1] == ("finish", -1)


def test_a_non_contiguous_tensor_is_staged_and_written_back_through_its_view() -> None:
    base = torch.arange(64, dtype=torch.float64).reshape(8, 8)
    view = base.t()
    staging.staged_all_reduce(view, doubling([]), chunk_bytes=64, copies=RecordingCopies())
    assert torch.equal(base, torch.arange(64, dtype=torch.float64).reshape(8, 8) * 2)


def test_to_host_and_back_in_chunks_keep_shape_dtype_and_bits() -> None:
    device_tensor = torch.randn(33, 7, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    copies = RecordingCopies()
    host = staging.to_host(device_tensor, copies, chunk_bytes=50)
    assert host.shape == device_tensor.shape and host.dtype == torch.bfloat16
    assert torch.equal(host, device_tensor)
    target = torch.zeros(7, 33, dtype=torch.bfloat16).t()  # a non-contiguous destination
    staging.to_device(host * 2, target, copies, chunk_bytes=50)
    assert torch.equal(target, device_tensor * 2)
    assert copies.log[-1] == ("finish", -1)


def test_a_tensor_on_a_device_other_than_cuda_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="stages CUDA tensors"):
        Slot(torch.empty(3, device="meta"))
