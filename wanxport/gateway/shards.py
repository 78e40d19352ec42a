"""What a gateway session hands on and counts: delivered shards, its own totals, a piece's meta,
and the error its calls raise when it ends under them.

Kept apart from ``gateway.session`` (the control dispatch and the shard calls)
so that the types its users hold do not drag the session's internals along.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from wanxport.control import ControlProtocolError, ShardAnnounce
from wanxport.control.messages import message_from_dict, message_to_dict

META_SINCE_VERSION_4 = ("mode", "mtime_ns", "symlink")  # file piece meta keys a peer of 3 is not sent
#: The data-plane meta key that carries a shard's announcement when the shard travels on the
#: data plane alone (protocol 5, ``GatewaySession.send_shard(data_plane_only=True)``): no
#: ShardAnnounce and no ShardComplete on the control channel; the data plane's acknowledgement
#: is the verdict. As safe as both channels: the data plane is authenticated under keys from
#: the control channel, and its acknowledgement says the receiver verified the digest the
#: shard was opened with. For shards whose receiver has nothing left to do once they are
#: verified (collective messages); a file's verdict waits for the file to be in place.
DATA_PLANE_ONLY = "announce"
#: An announcement's digest that ``GatewaySession.send_shard`` computes itself: with a peer of
#: protocol 5 while the shard's first datagrams are already on their way (``core.late_digest``).
UNHASHED = ""


class SessionFailed(ConnectionError):
    """The session ended before the operation finished (peer gone, control lost)."""


@dataclass
class DeliveredShard:
    """A shard handed to the application: its bytes and verdict, the sender's announcement and meta."""

    shard_id: int
    data: memoryview
    ok: bool
    announce: ShardAnnounce
    meta: dict[str, Any]
    at: float


@dataclass
class GatewayTotals:
    """What this gateway session moved, counted by the gateway as it hands shards on (mutable;
    the transport's own figures are the core's frozen snapshot, ``GatewaySession.stats()``)."""

    started: float = field(default_factory=time.monotonic)
    first_submit: float | None = None
    last_ack: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    shards_sent: int = 0  # acknowledged by the receiver
    shards_received: int = 0  # handed to the application


def meta_for_peer(meta: dict[str, Any] | None, protocol_version: int) -> dict[str, Any]:
    """A file piece's meta without what the agreed protocol does not carry: before 4, a
    file's mode, mtime and symlink target are not sent (the peer would not apply them)."""
    if not meta or protocol_version >= 4:
        return meta or {}
    return {k: v for k, v in meta.items() if k not in META_SINCE_VERSION_4}


def riding_meta(announce: ShardAnnounce) -> dict[str, Any]:
    """The announcement as a data-plane-only shard's meta carries it: without its digest,
    which the shard's data plane carries (in SHARD_OPEN, or after it in SHARD_DIGEST)."""
    fields = message_to_dict(dataclasses.replace(announce, digest="0" * 64))
    del fields["digest"]
    return fields


def riding_announcement(shard_id: int, riding: Any, digest: bytes | None) -> ShardAnnounce:
    """The announcement a data-plane-only shard carried in its meta (``DATA_PLANE_ONLY``),
    with the digest its data plane checked it against.

    One that does not parse, or announces another shard, fails the session: the peer's
    data plane is authenticated, so that is a broken peer, not noise on the wire."""
    if not isinstance(riding, dict) or digest is None:
        raise SessionFailed(f"shard {shard_id}: its data-plane announcement is invalid")
    try:
        announce = message_from_dict({**riding, "digest": digest.hex()})
    except ControlProtocolError as exc:
        raise SessionFailed(f"shard {shard_id}: its data-plane announcement is invalid ({exc})") from None
    if not isinstance(announce, ShardAnnounce) or announce.shard_id != shard_id:
        raise SessionFailed(f"shard {shard_id}: its data-plane meta announces another shard")
    return announce
