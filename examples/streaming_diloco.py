"""Streaming DiLoCo between two sites: fragments synced in turn at 4 bits while training goes on.

    python examples/streaming_diloco.py [--outer-steps 10] [--inner-steps 20] [--fragments 4]
                                        [--overlap 2] [--json FILE] [--check]

DiLoCo (``examples/diloco.py``) stops every site every H inner steps for one all-reduce of
the whole model's pseudo-gradient. Streaming DiLoCo splits the parameters into P fragments
(equal slices of the flattened parameter vector) and syncs one every H / P inner steps, so
each fragment still has one outer step per H inner steps, but the cross-site traffic is
spread over the period and overlapped with compute: a fragment's all-reduce
(``dist.all_reduce(..., async_op=True)``) stays in flight while the next ``--overlap``
inner steps run, and only then is its outer step (Nesterov SGD, DiLoCo's recipe) applied
and the fragment merged into the local replica (``--mix`` of the local value kept, the rest
the new global). The pseudo-gradients travel as int4 with a float32 scale per block of 128
and an error-feedback residual per fragment (``wanxport.torch.compression("int4")``).

The same two processes run DiLoCo with no compression and with int8 and streaming DiLoCo with
no compression and with int4, same model, data and seeds, and the report compares the final
loss on a held-out set (the global model, identical at both sites) and the cross-site bytes
per full-model sync period (H inner steps) as the sessions' own counters saw them
(``transport_bytes``: shard bytes sent plus received on the group's sessions, both ways, this
site, heartbeats included). The sites are processes on this machine over loopback paths.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loopback import PATHS_PER_PAIR, free_ports, make_pki, site_name  # noqa: E402
from diloco import INNER_LR, OUTER_LR, OUTER_MOMENTUM, diloco, eval_loss, make_model, site_batch  # noqa: E402

import wanxport.torch as wt  # noqa: E402
from wanxport.torch.metrics import transport_bytes  # noqa: E402

N_SITES = 2
HIDDEN = 256  # ~70 k parameters: each fragment's message header is small beside its int4 body
BASELINES = (None, "int8")


class Fragment:
    """One slice [a, b) of the flat parameters: its global value, outer momentum, send buffer."""

    def __init__(self, a: int, b: int, flat: torch.Tensor) -> None:
        self.a, self.b = a, b
        self.global_value = flat[a:b].clone()
        self.momentum = torch.zeros(b - a)
        self.buffer = torch.empty(b - a)  # its own buffer: its own error-feedback residual

    def start(self, flat: torch.Tensor, codec: str | None) -> dist.Work:
        """The fragment's pseudo-gradient (global - local) all-reduced (mean) in the background."""
        torch.sub(self.global_value, flat[self.a:self.b], out=self.buffer)
        with wt.compression(codec):
            work = dist.all_reduce(self.buffer, op=dist.ReduceOp.AVG, async_op=True)
        assert work is not None
        return work

    def finish(self, params: list[nn.Parameter], mix: float) -> None:
        """The outer step on the averaged pseudo-gradient, then the merge into the replica."""
        delta = self.buffer
        self.momentum.mul_(OUTER_MOMENTUM).add_(delta)
        self.global_value.sub_(OUTER_LR * (delta + OUTER_MOMENTUM * self.momentum))
        flat = parameters_to_vector(params)
        flat[self.a:self.b] = mix * flat[self.a:self.b] + (1 - mix) * self.global_value
        vector_to_parameters(flat, params)


