"""Two asyncio endpoints over loopback UDP: byte-exact transfers, forged and replayed datagrams."""

from __future__ import annotations

import asyncio
import hashlib
import random
import select
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from wanxport.aio import native_io
from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket
from wanxport.aio.endpoint import Endpoint
from wanxport.aio.native_lanes import ReceiveLane
from wanxport.aio.verify import ShardHasher
from wanxport.core import holdoff as holdoff_module
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.digest import shard_digest
from wanxport.core.stats import PathStats
from wanxport.presets import offload_chunk_bytes
from wanxport.wire import native
from wanxport.wire.datapath import PacketSealer
from wanxport.wire.frames import ProbeFrame
from wanxport.wire.header import encode_header
from wanxport.wire.protection import AeadProtection

A_CONN, B_CONN = 11, 22
WAIT_S = 30.0

DATAPATHS = [
    pytest.param("native", marks=pytest.mark.skipif(not native.NATIVE_AVAILABLE,
                                                     reason=str(native.import_error))),
    "python",
]
TRANSFER_DATAPATHS = DATAPATHS


def keys(seed: int) -> tuple[DirectionKey, DirectionKey]:
    rng = random.Random(seed)
    return (DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12)),
            DirectionKey("chacha20-poly1305", rng.randbytes(32), rng.randbytes(12)))


class Pair:
    """Sender a and receiver b, connected over ``n`` loopback paths."""

    def __init__(self, datapath: str, n: int, segments: int, seed: int = 1, holdoff_s: float = 0.001) -> None:
        paths = tuple(PathConfig(f"p{i}", 1500) for i in range(n))
        chunk = offload_chunk_bytes(paths, segments) if segments > 1 else None
        session = SessionConfig(paths=paths, chunk_bytes=chunk, max_ack_delay_s=max(0.001, holdoff_s))
        self.a_to_b, self.b_to_a = keys(seed)
        sockets = tuple(PathSocket(("127.0.0.1", 0)) for _ in paths)
        self.a = Endpoint(EndpointConfig(session, sockets, self.a_to_b, self.b_to_a, A_CONN, B_CONN,
                                         datapath=datapath, receive_holdoff_s=holdoff_s))
        try:
            self.b = Endpoint(EndpointConfig(session, sockets, self.b_to_a, self.a_to_b, B_CONN, A_CONN,
                                             datapath=datapath, receive_holdoff_s=holdoff_s))
        except BaseException:
            self.a.abort()
            raise
        self.a.connect(self.b.local_addresses)
        self.b.connect(self.a.local_addresses)

    async def transfer(self, payloads: list[bytes]) -> None:
        """Send every payload as a shard; assert each arrives byte-exact and is acknowledged."""
        futures = [self.a.submit(i, p) for i, p in enumerate(payloads)]
        got = {}
        while len(got) < len(payloads):
            shard = await asyncio.wait_for(self.b.receive_shard(), WAIT_S)
            got[shard.shard_id] = shard
        assert await asyncio.wait_for(asyncio.gather(*futures), WAIT_S) == [True] * len(payloads)
        for i, payload in enumerate(payloads):
            assert got[i].ok
            assert hashlib.sha256(got[i].data).digest() == hashlib.sha256(payload).digest()


