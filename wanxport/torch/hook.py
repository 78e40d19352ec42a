"""A hierarchical DDP communication hook: gloo inside a site, wanxport between sites.

Each site runs its own ``torch.distributed`` world (as ``torchrun`` per site would) and
wraps its model in DDP over it; ``ddp.register_comm_hook(state, allreduce_hook)`` then
reduces each gradient bucket in three steps (docs/design.md section 8)::

    reduce-scatter inside the site  ->  rank r <-> rank r at every other site  ->  all-gather
    (the site's gloo/NCCL group)        (this rank's own wanxport group)           inside the site

so R ranks per site each carry 1/R of the cross-site bytes over their own endpoint.
``torch.distributed`` places the ranks; wanxport adds no coordinator.

Ordering. gloo matches collectives by the order they are issued, so each intra-site
step runs on its own process group (created once, by every rank of the site, in
``HookState``): reduce-scatters are issued by the hook in bucket order (the order DDP
calls it, the same on every rank), all-gathers by one finishing thread in the same
order. The cross-site exchange of bucket k overlaps the reduce-scatter of bucket k+1.

Pipelining. A bucket larger than ``chunk_bytes`` goes through the three steps in
chunks, each chunk as a bucket above: the WAN starts on the first chunk's slice while
the site still reduce-scatters the rest, and only the last chunk's all-gather follows
the last byte. Without it a 64 MiB bucket's intra-site steps (0.15-0.3 s each with gloo
on a loaded host) were added to its ~2 s WAN step. ``allreduce_tensor`` is the same
path for any tensor, for callers that are not DDP (the emulated benchmark).

Failure. Every intra-site collective is bounded by the state's timeout (the groups'
own gloo timeout and ``Work.wait``); a cross-site ``CollectiveError`` does not leave the
site's other ranks waiting in the all-gather: each rank's slice travels with one
status element, so every rank of the site learns at that all-gather that some rank
failed and fails the bucket too, naming the cause. After a failure the state refuses
further buckets at once (every rank of the site saw the same failure); rebuild the
groups to continue.

Elastic groups (``elastic_group``) need DDP built with ``find_unused_parameters=True``:
DDP otherwise re-buckets after its first step, and a restarted site's first step would
pair its buckets with differently laid-out ones (the hook refuses a re-bucketed layout
with a message saying so). When a site is lost mid-backward each rank's
cross-site call is retried among the survivors by its group, so the bucket completes
with the mean over the *live* sites: the cross-site step then averages ("mean", divided
by the live count of the epoch the call completed in) and the site's own ranks divide
by R. Where the group cannot retry (``MembershipChanged``) the status element says so,
every rank of the site fails the bucket with ``MembershipChanged`` and the state does
not latch it: the loop redoes the step after ``boundary``.
"""

# No ``from __future__ import annotations`` here: DDP compares the hook's annotations with
# ``dist.GradBucket`` and ``Future[torch.Tensor]`` as objects, not strings.
import logging
import threading
from concurrent.futures import Future as PyFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.futures import Future

from wanxport.collective import CollectiveError, MembershipChanged
from wanxport.torch import _bridge

__all__ = ["DEFAULT_CHUNK_BYTES", "HookState", "allreduce_hook", "allreduce_tensor", "chunk_bounds"]

log = logging.getLogger(__name__)

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: A bucket is pipelined in chunks of about this many bytes (see the module docstring).
#: Measured over the emulated allreduce-4route WAN, 64 MiB, 2 ranks per site: 4 MiB
#: gave efficiency 0.72-0.79, 2 MiB 0.69-0.74, 8 MiB 0.66-0.69, 1 MiB 0.63 (more CPU per
#: call), unchunked 0.58-0.61.
DEFAULT_CHUNK_BYTES = 4 << 20


