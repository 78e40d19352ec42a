"""Loopback check of the control channel: ``python -m wanxport_lab.loopback_check``.

Builds a throw-away PKI, runs a server on two loopback addresses and prints
one JSON object: handshake time, message round trips per second, and how long
a ``ResilientControl`` takes to carry a message after its path goes dark, per
idle timeout. It is the reproducible source of the numbers in
docs/notes/control.md; timings depend on the machine, so nothing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from wanxport.control.certs import make_test_pki
from wanxport.control.channel import connect_control, serve_control
from wanxport.control.messages import Bye, ShardComplete
from wanxport.control.resilient import ResilientControl
from wanxport.control.session import ControlChannel


async def _echo(channel: ControlChannel) -> None:
    async for msg in channel:
        await channel.send(msg)


async def run(messages: int = 2000, idle_timeouts: tuple[float, ...] = (0.5, 1.0)) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        make_test_pki(tmp, ["gw-a", "gw-b"])
        d = Path(tmp)
        client: dict[str, Any] = {"cert": d / "gw-a.pem", "key": d / "gw-a.key", "ca": d / "ca.pem"}
        server_id: dict[str, Any] = {"cert": d / "gw-b.pem", "key": d / "gw-b.key", "ca": d / "ca.pem"}
        loop = asyncio.get_running_loop()
        report: dict[str, Any] = {}

        server = await serve_control("127.0.0.1", 0, **server_id, on_session=_echo)
        handshakes = []
        for _ in range(21):
            start = loop.time()
            channel = await connect_control(*server.addresses[0], **client)
            handshakes.append(loop.time() - start)
            channel.close()
        report["handshake_median_s"] = round(statistics.median(handshakes), 4)

        channel = await connect_control(*server.addresses[0], **client)
        start = loop.time()
        receiver = asyncio.create_task(_drain(channel, messages))
        for i in range(messages):
            await channel.send(ShardComplete(i, "verified"))
        await receiver
        report["echo_msgs_per_s"] = round(messages / (loop.time() - start))
        channel.close()
        server.close()

        failover: dict[str, float] = {}
        for idle in idle_timeouts:
            server = await serve_control(
                [("127.0.0.1", 0), ("127.0.0.1", 0)], **server_id, on_session=_echo,
                idle_timeout_s=idle,
            )
            resilient = await ResilientControl.connect(server.addresses, **client,
                                                       idle_timeout_s=idle)
            await resilient.send(Bye("before"))
            await resilient.recv()
            server.kill_listener(0)
            start = loop.time()
            await resilient.send(Bye("after"))
            await resilient.recv()
            failover[f"idle_timeout_{idle}s"] = round(loop.time() - start, 3)
            resilient.close()
            server.close()
        report["failover_delivery_s"] = failover
        return report


async def _drain(channel: ControlChannel, count: int) -> None:
    for _ in range(count):
        await channel.recv()


def main() -> None:
    print(json.dumps(asyncio.run(run()), indent=2))


if __name__ == "__main__":
    main()
