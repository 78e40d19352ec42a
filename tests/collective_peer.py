"""A site in its own process, for the liveness tests: joins, answers one all-reduce, says
"joined"; then either waits (for the test to kill it by pid) or, with ``"then": "recv"``,
posts a receive nobody will send to (from its first peer), says "pending", and prints
how that receive ended as one JSON line."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

from wanxport.collective import CollectiveError, join


async def main(spec: dict) -> None:
    pki = Path(spec["pki"])
    paths = spec["paths"]
    if isinstance(paths, dict):
        paths = {int(k): v for k, v in paths.items()}
    group = await join(spec["site"], spec["names"], identity=pki / spec["names"][spec["site"]],
                       ca=pki / "ca.pem", paths=paths, timeout=spec.get("timeout", 30.0))
    await group.all_reduce(np.ones(1000, dtype=np.float32))
    print("joined", flush=True)
    if spec.get("then") != "recv":
        await asyncio.Event().wait()
    peer = 1 if group.site == 0 else 0
    pending = asyncio.ensure_future(group.recv(np.zeros(4), src=peer, tag=9))
    await asyncio.sleep(0)
    print("pending", flush=True)
    started = time.monotonic()
    try:
        await pending
        result = {"error": None}
    except CollectiveError as exc:
        result = {"error": str(exc), "site": exc.site}
    result["elapsed_s"] = time.monotonic() - started
    print(json.dumps(result), flush=True)
    await group.close(drain_s=0.0)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