@pytest.fixture
async def pairs() -> AsyncIterator[Callable[..., Pair]]:
    """Builds started pairs; closes every endpoint (sockets, pacer threads) even on failure."""
    made: list[Pair] = []

    def make(datapath: str, n: int, segments: int, holdoff_s: float = 0.001) -> Pair:
        pair = Pair(datapath, n, segments, holdoff_s=holdoff_s)
        made.append(pair)
        pair.a.start()
        pair.b.start()
        return pair

    try:
        yield make
    finally:
        for pair in made:
            for endpoint in (pair.a, pair.b):
                await endpoint.close()


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.parametrize("datapath", TRANSFER_DATAPATHS)
@pytest.mark.parametrize(("n_paths", "segments"), [(2, 1), (3, 16)])
async def test_transfer_arrives_byte_exact(pairs: Callable[..., Pair], datapath: str, n_paths: int,
                                           segments: int) -> None:
    pair = pairs(datapath, n_paths, segments)
    size = 4 << 20 if datapath == "native" else 2 << 20
    await pair.transfer([payload(size, 1), payload(size // 3 + 7, 2)])
    assert pair.b.datagrams_rejected == 0
    assert pair.a.datapath_name == datapath


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))
@pytest.mark.parametrize("honest", [True, False])
async def test_large_shard_is_hashed_while_it_arrives(pairs: Callable[..., Pair], honest: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Most of a large shard is hashed before its last byte; the verdict is still exact."""
    left_at_finish: list[int] = []
    finish = ShardHasher.finish

    async def recording(self: ShardHasher) -> bytes:
        left_at_finish.append(len(self._buffer) - self.hashed)
        return await finish(self)

    monkeypatch.setattr(ShardHasher, "finish", recording)
    pair = pairs("native", 2, 16)
    data = payload(24 << 20, 5)
    digest = shard_digest(data if honest else data[:-1] + b"?")
    ack = pair.a.submit(0, data, digest=digest)
    shard = await asyncio.wait_for(pair.b.receive_shard(), WAIT_S)
    assert await asyncio.wait_for(ack, WAIT_S) is honest
    assert shard.ok is honest and bytes(shard.data) == data
    assert len(left_at_finish) == 1 and left_at_finish[0] < len(data) // 2


def forged_datagrams(rng: random.Random, path_id: int) -> dict[str, list[bytes]]:
    """Datagrams no honest sender produces, by the reason the receiver must give.

    The receiver's sockets are connected, so the kernel already drops datagrams
    from any other address; the tests inject through the sender's own sockets,
    as an on-path attacker spoofing its address would.
    """
    header = encode_header(path_id, B_CONN, rng.randrange(1 << 20))
    return {
        "marker": [b"\x9f" + rng.randbytes(rng.randrange(40, 1400)) for _ in range(20)],
        # QUIC-looking (0x40): on a socket no control channel shares, unclaimed and rejected.
        "quic": [b"\xff" + rng.randbytes(rng.randrange(40, 1400)) for _ in range(10)],
        "short": [rng.randbytes(rng.randrange(1, 31)).replace(b"\xff", b"\x21", 1) for _ in range(5)],
        "conn": [encode_header(path_id, B_CONN + 1, rng.randrange(1 << 20)) + rng.randbytes(200)
                 for _ in range(20)],
        "auth": [header[:8] + struct.pack(">Q", rng.randrange(1 << 40)) + rng.randbytes(300)
                 for _ in range(40)],
    }


@pytest.mark.parametrize("datapath", TRANSFER_DATAPATHS)
async def test_forged_datagrams_are_rejected_and_the_transfer_completes(
        pairs: Callable[..., Pair], datapath: str) -> None:
    pair = pairs(datapath, 2, 8)
    rng = random.Random(5)
    before = throw(pair, rng)
    data = payload(3 << 20, 3)
    fut = pair.a.submit(0, data)
    during = throw(pair, rng)
    shard = await asyncio.wait_for(pair.b.receive_shard(), WAIT_S)
    assert await asyncio.wait_for(fut, WAIT_S)
    assert shard.ok and bytes(shard.data) == data
    # Those thrown before the transfer were queued ahead of its data: surely counted.
    assert before <= pair.b.datagrams_rejected <= before + during
    counters = pair.b.datapath.counters
    assert counters.get("rejected_auth", 0) >= 2 * 40
    assert counters.get("rejected_conn", 0) >= 2 * 20
    assert counters.get("rejected_marker", 0) >= 2 * 20
    # QUIC-looking ones are set apart by both receivers and, with no control side, dropped.
    assert counters.get("passed_quic", 0) >= 2 * 10 and pair.b.handoff.unclaimed >= 2 * 10


def throw(pair: Pair, rng: random.Random) -> int:
    """Send forged datagrams on every path towards b; return how many."""
    thrown = 0
    for path_id, sock in enumerate(pair.a.sockets):
        for datagrams in forged_datagrams(rng, path_id).values():
            for d in datagrams:
                sock.send(d)
                thrown += 1
    return thrown


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (bounded by WAIT_S)."""
    async def spin() -> None:
        while not condition():
            await asyncio.sleep(0)
    await asyncio.wait_for(spin(), WAIT_S)


@pytest.mark.parametrize("datapath", DATAPATHS)
async def test_replayed_datagram_is_rejected(pairs: Callable[..., Pair], datapath: str) -> None:
    pair = pairs(datapath, 2, 1)
    sealer = PacketSealer(B_CONN, {0: AeadProtection(pair.a_to_b.cipher, pair.a_to_b.key, pair.a_to_b.iv)})
    datagram = sealer.seal(1, 40, [ProbeFrame(9)])
    spoofed = pair.a.sockets[1]  # an on-path attacker resending a captured datagram
    spoofed.send(datagram)
    await until(lambda: pair.b.session.paths[1].acks.largest == 40)
    assert pair.b.datagrams_rejected == 0
    spoofed.send(datagram)
    await until(lambda: pair.b.datagrams_rejected == 1)
    assert pair.b.datapath.counters["rejected_replay"] == 1
    assert pair.b.session.paths[1].acks.received.total == 1


@pytest.mark.parametrize("datapath", DATAPATHS)
async def test_probe_paths_hears_the_peer_on_every_path_then_data_flows(
        pairs: Callable[..., Pair], datapath: str) -> None:
    pair = pairs(datapath, 3, 8)
    assert await pair.a.probe_paths(WAIT_S) == [True, True, True]
    assert pair.b.datagrams_rejected == 0
    await pair.transfer([payload(1 << 20, 4)])


@pytest.mark.parametrize("datapath", DATAPATHS)
@pytest.mark.parametrize(("holdoff_s", "passes"), [(0.05, 1), (0.0, 4)])
async def test_receive_holdoff_drains_every_path_that_woke_meanwhile_in_one_pass(
        pairs: Callable[..., Pair], datapath: str, holdoff_s: float, passes: int) -> None:
    """A probe on each of 4 paths: with a hold-off, the first wake waits and one pass takes all
    four (and each side's answer waited it out); without, each path's wake is a pass of its own.
    Once the sender has measured RTTs too short beside the hold-off, it stops holding."""
    pair = pairs(datapath, 4, 1, holdoff_s=holdoff_s)
    started = time.monotonic()
    assert await pair.a.probe_paths(WAIT_S) == [True] * 4
    took = time.monotonic() - started
    assert (pair.b.receive_passes, pair.a.receive_passes) == (passes, passes)
    if holdoff_s:
        assert took >= 2 * holdoff_s * 0.9  # both sides held (asyncio may fire a timer ~1 ms early)
    await pair.transfer([payload(1 << 20, 4)])  # and data still flows, byte-exact, after it
    # a's RTT samples are about one hold-off (b's), under HOLDOFF_RTT_RATIO of them: a stops
    # holding. b, which sent no data, has no sample and holds on.
    assert (pair.a.receive_holding, pair.b.receive_holding) == (False, bool(holdoff_s))


@pytest.mark.parametrize("datapath", DATAPATHS)
async def test_receive_holdoff_yields_while_a_socket_fills(
        pairs: Callable[..., Pair], datapath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst larger than one drain takes (a flood, say) arrives while the receiver holds:
    that drain stops at its cap with datagrams left, so the hold-off turns off (a held socket
    that keeps filling drops the transfer's own datagrams) until HOLDOFF_YIELD_S passes
    without such a drain. Without the yield the receiver would hold on throughout. The
    yield (1 s here) is long beside a drain, so the first quiet drain falls within it."""
    monkeypatch.setattr(holdoff_module, "HOLDOFF_YIELD_S", 1.0)
    pair = pairs(datapath, 1, 1, holdoff_s=0.05)
    receiver = pair.b
    assert receiver.receive_holding  # no RTT sample: a receiver holds from the start
    flood = pair.a.sockets[0]  # connected to the receiver's, whose socket accepts only its peer
    burst = 4000  # more than a drain's cap (native 16 x 64, Python 512), each turned away
    for i in range(burst):
        flood.send(b"\x21" + i.to_bytes(4, "big") * 8)
    await until(lambda: receiver.datapath.rejected >= burst)
    assert not receiver.receive_holding, "a pressed drain turns the hold-off off"
    assert receiver.holdoff_yields >= 1

    async def drain_one_quiet_datagram() -> None:
        passes = receiver.receive_passes
        flood.send(b"\x21" + bytes(32))
        await until(lambda: receiver.receive_passes > passes)

    await drain_one_quiet_datagram()
    assert not receiver.receive_holding, "a dry drain within the yield does not end it"
    while not receiver.receive_holding:  # once the yield runs out, a dry drain holds again
        await drain_one_quiet_datagram()


@pytest.mark.parametrize("datapath", DATAPATHS)
async def test_while_data_keeps_arriving_the_sockets_are_polled_not_watched(
        pairs: Callable[..., Pair], datapath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A datagram every 5 ms against a 50 ms hold-off: the first wake takes both paths out
    of the loop's watch and every pass after it finds something, so the paths are polled
    pass after pass, not watched again and woken. Once a poll finds nothing the loop
    watches them again, and a lone datagram is drained without any timer."""
    pair = pairs(datapath, 2, 1, holdoff_s=0.05)
    receiver = pair.b
    watched: list[tuple[int, bool]] = []
    watch = receiver.intake._watch
    monkeypatch.setattr(receiver.intake, "_watch", lambda path_id, on: (watched.append((path_id, on)),
                                                                        watch(path_id, on))[1])
    flood = pair.a.sockets[0]  # turned away by the receiver's parser: drained, counted
    passes = receiver.receive_passes
    for i in range(120):
        flood.send(b"\x21" + i.to_bytes(4, "big") * 8)
        await asyncio.sleep(0.005)
    await until(lambda: receiver.datapath.rejected >= 120)
    held_passes = receiver.receive_passes - passes
    assert watched[:2] == [(0, False), (1, False)]
    # The old way was a watch cycle (two changes) per pass of the flooded path; now four changes
    # per dry poll, which only a stall of the loop longer than a hold-off makes.
    assert len(watched) <= held_passes, f"{len(watched)} watch changes over {held_passes} passes"
    await until(lambda: watched[-2:] == [(0, True), (1, True)])  # a dry poll: the loop watches again
    flood.send(b"\x21" + bytes(32))
    await until(lambda: receiver.datapath.rejected >= 121)


@pytest.mark.parametrize("bad", [-0.001, 0.2, float("nan")])
def test_receive_holdoff_out_of_range_is_refused(bad: float) -> None:
    session = SessionConfig(paths=(PathConfig("p0"),))
    a_to_b, b_to_a = keys(3)
    with pytest.raises(ValueError, match="receive_holdoff_s must be"):
        EndpointConfig(session, (PathSocket(("127.0.0.1", 0)),), a_to_b, b_to_a, receive_holdoff_s=bad)


@pytest.mark.parametrize("datapath", TRANSFER_DATAPATHS)
async def test_wrong_digest_fails_on_both_sides_while_other_shards_pass(
        pairs: Callable[..., Pair], datapath: str) -> None:
    """The receiver checks digests in a worker thread; the verdict still reaches both sides."""
    pair = pairs(datapath, 2, 4)
    good, bad = payload(1 << 20, 5), payload(300_000, 6)
    verdicts = [pair.a.submit(0, good), pair.a.submit(1, bad, digest=shard_digest(b"other"))]
    got = {}
    while len(got) < 2:
        shard = await asyncio.wait_for(pair.b.receive_shard(), WAIT_S)
        got[shard.shard_id] = shard
    assert got[0].ok and bytes(got[0].data) == good
    assert not got[1].ok
    assert await asyncio.wait_for(asyncio.gather(*verdicts), WAIT_S) == [True, False]


def _loop_factories() -> list[object]:
    factories: list[object] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return factories
    return [*factories, pytest.param(uvloop.new_event_loop, id="uvloop")]


@pytest.mark.parametrize("loop_factory", _loop_factories())
def test_timer_never_runs_the_session_before_its_deadline(
        loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """uvloop rounds timers to whole milliseconds (below 0.5 ms: the next iteration). An early
    run found nothing due and re-armed, so a paced sender spun through thousands of empty
    timer runs a second. Deadlines 0.1-2 ms ahead must reach the session at or after the
    deadline, in at most a few timer runs, and only those count as the loop's timer wake-ups."""

    async def main() -> None:
        pair = Pair("python", 1, 1)
        endpoint = pair.a
        try:
            endpoint.start()
            session = endpoint.session
            deadline: list[float | None] = [None]
            fired: list[float] = []

            def on_deadline(now: float) -> None:
                fired.append(now)
                deadline[0] = None

            session.on_deadline = on_deadline  # type: ignore[method-assign]
            session.next_deadline = lambda: deadline[0]  # type: ignore[method-assign]
            session.poll_transmit = lambda now: []  # type: ignore[method-assign]
            runs = [0]
            on_timer = endpoint._on_timer

            def counting() -> None:
                runs[0] += 1
                on_timer()

            endpoint._on_timer = counting  # type: ignore[method-assign]
            wakes = endpoint.timer_wakes
            for k in range(20):
                if endpoint._timer is not None:
                    endpoint._timer.cancel()
                endpoint._timer, endpoint._timer_at = None, float("inf")
                fired.clear()
                runs[0] = 0
                target = endpoint.clock() + 0.0001 * (k + 1)
                deadline[0] = target
                endpoint._service()
                waited = 0.0
                while not fired and waited < 5.0:  # bounded: a loaded host may run it late
                    await asyncio.sleep(0.005)
                    waited += 0.005
                assert len(fired) == 1 and fired[0] >= target, (k, fired, target)
                assert runs[0] <= 3
            # The loop's count of timer wake-ups is of those that reached the session, not of
            # early runs that only re-armed.
            assert endpoint.timer_wakes - wakes == 20
            assert endpoint.loop_events()["timer_wakes"] == endpoint.timer_wakes
        finally:
            pair.a.abort()
            pair.b.abort()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


@pytest.mark.alone  # the receiver's thread must answer within the sender's stall: timing on this host
@pytest.mark.parametrize("datapath", DATAPATHS)
def test_deadline_after_a_stall_reads_the_waiting_ack_before_it_judges(datapath: str) -> None:
    """The sender's loop stalls past its probe timeout while the answer lands in its socket.

    uvloop (libuv) runs due timers before it polls for I/O, so without reading first the
    probe timeout would find no acknowledgement, declare the flight lost, suspect the path
    and re-send what had arrived. The receiver runs on a loop thread of its own, so it
    answers while the sender is stalled. The stall is in an I/O callback, as a long
    receive pass (or the host descheduling the process there) would be: what follows
    is the loop's next turn, timers first.
    """
    uvloop = pytest.importorskip("uvloop")
    pair = Pair(datapath, 1, 1, holdoff_s=0.0)
    b_loop = asyncio.new_event_loop()
    b_thread = threading.Thread(target=b_loop.run_forever, daemon=True)
    b_thread.start()
    paused, go = threading.Event(), threading.Event()

    def pause_b() -> None:
        paused.set()
        go.wait(WAIT_S)
    warm: list[PathStats] = []  # the sender's path after the warm-up shard

    def on_b(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, b_loop).result(WAIT_S)

    async def b_start() -> None:
        pair.b.start()

    async def b_receive() -> list[bytes]:
        return [bytes((await asyncio.wait_for(pair.b.receive_shard(), WAIT_S)).data) for _ in range(2)]

    async def sender() -> None:
        pair.a.start()
        try:
            assert await asyncio.wait_for(pair.a.submit(0, payload(200_000, 6)), WAIT_S)  # warm: RTT in µs
            await until(lambda: pair.a.session.stats().paths[0].bytes_in_flight == 0)  # all acked
            warm.append(pair.a.session.stats().paths[0])
            b_loop.call_soon_threadsafe(pause_b)  # the receiver pauses ...
            assert await asyncio.to_thread(paused.wait, WAIT_S)
            ack = pair.a.submit(1, payload(1000, 7))  # ... while one datagram goes to it
            readable = await asyncio.to_thread(select.select, [pair.b.sockets[0]], [], [], WAIT_S)
            assert readable[0], "the datagram did not reach the receiver's socket"
            pto = pair.a.session.paths[0].loss.pto_s(pair.a.config.session.max_ack_delay_s)
            await stall_in_io_callback(max(0.3, 20 * pto), go.set)  # the answer arrives meanwhile
            assert await asyncio.wait_for(ack, WAIT_S)
        finally:
            await pair.a.close()

    try:
        on_b(b_start())
        received = asyncio.run_coroutine_threadsafe(b_receive(), b_loop)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(sender())
        assert received.result(WAIT_S) == [payload(200_000, 6), payload(1000, 7)]
        (before,), path = warm, pair.a.session.stats().paths[0]
        assert path.packets_lost == before.packets_lost and path.spurious_losses == before.spurious_losses
        assert path.retransmitted_bytes == before.retransmitted_bytes
        assert (path.failures, path.state) == (0, "active")
    finally:
        go.set()
        on_b(pair.b.close())
        b_loop.call_soon_threadsafe(b_loop.stop)
        b_thread.join(WAIT_S)
        b_loop.close()
        pair.a.abort()


async def stall_in_io_callback(seconds: float, before: Callable[[], None]) -> None:
    """Block the running loop for ``seconds`` inside a reader callback; ``before`` first."""
    loop = asyncio.get_running_loop()
    wake, trigger = socket.socketpair()
    done = loop.create_future()

    def stall() -> None:
        loop.remove_reader(wake.fileno())
        before()
        time.sleep(seconds)
        done.set_result(None)

    try:
        loop.add_reader(wake.fileno(), stall)
        trigger.send(b"x")
        await asyncio.wait_for(done, WAIT_S)
    finally:
        wake.close()
        trigger.close()


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))
def test_a_drain_reports_the_kernel_receive_time_of_its_newest_datagram() -> None:
    """What the intake subtracts from a held pass's round trips (``Received.rx_ns``)."""
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with a, b:
        b.bind(("127.0.0.1", 0))
        b.setblocking(False)
        native_io.enable_timestamps(b)
        before = time.time_ns()
        for _ in range(3):
            a.sendto(b"\x21" + bytes(40), b.getsockname())
        lane = ReceiveLane(7, 1, native.Protector("aes-256-gcm", bytes(32), bytes(12)), False, 2048)
        received = lane.receive(b)
        assert before <= received.rx_ns <= time.time_ns()
        assert lane.counters["rejected_conn"] == 3  # not ours: dropped, but heard
