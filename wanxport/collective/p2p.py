"""Point-to-point between two members of a group: ``send``/``recv`` and ``isend``/``irecv``.

Messages are matched by (source, destination, tag, order): each (peer, tag) pair
is a sequence of its own, numbered at call time on both sides. A send goes out at
once, eagerly, as one message carrying its signature (dtype, shape, element count)
and the data: a receiver has it one one-way delay (plus size / capacity) after the
send, with no control round trip first; a message that arrives before its receive
is posted waits in the group's inbox. The receiver checks the signature against its
own call before it copies a byte, then answers with its own signature, so a
mismatch is a ``CollectiveError`` at both ends naming both sides' values; ``send``
completes when that answer arrives. A call refused at its own site (a bad array)
still takes its number and tells the other end why (``abort_send`` to the
receiver, ``abort_recv`` to the sender), so later messages still pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .arrays import check_body, off_loop, refusing
from .buffers import as_array, flat_work, write_back
from .calls import Handle
from .message import HEADER_BYTES, P2P_DATA, P2P_REPLY, Call, Header, new_payload, text_payload, wire_shape

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine

    from .calls import CallSequence
    from .group import Channel, Got, Key
    from .link import SiteLink

TAG_LIMIT = 1 << 63


class PointToPoint:
    """The point-to-point half of ``Group`` (a mixin: it runs on the group's plumbing)."""

    if TYPE_CHECKING:  # what it uses of ``Group``
        gid: int
        site: int
        size: int
        names: list[str]
        links: dict[int, SiteLink]

        def _check_usable(self) -> None: ...
        def _sequence(self, channel: Channel) -> CallSequence: ...
        def _receive(self, key: Key) -> asyncio.Future[Got]: ...
        def _check_header(self, call: Call, peer: int, header: Header,
                          body: npt.NDArray[np.uint8]) -> None: ...
        def _over(self, channel: Channel, seq: int, peers: list[int]) -> None: ...
        def _run(self, call: Call, work: Coroutine[Any, Any, Any], timeout: float | None,
                 channel: Channel = ..., peers: list[int] | None = None) -> Coroutine[Any, Any, Any]: ...

    async def send(self, array: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``array`` (numpy array or CPU tensor, any size) to member ``dst`` under ``tag``;
        returns once ``dst``'s matching ``recv`` has it."""
        await self.isend(array, dst, tag, timeout)

    async def recv(self, array: Any, src: int, tag: int = 0, timeout: float | None = None) -> Any:
        """Receive into ``array`` (same dtype and shape as the sender's) from member ``src``'s
        next send under ``tag``; returns ``array``."""
        return await self.irecv(array, src, tag, timeout)

    def isend(self, array: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Handle:
        """``send`` started now (its place in the (dst, tag) order is this call's); a handle."""
        self._check_peer(dst, "dst", tag)
        channel = (P2P_REPLY, tag, dst)  # our sends to (dst, tag) are numbered as their answers
        with self._refusing_p2p("send", channel, "abort_send", dst):
            arr = as_array(array)
        call = self._p2p_call("send", channel, arr, dst, tag)
        return Handle(call, self._run(call, self._send(call, arr), timeout, channel, [dst]))

    def irecv(self, array: Any, src: int, tag: int = 0, timeout: float | None = None) -> Handle:
        """``recv`` started now (its place in the (src, tag) order is this call's); a handle."""
        self._check_peer(src, "src", tag)
        channel = (P2P_DATA, tag, src)
        with self._refusing_p2p("recv", channel, "abort_recv", src):
            arr = as_array(array)
            if not arr.flags.writeable:
                raise ValueError("array: read-only; recv writes into it")
        call = self._p2p_call("recv", channel, arr, src, tag)
        return Handle(call, self._run(call, self._recv(call, arr, array), timeout, channel, [src]))

    # -- the two ends ------------------------------------------------------------

    async def _send(self, call: Call, arr: npt.NDArray[Any]) -> None:
        payload = await off_loop(arr.nbytes, _message_of, arr)
        self.links[call.peer].send(Header(call, 0, 0, call.count), payload)
        peer, header, body = await self._receive((call.peer, P2P_REPLY, call.tag, call.seq, 0))
        self._check_header(call, peer, header, body)

    async def _recv(self, call: Call, arr: npt.NDArray[Any], original: Any) -> Any:
        got = await self._receive((call.peer, P2P_DATA, call.tag, call.seq, 0))
        peer, header, body = got
        if header.call.op == "send":  # answer with our signature: the sender checks it too
            reply = Call(call.seq, "recv", call.count, call.dtype, group=self.gid, tag=call.tag, peer=peer,
                         shape=call.shape, ndim=call.ndim)
            link = self.links[peer]

            def answer() -> None:
                link.send(Header(reply, 0, 0, 0), new_payload(0))

            # Once this receive's caller has its result: sending costs the loop a few hundred
            # microseconds, which the caller would otherwise wait out.
            Handle.after_result(answer)
        self._check_header(call, peer, header, body)
        check_body(call, header, body, self.names[peer])

        def place() -> None:
            flat = flat_work(arr)
            flat[:] = body.view(flat.dtype)
            write_back(arr, flat)

        await off_loop(arr.nbytes, place)
        return original

    # -- checks ------------------------------------------------------------------

    def _check_peer(self, peer: int, what: str, tag: int) -> None:
        """Arguments without which no other site is involved: a plain ValueError, no number taken."""
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < self.size \
                or peer == self.site:
            raise ValueError(f"{what}: {peer!r} is not another member's rank (0..{self.size - 1}, "
                             f"not {self.site})")
        if isinstance(tag, bool) or not isinstance(tag, int) or not -TAG_LIMIT <= tag < TAG_LIMIT:
            raise ValueError(f"tag: {tag!r} is not a 64-bit integer")
        if peer not in self.links:
            raise ValueError(f"{what}: member {peer} has no direct session with this site (point-to-point "
                             "needs one)")

    def _p2p_call(self, op: str, channel: tuple[int, int, int], arr: npt.NDArray[Any], peer: int,
                  tag: int) -> Call:
        self._check_usable()
        return Call(self._sequence(channel).take(), op, int(arr.size), arr.dtype.str, group=self.gid, tag=tag,
                    peer=peer, shape=wire_shape(arr.shape), ndim=arr.ndim)

    def _refusing_p2p(self, op: str, channel: tuple[int, int, int], abort: str, peer: int) -> Any:
        def refuse(exc: ValueError) -> None:
            self._check_usable()
            seq = self._sequence(channel).take()
            call = Call(seq, abort, 0, "", group=self.gid, tag=channel[1], peer=peer)
            message = text_payload(f"{op}: {exc}")
            self.links[peer].send(Header(call, 0, 0, message.nbytes - HEADER_BYTES), message)
            self._over(channel, call.seq, [peer])

        return refusing(refuse)


def _message_of(arr: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """A message buffer holding ``arr``'s bytes in C order."""
    raw = flat_work(arr).view(np.uint8)
    payload = new_payload(raw.nbytes)
    payload[HEADER_BYTES:] = raw
    return payload

