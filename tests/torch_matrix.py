"""The op x dtype x layout matrix: every op on a wanxport group and on gloo, in one world.

Three ranks (three sites) share one FileStore and a gloo default group; every rank
also joins ``new_group(all, backend="wanxport")``. For each dtype, every case is
first started on wanxport with ``async_op=True`` (all of them in flight at once),
then waited for; then each runs on gloo and the results are compared: bitwise for
data movement, integer and bool reductions and MIN/MAX; for floating sums and
products (whose order gloo's ring and wanxport's fixed order differ in) within one
ulp of the contributions' magnitude per rank. A case gloo itself refuses is
recorded as such and compared no further.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

DTYPES = ["bfloat16", "float16", "float32", "float64", "bool", "uint8", "int8", "int32", "int64"]
LAYOUTS = ["contiguous", "strided", "scalar", "empty"]
N = 3


def _tensor(torch: Any, dtype: Any, layout: str, seed: int) -> Any:
    """A deterministic tensor for (rank, case): (4, 6) values, strided: a transposed view."""
    gen = torch.Generator().manual_seed(seed)
    shape = {"contiguous": (4, 6), "strided": (6, 4), "scalar": (), "empty": (0, 6)}[layout]
    if dtype == torch.bool:
        base = torch.randint(0, 2, shape, generator=gen).bool()
    elif dtype.is_floating_point:
        base = (torch.randn(shape, generator=gen) * 4).to(dtype)
    else:
        base = torch.randint(-50 if dtype != torch.uint8 else 0, 50, shape, generator=gen).to(dtype)
    return base.t().contiguous().t() if layout == "strided" else base


def cases(torch: Any, dist: Any, device: str = "cpu") -> dict[str, Callable[..., Any]]:
    """name -> fn(group, dtype, layout, rank, async_op) returning (works, outputs to compare);
    ``device``: where the wanxport group's tensors live (gloo's, group None, stay on the CPU)."""
    R = dist.ReduceOp
    where = {"device": "cpu"}

    def make(dtype: Any, layout: str, rank: int, salt: int) -> Any:
        t = _tensor(torch, dtype, layout, 1000 * salt + rank)
        return t if where["device"] == "cpu" else (t.to(where["device"]) if t.is_contiguous()
                                                    else t.t().to(where["device"]).t())

    def empty(shape: Any, dtype: Any) -> Any:
        return torch.empty(shape, dtype=dtype, device=where["device"])

    def like(t: Any) -> Any:
        out = torch.empty_like(t.contiguous())
        return out.t().contiguous().t() if not t.is_contiguous() and t.dim() == 2 else out

    def all_reduce(op: Any) -> Callable[..., Any]:
        def run(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
            t = make(dtype, layout, rank, 1)
            return [dist.all_reduce(t, op=op, group=g, async_op=a)], [t]
        return run

    def broadcast(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        t = make(dtype, layout, rank, 2)
        return [dist.broadcast(t, group_src=1, group=g, async_op=a)], [t]

    def all_gather(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        t = make(dtype, layout, rank, 3)
        outs = [like(t) for _ in range(N)]
        return [dist.all_gather(outs, t, group=g, async_op=a)], outs

    def all_gather_into(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        t = make(dtype, layout, rank, 4)
        out = empty((N * t.shape[0], *t.shape[1:]) if t.dim() else (N,), dtype)
        return [dist.all_gather_into_tensor(out, t, group=g, async_op=a)], [out]

    def reduce_scatter(op: Any) -> Callable[..., Any]:
        def run(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
            ins = [make(dtype, layout, rank, 5 + k) for k in range(N)]
            out = like(ins[0])
            return [dist.reduce_scatter(out, ins, op=op, group=g, async_op=a)], [out]
        return run

    def reduce_scatter_tensor(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        if layout == "scalar":  # no 0-d output has a 1-D input of N parts (gloo aborts the process)
            return [], []
        t = torch.cat([make(dtype, layout, rank, 9 + k) for k in range(N)])
        out = empty((t.shape[0] // N, *t.shape[1:]), dtype)
        return [dist.reduce_scatter_tensor(out, t, group=g, async_op=a)], [out]

    def reduce(op: Any) -> Callable[..., Any]:
        def run(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
            t = make(dtype, layout, rank, 13)
            return [dist.reduce(t, group_dst=2, op=op, group=g, async_op=a)], [t] if rank == 2 else []
        return run

    def gather(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        t = make(dtype, layout, rank, 14)
        outs = [like(t) for _ in range(N)] if rank == 0 else None
        return [dist.gather(t, outs, group_dst=0, group=g, async_op=a)], outs or []

    def scatter(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        ins = [make(dtype, layout, rank, 15 + k) for k in range(N)] if rank == 1 else None
        out = like(make(dtype, layout, rank, 15))
        return [dist.scatter(out, ins, group_src=1, group=g, async_op=a)], [out]

    def all_to_all(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        ins = [make(dtype, layout, rank, 20 + k) for k in range(N)]
        outs = [like(t) for t in ins]
        return [dist.all_to_all(outs, ins, group=g, async_op=a)], outs

    def all_to_all_single(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        base = make(dtype, "contiguous", rank, 24)
        t = torch.cat([base, base[:2]])  # 6 rows: 1 to rank 0, 2 to rank 1, 3 to rank 2
        t = t.t().contiguous().t() if layout == "strided" else t
        out = empty((N * (rank + 1), *t.shape[1:]), dtype)
        return [dist.all_to_all_single(out, t, [rank + 1] * N, [1, 2, 3], group=g, async_op=a)], [out]

    def p2p_ring(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        t = make(dtype, layout, rank, 25)
        out = like(t)
        ops = [dist.P2POp(dist.isend, t, group_peer=(rank + 1) % N, group=g, tag=7),
               dist.P2POp(dist.irecv, out, group_peer=(rank - 1) % N, group=g, tag=7)]
        return dist.batch_isend_irecv(ops), [out]

    def send_recv(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        t = make(dtype, layout, rank, 26)
        if rank == 0:
            return [dist.isend(t, group_dst=2, group=g, tag=3)], []
        if rank == 2:
            out = like(t)
            return [dist.irecv(out, group_src=0, group=g, tag=3)], [out]
        return [], []

    def all_reduce_coalesced(g: Any, dtype: Any, layout: str, rank: int, a: bool) -> Any:
        ts = [make(dtype, layout, rank, 27 + k) for k in range(2)]
        return [dist.all_reduce_coalesced(ts, group=g, async_op=a)], ts

    def placed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(g: Any, *args: Any) -> Any:
            where["device"] = "cpu" if g is None else device
            return fn(g, *args)
        return run

    table = {"all_reduce_sum": all_reduce(R.SUM), "all_reduce_avg": all_reduce(R.AVG),
             "all_reduce_product": all_reduce(R.PRODUCT),
            "all_reduce_min": all_reduce(R.MIN), "all_reduce_max": all_reduce(R.MAX),
            "all_reduce_band": all_reduce(R.BAND), "all_reduce_bor": all_reduce(R.BOR),
            "all_reduce_bxor": all_reduce(R.BXOR), "broadcast": broadcast, "all_gather": all_gather,
            "all_gather_into_tensor": all_gather_into, "reduce_scatter_sum": reduce_scatter(R.SUM),
            "reduce_scatter_max": reduce_scatter(R.MAX), "reduce_scatter_tensor": reduce_scatter_tensor,
            "reduce_sum": reduce(R.SUM), "reduce_min": reduce(R.MIN), "gather": gather, "scatter": scatter,
            "all_to_all": all_to_all, "all_to_all_single": all_to_all_single, "batch_isend_irecv": p2p_ring,
            "send_recv": send_recv, "all_reduce_coalesced": all_reduce_coalesced}
    return {name: placed(fn) for name, fn in table.items()}


def _rounded(name: str, dtype: Any) -> bool:
    """Floating sums and products: gloo's order differs from the fixed rank order."""
    rounded = ("sum", "avg", "product", "coalesced", "tensor")
    return dtype.is_floating_point and any(k in name for k in rounded)


