"""One site of an elastic group in its own process, for the SIGKILL test: joins through a
TCPStore (a client of the test's server), then runs the documented step loop. Each
completed step prints one JSON line (the step, the live sites, a digest of the reduced
array); with ``"stall_at": k`` it stops before step k's collective (says "stalled") for
the test to kill it mid-collective; at the end it prints the final digest."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
from elastic_helpers import digest, fresh_state, grad, joiner
from torch.distributed import TCPStore

from wanxport.collective import MembershipChanged


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(spec: dict) -> None:
    import logging
    import os
    if os.environ.get("ELASTIC_DEBUG"):
        logging.basicConfig(level=logging.INFO, format=f"[{spec['site']}] %(name)s %(message)s")
        for noisy in ("quic", "wanxport.aio", "wanxport.control"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    store = TCPStore("127.0.0.1", spec["store_port"], is_master=False, timeout=timedelta(seconds=30))
    paths = {int(k): v for k, v in spec["paths"].items()}
    # Processes of their own on a host the suite keeps busy: a 1 s silence bound (the
    # in-process tests') can count a live peer as gone, which is not what this run tests.
    group = await joiner(store, Path(spec["pki"]), spec["names"], paths, spec["site"], liveness_min_s=3.0)
    state, step, until = fresh_state(), 0, spec["until"]
    say(joined=group.epoch.number)
    while step < until or group.size < len(spec["names"]) or step < group.epoch.start + 3:
        step = await group.boundary(step, state)
        g = grad(group.site, step)
        if step == spec.get("stall_at"):
            say(stalled=step)
            await asyncio.Event().wait()
        try:
            await group.all_reduce(g, op="mean")
        except MembershipChanged:
            say(redone=step)
            continue
        state.arrays["w"] = state.arrays["w"] + g
        state.arrays["step"] = np.array([step + 1])
        say(step=step, live=list(group.members), reduced=hashlib.sha256(g.tobytes()).hexdigest())
        step += 1
    say(final=step, digest=digest(state), admitted_at=group.epoch.start, changes=group.changes)
    await group.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
