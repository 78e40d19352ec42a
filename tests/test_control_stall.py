"""A starved gateway slows its control session down but never ends it; a dead one still ends it.

The server runs its own event loop in a thread, and a "stall" blocks that loop the way a
busy training step, a GC pause or a VM steal does: its sockets fill up unread, its
timers fire late and its keepalives stop. A stall longer than the QUIC idle timeout makes
the client drop its link and re-dial every control address; the server wakes to several
handshakes at once, and the session must come back over exactly one of them with every
message delivered once, in order. A server that never wakes ends the session within the
client's stated bound, naming it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from wanxport.control import (
    ControlChannel,
    ControlConnectionLost,
    ControlServer,
    ResilientControl,
    ShardComplete,
    serve_control,
)
from wanxport.control.certs import make_test_pki

pytestmark = pytest.mark.timeout(60)

IDLE_S = 1.0  # the server's QUIC idle timeout, so the link's: a stall longer than this drops it
DIAL_S = 2.0  # a handshake's bound: a first dial on a host busy with other tests may take a second
DIAL_IDLE_S = 3.0  # the client's, which bounds its handshakes: re-dials outlive the stall


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


def ident(pki: Path, name: str) -> dict[str, Path]:
    return {"cert": pki / f"{name}.pem", "key": pki / f"{name}.key", "ca": pki / "ca.pem"}


class ThreadedServer:
    """A control server on its own event loop (thread) that echoes every message back,
    and whose loop can be stalled from outside."""

    def __init__(self, pki: Path, resume_window_s: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.received: list[int] = []
        self.ends: list[BaseException | None] = []
        self._release = threading.Event()
        self.server: ControlServer = self._call(serve_control(
            [("127.0.0.1", 0), ("127.0.0.1", 0)], **ident(pki, "gw-b"), on_session=self._echo,
            idle_timeout_s=IDLE_S, resume_window_s=resume_window_s))

    def _call(self, coro: object) -> ControlServer:
        future: Future[ControlServer] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(timeout=10)

    async def _echo(self, channel: ControlChannel) -> None:
        try:
            async for msg in channel:
                assert isinstance(msg, ShardComplete)
                self.received.append(msg.shard_id)
                await channel.send(msg)
        except Exception as exc:  # noqa: BLE001 - the test reads why the session ended
            self.ends.append(exc)
        else:
            self.ends.append(None)

    async def stall(self, seconds: float | None) -> None:
        """Block the server's loop for ``seconds`` (None: until ``close``); returns once it is blocked."""
        blocked = threading.Event()

        def block() -> None:
            blocked.set()
            if seconds is None:
                self._release.wait()
            else:
                time.sleep(seconds)

        self.loop.call_soon_threadsafe(block)
        await asyncio.to_thread(blocked.wait)

    def sessions(self) -> int:
        return len(self.server.sessions)

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        self._release.set()
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def make_server(pki: Path) -> Iterator[Callable[..., ThreadedServer]]:
    servers: list[ThreadedServer] = []

    def make(resume_window_s: float = 30.0) -> ThreadedServer:
        servers.append(ThreadedServer(pki, resume_window_s))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


async def _echoed(channel: ResilientControl, first: int, count: int) -> list[int]:
    for shard in range(first, first + count):
        await channel.send(ShardComplete(shard, "verified"))
    got = []
    for _ in range(count):
        msg = await channel.recv()
        assert isinstance(msg, ShardComplete)
        got.append(msg.shard_id)
    return got


