"""Data-plane keys of one gateway session: first keys, rotation, installation.

Each side draws the keys for what *it* seals (``control.KeySchedule``) and
ships them as ``Keys`` over the control channel. Rotation follows the flow in
``control.keys``: the sealing side sends ``Keys(n+1)`` while still sealing
with ``n``; the opening side installs them in phase slot ``(n+1) & 1`` and
answers ``KeyUpdate(n+1)``; only then does the sealing side switch. The
opening side keeps the previous phase's key in the other slot, so datagrams
sealed before the switch still open.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from wanxport.aio.config import DirectionKey
from wanxport.aio.endpoint import Endpoint
from wanxport.control import ControlProtocolError, Keys, KeySchedule, KeyUpdate, RotationLimits

log = logging.getLogger(__name__)

# A new rotation waits this long after the previous switch, so datagrams sealed
# under phase n-1 (still in flight or in the pacer ring) have left before the
# opening side overwrites that slot with phase n+1.
MIN_PHASE_LIFETIME_S = 0.5
# The run report lists when the most recent rotations happened; a warm session rotates
# hourly for months, so only this many are kept (``rotations`` counts them all).
KEEP_ROTATION_TIMES = 256


def direction_key(keys: Keys) -> DirectionKey:
    return DirectionKey(keys.cipher, keys.key, keys.iv)


class DataKeys:
    """Our sending keys (with the rotation trigger) and the peer's installed phases."""

    def __init__(self, direction: str, cipher: str, limits: RotationLimits,
                 clock: Callable[[], float]) -> None:
        self.schedule = KeySchedule(direction, cipher, limits)
        self.peer_direction = ("responder->initiator" if direction == "initiator->responder"
                               else "initiator->responder")
        self.clock = clock
        self.phase_started = clock()
        self.rotations = 0
        self.peer_phase = 0
        self.rotation_times: deque[float] = deque(maxlen=KEEP_ROTATION_TIMES)

    @property
    def current(self) -> Keys:
        return self.schedule.current

    def due(self, endpoint: Endpoint) -> Keys | None:
        """The ``Keys`` to send when a limit is reached (None otherwise)."""
        now = self.clock()
        if now - self.phase_started < MIN_PHASE_LIFETIME_S:
            return None
        if not self.schedule.should_rotate(endpoint.bytes_under_key, endpoint.packets_under_key,
                                           now - self.phase_started):
            return None
        keys = self.schedule.rotate()
        log.info("data keys %s: offering phase %d", self.schedule.direction, keys.key_phase)
        return keys

    def on_key_update(self, msg: KeyUpdate, endpoint: Endpoint) -> None:
        """The peer installed our next phase: seal with it from now on."""
        if msg.direction != self.schedule.direction:
            raise ControlProtocolError(f"key_update.direction: {msg.direction!r} is not valid; "
                                       f"expected {self.schedule.direction!r}")
        keys = self.schedule.confirm(msg.key_phase)
        endpoint.use_send_key(keys.key_phase, direction_key(keys))
        self.phase_started = self.clock()
        self.rotations += 1
        self.rotation_times.append(self.phase_started)
        log.info("data keys %s: sealing with phase %d", self.schedule.direction, keys.key_phase)

    def on_keys(self, msg: Keys, endpoint: Endpoint) -> KeyUpdate:
        """The peer's next phase: install it and say so."""
        if msg.direction != self.peer_direction:
            raise ControlProtocolError(f"keys.direction: {msg.direction!r} is not valid; "
                                       f"expected {self.peer_direction!r}")
        if msg.key_phase != self.peer_phase + 1:
            raise ControlProtocolError(f"keys.key_phase: {msg.key_phase} is not valid; "
                                       f"expected {self.peer_phase + 1}")
        endpoint.install_recv_key(msg.key_phase, direction_key(msg))
        self.peer_phase = msg.key_phase
        return KeyUpdate(direction=msg.direction, key_phase=msg.key_phase)
