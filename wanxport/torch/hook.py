"""A hierarchical DDP communication hook: gloo inside a site, wanxport between sites.

Each site runs its own ``torch.distributed`` world (as ``torchrun`` per site would) and
wraps its model in DDP over it; ``ddp.register_comm_hook(state, allreduce_hook)`` then
reduces each gradient bucket in three steps (DESIGN.md section 8)::

    reduce-scatter inside the site  ->  rank r <-> rank r at every other site  ->  all-gather
    (the site's gloo/NCCL group)        (this rank's own wanxport group)           inside the site

so R ranks per site each carry 1/R of the cross-site bytes over their own endpoint.
``torch.distributed`` places the ranks; wanxport adds no coordinator.

Ordering. gloo matches collectives by the order they are issued, so each intra-site
step runs on its own process group (created once, by every rank of the site, in
``HookState``): reduce-scatters are issued by the hook in bucket order (the order DDP
calls it, the same on every rank), all-gathers by one finishing thread in the same
order. The cross-site exchange of bucket k overlaps the reduce-scatter of bucket k+1.

Failure. Every intra-site collective is bounded by the state's timeout (the groups'
own gloo timeout and ``Work.wait``); a cross-site ``CollectiveError`` does not leave the
site's other ranks waiting in the all-gather: each rank's slice travels with one
status element, so every rank of the site learns at that all-gather that some rank
failed and fails the bucket too, naming the cause. After a failure the state refuses
further buckets at once (every rank of the site saw the same failure); rebuild the
groups to continue.
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

from wanxport.collective import CollectiveError
from wanxport.torch import _bridge

__all__ = ["HookState", "allreduce_hook"]

log = logging.getLogger(__name__)

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(eq=False)
class HookState:
    """What ``allreduce_hook`` needs: this rank's cross-site group and its site's process group.

    ``group``: this rank's wanxport group (``wanxport.collective``, sync wrapper), whose
    members are the same-index ranks of every site. ``process_group``: the site's world
    (default: the default group). Construct it on every rank of the site in the same
    order, since it creates two process groups of its own. ``timeout`` (seconds) bounds
    each bucket's intra-site steps and its cross-site exchange. ``compress``: ``None``,
    ``"bf16"`` or ``"int8"`` for the cross-site step (error feedback per bucket index).
    """

    group: Any
    process_group: dist.ProcessGroup | None = None
    timeout: float = 60.0
    compress: str | None = None
    _site_ranks: int = field(init=False, default=1)
    _site_rank: int = field(init=False, default=0)
    _rs_group: dist.ProcessGroup | None = field(init=False, default=None)
    _ag_group: dist.ProcessGroup | None = field(init=False, default=None)
    _start: ThreadPoolExecutor = field(init=False)
    _finish: ThreadPoolExecutor = field(init=False)
    _failed: BaseException | None = field(init=False, default=None)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout: {self.timeout} is not valid; use a number of seconds > 0")
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
    def world_size(self) -> int:
        """Ranks in the whole job: the site's ranks times the number of sites (the DDP mean's divisor)."""
        return self._site_ranks * _bridge.size(self.group)

    def close(self) -> None:
        """Stop the hook's threads (the process groups belong to torch.distributed)."""
        self._start.shutdown(wait=True)
        self._finish.shutdown(wait=True)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._failed is None:
                self._failed = exc


def allreduce_hook(state: HookState, bucket: GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: the mean of ``bucket`` over every rank of every site (see the module docstring)."""
    result: Future[torch.Tensor] = Future()
    if state._failed is not None:
        result.set_exception(CollectiveError(f"an earlier bucket failed: {state._failed}"))
        return result
    buffer = bucket.buffer()
    bucket_id = bucket.index()
    ranks = state._site_ranks
    if ranks == 1:
        piece = buffer.detach().clone()
        state._finish.submit(_finish_single, state, bucket_id, piece, result)
        return result
    chunk = -(-buffer.numel() // ranks)
    padded = buffer if chunk * ranks == buffer.numel() else torch.cat(
        [buffer, buffer.new_zeros(chunk * ranks - buffer.numel())])
    piece = buffer.new_empty(chunk)
    work = _reduce_scatter(piece, padded, group=state._rs_group, async_op=True)
    exchange = state._start.submit(_start_exchange, state, bucket_id, work, piece)
    state._finish.submit(_finish_bucket, state, buffer.numel(), piece, exchange, result)
    return result


def _start_exchange(state: HookState, bucket_id: int, work: dist.Work, piece: torch.Tensor) -> PyFuture[None]:
    """Wait for this rank's reduced slice, then start its cross-site all-reduce (stage one)."""
    work.wait(timedelta(seconds=state.timeout))
    return _bridge.all_reduce_start(state.group, piece, name=f"ddp-bucket-{bucket_id}/{piece.numel()}",
                                    compress=state.compress, timeout=state.timeout)


def _finish_single(state: HookState, bucket_id: int, piece: torch.Tensor,
                   result: Future[torch.Tensor]) -> None:
    """One rank per site: only the cross-site step."""
    try:
        _bridge.all_reduce_start(state.group, piece, name=f"ddp-bucket-{bucket_id}/{piece.numel()}",
                                 compress=state.compress, timeout=state.timeout).result()
        result.set_result(piece.div_(state.world_size))
    except Exception as exc:  # noqa: BLE001 - handed to DDP through the future
        state._fail(exc)
        result.set_exception(exc)


def _finish_bucket(state: HookState, numel: int, piece: torch.Tensor,
                   exchange: PyFuture[PyFuture[None]], result: Future[torch.Tensor]) -> None:
    """Wait for the cross-site step, then all-gather the slices with each rank's status (stage two)."""
    ranks, chunk = state._site_ranks, piece.numel()
    failure: BaseException | None = None
    try:
        exchange.result().result()
    except Exception as exc:  # noqa: BLE001 - the site's other ranks must hear of it
        failure = exc
        log.warning("cross-site exchange failed on site rank %d: %s", state._site_rank, exc)
    mine = torch.cat([piece, piece.new_full((1,), 0 if failure is None else 1)])
    try:
        gathered = piece.new_empty(ranks * (chunk + 1))
        work = _all_gather(gathered, mine, group=state._ag_group, async_op=True)
        work.wait(timedelta(seconds=state.timeout))
    except Exception as exc:  # noqa: BLE001 - handed to DDP through the future
        failure = failure or exc
        gathered = None
    if gathered is not None and failure is None:
        rows = gathered.view(ranks, chunk + 1)
        failed = [r for r in range(ranks) if rows[r, chunk].item() != 0]
        if not failed:
            reduced = rows[:, :chunk].reshape(-1)[:numel].div_(state.world_size)
            result.set_result(reduced)
            return
        failure = CollectiveError(f"site rank(s) {failed} failed the cross-site exchange")
    assert failure is not None
    state._fail(failure)
    result.set_exception(failure if isinstance(failure, CollectiveError)
                         else CollectiveError(f"intra-site step failed: {failure}"))
