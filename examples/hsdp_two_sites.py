"""HSDP across two sites: FSDP2 shards inside a site over gloo, replicas across sites over wanxport.

    python examples/hsdp_two_sites.py [--steps 5] [--compress int8] [--ranks-per-site 2]
                                      [--device cpu|cuda] [--json FILE]

Four processes on this machine stand for 2 sites x 2 ranks in ONE global
torch.distributed world (gloo, one store every rank reaches). Each rank builds a
2-D DeviceMesh::

    init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"),
                     backend_override={"replicate": ("wanxport", WanxportOptions(site_config))})

so the "shard" groups (the ranks of one site) are gloo groups and the "replicate"
groups (rank r of every site) are wanxport groups, and wraps the model with FSDP2's
``fully_shard(model, mesh=mesh)``: parameters are sharded over a site's ranks, and
each shard's gradient is all-reduced between the sites' replicas over wanxport.
Every rank of a site reads the same site config; ``LOCAL_RANK`` (set here as
torchrun would) gives each its own ports.

The same processes first train the same model on the same data with plain gloo HSDP
(the same mesh, every group gloo); after every step each rank compares its parameter
shards with that run's (``torch.allclose``, rtol 1e-5, atol 1e-6, as
train_two_sites.py). With ``--compress int8`` the replicate all-reduce travels as int8
with error feedback: the run reports how far it drifts instead of requiring a match.
``--device cuda`` puts the model and data on the GPU (every rank on GPU 0: with
``--ranks-per-site 1`` both sites share one GPU); the wanxport backend stages the
replicate all-reduce through pinned host memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loopback import free_ports, make_pki, site_name  # noqa: E402

import wanxport.torch as wt  # noqa: E402

N_SITES = 2
RTOL, ATOL = 1e-5, 1e-6
BATCH, FEATURES, CLASSES = 16, 32, 4
PORTS_PER_RANK = 8  # each rank's block of wanxport ports (one replicate group needs one)


def make_model(device: str) -> nn.Module:
    torch.manual_seed(0)  # every rank (and both runs) start from the same parameters
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, CLASSES)).to(device)


def batch(global_rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + global_rank)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    return x, (x[:, :CLASSES] * 3).argmax(dim=1)


def train(mesh: object, global_rank: int, steps: int, compress: str | None,
          device: str) -> list[torch.Tensor]:
    """``steps`` SGD steps of the model sharded on ``mesh``; this rank's flat shards after each."""
    model = make_model(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    history = []
    for step in range(steps):
        x, y = (t.to(device) for t in batch(global_rank, step))
        opt.zero_grad()
        with wt.compression(compress):
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        history.append(torch.cat([p.to_local().detach().reshape(-1) for p in model.parameters()]).cpu())
    return history


def worker(global_rank: int, work: Path, first_ports: list[int], steps: int, compress: str | None,
           timeout: float, per_site: int, device: str) -> None:
    site, local = divmod(global_rank, per_site)
    os.environ["LOCAL_RANK"] = str(local)  # what torchrun sets; the backend derives ports from it
    if device == "cuda":
        torch.cuda.set_device(0)
    world = N_SITES * per_site
    dist.init_process_group("gloo", store=dist.FileStore(str(work / "store"), world), rank=global_rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    shape, names = (N_SITES, per_site), ("replicate", "shard")
    reference = train(init_device_mesh(device, shape, mesh_dim_names=names), global_rank, steps, None, device)
    config = wt.SiteConfig.make(work / "pki" / site_name(site), work / "pki" / "ca.pem",
                                [f"127.0.0.1:{first_ports[site]}"])
    options = wt.WanxportOptions(config, ports_per_rank=PORTS_PER_RANK, timeout=timedelta(seconds=timeout))
    mesh = init_device_mesh(device, shape, mesh_dim_names=names,
                            backend_override={"replicate": ("wanxport", options)})
    replicate = mesh.get_group("replicate")
    history = train(mesh, global_rank, steps, compress, device)
    diffs = [float((a - b).abs().max()) for a, b in zip(history, reference, strict=True)]
    close = [bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))
             for a, b in zip(history, reference, strict=True)]
    (work / f"rank-{global_rank}.json").write_text(json.dumps({
        "rank": global_rank, "replicate_backend": dist.get_backend(replicate),
        "shard_backend": dist.get_backend(mesh.get_group("shard")),
        "cross_site_bytes": wt.cross_site_bytes(replicate), "max_abs_diff": diffs, "allclose": close}))
    dist.destroy_process_group()


def run(steps: int, compress: str | None, timeout: float, per_site: int = 2,
        device: str = "cpu") -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="wanxport-hsdp-") as tmp:
        work = Path(tmp)
        make_pki(work / "pki", N_SITES)
        block = per_site * PORTS_PER_RANK
        first = free_ports(N_SITES * block)[0]
        firsts = [first + s * block for s in range(N_SITES)]
        mp.spawn(worker, args=(work, firsts, steps, compress, timeout, per_site, device),
                 nprocs=N_SITES * per_site)
        ranks = range(N_SITES * per_site)
        per_rank = [json.loads((work / f"rank-{g}.json").read_text()) for g in ranks]
    return {
        "sites": N_SITES, "ranks_per_site": per_site, "steps": steps, "compress": compress, "device": device,
        "torch": torch.__version__,
        "rtol": RTOL, "atol": ATOL,
        "backends": sorted({(r["replicate_backend"], r["shard_backend"]) for r in per_rank}),
        "allclose_every_step": all(all(r["allclose"]) for r in per_rank),
        "max_abs_diff_per_step": [max(r["max_abs_diff"][s] for r in per_rank) for s in range(steps)],
        "cross_site_bytes": sum(r["cross_site_bytes"] for r in per_rank),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compress", choices=["bf16", "int8"], help="codec of the replicate all-reduce")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per collective")
    parser.add_argument("--ranks-per-site", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.ranks_per_site < 1:
        parser.error("--steps and --ranks-per-site must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    result = run(args.steps, args.compress, args.timeout, args.ranks_per_site, args.device)
    for step, diff in enumerate(result["max_abs_diff_per_step"]):  # type: ignore[arg-type]
        print(f"step {step + 1:2d}: max |wanxport HSDP - gloo HSDP| = {diff:.3g}")
    where = (f"{N_SITES} sites x {args.ranks_per_site} ranks on {args.device}, "
             f"mesh (replicate, shard) = {result['backends']}")
    if args.compress:
        drift = max(result["max_abs_diff_per_step"])  # type: ignore[type-var]
        print(f"{where}, {args.steps} steps, {args.compress} across sites: parameters within {drift:.3g} "
              f"of gloo HSDP ({result['cross_site_bytes']} cross-site bytes)")
    else:
        verdict = "match" if result["allclose_every_step"] else "DIFFER from"
        print(f"{where}, {args.steps} steps: parameters {verdict} gloo HSDP at every step "
              f"(rtol {RTOL:g}, atol {ATOL:g})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["allclose_every_step"] or args.compress else 1


if __name__ == "__main__":
    sys.exit(main())
