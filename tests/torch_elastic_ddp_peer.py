"""One rank of a 3-site x 2-rank DDP job on ``wanxport.torch.elastic_group``, in its own
process, so the test can kill a site's ranks and start them again.

Each site is its own gloo world (a FileStore per incarnation of the site); rank r of
every site forms the elastic group of local rank r through the test's TCPStore. The step
loop is the one documented for users: ``boundary`` before each step, the step redone on
``MembershipChanged``. Prints one JSON line per step (the live sites and a digest of the
parameters); with ``"stall_at": k`` it stops before step k's backward pass (for the test
to kill it), and ``"final"`` with the epoch it was admitted in at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wanxport.torch as wt

SITES, RANKS = 3, 2


def main(spec: dict) -> None:
    site, rank, timeout = spec["site"], spec["rank"], 60.0
    dist.init_process_group("gloo", store=dist.FileStore(spec["site_store"], RANKS), rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=timeout))
    store = dist.TCPStore("127.0.0.1", spec["store_port"], is_master=False,
                          timeout=timedelta(seconds=timeout))
    pki, first = spec["pki"], spec["first_port"]
    config = wt.SiteConfig.make(f"{pki}/site-{site}", f"{pki}/ca.pem",
                                [f"127.0.0.1:{first + site * 128 + path * 64}" for path in range(2)])
    group = wt.elastic_group(store, site, SITES, config=config, rank_in_site=rank, timeout=timeout,
                             liveness_min_s=3.0)
    torch.manual_seed(spec.get("seed", 0))  # a restarted site starts from others: the state must come
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    # Buckets that stay as the constructor made them: a restarted site's first step pairs
    # with the live sites' (DDP would otherwise re-bucket after its first step).
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002, find_unused_parameters=True)
    ddp.register_comm_hook(wt.HookState(group, timeout=timeout), wt.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = wt.TrainingState(model, optimizer)
    step = 0
    while step < spec["until"] or group.size < SITES or step < group.epoch.start + 2:
        step = group.boundary(step, state)
        gen = torch.Generator().manual_seed(100 * (RANKS * site + rank) + step)
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 4, generator=gen)
        if step == spec.get("stall_at"):
            print(json.dumps({"stalled": step}), flush=True)
            sys.stdin.read()  # the test kills this process here
        optimizer.zero_grad()
        try:
            nn.functional.mse_loss(ddp(x), y).backward()
        except wt.MembershipChanged:
            continue
        optimizer.step()
        params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        print(json.dumps({"step": step, "live": list(group.members),
                          "params": hashlib.sha256(params).hexdigest()}), flush=True)
        step += 1
    print(json.dumps({"final": step, "epoch": group.epoch.number, "admitted_at": group.epoch.start}),
          flush=True)
    group.close()
    os._exit(0)  # the killed incarnation's gloo peers are gone: skip torch's teardown


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
