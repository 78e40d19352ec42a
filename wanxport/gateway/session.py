"""One gateway session: the control channel and the data-plane endpoint, together.

The control channel (QUIC, mutual TLS) sets the session up and then carries
what the data plane should not: shard announcements, completion verdicts,
key rotation and the goodbye. The endpoint moves the bytes. This class runs
the control reader (dispatching those messages) and the rotation check, and
offers the few calls the file transfer and the Python API are built on:
``send_shard`` on the initiator, ``receive``/``complete`` on the responder.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from wanxport.aio.endpoint import Endpoint, ReceivedShard
from wanxport.aio.threadcpu import hashing
from wanxport.control import (
    PROTOCOL_VERSION,
    Bye,
    ControlChannel,
    ControlClosed,
    ControlProtocolError,
    Keys,
    KeyUpdate,
    Message,
    PathStatus,
    ResumeHave,
    ResumeQuery,
    ShardAnnounce,
    ShardComplete,
    for_version,
)
from wanxport.core.digest import shard_digest_hex
from wanxport.core.stats import SessionStats
from wanxport.core.warm import PathMemory

from .rekey import DataKeys
from .shards import (
    DATA_PLANE_ONLY,
    UNHASHED,
    DeliveredShard,
    GatewayTotals,
    SessionFailed,
    meta_for_peer,
    riding_announcement,
    riding_meta,
)

log = logging.getLogger(__name__)

ROTATION_CHECK_S = 0.05


async def digest_hex_async(data: Any) -> str:
    """The shard digest (``core.digest``) off the event loop: the hash releases the GIL."""
    return await asyncio.to_thread(counted_digest_hex, data)


def counted_digest_hex(data: Any) -> str:
    """``shard_digest_hex``, its CPU counted as the ``digest`` role (``aio.threadcpu``)."""
    with hashing():
        return shard_digest_hex(data)


class GatewaySession:
    """Both roles share this class; ``role`` is "initiator" (sender) or "responder"."""

    def __init__(self, role: str, channel: ControlChannel, endpoint: Endpoint, keys: DataKeys,
                 peer_name: str, *, mode: str, stall_timeout_s: float | None = None,
                 protocol_version: int = PROTOCOL_VERSION) -> None:
        """``stall_timeout_s`` (receiver): fail the session when shards are open and no
        data arrived for that long (the core's stall deadline, ``core.stall``); None: wait for ever.
        ``protocol_version``: the version agreed with the peer at setup (``handshake``);
        what this session sends carries nothing newer."""
        self.role = role
        self.protocol_version = protocol_version
        self.channel = channel
        self.endpoint = endpoint
        self.keys = keys
        self.peer_name = peer_name
        self.mode = mode
        self.peer_instance: str | None = None  # the peer process's id (Hello/Welcome.instance)
        self.totals = GatewayTotals()
        self._loop = asyncio.get_running_loop()
        self._announced: dict[int, ShardAnnounce] = {}
        self._announce_waiters: dict[int, asyncio.Future[ShardAnnounce]] = {}
        self._completions: dict[int, asyncio.Future[str]] = {}
        self._reasons: dict[int, str] = {}  # the receiver's reason for a verdict (protocol 4)
        self._empty: asyncio.Queue[ShardAnnounce] = asyncio.Queue()
        self._quiet: set[int] = set()  # data-plane-only shards received, not yet completed
        # The responder's answer to a ResumeQuery (the daemon's inbox); without one it holds nothing.
        self.resume_handler: Callable[[ResumeQuery], Awaitable[ResumeHave]] | None = None
        self._resume_answers: dict[int, asyncio.Future[ResumeHave]] = {}
        self._ended: asyncio.Future[str] = self._loop.create_future()
        self._failure: Exception | None = None
        self._peer_reason: str | None = None
        self._tasks = [asyncio.create_task(self._read_control()), asyncio.create_task(self._rotate())]
        if role == "responder" or stall_timeout_s is not None:  # we receive
            self._tasks.append(asyncio.create_task(self._watch_data_close()))
            if stall_timeout_s is not None:
                endpoint.watch_stall(stall_timeout_s)
                self._tasks.append(asyncio.create_task(self._watch_stall()))
        self._closed = False
        self._close_done = asyncio.Event()
        self._close_reason: str | None = None

    # -- sending (initiator) ---------------------------------------------------

    async def send_shard(self, shard_id: int, data: Any, announce: ShardAnnounce,
                         meta: dict[str, Any] | None = None,
                         on_acked: Callable[[], None] | None = None, *,
                         data_plane_only: bool = False) -> bool:
        """Announce, send and wait for the receiver's verdict over both channels.

        True only when the data plane acknowledged the shard as verified *and*
        the receiver confirmed completion on the control channel (for files:
        after the file is in place). ``on_acked`` runs once the data plane is done
        with ``data`` (acknowledged, or the session ended while it was in flight):
        a file's verdict comes after its last piece, each piece's buffer is free before.
        ``data_plane_only``: the shard travels on the data plane alone with a peer of
        protocol 5 (``gateway.shards.DATA_PLANE_ONLY``), on both channels with older peers.
        An announcement whose digest is ``UNHASHED`` has it computed here: with a peer of
        protocol 5 while the shard flows (``core.late_digest``), else before it leaves.
        """
        self._check_alive()
        late = announce.digest == UNHASHED and self.protocol_version >= 5
        if announce.digest == UNHASHED and not late:
            announce = dataclasses.replace(announce, digest=await digest_hex_async(data))
        quiet = data_plane_only and self.protocol_version >= 5
        verdict = None if quiet else self._completion(shard_id)
        if verdict is not None and not late:
            await self.channel.send(for_version(announce, self.protocol_version))
        now = self.endpoint.clock()
        if self.totals.first_submit is None:
            self.totals.first_submit = now
        peer_meta = meta_for_peer(meta, self.protocol_version)
        if quiet:
            peer_meta = {**peer_meta, DATA_PLANE_ONLY: riding_meta(announce)}
        wire_meta = json.dumps(peer_meta).encode()
        digest = None if late else bytes.fromhex(announce.digest)
        acked = self.endpoint.submit(shard_id, data, wire_meta, digest, digest_later=late)
        if late:  # the first datagrams are on their way: hash meanwhile
            announce = dataclasses.replace(announce, digest=await digest_hex_async(data))
            self.endpoint.set_digest(shard_id, bytes.fromhex(announce.digest))
            if verdict is not None:
                await self.channel.send(for_version(announce, self.protocol_version))
        del data  # the data plane holds it until acknowledged, and no longer
        try:
            ok = await self._until_ended(acked)
        except SessionFailed:
            # The receiver sends its verdict only once it verified the shard, so a verdict
            # answers for the data plane too. A receiver that leaves right after its verdict
            # ends the session before its data-plane acknowledgement (sent first, but on
            # another channel, and never repeated after a close) need have reached us.
            if verdict is None or not verdict.done() or verdict.cancelled():
                raise
            ok = True
        finally:
            if on_acked is not None:
                on_acked()
        self.totals.last_ack = self.endpoint.clock()
        self.totals.bytes_sent += announce.size_bytes
        self.totals.shards_sent += 1
        if verdict is None:
            return bool(ok)
        status = await self._until_ended(verdict)
        return bool(ok) and status == "verified"

    async def resume_query(self, query: ResumeQuery) -> ResumeHave:
        """Ask the receiver which of a file's pieces it already holds (the initiator)."""
        self._check_alive()
        answer: asyncio.Future[ResumeHave] = self._loop.create_future()
        self._resume_answers[query.query_id] = answer
        try:
            await self.channel.send(query)
            result: ResumeHave = await self._until_ended(answer)
            return result
        finally:
            self._resume_answers.pop(query.query_id, None)

    def verdict(self, shard_id: int) -> str | None:
        """The receiver's status for a shard (None until it answered): why a send failed."""
        fut = self._completions.get(shard_id)
        return fut.result() if fut is not None and fut.done() and not fut.cancelled() else None

    def verdict_reason(self, shard_id: int) -> str | None:
        """Why the receiver did not verify a shard, when it said (a protocol 4 peer)."""
        return self._reasons.get(shard_id)

    async def announce_empty(self, announce: ShardAnnounce) -> bool:
        """A zero-byte shard (an empty file) exists only on the control channel."""
        self._check_alive()
        verdict = self._completion(announce.shard_id)
        await self.channel.send(for_version(announce, self.protocol_version))
        return await self._until_ended(verdict) == "verified"

    # -- receiving (responder) -------------------------------------------------

    async def receive(self) -> DeliveredShard:
        """The next shard that arrived, once its announcement is here too."""
        got: ReceivedShard = await self._until_ended(asyncio.ensure_future(self.endpoint.receive_shard()))
        try:
            meta = json.loads(got.meta) if got.meta else {}
        except ValueError:
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        riding = meta.pop(DATA_PLANE_ONLY, None) if self.protocol_version >= 5 else None
        if riding is not None:  # its verdict is the data plane's: ``complete`` sends nothing
            announce = riding_announcement(got.shard_id, riding, got.digest)
            self._quiet.add(got.shard_id)
        else:
            announce = await self._until_ended(self._announcement(got.shard_id))
        self.totals.bytes_received += len(got.data)
        self.totals.shards_received += 1
        ok = got.ok and announce.size_bytes == len(got.data)
        return DeliveredShard(got.shard_id, got.data, ok, announce, meta, got.at)


    def announcement(self, shard_id: int) -> ShardAnnounce | None:
        return self._announced.get(shard_id)

    async def next_empty(self) -> ShardAnnounce:
        """The next announced zero-byte shard (it never appears on the data plane)."""
        return await self._until_ended(asyncio.ensure_future(self._empty.get()))

    async def complete(self, shard_id: int, status: str, reason: str | None = None) -> None:
        """The verdict on a shard, and why it is not ``verified`` (sent to a protocol 4 peer)."""
        # The shard is answered: its announcement is not needed again (a warm session
        # receives shards for months, so nothing per shard may stay behind).
        self._announced.pop(shard_id, None)
        if shard_id in self._quiet:  # its data-plane acknowledgement was the verdict
            self._quiet.discard(shard_id)
            return
        await self.channel.send(for_version(ShardComplete(shard_id, status, reason), self.protocol_version))

    def forget(self, shard_ids: Iterable[int]) -> None:
        """The initiator read these shards' verdicts: drop them (a warm session sends
        shards for months)."""
        for shard_id in shard_ids:
            self._completions.pop(shard_id, None)
            self._reasons.pop(shard_id, None)

    async def wait_ended(self) -> str:
        """Until the peer says goodbye (the reason) or the session fails (raises)."""
        return await asyncio.shield(self._ended)

    # -- lifecycle -------------------------------------------------------------

    @property
    def failure(self) -> Exception | None:
        """What ended the session abnormally (None while alive or after a goodbye)."""
        return self._failure

    @property
    def end_reason(self) -> str | None:
        """Why the session ended (the goodbye's reason, or the failure), or why our close
        (under way) ends it; None while it runs."""
        return self._ended.result() if self._ended.done() else self._close_reason

    @property
    def peer_reason(self) -> str | None:
        """The reason the peer gave for ending the session (its goodbye, or its data-plane
        CLOSE), if the peer ended it; None when this side or a failure did."""
        return self._peer_reason

    @property
    def datagrams_rejected(self) -> int:
        return self.endpoint.datagrams_rejected

    # -- the transport's figures and steering, for reports, metrics, progress, the daemon --
    def stats(self) -> SessionStats:
        """A frozen snapshot of the data plane's figures, every path's included (``core.stats``)."""
        return self.endpoint.stats()

    def acked_bytes(self) -> int:
        """Payload bytes the peer acknowledged so far: one integer, no snapshot taken."""
        return self.endpoint.acked_bytes()

    def receiving_bytes(self) -> int:
        """Payload bytes held in shards still arriving (not yet handed to the application)."""
        return self.endpoint.receiving_bytes()

    @property
    def peer_credit_bytes(self) -> int:
        """How many bytes of open shards the peer accepts at once (its receive credit)."""
        return self.endpoint.peer_credit_bytes

    def set_rate_caps(self, caps_bps: tuple[float | None, ...]) -> None:
        """Each path's sending rate cap (bits/s, None: uncapped), in force from the next packet."""
        self.endpoint.set_rate_caps(caps_bps)

    def rate_caps_bps(self) -> tuple[float | None, ...]:
        return self.endpoint.rate_caps_bps()

    def resume_path(self, path_id: int, memory: PathMemory) -> bool:
        """Offer a path a previous session's saved state (careful resume, ``core.warm``)."""
        return self.endpoint.resume_path(path_id, memory)

    async def close(self, reason: str = "done", *, goodbye: bool = True) -> None:
        """Say goodbye (when still possible and ``goodbye``: not to a peer known dead, whose
        answer would be waited for in vain), stop the data plane, end the channel."""
        if self._closed:
            await self._close_done.wait()  # another caller's close: until it is through
            return
        self._closed = True
        self._close_reason = reason
        try:
            if goodbye and self._failure is None and not self.channel.closed:
                with contextlib.suppress(Exception):
                    await self.channel.send(Bye(reason))
                    await self.channel.aclose(timeout_s=2.0)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.endpoint.close(reason)
            self.channel.close()
            if not self._ended.done():
                self._ended.set_result(reason)
            self._close_done.set()

    async def __aenter__(self) -> GatewaySession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close("done" if exc[0] is None else "error")

    # -- internals -------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise SessionFailed(str(self._failure))
        if self._ended.done():  # the reason says why (a peer's full disk names ENOSPC)
            raise SessionFailed(f"the session has ended ({self._ended.result()})")

    async def _until_ended(self, fut: asyncio.Future[Any]) -> Any:
        """``fut``'s result, or SessionFailed when the session ends first.

        A waiter cancelled meanwhile (a collective closing its link) cancels ``fut`` too:
        nobody will read it, so the endpoint's close must not fail it with an exception
        that asyncio then reports as never retrieved."""
        try:
            done, _ = await asyncio.wait({fut, self._ended}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        if fut in done:
            return fut.result()
        fut.cancel()
        if self._failure is not None:
            raise SessionFailed(str(self._failure))
        raise SessionFailed(f"the peer ended the session ({self._ended.result()})")

    def _completion(self, shard_id: int) -> asyncio.Future[str]:
        fut = self._completions.get(shard_id)
        if fut is None:
            fut = self._completions[shard_id] = self._loop.create_future()
        return fut

    def _announcement(self, shard_id: int) -> asyncio.Future[ShardAnnounce]:
        fut: asyncio.Future[ShardAnnounce] = self._loop.create_future()
        if shard_id in self._announced:
            fut.set_result(self._announced[shard_id])
        else:
            self._announce_waiters[shard_id] = fut
        return fut

    async def _read_control(self) -> None:
        try:
            async for msg in self.channel:
                await self._dispatch(msg)
            self._end("control channel closed")
        except ControlClosed:
            self._end("control channel closed")
        except Exception as exc:  # noqa: BLE001 - whatever ended the channel ends the session
            self._fail(exc)

    async def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, ShardAnnounce):
            self._announced[msg.shard_id] = msg
            if msg.size_bytes == 0:
                self._empty.put_nowait(msg)
            waiter = self._announce_waiters.pop(msg.shard_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(msg)
        elif isinstance(msg, ShardComplete):
            fut = self._completion(msg.shard_id)
            if not fut.done():
                fut.set_result(msg.status)
                if msg.reason:
                    self._reasons[msg.shard_id] = msg.reason
        elif isinstance(msg, Keys):
            await self.channel.send(self.keys.on_keys(msg, self.endpoint))
        elif isinstance(msg, KeyUpdate):
            self.keys.on_key_update(msg, self.endpoint)
        elif isinstance(msg, Bye):
            self._end(msg.reason or "bye", peer_reason=msg.reason)
        elif isinstance(msg, ResumeQuery):
            handler = self.resume_handler
            await self.channel.send(await handler(msg) if handler is not None
                                    else ResumeHave(msg.query_id, []))
        elif isinstance(msg, ResumeHave):
            answer = self._resume_answers.get(msg.query_id)
            if answer is not None and not answer.done():
                answer.set_result(msg)
        elif isinstance(msg, PathStatus):
            log.info("peer reports path %d %s %s", msg.path_id, "up" if msg.up else "down", msg.reason)
        else:
            raise ControlProtocolError(f"{msg.TYPE}: not valid after session setup")

    async def _watch_data_close(self) -> None:
        """The peer's data-plane CLOSE also ends the session: its goodbye on the control
        channel may be stuck behind a control path that just died."""
        closed = await self.endpoint.wait_closed()
        if self._closed:
            return  # our own close
        log.info("data plane closed by the peer (%s)", closed.error or closed.code)
        self._end(f"peer closed the data plane ({closed.error or closed.code})", peer_reason=closed.error)

    async def _watch_stall(self) -> None:
        """A sender that opens shards and then stops sending (while its control channel
        stays alive) would hold our receive budget, and the receiving loop, for ever:
        the core reports it (``ReceiveStalled``) and the session fails with its reason."""
        stalled = await self.endpoint.wait_stalled()
        self._fail(SessionFailed(stalled.describe()))

    async def _rotate(self) -> None:
        while True:
            await asyncio.sleep(ROTATION_CHECK_S)
            keys = self.keys.due(self.endpoint)
            if keys is not None:
                await self.channel.send(keys)

    def _end(self, reason: str, peer_reason: str | None = None) -> None:
        if not self._ended.done():
            self._peer_reason = peer_reason
            self._ended.set_result(reason)

    def _fail(self, exc: Exception) -> None:
        if self._failure is None and not self._ended.done():
            log.warning("session with %s failed: %s", self.peer_name, exc)
            self._failure = exc
            self._ended.set_result(str(exc))
