"""The DDP hook over elastic groups: 3 sites x 2 ranks, rank processes for ``run_ranks``.

Each site is its own gloo world (a FileStore); rank r of every site forms the elastic
group of local rank r through one TCPStore (the test's, on loopback). Site 2's ranks
kill themselves in the middle of a backward pass (from a gradient hook, after DDP has
started reducing earlier buckets); the other ranks' step must complete with the mean
over the live sites and every step after it too. Each rank writes, per step, how many
sites were live and a digest of its parameters.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch_helpers import write

SITES, RANKS, STEPS, KILL_AT = 3, 2, 4, 2


def ddp_elastic_worker(global_rank: int, work: Path, store_port: int, first_port: int, timeout: float,
                       ) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import wanxport.torch as wt

    site, rank = divmod(global_rank, RANKS)
    dist.init_process_group("gloo", store=dist.FileStore(str(work / f"store-{site}"), RANKS), rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=timeout))
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=timeout))
    pki = work / "pki"
    config = wt.SiteConfig.make(pki / f"site-{site}", pki / "ca.pem",
                                [f"127.0.0.1:{first_port + site * 128 + path * 64}" for path in range(2)])
    group = wt.elastic_group(store, site, SITES, config=config, rank_in_site=rank, timeout=timeout,
                             liveness_min_s=3.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    # A bucket per layer or so (several calls per backward), as the constructor lays them out.
    ddp = DDP(model, bucket_cap_mb=0.002, find_unused_parameters=True)
    ddp.register_comm_hook(wt.HookState(group, timeout=timeout), wt.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = wt.TrainingState(model, optimizer)
    out: dict[str, Any] = {"rank": global_rank, "steps": {}}
    step = 0
    while step < STEPS:
        step = group.boundary(step, state)
        began = time.monotonic()
        gen = torch.Generator().manual_seed(100 * global_rank + step)
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 4, generator=gen)
        if site == 2 and step == KILL_AT:
            model[0].weight.register_hook(lambda _: os.kill(os.getpid(), signal.SIGKILL))
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        digest = hashlib.sha256(params).hexdigest()
        out["steps"][str(step)] = {"live": list(group.members), "params": digest, "began": began,
                                   "ended": time.monotonic()}
        step += 1
    write(work / f"rank-{global_rank}.json", out)
    os._exit(0)  # site 2's gloo peers and sessions are gone: skip the teardown
