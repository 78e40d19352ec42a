"""The three ways a torchrun job spans sites with wanxport (the recipe of docs/notes/torch.md).

Every rank of a site reads the site's one config (``WANXPORT_TORCH_CONFIG``); torchrun's
``LOCAL_RANK`` gives each rank its own ports. Run at each site (``--node-rank`` = the
site's index)::

    # one rank per site: the sites are the world (a DiLoCo outer group)
    WANXPORT_TORCH_CONFIG=site.toml python -m torch.distributed.run --nnodes 2 --node-rank S \\
        --nproc-per-node 1 --master-addr HOST --master-port PORT examples/torchrun_sites.py sites --out DIR
    # one global world (gloo): a 2-D mesh whose "replicate" dimension is wanxport (FSDP2), and DDP
    # on a wanxport group of the same-index ranks, each against the same run on gloo groups
    WANXPORT_TORCH_CONFIG=site.toml python -m torch.distributed.run --nnodes 2 --node-rank S \\
        --nproc-per-node 2 --master-addr HOST --master-port PORT examples/torchrun_sites.py mesh --out DIR
    # a world per site (a torchrun per site, its own master) and the DDP hook between sites,
    # meeting through a store the sites share (rank 0 of site 0 hosts it)
    WANXPORT_TORCH_CONFIG=site.toml python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 \\
        --master-port SITE_PORT examples/torchrun_sites.py hook --site S --sites 2 \\
        --store HOST:STORE_PORT --out DIR

Each rank writes what it saw to ``DIR/<mode>-<site>-<local rank>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import wanxport.torch as wt

TIMEOUT = timedelta(seconds=60)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def step_data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 16, generator=gen)
    return x, (x[:, :4]).argmax(dim=1)


def train(net: nn.Module, rank: int, steps: int = 2) -> torch.Tensor:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        x, y = step_data(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return torch.cat([getattr(p, "_local_tensor", p).detach().reshape(-1) for p in net.parameters()])


def same_everywhere(flat: torch.Tensor, group: Any) -> bool:
    """Whether every member of ``group`` holds bitwise the same ``flat``."""
    rows = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, flat, group=group)
    return all(torch.equal(rows[0], r) for r in rows)


def sites() -> dict[str, Any]:
    dist.init_process_group("wanxport", timeout=TIMEOUT)  # env:// from torchrun; config from the env
    rank, size = dist.get_rank(), dist.get_world_size()
    total = torch.full((3,), float(rank + 1))
    dist.all_reduce(total)
    message = torch.arange(5.0) if rank == 0 else torch.zeros(5)
    if rank == 0:
        dist.send(message, dst=1)
    elif rank == 1:
        dist.recv(message, src=0)
    return {"backend": dist.get_backend(), "rank": rank, "size": size, "sum": total.tolist(),
            "received": message.tolist()}


def mesh() -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    n_sites, per_site = int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]), \
        int(os.environ["LOCAL_WORLD_SIZE"])
    grid = init_device_mesh("cpu", (n_sites, per_site), mesh_dim_names=("replicate", "shard"),
                            backend_override={"replicate": "wanxport"})
    sharded = model()
    fully_shard(sharded, mesh=grid)
    shards = train(sharded, rank)
    replicas = [[s * per_site + r for s in range(n_sites)] for r in range(per_site)]
    wan = [dist.new_group(ranks, backend="wanxport") for ranks in replicas][local]
    gloo = [dist.new_group(ranks) for ranks in replicas][local]
    over_wan, over_gloo = (train(DDP(model(), process_group=g), rank) for g in (wan, gloo))
    return {"replicate_backend": dist.get_backend(grid.get_group("replicate")),
            "shard_backend": dist.get_backend(grid.get_group("shard")),
            "fsdp_shards_equal_across_sites": same_everywhere(shards, grid.get_group("replicate")),
            "ddp_backend": dist.get_backend(wan),
            "ddp_wanxport_equals_ddp_gloo": bool(torch.allclose(over_wan, over_gloo, rtol=1e-5, atol=1e-6))}


def hook(site: int, n_sites: int, store_at: str) -> dict[str, Any]:
    dist.init_process_group("gloo", timeout=TIMEOUT)  # this site's own world
    host, _, port = store_at.rpartition(":")
    first = site == 0 and int(os.environ["LOCAL_RANK"]) == 0
    store = dist.TCPStore(host, int(port), is_master=first, timeout=TIMEOUT, wait_for_workers=False)
    group = wt.cross_site_group(store, site, n_sites, timeout=TIMEOUT.total_seconds())
    net = DDP(model())
    state = wt.HookState(group, timeout=TIMEOUT.total_seconds())
    net.register_comm_hook(state, wt.allreduce_hook)
    flat = train(net, int(os.environ["RANK"]) + site * dist.get_world_size())
    rows = group.all_gather(flat.numpy())
    state.close()
    group.close()
    return {"site": site, "params_equal_across_sites": all(bool((rows[0] == r).all()) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["sites", "mesh", "hook"])
    parser.add_argument("--out", type=Path, required=True, help="directory for each rank's JSON")
    parser.add_argument("--site", type=int, help="hook: this site's index")
    parser.add_argument("--sites", type=int, default=2, help="hook: how many sites")
    parser.add_argument("--store", help="hook: HOST:PORT of the store the sites share")
    args = parser.parse_args()
    if args.mode == "sites":
        result = sites()
    elif args.mode == "mesh":
        result = mesh()
    else:
        if args.site is None or not args.store:
            parser.error("hook needs --site and --store")
        result = hook(args.site, args.sites, args.store)
    site = args.site if args.site is not None else int(os.environ.get("GROUP_RANK", "0"))
    name = f"{args.mode}-{site}-{os.environ['LOCAL_RANK']}.json"
    (args.out / name).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