@dataclass(eq=False)
class HookState:
    """What ``allreduce_hook`` needs: this rank's cross-site group and its site's process group.

    ``group``: this rank's wanxport group (``wanxport.collective``, sync wrapper), whose
    members are the same-index ranks of every site. ``process_group``: the site's world
    (default: the default group). Construct it on every rank of the site in the same
    order, since it creates two process groups of its own. ``timeout`` (seconds) bounds
    each bucket's intra-site steps and its cross-site exchange. ``compress``: ``None``,
    ``"bf16"`` or ``"int8"`` for the cross-site step (error feedback per bucket index).
    ``chunk_bytes``: with more than one rank per site, a bucket larger than this is
    pipelined in chunks of about this size (every rank of every site must use the same).
    """

    group: Any
    process_group: dist.ProcessGroup | None = None
    timeout: float = 60.0
    compress: str | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    _site_ranks: int = field(init=False, default=1)
    _site_rank: int = field(init=False, default=0)
    _rs_group: dist.ProcessGroup | None = field(init=False, default=None)
    _ag_group: dist.ProcessGroup | None = field(init=False, default=None)
    _start: ThreadPoolExecutor = field(init=False)
    _finish: ThreadPoolExecutor = field(init=False)
    _failed: BaseException | None = field(init=False, default=None)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _layouts: dict[int, tuple[tuple[int, ...], ...]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout: {self.timeout} is not valid; use a number of seconds > 0")
        chunk = self.chunk_bytes
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
            raise ValueError(f"chunk_bytes: {self.chunk_bytes!r} is not valid; use a number of bytes > 0")
        pg = self.process_group
        self._site_ranks = dist.get_world_size(pg)
        self._site_rank = dist.get_rank(pg)
        if self._site_ranks > 1:
            ranks = dist.get_process_group_ranks(pg) if pg is not None else None
            limit = timedelta(seconds=self.timeout)
            backend = str(dist.get_backend(pg))
            self._rs_group = dist.new_group(ranks, timeout=limit, backend=backend)
            self._ag_group = dist.new_group(ranks, timeout=limit, backend=backend)
        self._start = ThreadPoolExecutor(1, thread_name_prefix="wanxport-hook-start")
        self._finish = ThreadPoolExecutor(1, thread_name_prefix="wanxport-hook-finish")

    @property
    def elastic(self) -> bool:
        """Whether the cross-site group is elastic (its live size may change within a step)."""
        return hasattr(self.group, "boundary")

    @property
    def world_size(self) -> int:
        """Ranks in the whole job: the site's ranks times the number of sites (the DDP mean's divisor)."""
        return self._site_ranks * _bridge.size(self.group)

    def close(self) -> None:
        """Stop the hook's threads (the process groups belong to torch.distributed)."""
        self._start.shutdown(wait=True)
        self._finish.shutdown(wait=True)

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, MembershipChanged):
            return  # the step is redone after the group's boundary: later buckets may run
        with self._lock:
            if self._failed is None:
                self._failed = exc


REBUCKETED = ("DDP re-bucketed the gradients after its first step (bucket {index}'s parameters changed "
              "from {before} to {after}): in an elastic group a restarted site's first step would pair its "
              "buckets with differently laid-out ones at the live sites; construct DDP with "
              "find_unused_parameters=True, which keeps the constructor's buckets at every site and every "
              "restart")