def _compare(torch: Any, name: str, dtype: Any, mine: list[Any], gloo: list[Any]) -> str:
    if len(mine) != len(gloo):
        return f"{len(mine)} outputs, gloo {len(gloo)}"
    for k, (w, g) in enumerate(zip([t.cpu() for t in mine], gloo, strict=True)):
        if w.shape != g.shape or w.dtype != g.dtype or w.stride() != g.stride():
            return f"output {k}: {tuple(w.shape)} {w.dtype} {w.stride()}, gloo {tuple(g.shape)} {g.dtype}"
        if _rounded(name, dtype):
            # one ulp per rank of the contributions' magnitude (inputs: N(0, 4^2), |x| < 16 in practice)
            tol = N * torch.finfo(dtype).eps * (g.double().abs() + 16 * N)
            if not bool(((w.double() - g.double()).abs() <= tol).all()):
                return f"output {k}: beyond one ulp per rank: {w.tolist()} vs {g.tolist()}"
        elif not torch.equal(w.reshape(-1).view(torch.uint8), g.reshape(-1).view(torch.uint8)):
            return f"output {k}: not bitwise equal: {w.tolist()} vs {g.tolist()}"
    return "ok"


def matrix_worker(rank: int, work: Path, base_ports: list[int], timeout: float, device: str = "cpu") -> None:
    import torch
    import torch.distributed as dist

    import wanxport.torch as wt

    config = wt.SiteConfig.make(work / "pki" / f"site-{rank}", work / "pki" / "ca.pem",
                                [f"127.0.0.1:{base_ports[rank]}"])
    dist.init_process_group("gloo", store=dist.FileStore(str(work / "store"), N), rank=rank, world_size=N,
                            timeout=timedelta(seconds=timeout))
    wan = dist.new_group(list(range(N)), backend="wanxport", pg_options=wt.WanxportOptions(config),
                         timeout=timedelta(seconds=timeout))
    table = cases(torch, dist, device)
    results: dict[str, str] = {}
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        started = []
        for name, case in table.items():
            for layout in LAYOUTS:
                key = f"{name}/{dtype_name}/{layout}"
                try:
                    works, outs = case(wan, dtype, layout, rank, True)
                    started.append((key, name, layout, works, outs))
                except Exception as exc:  # noqa: BLE001 - recorded, compared with gloo's refusal
                    results[key] = f"wanxport refused: {type(exc).__name__}: {exc}"
        for key, _, _, works, _ in started:
            try:
                for w in works:
                    w.wait()
            except Exception as exc:  # noqa: BLE001
                results[key] = f"wanxport failed: {type(exc).__name__}: {exc}"
        mine = {key: outs for key, _, _, _, outs in started}
        for name, case in table.items():
            for layout in LAYOUTS:
                key = f"{name}/{dtype_name}/{layout}"
                try:
                    works, gloo_outs = case(None, dtype, layout, rank, False)
                    for w in works:
                        if w is not None:  # a blocking call returned None
                            w.wait()
                except Exception as exc:  # noqa: BLE001
                    gloo_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    results[key] = f"gloo refused ({gloo_error}); wanxport: {results.get(key, 'ran')}"
                    continue
                if key in results:
                    continue
                try:
                    results[key] = _compare(torch, name, dtype, mine[key], gloo_outs)
                except Exception:  # noqa: BLE001
                    results[key] = "compare failed: " + traceback.format_exc(limit=2)
    results.update(_work_and_barrier(torch, dist, wan, rank, timeout))
    (work / f"matrix-{rank}.json").write_text(json.dumps(results, indent=0))
    dist.destroy_process_group()


def _work_and_barrier(torch: Any, dist: Any, wan: Any, rank: int, timeout: float) -> dict[str, str]:
    """``Work.result()`` gives the op's outputs; then rank 2 skips a monitored barrier: ranks 0
    and 1 must raise naming it (the group is unusable afterwards, so this comes last)."""
    t = torch.full((2,), float(rank))
    work = dist.all_reduce(t, group=wan, async_op=True)
    out = {"result": "ok" if [r.tolist() for r in work.result()] == [[3.0, 3.0]] else str(work.result())}
    store = dist.distributed_c10d._get_default_store()
    if rank == 2:
        store.wait(["barrier-checked-0", "barrier-checked-1"], timedelta(seconds=3 * timeout))
        out["monitored_barrier"] = "skipped"
        return out
    try:
        wan.monitored_barrier(timedelta(seconds=2))
        out["monitored_barrier"] = "returned"
    except Exception as exc:  # noqa: BLE001 - the test checks what it was
        out["monitored_barrier"] = f"{type(exc).__name__}: {exc}"
    store.set(f"barrier-checked-{rank}", "1")  # nobody leaves (closing its sessions) before both saw it
    store.wait(["barrier-checked-0", "barrier-checked-1"], timedelta(seconds=3 * timeout))
    return out
