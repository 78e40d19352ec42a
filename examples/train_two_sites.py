"""DDP across two sites, two ranks each, with wanxport between the sites.

    python examples/train_two_sites.py [--steps 20] [--ranks-per-site 2] [--json FILE]
    sudo .venv/bin/python examples/train_two_sites.py --emulated clean-2path   # over an emulated WAN

Each site is its own ``torch.distributed`` world (gloo, its own store), as ``torchrun``
per site would make it; the ranks of a site wrap the model in DDP over that world and
register ``wanxport.torch.allreduce_hook``, whose state holds the rank's wanxport group
with the same-index rank of the other site. A bucket is reduce-scattered inside the
site, each rank's slice crosses to the other site over its own wanxport session (two
loopback paths here), and an all-gather inside the site finishes it.

The same processes first train the same model on the same data as one plain gloo
DDP world of all four ranks (the single-site baseline); after every step of the
two-site run each rank compares its parameters with the baseline's at that step
(``torch.allclose``, rtol 1e-5, atol 1e-6; no compression). By default the sites are
processes on this machine over loopback; with ``--emulated SCENARIO`` each site's ranks
run in that scenario's gateway namespace and every scenario path (its RTT, rate, loss)
is a wanxport path between each pair of same-index ranks. The comparison is the point:
the hook gives DDP's own answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loopback import PATHS_PER_PAIR, free_ports, make_pki, site_name  # noqa: E402

from wanxport.collective import join_sync  # noqa: E402
from wanxport.torch import HookState, allreduce_hook  # noqa: E402

N_SITES = 2
RTOL, ATOL = 1e-5, 1e-6
BATCH, FEATURES, CLASSES = 16, 32, 4
EMULATED_PORT = 7600  # first wanxport port of each path in the emulated namespaces (--emulated)
BUCKET_CAP_MB = 0.008  # a few small buckets, so the hook's per-bucket pipeline is exercised


def make_model() -> nn.Module:
    torch.manual_seed(0)  # every rank (and both runs) start from the same parameters
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, CLASSES))


def batch(global_rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same data for a global rank at a step in both runs."""
    gen = torch.Generator().manual_seed(1000 * step + global_rank)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    return x, (x[:, :CLASSES] * 3).argmax(dim=1)


def train(ddp: DDP, global_rank: int, steps: int) -> list[torch.Tensor]:
    """``steps`` SGD steps; the flat parameters after each."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    history = []
    for step in range(steps):
        x, y = batch(global_rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        history.append(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).clone())
    return history


def baseline(global_rank: int, world: int, work: Path, steps: int) -> list[torch.Tensor]:
    """Plain single-site DDP: one gloo world of every rank."""
    store = dist.FileStore(str(work / "store-baseline"), world)
    dist.init_process_group("gloo", store=store, rank=global_rank, world_size=world)
    try:
        return train(DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB), global_rank, steps)
    finally:
        dist.destroy_process_group()


def pair_paths(first_port: int, rank: int) -> list[str]:
    """The loopback paths between rank ``rank`` of site 0 and of site 1 (its own ports)."""
    return [f"127.0.0.1:{first_port + rank * PATHS_PER_PAIR + i}" for i in range(PATHS_PER_PAIR)]


def two_sites(global_rank: int, ranks: int, work: Path, steps: int, paths: list[str],
              timeout: float) -> tuple[list[torch.Tensor], float]:
    """The same training as two sites: a gloo world per site, wanxport between them."""
    site, rank = divmod(global_rank, ranks)
    store = dist.FileStore(str(work / f"store-{site_name(site)}"), ranks)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=ranks,
                            timeout=timedelta(seconds=timeout))
    pki = work / "pki"
    group = join_sync(site, [site_name(s) for s in range(N_SITES)], identity=pki / site_name(site),
                      ca=pki / "ca.pem", paths=paths, timeout=timeout)
    try:
        ddp = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
        state = HookState(group, timeout=timeout)
        ddp.register_comm_hook(state, allreduce_hook)
        start = time.perf_counter()
        history = train(ddp, global_rank, steps)
        elapsed = time.perf_counter() - start
        state.close()
        return history, elapsed
    finally:
        group.close()
        dist.destroy_process_group()


def compare(global_rank: int, work: Path, history: list[torch.Tensor], reference: list[torch.Tensor],
            elapsed: float) -> None:
    """This rank's verdict per step, for the parent to collect."""
    diffs = [float((a - b).abs().max()) for a, b in zip(history, reference, strict=True)]
    close = [bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))
             for a, b in zip(history, reference, strict=True)]
    (work / f"rank-{global_rank}.json").write_text(json.dumps(
        {"rank": global_rank, "max_abs_diff": diffs, "allclose": close, "two_site_s": elapsed}))


