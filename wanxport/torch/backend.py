"""The ``"wanxport"`` torch.distributed backend: process groups whose members are at different sites.

``import wanxport.torch`` registers it for CPU and CUDA tensors. Two worlds use it:

- one rank per site: ``init_process_group("wanxport", store=..., rank=site, world_size=n,
  pg_options=SiteConfig.load(FILE))`` (a DiLoCo outer group);
- one global world across sites (gloo or NCCL, one store every rank reaches), where
  ``new_group(ranks, backend="wanxport")`` or ``init_device_mesh(...,
  backend_override={"replicate": "wanxport"})`` makes the cross-site groups wanxport
  groups. Each rank's config comes from ``WanxportOptions`` / ``WANXPORT_TORCH_CONFIG``,
  its ports from the config and ``LOCAL_RANK`` (``rendezvous.PortBlock``).

Members meet through the group's c10d store (each publishes its identity name and
where it listens) and join a ``wanxport.collective`` group. torch 2.13 binds no
constructor for a Python ``c10d::Backend``, so the backend is what torch's own Python
backends are, a ``ProcessGroup`` subclass returned by the creator: torch calls its
methods from Python (``dist.send``, ``dist.gather`` ...) and from C++ through the
binding's overrides (DDP's reducer, functional collectives, FSDP2). Every op gloo
has is here (``ops``), with gloo's reduce-op and dtype rules (``dtypes``); each
returns a ``Work`` at once and completes when the collective does, so any number may
be in flight. A dead or stalled member makes ``wait()`` raise ``CollectiveError``
naming it, never hang.

A call this backend refuses at one member (outputs of the wrong size, ``ReduceOp.BAND``
on floats) raises ``ValueError`` there, but first takes its place in the group's
sequence and tells the others why (``Group.refuse``): their matching call fails with
``CollectiveError`` naming this member and the reason, and the next call pairs.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from wanxport.collective import CollectiveError
from wanxport.torch import _bridge, dtypes, ops, staging
from wanxport.torch.work import (
    OpWork,
    WanxportOptions,
    after,
    codec_in_use,
    compression,
    same,
    same_dtype,
    split_into,
    split_rows,
)

__all__ = ["BACKEND", "WanxportOptions", "WanxportProcessGroup", "compression"]

BACKEND = "wanxport"


def _opt(opts: Any, name: str, default: Any) -> Any:
    return getattr(opts, name, default) if opts is not None else default


class WanxportProcessGroup(dist.ProcessGroup):
    """A group whose members are at different sites, over a ``wanxport.collective`` group."""

    def __init__(self, group: Any, rank: int, size: int, timeout: float,
                 release_ports: Callable[[], None] = lambda: None) -> None:
        super().__init__(rank, size)
        self.group = group
        self.timeout = timeout
        self._release_ports = release_ports
        self._name = ""
        self._desc = ""

    # -- identity torch asks for (DeviceMesh, functional collectives resolve groups by name) --

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    # -- plumbing ------------------------------------------------------------------------

    def _work(self, start: Callable[[], concurrent.futures.Future[Any]], value: Any,
              tensors: Sequence[torch.Tensor] = ()) -> dist.Work:
        """A ``Work`` completing (with ``value``, or the op's error) with ``start()``'s future.
        With a CUDA tensor the op completes before this returns (its copies back are done)."""
        result: Future[Any] = Future()
        try:
            pending = start()
        except Exception as exc:  # noqa: BLE001 - reported through the Work, as torch's backends do
            result.set_exception(exc)
            return OpWork(None, result, value)
        if any(t.device.type != "cpu" for t in tensors):
            concurrent.futures.wait([pending])

        def done(finished: concurrent.futures.Future[Any]) -> None:
            error = finished.exception()
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(value)

        pending.add_done_callback(done)
        return OpWork(pending, result, value)

    def _checked(self, op: str, check: Callable[[], Any], *, collective: bool = True) -> Any:
        """``check()``'s value; a ValueError it raises is first refused in the group (the
        call takes its sequence number and the others hear why), then raised. Ops made of
        point-to-point calls (``collective=False``) raise here only: the others' matching
        calls fail at their timeout, naming this member."""
        try:
            return check()
        except ValueError as exc:
            text = str(exc) if str(exc).startswith(op) else f"{op}: {exc}"
            if collective:
                raise self.group.refuse(op, text) from None
            raise ValueError(text) from None

    def _reduce_name(self, op: str, opts: Any, dtype_of: Sequence[torch.Tensor]) -> str:
        def check() -> str:
            name = dtypes.op_name(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
            for t in dtype_of:
                dtypes.check_op(name, t.dtype, op)
            return name
        return self._checked(op, check)  # type: ignore[no-any-return]

    # -- reductions ----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        (tensor,) = tensors
        name = self._reduce_name("all_reduce", opts, [tensor])
        codec = codec_in_use()
        if tensor.device.type == "cuda" and dtypes.fast_path(name, tensor.dtype):
            def staged() -> concurrent.futures.Future[Any]:
                staging.staged_all_reduce(tensor, lambda chunk, i: ops.all_reduce(
                    self.group, chunk, name, compress=codec, timeout=self.timeout))
                return _bridge.done()
            return self._work(staged, tensors, tensors)
        return self._work(lambda: ops.all_reduce(self.group, tensor, name, compress=codec,
                                                 timeout=self.timeout), tensors, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        if not tensors:
            return self._work(_bridge.done, tensors)
        name = self._reduce_name("all_reduce_coalesced", opts, tensors)
        self._checked("all_reduce_coalesced", lambda: same_dtype(tensors))
        flat = torch.cat([t.detach().reshape(-1).cpu() for t in tensors])

        def start() -> concurrent.futures.Future[Any]:
            future = ops.all_reduce(self.group, flat, name, compress=None, timeout=self.timeout)
            return after(future, lambda: split_into(flat, tensors))
        return self._work(start, tensors, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        (tensor,) = tensors
        name = self._reduce_name("reduce", opts, [tensor])
        return self._work(lambda: ops.all_reduce(self.group, tensor, name, compress=None,
                                                 timeout=self.timeout,
                                                 root=opts.rootRank), tensors, tensors)

    def _reduce_scatter_flat(self, op: str, flat: torch.Tensor, outputs: list[torch.Tensor], opts: Any,
                             value: Any, bool_bytes: bool = False) -> dist.Work:
        name = self._reduce_name(op, opts, [flat])
        return self._work(lambda: ops.reduce_scatter(self.group, flat, outputs, name, timeout=self.timeout,
                                                     bool_bytes=bool_bytes), value, [flat, *outputs])

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        (output,), (inputs,) = outputs, input_lists

        def check() -> torch.Tensor:
            if len(inputs) != self.size():
                raise ValueError(f"need {self.size()} inputs, got {len(inputs)}")
            same(inputs, output)
            return torch.cat([t.detach().reshape(-1).cpu() for t in inputs])

        flat = self._checked("reduce_scatter", check)
        return self._reduce_scatter_flat("reduce_scatter", flat, [output], opts, outputs, bool_bytes=True)

    def _reduce_scatter_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> dist.Work:
        def check() -> torch.Tensor:
            if tensor.numel() != output.numel() * self.size() or tensor.dtype != output.dtype:
                raise ValueError(f"the input must be {self.size()} x the output's {output.numel()} "
                                 f"{output.dtype} elements, got {tensor.numel()} {tensor.dtype}")
            return tensor.detach().reshape(-1).cpu().clone()  # the input stays as given
        flat = self._checked("reduce_scatter", check)
        return self._reduce_scatter_flat("reduce_scatter", flat, [output], opts, output)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        def check() -> torch.Tensor:
            same_dtype([*outputs, *inputs])
            n = self.size()
            for o, t in zip(outputs, inputs, strict=True):
                if t.numel() != o.numel() * n:
                    raise ValueError(f"each input must be {n} x its output, got {t.numel()} for {o.numel()}")
            parts = [t.detach().reshape(n, -1).cpu() for t in inputs]
            return torch.cat([p[k] for k in range(n) for p in parts])  # rank k's outputs, one after another
        flat = self._checked("reduce_scatter", check)
        return self._reduce_scatter_flat("reduce_scatter", flat, outputs, opts, outputs)

    # -- data movement ---------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        (tensor,) = tensors
        return self._work(lambda: ops.broadcast(self.group, tensor, opts.rootRank, timeout=self.timeout),
                          tensors, tensors)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        (outputs,), (tensor,) = output_lists, inputs

        def check() -> None:
            if len(outputs) != self.size():
                raise ValueError(f"need {self.size()} outputs, got {len(outputs)}")
            same(outputs, tensor)
        self._checked("all_gather", check)
        rows = [[o] for o in outputs]
        return self._work(lambda: ops.all_gather_bytes(self.group, [tensor], rows, timeout=self.timeout),
                          output_lists, [tensor, *outputs])

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.allgather_into_tensor_coalesced([output], [tensor], opts, value=output)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        def check() -> None:
            if len(output_lists) != self.size() or any(len(row) != len(inputs) for row in output_lists):
                raise ValueError(f"need {self.size()} output lists of {len(inputs)} tensors")
            for row in output_lists:
                for o, t in zip(row, inputs, strict=True):
                    same([o], t)
        self._checked("all_gather_coalesced", check)
        return self._work(lambda: ops.all_gather_bytes(self.group, inputs, output_lists,
                                                       timeout=self.timeout),
                          output_lists, [*inputs, *(o for row in output_lists for o in row)])

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None, value: Any = None) -> dist.Work:
        n = self.size()

        def check() -> list[list[torch.Tensor]]:
            rows: list[list[torch.Tensor]] = [[] for _ in range(n)]
            for o, t in zip(outputs, inputs, strict=True):
                if o.numel() != t.numel() * n or o.dtype != t.dtype:
                    raise ValueError(f"the output needs {n} x {t.numel()} {t.dtype} elements, "
                                     f"got {o.numel()} {o.dtype}")
                parts = o.view(n, -1) if o.is_contiguous() else None
                if parts is None:
                    raise ValueError("the output tensor must be contiguous (it is filled in place)")
                for r in range(n):
                    rows[r].append(parts[r])
            return rows
        rows = self._checked("all_gather", check)
        return self._work(lambda: ops.all_gather_bytes(self.group, inputs, rows, timeout=self.timeout),
                          outputs if value is None else value, [*inputs, *outputs])

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> dist.Work:
        (tensor,), root = inputs, opts.rootRank
        outputs = output_lists[0] if output_lists else []

        def check() -> None:
            if self.rank() == root:
                if len(outputs) != self.size():
                    raise ValueError(f"need {self.size()} outputs at the root, got {len(outputs)}")
                same(outputs, tensor)
        self._checked("gather", check, collective=False)
        return self._work(lambda: ops.gather(self.group, tensor, outputs, root, timeout=self.timeout),
                          output_lists, [tensor, *outputs])

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any) -> dist.Work:
        (output,), root = outputs, opts.rootRank
        inputs = input_lists[0] if input_lists else []

        def check() -> None:
            if self.rank() == root:
                if len(inputs) != self.size():
                    raise ValueError(f"need {self.size()} inputs at the root, got {len(inputs)}")
                same(inputs, output)
        self._checked("scatter", check, collective=False)
        return self._work(lambda: ops.scatter(self.group, output, inputs, root, timeout=self.timeout),
                          outputs, [output, *inputs])

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> dist.Work:
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise ValueError(f"all_to_all: need {self.size()} inputs and outputs")
        return self._work(lambda: ops.all_to_all(self.group, outputs, inputs, timeout=self.timeout),
                          outputs, [*outputs, *inputs])

    def alltoall_base(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], opts: Any = None) -> dist.Work:
        n = self.size()
        outs = split_rows(output, output_splits, n, "output")
        ins = split_rows(tensor, input_splits, n, "input")
        if not output.is_contiguous():
            raise ValueError("all_to_all_single: the output tensor must be contiguous "
                             "(it is filled in place)")
        return self._work(lambda: ops.all_to_all(self.group, outs, ins, timeout=self.timeout),
                          output, [output, tensor])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        (tensor,) = tensors
        return self._work(lambda: ops.send(self.group, tensor, dst, tag, timeout=self.timeout),
                          tensors, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        (tensor,) = tensors
        return self._work(lambda: ops.recv(self.group, tensor, src, tag, timeout=self.timeout),
                          tensors, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        raise ValueError("recv: the wanxport backend matches messages by source; pass src")

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._work(lambda: ops.barrier(self.group, timeout=self.timeout), None)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """A barrier bounded by ``timeout``; raises naming the member(s) that did not arrive (the
        group is unusable afterwards, as after any timeout). torch's ``dist.monitored_barrier``
        admits gloo only: call this method on the group."""
        seconds = timeout.total_seconds() if timeout else self.timeout
        try:
            ops.barrier(self.group, timeout=seconds).result()
        except CollectiveError as exc:
            raise CollectiveError(f"monitored_barrier: not every rank arrived within {seconds:g} s: {exc}",
                                  exc.site) from None

    # all_gather_single etc. are torch 2.13's names for the forms above; earlier releases use the others.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    def shutdown(self) -> None:
        _bridge.close(self.group)
        self._release_ports()

    abort = shutdown
