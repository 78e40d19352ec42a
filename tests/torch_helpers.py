"""Shared helpers of the wanxport.torch tests: rank processes that always end, and their workers.

Each test starts real processes (spawn: one torch.distributed world each, as a job
would); ``run_ranks`` waits for them with a deadline and kills what is left, so a
hang fails the test instead of wedging the suite. Workers report through JSON files.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any


def run_ranks(target: Callable[..., None], n: int, args: tuple[Any, ...],
              deadline_s: float) -> list[int | None]:
    """Run ``target(index, *args)`` in ``n`` spawned processes; their exit codes (None: killed)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(i, *args), daemon=True) for i in range(n)]
    for proc in procs:
        proc.start()
    end = time.monotonic() + deadline_s
    for proc in procs:
        proc.join(max(0.0, end - time.monotonic()))
    codes: list[int | None] = []
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
            codes.append(None)
        else:
            codes.append(proc.exitcode)
    return codes


def write(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result))


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


# -- the "wanxport" process group ------------------------------------------------


def pg_worker(site: int, work: Path, ports: list[int], timeout: float) -> None:
    """Site ``site`` of two: every collective of the process group, then a peer that stops."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import wanxport.torch as wt

    config = wt.SiteConfig.make(work / "pki" / f"site-{site}", work / "pki" / "ca.pem",
                                [f"127.0.0.1:{p}" for p in ports])
    store = dist.FileStore(str(work / "store"), 2)
    dist.init_process_group("wanxport", store=store, rank=site,
                            world_size=2, pg_options=config, timeout=timedelta(seconds=timeout))
    out: dict[str, Any] = {"backend": str(dist.get_backend()), "rank": dist.get_rank(),
                           "world": dist.get_world_size()}
    rng = np.random.default_rng(site)
    x = torch.from_numpy(rng.standard_normal(1000).astype(np.float32))
    out["input"] = x.tolist()
    summed = x.clone()
    dist.all_reduce(summed)
    out["sum"] = summed.tolist()
    mean = x.clone()
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    out["mean"] = mean.tolist()
    b = torch.full((3, 4), float(site))
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    gathered = [torch.empty(5, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(gathered, torch.arange(5) + 10 * site)
    out["all_gather"] = [g.tolist() for g in gathered]
    single = torch.empty(2, 3)
    dist.all_gather_into_tensor(single, torch.full((3,), site + 0.5))
    out["all_gather_single"] = single.tolist()
    part = torch.empty(4)
    dist.reduce_scatter(part, [torch.full((4,), 1.0 + site), torch.full((4,), 10.0 + site)])
    out["reduce_scatter"] = part.tolist()
    flat_in = torch.arange(8, dtype=torch.float32) * (site + 1)
    half = torch.empty(4)
    dist.reduce_scatter_tensor(half, flat_in)
    out["reduce_scatter_single"] = half.tolist()
    out["reduce_scatter_single_input_kept"] = bool(torch.equal(flat_in, torch.arange(8.0) * (site + 1)))
    dist.barrier()
    first, second = torch.ones(10_000) * (site + 1), torch.ones(7) * (site + 2)
    works = [dist.all_reduce(first, async_op=True), dist.all_reduce(second, async_op=True)]
    for w in works:
        w.wait()
    out["async"] = [first[0].item(), second[0].item()]
    before = wt.cross_site_bytes()
    grads = torch.from_numpy(rng.standard_normal(1 << 16).astype(np.float32))
    plain = grads.clone()
    dist.all_reduce(plain)
    middle = wt.cross_site_bytes()
    with wt.compression("int8"):
        packed = grads.clone()
        dist.all_reduce(packed)
    after = wt.cross_site_bytes()
    out["bytes_none"], out["bytes_int8"] = middle - before, after - middle
    out["int8_max_error"] = float((packed - plain).abs().max())
    out["int8_scale_bound"] = float(2 * grads.abs().max() / 127)  # two contributions, half a step each
    top = torch.tensor([float(site), 5.0 - site])
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    out["max"] = top.tolist()
    try:
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND)
    except ValueError as exc:
        out["band_error"] = str(exc)
    square = torch.arange(100.0).reshape(10, 10)
    view = square.t()  # non-contiguous: reduced in a contiguous copy, written back through the view
    dist.all_reduce(view)
    out["transposed_sum"] = bool(torch.equal(square, torch.arange(100.0).reshape(10, 10) * 2))
    # Site 0 asks for a bitwise AND of floats (refused there); site 1's matching call must fail
    # naming site 0 and the reason, and the next call must still pair (101 at both, never 11).
    try:
        bad_or_good = torch.ones(4) if site == 0 else torch.ones(4, dtype=torch.int32)
        dist.all_reduce(bad_or_good, op=dist.ReduceOp.BAND)
        out["refused"] = "returned"
    except Exception as exc:  # noqa: BLE001 - the test checks what it was
        out["refused"] = f"{type(exc).__name__}: {exc}"
    after = torch.full((4,), 100.0 if site == 0 else 1.0)
    dist.all_reduce(after)
    out["after_refused"] = after.tolist()
    # Site 1 stops calling: site 0's next collective must fail within the timeout.
    if site == 0:
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(16))
            out["stalled"] = "returned"
        except Exception as exc:  # noqa: BLE001 - the test checks what it was
            out["stalled"] = f"{type(exc).__name__}: {exc}"
        out["stalled_s"] = time.monotonic() - started
        store.set("stall-over", "1")
    else:  # alive but silent (a stalled site, not a closed session) until site 0 has its error
        store.wait(["stall-over"], timedelta(seconds=3 * timeout))
    write(work / f"site-{site}.json", out)
    dist.destroy_process_group()


# -- the DDP hook with a rank that dies --------------------------------------------


def two_site_rank(global_rank: int, work: Path, first_port: int, timeout: float) -> Any:
    """Rank ``global_rank`` of 2 sites x 2 ranks over loopback: its site's gloo world (a
    FileStore) and its wanxport group with the same-index rank of the other site. ``timeout``
    bounds the group's calls (and the hook's, given to ``HookState``); the site's default gloo
    group, which only sets DDP up here, gets at least 60 s, as setup on a busy host may take."""
    import torch.distributed as dist

    from wanxport.collective import join_sync

    site, rank = divmod(global_rank, 2)
    dist.init_process_group("gloo", store=dist.FileStore(str(work / f"store-{site}"), 2), rank=rank,
                            world_size=2, timeout=timedelta(seconds=max(timeout, 60.0)))
    pki = work / "pki"
    return join_sync(site, ["site-0", "site-1"], identity=pki / f"site-{site}", ca=pki / "ca.pem",
                     paths=[f"127.0.0.1:{first_port + 2 * rank + i}" for i in range(2)], timeout=timeout)


def hook_failure_worker(global_rank: int, work: Path, first_port: int, timeout: float) -> None:
    """2 sites x 2 ranks; after one good step site 1's rank 0 is killed; the others must raise."""
    import os
    import signal

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from wanxport.torch import HookState, allreduce_hook

    group = two_site_rank(global_rank, work, first_port, timeout)
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(64, 64), bucket_cap_mb=0.004)
    state = HookState(group, timeout=timeout)
    ddp.register_comm_hook(state, allreduce_hook)
    out: dict[str, Any] = {"rank": global_rank}
    x = torch.randn(8, 64)
    ddp(x).sum().backward()
    out["first_step"] = "ok"
    if global_rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        ddp(x).sum().backward()
        out["second_step"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the test checks what it was
        out["second_step"] = f"{type(exc).__name__}: {exc}"
    out["second_step_s"] = time.monotonic() - started
    out["refused_after"] = ""
    try:
        ddp(x).sum().backward()
    except Exception as exc:  # noqa: BLE001
        out["refused_after"] = str(exc)
    write(work / f"rank-{global_rank}.json", out)
    os._exit(0)  # the gloo group has a dead member: skip its teardown


def chunked_worker(global_rank: int, work: Path, first_port: int, timeout: float) -> None:
    """2 sites x 2 ranks: ``allreduce_tensor`` over several chunks (the last one padded)."""
    import hashlib

    import numpy as np
    import torch
    import torch.distributed as dist

    from wanxport.torch import HookState, allreduce_tensor

    group = two_site_rank(global_rank, work, first_port, timeout)
    count = 10_007  # 16 KiB chunks (4,096 elements): two whole ones and a padded third
    inputs = [np.random.default_rng([7, g]).standard_normal(count).astype(np.float32) for g in range(4)]
    state = HookState(group, timeout=timeout, chunk_bytes=16_384)
    out: dict[str, Any] = {"rank": global_rank}
    for mean in (False, True):
        tensor = torch.from_numpy(inputs[global_rank].copy())
        got = allreduce_tensor(state, tensor, name=f"t-{mean}", mean=mean).wait()
        exact = np.sum(np.stack(inputs).astype(np.float64), axis=0) / (4 if mean else 1)
        out[f"same_tensor_{mean}"] = got.data_ptr() == tensor.data_ptr()
        out[f"max_err_{mean}"] = float(np.max(np.abs(tensor.numpy() - exact)))
        out[f"digest_{mean}"] = hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
    state.close()
    group.close()
    dist.destroy_process_group()
    write(work / f"rank-{global_rank}.json", out)


def refused_hook_worker(site: int, work: Path, first_port: int, timeout: float) -> None:
    """2 sites x 1 rank: site 0 hands ``allreduce_tensor`` a strided view (refused), site 1 a
    good tensor; then both a good one. Records what each call gave."""
    import torch
    import torch.distributed as dist

    from wanxport.collective import join_sync
    from wanxport.torch import HookState, allreduce_tensor

    dist.init_process_group("gloo", store=dist.FileStore(str(work / f"store-{site}"), 1), rank=0,
                            world_size=1, timeout=timedelta(seconds=timeout))
    pki = work / "pki"
    group = join_sync(site, ["site-0", "site-1"], identity=pki / f"site-{site}", ca=pki / "ca.pem",
                      paths=[f"127.0.0.1:{first_port + i}" for i in range(2)], timeout=timeout)
    state = HookState(group, timeout=timeout)
    out: dict[str, Any] = {}
    try:
        first = torch.arange(16.0)[::2] if site == 0 else torch.ones(8)
        allreduce_tensor(state, first, name="t").wait()
        out["refused"] = "returned"
    except Exception as exc:  # noqa: BLE001 - the test checks what it was
        out["refused"] = f"{type(exc).__name__}: {exc}"
    state = HookState(group, timeout=timeout)  # a failed state refuses later buckets: a fresh one
    after = torch.full((4,), 100.0 if site == 0 else 1.0)
    allreduce_tensor(state, after, name="u").wait()
    out["after"] = after.tolist()
    write(work / f"site-{site}.json", out)
    state.close()
    group.close()
    dist.destroy_process_group()


# -- torch.distributed.pipelining over a world of sites ------------------------------


def pipeline_worker(site: int, work: Path, ports: list[int], timeout: float) -> None:
    """Stage ``site`` of a two-stage GPipe schedule (4 microbatches) over the wanxport world;
    its gradients and (at the last stage) losses next to the same model run in one process."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    import wanxport.torch as wt

    config = wt.SiteConfig.make(work / "pki" / f"site-{site}", work / "pki" / "ca.pem",
                                [f"127.0.0.1:{ports[site]}"])
    dist.init_process_group("wanxport", store=dist.FileStore(str(work / "store"), 2), rank=site, world_size=2,
                            pg_options=config, timeout=timedelta(seconds=timeout))

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))

    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(16, 2, generator=torch.Generator().manual_seed(2))
    part = model()[:3] if site == 0 else model()[3:]
    schedule = ScheduleGPipe(PipelineStage(part, site, 2, torch.device("cpu")), n_microbatches=4,
                             loss_fn=nn.functional.mse_loss)
    losses: list[torch.Tensor] = []
    if site == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    whole = model()
    local = [nn.functional.mse_loss(whole(xc), yc) for xc, yc in zip(x.chunk(4), y.chunk(4), strict=True)]
    (sum(local) / 4).backward()  # GPipe scales the summed microbatch gradients by 1/4
    same = whole[:3] if site == 0 else whole[3:]
    write(work / f"site-{site}.json", {
        "grads_close": all(bool(torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6))
                           for a, b in zip(part.parameters(), same.parameters(), strict=True)),
        "losses": [float(v.detach()) for v in losses], "one_process": [float(v.detach()) for v in local]})
    dist.destroy_process_group()
