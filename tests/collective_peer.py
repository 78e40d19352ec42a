"""A peer site in its own process, for the killed-peer test: joins, answers one all-reduce,
says "joined", then waits (for the test to kill it by pid)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np

from wanxport.collective import join


async def main(spec: dict) -> None:
    pki = Path(spec["pki"])
    group = await join(spec["site"], spec["names"], identity=pki / spec["names"][spec["site"]],
                       ca=pki / "ca.pem", paths=spec["paths"], timeout=30.0)
    await group.all_reduce(np.ones(1000, dtype=np.float32))
    print("joined", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
