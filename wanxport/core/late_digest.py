"""Digests that follow their shard: the first datagram leaves before the shard is hashed.

Why: hashing a shard before its first datagram puts a whole pass over its bytes
(about 0.2 s per GiB on one core) in front of the transfer. A sender that opens
the shard unhashed (SHARD_OPEN_UNHASHED) hashes it while the data flows and sends
the digest in a SHARD_DIGEST frame; the receiver hashes what arrives as before
and checks it against that digest once both the bytes and the digest are in.
Verification is as strong as before: the receiver still compares a BLAKE3
digest of every byte it holds with the one the sender computed over its bytes.

A SHARD_DIGEST may overtake its shard's SHARD_OPEN on another path: it is held
(at most ``MAX_EARLY`` shards' worth) until the shard opens.
"""

from __future__ import annotations

from wanxport.core.incoming import IncomingData
from wanxport.core.outgoing import OutgoingData
from wanxport.wire.frames import DIGEST_LEN, Frame, ShardDigestFrame

MAX_EARLY = 1024  # digests held for shards not opened yet; more is a protocol violation


def give_digest(outgoing: OutgoingData, control: list[Frame], shard_id: int, digest: bytes) -> None:
    """The sender learnt the digest of a shard it submitted unhashed: it rides in the shard's
    SHARD_OPEN if that has not left yet, else in a SHARD_DIGEST of its own (``control``)."""
    shard = outgoing.shards.get(shard_id)
    if shard is None or shard.digest is not None:
        return  # finished (the peer cannot have verified it: it failed), or already given
    shard.digest = digest
    if shard.opened:
        control.append(ShardDigestFrame(shard_id, digest))


class LateDigests:
    """The receiver's side: digests learnt for shards opened unhashed, or not opened yet."""

    def __init__(self, incoming: IncomingData) -> None:
        self._incoming = incoming
        self._early: dict[int, bytes] = {}
        self.refusal = ""

    def learn(self, shard_id: int, digest: bytes) -> bool:
        """A SHARD_DIGEST (or one held for a shard that just opened). False, with ``refusal``
        saying why, for a digest that contradicts the one its shard has, or one too many
        held; a shard already handed over needs none."""
        if len(digest) != DIGEST_LEN:
            self.refusal = f"shard {shard_id}: a digest of {len(digest)} bytes"
            return False
        if self._incoming.finished.contains_point(shard_id):
            return True
        shard = self._incoming.shards.get(shard_id)
        if shard is None:
            if shard_id not in self._early and len(self._early) >= MAX_EARLY:
                self.refusal = f"shard {shard_id}: more than {MAX_EARLY} digests for shards not opened"
                return False
            self._early[shard_id] = digest
            return True
        if shard.digest is not None and shard.digest != digest:
            self.refusal = f"shard {shard_id}: a second digest that differs from the first"
            return False
        shard.digest = digest
        return True

    def opened(self, shard_id: int) -> bool:
        """A SHARD_OPEN was accepted: give its shard a digest that came first (False: they differ)."""
        digest = self._early.pop(shard_id, None)
        return digest is None or self.learn(shard_id, digest)
