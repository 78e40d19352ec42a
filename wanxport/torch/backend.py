"""The ``"wanxport"`` torch.distributed backend: a world of one rank per site.

``import wanxport.torch`` registers it; then, at every site::

    dist.init_process_group("wanxport", store=store, rank=site_index, world_size=n_sites,
                            pg_options=SiteConfig.load("site.toml"))   # or WANXPORT_TORCH_CONFIG

makes the sites one process group (a DiLoCo outer group, HSDP's replica dimension), on
which ``dist.all_reduce``, ``broadcast``, ``all_gather`` (list and single-tensor forms),
``reduce_scatter`` (both forms) and ``barrier`` run over ``wanxport.collective``. The
sites find each other through the c10d store (any the sites can reach: a TCPStore on
the control network, a FileStore in tests): each publishes its identity name and path
addresses from its ``SiteConfig`` and reads the others', so no file lists the peers.

torch.distributed hands a Python backend the op's tensors and options and wants a
``Work`` back; every op here is started on the group's event loop and its ``Work``
completes a ``torch.futures.Future`` when the collective does, so ``async_op=True``
overlaps several. Each call is bounded by the process group's timeout: a dead or
stalled site makes ``Work.wait()`` raise ``CollectiveError`` naming it, never hang.
``ReduceOp.SUM`` and ``AVG`` only (the collective's ``sum`` and ``mean``); others raise
``ValueError``. Cross-site compression: ``with wanxport.torch.compression("int8"):``.

A call this backend refuses at one site (a non-contiguous or CUDA tensor, an
unsupported reduce op, outputs of the wrong size) raises ``ValueError`` there, but
first takes its place in the group's sequence and tells the other sites why
(``Group.refuse``): their matching call fails with ``CollectiveError`` naming this
site and the reason, and the next call pairs as it should.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work
from torch.futures import Future

from wanxport.torch import _bridge
from wanxport.torch.config import ConfigError, SiteConfig
from wanxport.torch.rendezvous import join_through_store

__all__ = ["BACKEND", "WanxportProcessGroup", "compression", "cross_site_bytes", "register"]

BACKEND = "wanxport"

_local = threading.local()


@contextlib.contextmanager
def compression(codec: str | None) -> Iterator[None]:
    """Within the block, all-reduces on a ``"wanxport"`` group travel as ``codec``
    (``None``, ``"bf16"``, ``"int8"``), with an error-feedback residual per tensor."""
    previous = getattr(_local, "codec", None)
    _local.codec = codec
    try:
        yield
    finally:
        _local.codec = previous


def _op(reduce_op: Any) -> str:
    if reduce_op == dist.ReduceOp.SUM:
        return "sum"
    if reduce_op == dist.ReduceOp.AVG:
        return "mean"
    raise ValueError(f"the wanxport backend reduces with SUM or AVG, not {reduce_op}")


def _cpu(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: the wanxport process group takes CPU tensors "
                         f"(stage CUDA tensors with wanxport.torch.staging), got {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: the wanxport process group takes contiguous tensors")
    return tensor


class _Work(Work):
    """A collective in flight. torch's ``_create_work_from_future`` would swallow a failed
    future's error in ``wait()``; this one raises it (``CollectiveError`` naming the site)."""

    def __init__(self, pending: concurrent.futures.Future[Any] | None, future: Future[Any]) -> None:
        super().__init__()
        self._pending = pending
        self._future = future

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if timeout else 0.0
        if self._pending is not None and seconds > 0:
            concurrent.futures.wait([self._pending], seconds)
            if not self._pending.done():
                raise RuntimeError(f"wanxport: the collective did not complete within {seconds:g} s")
        self._future.wait()  # raises the collective's error
        return True

    def get_future(self) -> Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()