def streaming(site: int, outer_steps: int, inner_steps: int, fragments: int, overlap: int, mix: float,
              codec: str | None) -> dict[str, object]:
    """One streaming DiLoCo run; its final loss, transport bytes and how the syncs overlapped."""
    model = make_model(HIDDEN)
    params = list(model.parameters())
    with torch.no_grad():
        flat = parameters_to_vector(params)
    count = flat.numel()
    parts = [Fragment(p * count // fragments, (p + 1) * count // fragments, flat) for p in range(fragments)]
    inner = torch.optim.AdamW(model.parameters(), lr=INNER_LR, weight_decay=0.0)
    gen = torch.Generator().manual_seed(7 + site)
    pg = dist.group.WORLD
    every = inner_steps // fragments
    pending: list[tuple[int, Fragment, dist.Work]] = []  # (step it is due, fragment, its all-reduce)
    finished_in_background = 0
    before = transport_bytes(pg)
    for step in range(1, outer_steps * inner_steps + 1):
        x, y = site_batch(gen, site)
        inner.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        inner.step()
        with torch.no_grad():
            while pending and pending[0][0] <= step:
                _, part, work = pending.pop(0)
                finished_in_background += work.is_completed()
                work.wait()
                part.finish(params, mix)
            if step % every == 0 and step // every <= outer_steps * fragments:
                part = parts[(step // every - 1) % fragments]
                pending.append((step + overlap, part, part.start(parameters_to_vector(params), codec)))
    with torch.no_grad():
        for _, part, work in pending:  # the last fragments' syncs land after the last inner step
            work.wait()
            part.finish(params, mix)
        global_flat = torch.cat([p.global_value for p in parts])
        vector_to_parameters(global_flat, params)
    syncs = outer_steps * fragments
    return {"final_loss": eval_loss(model), "params": count,
            "transport_bytes": transport_bytes(pg) - before,
            "global_sha256": hashlib.sha256(global_flat.numpy().tobytes()).hexdigest(),
            "syncs": syncs, "syncs_done_before_wait": finished_in_background}


def baseline(site: int, outer_steps: int, inner_steps: int, codec: str | None) -> dict[str, object]:
    """DiLoCo (examples/diloco.py) on the same model, with the sessions' bytes counted around it."""
    before = transport_bytes(dist.group.WORLD)
    result = diloco(site, outer_steps, inner_steps, codec, hidden=HIDDEN)
    return {**result, "transport_bytes": transport_bytes(dist.group.WORLD) - before}


def worker(site: int, work: Path, args: argparse.Namespace, first_port: int) -> None:
    pki = work / "pki"
    config = wt.SiteConfig.make(pki / site_name(site), pki / "ca.pem",
                                [f"127.0.0.1:{first_port + site * PATHS_PER_PAIR + i}"
                                 for i in range(PATHS_PER_PAIR)])
    dist.init_process_group("wanxport", store=dist.FileStore(str(work / "store"), N_SITES), rank=site,
                            world_size=N_SITES, pg_options=config, timeout=timedelta(seconds=args.timeout))
    try:
        results = {f"diloco-{c}": baseline(site, args.outer_steps, args.inner_steps, c) for c in BASELINES}
        for codec in (None, "int4"):
            results[f"streaming-{codec}"] = streaming(site, args.outer_steps, args.inner_steps,
                                                      args.fragments, args.overlap, args.mix, codec)
    finally:
        dist.destroy_process_group()
    (work / f"site-{site}.json").write_text(json.dumps(results))


def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="wanxport-streaming-diloco-") as tmp:
        work = Path(tmp)
        make_pki(work / "pki", N_SITES)
        first_port = free_ports(N_SITES * PATHS_PER_PAIR)[0]
        mp.spawn(worker, args=(work, args, first_port), nprocs=N_SITES)
        sites = [json.loads((work / f"site-{s}.json").read_text()) for s in range(N_SITES)]
    modes = list(sites[0])
    per_period = {m: sites[0][m]["transport_bytes"] / args.outer_steps for m in modes}
    loss = {m: sites[0][m]["final_loss"] for m in modes}
    plain = "diloco-None"
    return {
        "sites": N_SITES, "outer_steps": args.outer_steps, "inner_steps": args.inner_steps,
        "fragments": args.fragments, "overlap_steps": args.overlap, "mix": args.mix,
        "params": sites[0]["streaming-int4"]["params"], "hidden": HIDDEN,
        "initial_loss": sites[0][plain]["initial_loss"],
        "final_loss": loss,
        "final_loss_per_site": {m: [s[m]["final_loss"] for s in sites] for m in modes},
        "streaming_global_sha256_per_site": {m: [s[m]["global_sha256"] for s in sites]
                                             for m in modes if m.startswith("streaming")},
        "transport_bytes": {m: [s[m]["transport_bytes"] for s in sites] for m in modes},
        "cross_site_bytes_per_sync_period": per_period,
        "byte_ratio_vs_uncompressed": {m: per_period[plain] / per_period[m] for m in modes},
        "loss_relative_to_uncompressed": {m: (loss[m] - loss[plain]) / loss[plain] for m in modes},
        "int4_loss_relative_to_streaming_uncompressed":
            (loss["streaming-int4"] - loss["streaming-None"]) / loss["streaming-None"],
        "syncs_done_before_wait": sites[0]["streaming-int4"]["syncs_done_before_wait"],
        "syncs": sites[0]["streaming-int4"]["syncs"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outer-steps", type=int, default=10, help="full-model sync periods")
    parser.add_argument("--inner-steps", type=int, default=20, help="H: inner steps per period")
    parser.add_argument("--fragments", type=int, default=4, help="P: fragments, one synced every H/P steps")
    parser.add_argument("--overlap", type=int, default=2,
                        help="inner steps a fragment's all-reduce runs behind before its outer step")
    parser.add_argument("--mix", type=float, default=0.5, help="share of the local fragment kept at a merge")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per collective")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless int4 moves >= 7x fewer bytes than uncompressed DiLoCo "
                             "and ends no more than 2 %% above its loss")
    args = parser.parse_args(argv)
    if args.outer_steps < 1 or args.fragments < 1 or args.inner_steps % args.fragments:
        parser.error("--outer-steps and --fragments must be at least 1, and --fragments divide --inner-steps")
    if not 0 <= args.overlap < args.inner_steps // args.fragments:
        parser.error("--overlap must be in 0 .. inner-steps / fragments - 1 (one sync in flight at a time)")
    if not 0.0 <= args.mix < 1.0:
        parser.error("--mix must be in [0, 1)")
    result = run(args)
    for mode, per_period in result["cross_site_bytes_per_sync_period"].items():  # type: ignore[attr-defined]
        print(f"{mode:>15}: final loss {result['final_loss'][mode]:.5f}, "  # type: ignore[index]
              f"{per_period:,.0f} cross-site bytes per sync period "
              f"({result['byte_ratio_vs_uncompressed'][mode]:.2f}x fewer than uncompressed)")  # type: ignore[index]
    print(f"initial loss {result['initial_loss']:.5f}; {result['params']:,} parameters, "
          f"{args.outer_steps} periods x {args.inner_steps} inner steps, {args.fragments} fragments; "
          f"{result['syncs_done_before_wait']} of {result['syncs']} fragment syncs done in the background")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ratio = result["byte_ratio_vs_uncompressed"]["streaming-int4"]  # type: ignore[index]
    worse = result["loss_relative_to_uncompressed"]["streaming-int4"]  # type: ignore[index]
    return 1 if args.check and (ratio < 7 or worse > 0.02) else 0


if __name__ == "__main__":
    sys.exit(main())
