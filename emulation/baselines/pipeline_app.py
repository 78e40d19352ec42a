"""One stage of ``python -m emulation pipeline``: runs in a gateway namespace.

    python -m emulation.baselines.pipeline_app wanxport '<json spec>'
    python -m emulation.baselines.pipeline_app gloo '<json spec>'

Site a runs stage 0, site b stage 1 of ``examples/pipeline_two_sites.py``, with that
example's own schedule (``first_stage`` / ``last_stage``): M microbatches per step, each
activation crossing a -> b and its gradient b -> a as a point-to-point message. wanxport:
the two sites form a ``wanxport.collective`` group over every path (``join_sync``), whose
``isend``/``irecv`` the schedule calls as they are. gloo: a world of the two ranks on the
best route (``allreduce_app.gloo_world``), ``torch.distributed.isend``/``irecv``.

Runner protocol as the other baselines: ``{"event": "ready"}`` once joined, "go" on
stdin, then ``{"event": "done", ...}`` with each step's (start, end) on CLOCK_MONOTONIC
(shared by the namespaces; a step starts after a barrier, untimed) and, per step, a
digest of the activations and gradients this site sent and received (taken after the
step, off the clock: the runner checks that what a sent is what b received and back).

With ``latency_sizes``, after the steps site a sends ``messages`` messages of each size
to b one after another (each waits for b's one-element answer before the next); b
records when each ``recv`` returned. A message's latency is b's return minus a's call.
The first and last message of each size are checked element for element at b.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from emulation.baselines.allreduce_app import StepRecord, gloo_world, group_report
from emulation.baselines.tcp_app import emit

DATA_TAG, ANSWER_TAG = 3, 4
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"  # the schedule is the example's own


class TorchPointToPoint:
    """torch.distributed (gloo) with the point-to-point face the schedule calls."""

    def __init__(self, dist: Any) -> None:
        self.dist = dist

    def isend(self, array: Any, dst: int, tag: int = 0) -> Any:
        return self.dist.isend(array, dst, tag=tag)

    def irecv(self, array: Any, src: int, tag: int = 0) -> Any:
        return self.dist.irecv(array, src, tag=tag)

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


def closed_sessions(group: Any) -> str:
    """Each link's session end (its reason, the peer's, the failure), as the session recorded it."""
    out = []
    for link in group.group.links.values():
        session = link.session
        if session.end_reason is None:
            out.append(f"{link.name}: open")
            continue
        why = f"{link.name}: ended ({session.end_reason}"
        if session.peer_reason:
            why += f"; the peer said {session.peer_reason}"
        if session.failure is not None:
            why += f"; {session.failure!r}"
        out.append(why + ")")
    return ", ".join(out) or "no links"


def digest(tensors: list[Any]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def message(size_bytes: int, index: int) -> Any:
    import torch

    rng = np.random.default_rng([size_bytes, index])
    return torch.from_numpy(rng.standard_normal(size_bytes // 4, dtype=np.float32))


def latency_sweep(comm: Any, site: int, sizes: list[int], messages: int) -> dict[str, Any]:
    """Site a: each message's ``isend`` call time; site b: each ``recv``'s return, and whether
    the checked messages arrived intact. wanxport: each size's payload bytes per path, as this
    site's session counted them (which paths carried the size's messages)."""
    import torch

    answer = torch.zeros(1)
    stamps: dict[str, list[float]] = {}
    per_path: dict[str, list[int]] = {}
    intact = True
    for size in sizes:
        before = sent_per_path(comm)
        times = stamps[str(size)] = []
        reused = message(size, 0)  # one buffer for the unchecked ones: no generation between sends
        box = torch.empty(size // 4)
        for i in range(messages):
            checked = i in (0, messages - 1)
            if site == 0:
                data = message(size, i) if checked else reused
                times.append(time.monotonic())
                comm.isend(data, dst=1, tag=DATA_TAG).wait()
                comm.irecv(answer, src=1, tag=ANSWER_TAG).wait()
            else:
                comm.irecv(box, src=0, tag=DATA_TAG).wait()
                times.append(time.monotonic())
                comm.isend(answer, dst=0, tag=ANSWER_TAG).wait()
                if checked:
                    intact = intact and bool(torch.equal(box, message(size, i)))
        if before is not None:
            per_path[str(size)] = [b - a for a, b in zip(before, sent_per_path(comm), strict=True)]
    return {"stamps": stamps, "intact": intact, "payload_bytes_per_path": per_path}


def sent_per_path(comm: Any) -> list[int] | None:
    """Payload bytes this site's wanxport session has sent on each path so far (None for gloo)."""
    if not hasattr(comm, "group"):
        return None

    import asyncio

    async def read() -> list[int]:
        return [p.payload_bytes for stats in comm.group.path_stats().values() for p in stats]

    return asyncio.run_coroutine_threadsafe(read(), comm.loop).result()


def main(argv: list[str]) -> int:
    import torch

    sys.path.insert(0, str(EXAMPLES))
    from pipeline_two_sites import first_stage, last_stage, make_stages

    comm_name, spec = argv[0], json.loads(argv[1])
    torch.set_num_threads(1)
    site, rows, hidden, m = spec["site"], spec["rows"], spec["hidden"], spec["microbatches"]
    if comm_name == "wanxport":
        from wanxport.collective import join_sync

        pki, names = spec["pki"], spec["names"]
        comm: Any = join_sync(site, names, identity=f"{pki}/{names[site]}", ca=f"{pki}/ca.pem",
                              paths=spec["paths"], timeout=spec["timeout"], join_timeout=60.0)
    else:
        comm = TorchPointToPoint(gloo_world({**spec, "ranks_per_site": 1, "rank": 0}))
    stage = make_stages(hidden)[site]
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    emit({"event": "ready"})
    sys.stdin.readline()
    record, digests, losses, sweep = StepRecord(), [], [], None
    try:
        for step in range(spec["steps"]):
            comm.barrier()
            with record.step():
                opt.zero_grad()
                if site == 0:
                    sent, received = first_stage(stage, comm, step, m, rows, hidden)
                else:
                    loss, received, sent = last_stage(stage, comm, step, m, rows, hidden)
                    losses.append(loss)
                opt.step()
            comm.barrier()
            digests.append({"sent": digest(sent), "received": digest(received)})
        if spec.get("latency_sizes"):
            sweep = latency_sweep(comm, site, spec["latency_sizes"], spec["messages"])
            comm.barrier()
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        record.failed(exc)
        if comm_name == "wanxport":  # why the sessions ended, where they did: what the error lacks
            record.error = f"{record.error}; {closed_sessions(comm)}"
    extra: dict[str, Any] = {"paths": []}
    if comm_name == "wanxport":
        import asyncio

        extra = asyncio.run_coroutine_threadsafe(group_report(comm.group), comm.loop).result()
    comm.close()
    emit({**record.report(), **extra, "digests": digests, "losses": losses, "sweep": sweep})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
