"""The simulator drives the core with the calls the asyncio endpoint makes .

A real loopback transfer (two aio Endpoints over 127.0.0.1 sockets, 2 paths,
a few MiB, 16 datagrams per core packet) is recorded at the session boundary
by a thin wrapper — method, arguments, ``now`` and result of every core call
— and replayed into a fresh session with the same configuration through the
simulator's driver (``wanxport.sim.driver.Driver``, the code path the
simulator uses to call the core). The transmits, deadlines and events of the
replay must be those of the real run, call for call.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, replace
from typing import Any

import pytest

from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket
from wanxport.aio.endpoint import Endpoint
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.events import ShardFilled
from wanxport.core.session import Session
from wanxport.presets import offload_chunk_bytes
from wanxport.sim.driver import Control, Driver, Run
from wanxport.wire import native

RECORDED = ("submit", "set_digest", "receive_data_run", "receive_packets", "received_prefix",
            "shard_verified", "on_deadline", "events", "poll_transmit", "next_deadline")


@dataclass
class Call:
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any


class RecordingSession:
    """Wraps a Session: records every core call and its result, passes everything else through."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.calls: list[Call] = []
        self.recording = True

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._session, name)
        if name not in RECORDED:
            return target

        def record(*args: Any, **kwargs: Any) -> Any:
            result = target(*args, **kwargs)
            if self.recording:
                self.calls.append(Call(name, args, kwargs, result))
            return result
        return record


def normalized(events: list[Any]) -> list[Any]:
    """A ShardFilled event carries the allocator's buffer, which is the driver's own; the
    rest of it (shard, digest, time) must match."""
    return [replace(e, buffer=len(e.buffer)) if isinstance(e, ShardFilled) else e for e in events]


def replay(config: SessionConfig, calls: list[Call]) -> int:
    """Feed the recorded calls to a fresh session through the simulator's driver; compare
    every result. Returns how many transmits were compared."""
    driver = Driver(Session(config, defer_verification=True))
    compared = 0
    i = 0
    while i < len(calls):
        call = calls[i]
        if call.method in ("receive_data_run", "receive_packets"):
            # One receive batch: its runs, then its controls (one call, which applies a
            # path's ACKs together), all at one ``now`` (the endpoint services once for
            # several batches of one loop iteration).
            # (No receive hold-off here: nothing waited, ``held_s`` is 0 throughout.)
            runs: list[Run] = []
            controls: list[Control] = []
            now = call.args[6] if call.method == "receive_data_run" else call.args[1]
            while (i < len(calls) and calls[i].method == "receive_data_run"
                   and calls[i].args[6] == now):
                path_id, first_pn, count, shard_id, offset, length, now = calls[i].args[:7]
                runs.append((path_id, first_pn, count, shard_id, offset, length))
                i += 1
            if (i < len(calls) and calls[i].method == "receive_packets"
                    and calls[i].args[1] == now):
                packets, now = calls[i].args[:2]
                controls.extend(packets)
                i += 1
            driver.receive(runs, controls, now)
            continue
        if call.method == "events":
            poll, deadline = calls[i + 1], calls[i + 2]
            assert (poll.method, deadline.method) == ("poll_transmit", "next_deadline"), i
            serviced = driver.service(poll.args[0])
            assert normalized(serviced.events) == normalized(call.result), i
            assert serviced.transmits == poll.result, i
            assert serviced.deadline == deadline.result, i
            compared += len(poll.result)
            i += 3
            continue
        if call.method == "submit":
            shard_id, data, now = call.args
            driver.submit(shard_id, data, now, **call.kwargs)
        elif call.method == "set_digest":
            driver.set_digest(*call.args)
        elif call.method == "received_prefix":
            assert driver.received_prefix(*call.args) == call.result, i
        elif call.method == "shard_verified":
            driver.verified(*call.args)
        elif call.method == "on_deadline":
            driver.fire(*call.args)
        else:
            raise AssertionError(f"call {i}: {call.method} outside a service round")
        i += 1
    return compared


DATAPATHS = [
    pytest.param("native", marks=pytest.mark.skipif(not native.NATIVE_AVAILABLE,
                                                     reason=str(native.import_error))),
    "python",
]


@pytest.mark.parametrize("datapath", DATAPATHS)
async def test_a_loopback_transfer_replays_identically_through_the_simulator_driver(datapath: str) -> None:
    paths = (PathConfig("p0", 1500), PathConfig("p1", 1500))
    config = SessionConfig(paths=paths, chunk_bytes=offload_chunk_bytes(paths, 16), max_ack_delay_s=0.001)
    rng = random.Random(13)
    a_to_b = DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))
    b_to_a = DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))
    sockets = tuple(PathSocket(("127.0.0.1", 0)) for _ in paths)
    a = Endpoint(EndpointConfig(config, sockets, a_to_b, b_to_a, 1, 2, datapath=datapath))
    b = Endpoint(EndpointConfig(config, sockets, b_to_a, a_to_b, 2, 1, datapath=datapath))
    a.connect(b.local_addresses)
    b.connect(a.local_addresses)
    recorders = [RecordingSession(a.session), RecordingSession(b.session)]
    a.session, b.session = recorders  # type: ignore[assignment]
    payloads = [rng.randbytes(size) for size in (3 << 20, 1 << 20, 777_777)]
    a.start()
    b.start()
    try:
        futures = [a.submit(i, p) for i, p in enumerate(payloads)]
        for _ in payloads:
            shard = await asyncio.wait_for(b.receive_shard(), 60.0)
            expected = hashlib.sha256(payloads[shard.shard_id]).digest()
            assert shard.ok and hashlib.sha256(shard.data).digest() == expected
        assert await asyncio.wait_for(asyncio.gather(*futures), 60.0) == [True] * len(payloads)
        for recorder in recorders:
            recorder.recording = False
    finally:
        await a.close()
        await b.close()
    sender, receiver = recorders
    assert any(c.method == "receive_data_run" for c in receiver.calls)
    assert any(c.method == "receive_data_run" and c.args[2] > 1 for c in receiver.calls)  # real runs
    assert any(c.method == "shard_verified" for c in receiver.calls)
    for recorder in recorders:
        assert replay(config, recorder.calls) > 0
    with pytest.raises(AssertionError):  # the comparison has teeth: another config diverges
        replay(replace(config, chunk_bytes=(config.chunk_bytes or 0) // 2), sender.calls)
    segmented = [tx for c in sender.calls if c.method == "poll_transmit" for tx in c.result if tx.count > 1]
    assert segmented, "the sender never sent a multi-datagram core packet"
