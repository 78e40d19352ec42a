"""Data-plane key schedule: fresh keys per direction and key phase, and when to rotate.

Keys are never derived from one another: each phase gets new ``os.urandom``
material, so learning one key reveals nothing about the previous or next.
Each gateway draws the keys for the datagrams *it* sends and ships them over
the authenticated control channel (``messages.Keys``).

Rotation (the message flow, see also ``messages.KeyUpdate``):

1. the sender's ``should_rotate`` turns true (bytes, packets or time under the
   current key reached a limit);
2. it calls ``rotate()`` and sends ``Keys(key_phase=n+1)`` on the control channel,
   while still sealing with phase ``n``;
3. the receiver installs the new key in slot ``(n+1) & 1`` (the wire carries only
   the phase's low bit) and answers ``KeyUpdate(key_phase=n+1)``;
4. on that confirmation the sender seals with phase ``n+1`` (``confirm``).

So no datagram is sealed under a key its receiver lacks. The limits are far
below AES-GCM's per-key safety bound; nonces cannot repeat anyway because
packet numbers per path never repeat under one key.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .messages import CIPHERS, DIRECTIONS, Keys

KEY_BYTES = 32
IV_BYTES = 12


@dataclass(frozen=True)
class RotationLimits:
    """Rotate when any limit is reached; tests may use tiny values."""

    packets: int = 2**30
    bytes: int = 64 * 2**30
    seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("packets", "bytes", "seconds"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"rotation limit {name}: {value} is not valid; use a number > 0")


class KeySchedule:
    """The sending keys of one direction, phase by phase."""

    def __init__(
        self,
        direction: str,
        cipher: str = "aes-256-gcm",
        limits: RotationLimits | None = None,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction: {direction!r} is not valid; use one of {DIRECTIONS}")
        if cipher not in CIPHERS:
            raise ValueError(f"cipher: {cipher!r} is not valid; use one of {CIPHERS}")
        self.direction = direction
        self.cipher = cipher
        self.limits = limits or RotationLimits()
        self._random = random_bytes
        self.current = self._make(0)
        self.pending: Keys | None = None

    def _make(self, phase: int) -> Keys:
        return Keys(
            direction=self.direction,
            key_phase=phase,
            cipher=self.cipher,
            key=self._random(KEY_BYTES),
            iv=self._random(IV_BYTES),
        )

    def should_rotate(self, bytes_sent: int, packets_sent: int, elapsed_s: float) -> bool:
        """True when the current key has carried enough (counts since it started),
        and no rotation is already waiting for the receiver's confirmation."""
        if self.pending is not None:
            return False
        return (
            packets_sent >= self.limits.packets
            or bytes_sent >= self.limits.bytes
            or elapsed_s >= self.limits.seconds
        )

    def rotate(self) -> Keys:
        """Fresh keys for the next phase; send them, keep sealing with ``current``."""
        if self.pending is None:
            self.pending = self._make(self.current.key_phase + 1)
        return self.pending

    def confirm(self, key_phase: int) -> Keys:
        """The receiver confirmed ``key_phase`` (KeyUpdate); it becomes current."""
        if self.pending is None or key_phase != self.pending.key_phase:
            expected = None if self.pending is None else self.pending.key_phase
            raise ValueError(f"key_update.key_phase: {key_phase} is not valid; expected {expected}")
        self.current, self.pending = self.pending, None
        return self.current