async def test_a_starved_host_longer_than_the_idle_timeout_keeps_the_session(make_server, pki: Path) -> None:
    """Each round starves both ends while the client sends: the server's loop blocks for 2.5
    idle timeouts, so the client's link times out and it re-dials both addresses; the
    client's own loop blocks from 1.6 to 2.8 idle timeouts, so it wakes to both handshake
    answers at once. The session resumes over exactly one link (one attach per re-dial);
    nothing is lost or repeated."""
    server = make_server()
    channel = await ResilientControl.connect(
        server.server.addresses, **ident(pki, "gw-a"), timeout_s=5, idle_timeout_s=DIAL_IDLE_S,
        stagger_s=0.25)
    try:
        assert await _echoed(channel, 0, 3) == [0, 1, 2]
        sent = 3
        for round_ in range(1, 4):
            await server.stall(2.5 * IDLE_S)
            asyncio.get_running_loop().call_later(1.6 * IDLE_S, time.sleep, 1.2 * IDLE_S)
            for shard in range(sent, sent + 5):  # queued while the link dies and is re-dialled
                await channel.send(ShardComplete(shard, "verified"))
            got = [(await channel.recv()).shard_id for _ in range(5)]  # type: ignore[attr-defined]
            assert got == list(range(sent, sent + 5))
            sent += 5
            assert channel.reconnects_total >= round_
        assert await _echoed(channel, sent, 2) == [sent, sent + 1]
        assert server.received == list(range(sent + 2))
        assert not channel.closed and server.sessions() == 1 and server.ends == []
        assert server.server.resumed_total == channel.reconnects_total
    finally:
        channel.close()


async def test_a_server_gone_for_good_ends_the_session_within_its_bound(make_server, pki: Path) -> None:
    """The server never wakes: the client notices within the idle timeout, re-dials for its
    resume window (each dial bounded by its timeout) and then ends the session naming both."""
    server = make_server()
    channel = await ResilientControl.connect(
        server.server.addresses, **ident(pki, "gw-a"), timeout_s=DIAL_S, idle_timeout_s=IDLE_S,
        stagger_s=0.1, resume_window_s=1.0)
    try:
        assert await _echoed(channel, 0, 1) == [0]
        await server.stall(None)
        bound_s = IDLE_S + 1.0 + DIAL_S  # idle timeout + resume window + the last dial's timeout
        with pytest.raises(ControlConnectionLost, match=r"not re-established within 1\.0s"):
            await asyncio.wait_for(channel.recv(), timeout=4 * bound_s)
        assert channel.closed
    finally:
        channel.close()



async def test_a_client_starved_for_twice_the_idle_timeout_resumes_within_the_window(
        make_server, pki: Path) -> None:
    """The client's loop blocks for two idle timeouts right after sending: the server's link
    times it out and the session waits its resume window. The client wakes and notices its
    dead link within one idle timeout of listening (the acknowledgements it read late
    inflated QUIC's own idle timeout several-fold), resumes within the window, and every
    message, sent before the stall or echoed into it, arrives once and in order."""
    server = make_server(resume_window_s=4.0)
    channel = await ResilientControl.connect(
        server.server.addresses, **ident(pki, "gw-a"), timeout_s=5, idle_timeout_s=IDLE_S)
    try:
        assert await _echoed(channel, 0, 2) == [0, 1]
        for shard in range(2, 6):
            await channel.send(ShardComplete(shard, "verified"))
        time.sleep(2 * IDLE_S)  # the stall: this loop runs nothing meanwhile
        got = [(await channel.recv()).shard_id for _ in range(4)]  # type: ignore[attr-defined]
        assert got == [2, 3, 4, 5]
        assert await _echoed(channel, 6, 2) == [6, 7]
        assert server.received == list(range(8))
        assert channel.reconnects_total == 1 and server.server.resumed_total == 1
        assert not channel.closed and server.sessions() == 1 and server.ends == []
    finally:
        channel.close()


async def test_a_client_starved_past_the_resume_window_is_told_why_its_session_ended(
        make_server, pki: Path) -> None:
    """The client's own loop blocks for longer than the server's idle timeout plus its
    resume window: the server counts the client gone and ends the session; the client
    wakes, finds its link dead, re-dials and is refused with the reason the session ended."""
    server = make_server(resume_window_s=0.5)
    channel = await ResilientControl.connect(
        server.server.addresses, **ident(pki, "gw-a"), timeout_s=5, idle_timeout_s=IDLE_S)
    try:
        assert await _echoed(channel, 0, 1) == [0]
        time.sleep(3 * (IDLE_S + 0.5))  # the stall: this loop runs nothing meanwhile
        with pytest.raises(ControlConnectionLost, match=r"control session not resumed: .*session "
                           r"already ended: gateway 'gw-a' did not reconnect within 0\.5s"):
            await asyncio.wait_for(channel.recv(), timeout=10 * IDLE_S)
        assert isinstance(server.ends[0], ControlConnectionLost) and server.sessions() == 0
    finally:
        channel.close()
