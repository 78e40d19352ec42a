"""DiLoCo between two sites: local training, an int8 outer step every H steps over wanxport.

    python examples/diloco.py [--outer-steps 10] [--inner-steps 20] [--json FILE]

Each site trains its own replica for H inner steps (AdamW) on its own data; then the
sites average their pseudo-gradients (the change of the parameters since the last
outer step) with one ``dist.all_reduce`` on the ``"wanxport"`` process group, a world
of one rank per site, and apply the average with an outer Nesterov-momentum SGD
(DiLoCo's recipe). The pseudo-gradients travel as int8 with a per-block scale and an
error-feedback residual (``wanxport.torch.compression("int8")``): about a quarter of
the bytes of float32.

The same two processes run the whole training twice, with uncompressed and with int8
pseudo-gradients, and report both final losses on a held-out set (the int8 run should
end within 2 % of the uncompressed one) and the cross-site bytes of each outer step.
The sites are processes on this machine over loopback paths.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loopback import PATHS_PER_PAIR, free_ports, make_pki, site_name  # noqa: E402

import wanxport.torch as wt  # noqa: E402

N_SITES = 2
FEATURES, HIDDEN, BATCH = 16, 64, 32
INNER_LR, OUTER_LR, OUTER_MOMENTUM = 3e-3, 0.7, 0.9


def make_model(hidden: int = HIDDEN) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 1))


def teacher(x: torch.Tensor) -> torch.Tensor:
    """The function every site learns (smooth, nonlinear)."""
    waves = torch.sin(x[:, :4].sum(dim=1, keepdim=True))
    return waves + 0.5 * torch.tanh(x[:, 4:8]).prod(dim=1, keepdim=True)


def site_batch(gen: torch.Generator, site: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each site's own data: shifted inputs per site (not identically distributed)."""
    x = torch.randn(BATCH, FEATURES, generator=gen) + 0.3 * (site - 0.5)
    return x, teacher(x)


def eval_loss(model: nn.Module) -> float:
    gen = torch.Generator().manual_seed(12345)
    x = torch.randn(2048, FEATURES, generator=gen)
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), teacher(x)))


def diloco(site: int, outer_steps: int, inner_steps: int, codec: str | None,
           hidden: int = HIDDEN) -> dict[str, object]:
    """One DiLoCo run on the default ("wanxport") group; the final loss and bytes per outer step."""
    model = make_model(hidden)
    initial_loss = eval_loss(model)
    params = list(model.parameters())
    global_params = [p.detach().clone() for p in params]
    momentum = [torch.zeros_like(p) for p in params]
    inner = torch.optim.AdamW(model.parameters(), lr=INNER_LR, weight_decay=0.0)
    pseudo = torch.empty(sum(p.numel() for p in params))  # one buffer: one all-reduce, one residual
    gen = torch.Generator().manual_seed(7 + site)
    pg = dist.group.WORLD
    bytes_per_outer: list[int] = []
    for _ in range(outer_steps):
        for _ in range(inner_steps):
            x, y = site_batch(gen, site)
            inner.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            inner.step()
        offset = 0
        for p, g in zip(params, global_params, strict=True):
            pseudo[offset:offset + p.numel()] = (g - p.detach()).reshape(-1)
            offset += p.numel()
        before = wt.cross_site_bytes(pg)
        with wt.compression(codec):
            dist.all_reduce(pseudo, op=dist.ReduceOp.AVG)
        bytes_per_outer.append(wt.cross_site_bytes(pg) - before)
        offset = 0
        with torch.no_grad():
            for p, g, m in zip(params, global_params, momentum, strict=True):
                delta = pseudo[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                m.mul_(OUTER_MOMENTUM).add_(delta)                      # Nesterov outer SGD
                g.sub_(OUTER_LR * (delta + OUTER_MOMENTUM * m))
                p.copy_(g)
    return {"initial_loss": initial_loss, "final_loss": eval_loss(model),
            "bytes_per_outer_step": bytes_per_outer, "params": sum(p.numel() for p in params)}


def worker(site: int, work: Path, outer_steps: int, inner_steps: int, first_port: int,
           timeout: float) -> None:
    pki = work / "pki"
    config = wt.SiteConfig.make(pki / site_name(site), pki / "ca.pem",
                                [f"127.0.0.1:{first_port + site * PATHS_PER_PAIR + i}"
                                 for i in range(PATHS_PER_PAIR)])
    dist.init_process_group("wanxport", store=dist.FileStore(str(work / "store"), N_SITES), rank=site,
                            world_size=N_SITES, pg_options=config, timeout=timedelta(seconds=timeout))
    try:
        results = {str(codec): diloco(site, outer_steps, inner_steps, codec) for codec in (None, "int8")}
    finally:
        dist.destroy_process_group()
    (work / f"site-{site}.json").write_text(json.dumps(results))


def run(outer_steps: int, inner_steps: int, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="wanxport-diloco-") as tmp:
        work = Path(tmp)
        make_pki(work / "pki", N_SITES)
        first_port = free_ports(N_SITES * PATHS_PER_PAIR)[0]
        mp.spawn(worker, args=(work, outer_steps, inner_steps, first_port, timeout), nprocs=N_SITES)
        sites = [json.loads((work / f"site-{s}.json").read_text()) for s in range(N_SITES)]
    plain, int8 = sites[0]["None"], sites[0]["int8"]
    return {
        "sites": N_SITES, "outer_steps": outer_steps, "inner_steps": inner_steps,
        "params": plain["params"],
        "initial_loss": plain["initial_loss"],
        "final_loss": {"none": plain["final_loss"], "int8": int8["final_loss"]},
        "final_loss_per_site": {"none": [s["None"]["final_loss"] for s in sites],
                                "int8": [s["int8"]["final_loss"] for s in sites]},
        "relative_difference": abs(int8["final_loss"] - plain["final_loss"]) / plain["final_loss"],
        "cross_site_bytes_per_outer_step": {"none": plain["bytes_per_outer_step"],
                                            "int8": int8["bytes_per_outer_step"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outer-steps", type=int, default=10)
    parser.add_argument("--inner-steps", type=int, default=20, help="H: inner steps per outer step")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per collective")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if args.outer_steps < 1 or args.inner_steps < 1:
        parser.error("--outer-steps and --inner-steps must be at least 1")
    result = run(args.outer_steps, args.inner_steps, args.timeout)
    losses, sent = result["final_loss"], result["cross_site_bytes_per_outer_step"]
    for codec in ("none", "int8"):
        per_step = sent[codec]  # type: ignore[index]
        print(f"{codec:>4}: final loss {losses[codec]:.5f}, "  # type: ignore[index]
              f"cross-site bytes per outer step {sum(per_step) / len(per_step):,.0f} (this site, both ways)")
    print(f"initial loss {result['initial_loss']:.5f}")
    print(f"int8 final loss within {100 * result['relative_difference']:.2f} % of uncompressed "  # type: ignore[operator]
          f"({result['params']:,} parameters, {args.outer_steps} outer x {args.inner_steps} inner steps)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["relative_difference"] <= 0.02 else 1  # type: ignore[operator]


if __name__ == "__main__":
    sys.exit(main())