def allreduce_hook(state: HookState, bucket: GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: the mean of ``bucket`` over every rank of every site (see the module docstring)."""
    buffer = bucket.buffer()
    if state.elastic:
        check_layout(state, bucket.index(), tuple(tuple(p.shape) for p in bucket.parameters()), buffer)
    if state._site_ranks == 1:
        buffer = buffer.detach().clone()  # one rank per site: the cross-site step reduces a copy
    return allreduce_tensor(state, buffer, name=f"ddp-bucket-{bucket.index()}", mean=True)


def check_layout(state: HookState, index: int, layout: tuple[tuple[int, ...], ...],
                 buffer: torch.Tensor) -> None:
    """Refuse a bucket whose parameters are not the ones this index held at the first step.

    DDP lays its first step out in one bucket and re-buckets after it in the order the
    gradients became ready, so a site that restarts runs its first step with the first
    layout while the live sites run the later one: same sizes, the gradients of different
    parameters summed together, a silently wrong step. Every rank of every site re-buckets
    at the same step, so every one refuses the same call."""
    before = state._layouts.setdefault(index, layout)
    if before != layout:
        reason = REBUCKETED.format(index=index, before=list(before), after=list(layout))
        _refuse(state, reason, buffer.numel(), buffer.element_size())


def allreduce_tensor(state: HookState, tensor: torch.Tensor, *, name: str, mean: bool = False,
                     ) -> Future[torch.Tensor]:
    """Sum (or with ``mean`` the mean) of 1-D CPU ``tensor`` over every rank of every site, in place.

    The hook's path (reduce-scatter, cross-site, all-gather; chunked past ``chunk_bytes``).
    Every rank of every site calls it in the same order with the same ``name``, which keys
    the cross-site error feedback. The future's value is ``tensor``.
    """
    result: Future[torch.Tensor] = Future()
    if state._failed is not None:
        result.set_exception(CollectiveError(f"an earlier bucket failed: {state._failed}"))
        return result
    ranks = state._site_ranks
    if tensor.dim() != 1 or not tensor.is_contiguous():
        _refuse(state, "allreduce_tensor: need a contiguous 1-D tensor", tensor.numel(),
                tensor.element_size())
    elastic = state.elastic
    divisor = (state._site_ranks if elastic else state.world_size) if mean else 1
    op = "mean" if mean and elastic else "sum"
    if ranks == 1:
        state._finish.submit(_finish_single, state, f"{name}/{tensor.numel()}", tensor, result, divisor, op)
        return result
    bounds = chunk_bounds(tensor.numel(), ranks, state.chunk_bytes, tensor.element_size())
    call = _Call(tensor, divisor, result, len(bounds))
    for index, (lo, hi, width) in enumerate(bounds):
        part = tensor[lo:hi]
        pad = width * ranks - (hi - lo)
        padded = torch.cat([part, part.new_zeros(pad)]) if pad else part
        piece = part.new_empty(width)
        work = _reduce_scatter(piece, padded, group=state._rs_group, async_op=True)
        exchange = state._start.submit(_start_exchange, state, f"{name}/{index}/{width}", work, piece, op)
        state._finish.submit(_finish_chunk, state, call, part, piece, exchange)
    return result


def _refuse(state: HookState, reason: str, numel: int, itemsize: int) -> None:
    """Raise ValueError for a call this rank refuses, after refusing in its wanxport group the
    cross-site calls it would have made (one per chunk), each on the thread that would have
    started it, so they keep their places and the other sites' matching calls fail with
    ``reason`` instead of pairing with this rank's next ones."""
    ranks = state._site_ranks
    calls = 1 if ranks == 1 else len(chunk_bounds(numel, ranks, state.chunk_bytes, itemsize))
    pool = state._finish if ranks == 1 else state._start
    for _ in range(calls):
        pool.submit(state.group.refuse, "all_reduce", reason)
    raise ValueError(reason)


def chunk_bounds(numel: int, ranks: int, chunk_bytes: int, itemsize: int) -> list[tuple[int, int, int]]:
    """``allreduce_tensor``'s chunks of ``numel`` elements: ``(start, end, width)``, where site
    rank r carries elements ``start + r * width`` up to ``start + (r + 1) * width`` of it across
    sites (the last chunk padded with zeros to ``ranks * width``)."""
    step = max(ranks, chunk_bytes // itemsize // ranks * ranks)
    return [(lo, min(lo + step, numel), -(-(min(lo + step, numel) - lo) // ranks))
            for lo in range(0, numel, step)] or [(0, 0, 0)]


@dataclass(eq=False)
class _Call:
    """One ``allreduce_tensor`` call's chunks: the finishing thread completes them in order."""

    tensor: torch.Tensor
    divisor: int
    result: Future[torch.Tensor]
    chunks_left: int
    failure: BaseException | None = None


def _start_exchange(state: HookState, name: str, work: dist.Work, piece: torch.Tensor, op: str,
                    ) -> PyFuture[None]:
    """Wait for this rank's reduced slice, then start its cross-site all-reduce (stage one)."""
    work.wait(timedelta(seconds=state.timeout))
    return _bridge.all_reduce_start(state.group, piece, op=op, name=name, compress=state.compress,
                                    timeout=state.timeout)


def _finish_single(state: HookState, name: str, piece: torch.Tensor,
                   result: Future[torch.Tensor], divisor: int, op: str) -> None:
    """One rank per site: only the cross-site step."""
    try:
        _bridge.all_reduce_start(state.group, piece, op=op, name=name, compress=state.compress,
                                 timeout=state.timeout).result()
        result.set_result(piece.div_(divisor) if divisor != 1 else piece)
    except Exception as exc:  # noqa: BLE001 - handed to DDP through the future
        state._fail(exc)
        result.set_exception(exc)


def _finish_chunk(state: HookState, call: _Call, part: torch.Tensor, piece: torch.Tensor,
                  exchange: PyFuture[PyFuture[None]]) -> None:
    """Wait for a chunk's cross-site step, then all-gather the slices with each rank's status
    (stage two) into ``part``; the call's last chunk completes its future."""
    failure = _gather_chunk(state, part, piece, exchange, call.divisor)
    if failure is not None and call.failure is None:
        call.failure = failure
        state._fail(failure)
    call.chunks_left -= 1
    if call.chunks_left:
        return
    if call.failure is None:
        call.result.set_result(call.tensor)
    else:
        call.result.set_exception(call.failure if isinstance(call.failure, CollectiveError)
                                  else CollectiveError(f"intra-site step failed: {call.failure}"))


def _gather_chunk(state: HookState, part: torch.Tensor, piece: torch.Tensor,
                  exchange: PyFuture[PyFuture[None]], divisor: int) -> BaseException | None:
    ranks, chunk = state._site_ranks, piece.numel()
    failure: BaseException | None = None
    try:
        exchange.result().result()
    except Exception as exc:  # noqa: BLE001 - the site's other ranks must hear of it
        failure = exc
        log.warning("cross-site exchange failed on site rank %d: %s", state._site_rank, exc)
    status = 0 if failure is None else 2 if isinstance(failure, MembershipChanged) else 1
    mine = torch.cat([piece, piece.new_full((1,), status)])
    try:
        gathered = piece.new_empty(ranks * (chunk + 1))
        work = _all_gather(gathered, mine, group=state._ag_group, async_op=True)
        work.wait(timedelta(seconds=state.timeout))
    except Exception as exc:  # noqa: BLE001 - handed to DDP through the future
        return failure or exc
    if failure is not None:
        return failure
    rows = gathered.view(ranks, chunk + 1)
    failed = [r for r in range(ranks) if rows[r, chunk].item() != 0]
    if failed:
        if all(rows[r, chunk].item() == 2 for r in failed):
            return MembershipChanged(f"site rank(s) {failed}: the membership changed mid-step; redo the step "
                                     "after boundary()")
        return CollectiveError(f"site rank(s) {failed} failed the cross-site exchange")
    part.copy_(rows[:, :chunk].reshape(-1)[:part.numel()])
    if divisor != 1:
        part.div_(divisor)
    return None