class WanxportProcessGroup(dist.ProcessGroup):
    """One rank per site over a ``wanxport.collective`` group (see the module docstring)."""

    def __init__(self, group: Any, rank: int, size: int, timeout: float) -> None:
        super().__init__(rank, size)
        self.group = group
        self.timeout = timeout

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def _work(self, start: Callable[[], Any], value: Any) -> dist.Work:
        """A ``Work`` that completes (with ``value``, or the collective's error) with ``start()``'s future."""
        result: Future[Any] = Future()
        try:
            pending = start()
        except Exception as exc:  # noqa: BLE001 - reported through the Work, as torch's backends do
            result.set_exception(exc)
            return _Work(None, result)

        def done(finished: Any) -> None:
            error = finished.exception()
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(value)

        pending.add_done_callback(done)
        return _Work(pending, result)

    def _checked(self, op: str, check: Callable[[], Any]) -> Any:
        """``check()``'s value; a ValueError it raises is first refused in the group (the
        call takes its sequence number and the other sites hear why), then raised."""
        try:
            return check()
        except ValueError as exc:
            raise self.group.refuse(op, str(exc)) from None

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        (tensor,) = tensors

        def check() -> str:
            _cpu(tensor, "all_reduce")
            return _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        op = self._checked("all_reduce", check)
        codec = getattr(_local, "codec", None)
        return self._work(lambda: _bridge.all_reduce_start(self.group, tensor, op=op, compress=codec,
                                                           timeout=self.timeout), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        (tensor,) = tensors
        self._checked("broadcast", lambda: _cpu(tensor, "broadcast"))
        return self._work(lambda: _bridge.broadcast_start(self.group, tensor, root=opts.rootRank,
                                                          timeout=self.timeout), tensors)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        (outputs,), (tensor,) = output_lists, inputs

        def check() -> None:
            for t in (tensor, *outputs):
                _cpu(t, "all_gather")
            _bridge.check_gather(self.group, tensor, list(outputs))

        self._checked("all_gather", check)
        return self._work(lambda: _bridge.all_gather_start(self.group, tensor, list(outputs),
                                                           timeout=self.timeout), output_lists)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> dist.Work:
        def check() -> list[torch.Tensor]:
            _cpu(tensor, "all_gather_single")
            if output.numel() != tensor.numel() * self.size():
                raise ValueError(f"all_gather_single: the output needs {self.size()} x {tensor.numel()} "
                                 f"elements, got {output.numel()}")
            outputs = list(_cpu(output, "all_gather_single output").view(self.size(), -1))
            _bridge.check_gather(self.group, tensor, outputs)
            return outputs

        outputs = self._checked("all_gather", check)
        return self._work(lambda: _bridge.all_gather_start(self.group, tensor, outputs,
                                                           timeout=self.timeout), output)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        (output,), (inputs,) = outputs, input_lists

        def check() -> tuple[str, torch.Tensor]:
            op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
            flat = torch.cat([_cpu(t, "reduce_scatter input").reshape(-1) for t in inputs])
            _cpu(output, "reduce_scatter")
            _bridge.check_scatter(self.group, flat, output)
            return op, flat

        op, flat = self._checked("reduce_scatter", check)
        return self._work(lambda: _bridge.reduce_scatter_start(self.group, flat, output, op=op,
                                                               timeout=self.timeout), outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, tensor: torch.Tensor,
                             opts: Any = None) -> dist.Work:
        def check() -> tuple[str, torch.Tensor]:
            op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
            flat = _cpu(tensor, "reduce_scatter_single input").reshape(-1).clone()  # the input stays as given
            _cpu(output, "reduce_scatter_single")
            _bridge.check_scatter(self.group, flat, output)
            return op, flat

        op, flat = self._checked("reduce_scatter", check)
        return self._work(lambda: _bridge.reduce_scatter_start(self.group, flat, output, op=op,
                                                               timeout=self.timeout), output)

    # torch 2.13 calls the single-tensor forms by these names; earlier releases by the underscored ones.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._work(lambda: _bridge.barrier_start(self.group, timeout=self.timeout), None)

    def shutdown(self) -> None:
        _bridge.close(self.group)


def cross_site_bytes(pg: dist.ProcessGroup | None = None) -> int:
    """Collective bytes this site's wanxport group sent plus received so far (``pg``: default group)."""
    group = dist.group.WORLD if pg is None else pg
    if not isinstance(group, WanxportProcessGroup):
        raise ValueError(f"cross_site_bytes: {group!r} is not a 'wanxport' process group")
    return _bridge.cross_site_bytes(group.group)


def _create(options: Any, backend_options: Any) -> WanxportProcessGroup:
    """torch's extended-API creator: rendezvous through the store, then join the sites' group."""
    config = backend_options if isinstance(backend_options, SiteConfig) else None
    if backend_options is not None and config is None:
        raise ConfigError(f"pg_options for the wanxport backend must be a SiteConfig, "
                          f"got {backend_options!r}")
    if config is None:
        config = SiteConfig.from_env()
    timeout = options.timeout.total_seconds() if isinstance(options.timeout, timedelta) else 1800.0
    group = join_through_store(options.store, options.group_rank, options.group_size, config,
                                       timeout=timeout)
    return WanxportProcessGroup(group, options.group_rank, options.group_size, timeout)


def register() -> None:
    """Register the ``"wanxport"`` backend with torch.distributed (idempotent; done on import)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