def worker(global_rank: int, ranks: int, work: Path, steps: int, first_port: int, timeout: float) -> None:
    """Loopback sites: the baseline, then the two-site run, in the same process."""
    reference = baseline(global_rank, ranks * N_SITES, work, steps)
    paths = pair_paths(first_port, global_rank % ranks)
    history, elapsed = two_sites(global_rank, ranks, work, steps, paths, timeout)
    compare(global_rank, work, history, reference, elapsed)


def baseline_worker(global_rank: int, ranks: int, work: Path, steps: int) -> None:
    torch.save(baseline(global_rank, ranks * N_SITES, work, steps), work / f"reference-{global_rank}.pt")


def emulated_rank(global_rank: int, ranks: int, work: Path, steps: int, paths: list[str],
                  timeout: float) -> None:
    """One rank of an emulated site, started inside that site's namespace by ``run_emulated``."""
    reference = torch.load(work / f"reference-{global_rank}.pt")
    history, elapsed = two_sites(global_rank, ranks, work, steps, paths, timeout)
    compare(global_rank, work, history, reference, elapsed)


def run_emulated(scenario_name: str, work: Path, steps: int, ranks: int, timeout: float) -> None:
    """The sites in the emulation's two gateway namespaces (root): every scenario path is a
    wanxport path of every rank pair (rank r on port EMULATED_PORT + r of site b's addresses);
    gloo inside a site runs on the namespace's loopback."""
    from emulation.api import Emulation
    from emulation.bundled import resolve_scenario

    scenario = resolve_scenario(scenario_name)
    mp.spawn(baseline_worker, args=(ranks, work, steps), nprocs=ranks * N_SITES)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    with Emulation(scenario) as emu:
        procs = []
        for global_rank in range(ranks * N_SITES):
            site, rank = divmod(global_rank, ranks)
            paths = [f"{p.b_addr}:{EMULATED_PORT + rank}" for p in emu.paths]
            argv = [sys.executable, __file__, "--_rank", str(global_rank), "--_work", str(work),
                    "--_paths", ",".join(paths), "--steps", str(steps), "--ranks-per-site", str(ranks),
                    "--timeout", str(timeout)]
            procs.append(emu.popen("ab"[site], argv, env=env))
        try:
            for proc in procs:
                proc.wait(timeout=steps * timeout + 120)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def run(steps: int, ranks: int, timeout: float, emulated: str | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="wanxport-two-sites-") as tmp:
        work = Path(tmp)
        make_pki(work / "pki", N_SITES)
        if emulated is None:
            first_port = free_ports(ranks * PATHS_PER_PAIR)[0]
            mp.spawn(worker, args=(ranks, work, steps, first_port, timeout), nprocs=ranks * N_SITES)
        else:
            run_emulated(emulated, work, steps, ranks, timeout)
        missing = [g for g in range(ranks * N_SITES) if not (work / f"rank-{g}.json").exists()]
        if missing:
            raise SystemExit(f"rank(s) {missing} did not finish (see their output above)")
        per_rank = [json.loads((work / f"rank-{g}.json").read_text()) for g in range(ranks * N_SITES)]
    every_step = [all(r["allclose"][s] for r in per_rank) for s in range(steps)]
    return {
        "sites": N_SITES, "sites_over": emulated or "loopback", "ranks_per_site": ranks, "steps": steps,
        "rtol": RTOL, "atol": ATOL,
        "allclose_every_step": all(every_step),
        "max_abs_diff": max(max(r["max_abs_diff"]) for r in per_rank),
        "max_abs_diff_per_step": [max(r["max_abs_diff"][s] for r in per_rank) for s in range(steps)],
        "two_site_s": max(r["two_site_s"] for r in per_rank),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ranks-per-site", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per collective")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--emulated", metavar="SCENARIO",
                        help="run the sites in this scenario's emulated WAN namespaces (root), not loopback")
    for hidden in ("--_rank", "--_work", "--_paths"):  # one rank inside a namespace (run_emulated)
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.ranks_per_site < 1:
        parser.error("--steps and --ranks-per-site must be at least 1")
    if args._rank is not None:
        emulated_rank(int(args._rank), args.ranks_per_site, Path(args._work), args.steps,
                      args._paths.split(","), args.timeout)
        return 0
    result = run(args.steps, args.ranks_per_site, args.timeout, args.emulated)
    for step, diff in enumerate(result["max_abs_diff_per_step"]):  # type: ignore[arg-type]
        print(f"step {step + 1:2d}: max |two-site - single-site| = {diff:.3g}")
    verdict = "match" if result["allclose_every_step"] else "DIFFER"
    print(f"{N_SITES} sites x {args.ranks_per_site} ranks over {result['sites_over']}, {args.steps} steps: "
          f"parameters {verdict} "
          f"plain gloo DDP at every step (rtol {RTOL:g}, atol {ATOL:g})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["allclose_every_step"] else 1


if __name__ == "__main__":
    sys.exit(main())
