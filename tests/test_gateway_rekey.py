"""A warm session's key bookkeeping stays bounded however often it rotates."""

from __future__ import annotations

from typing import Any

from wanxport.control import KeyUpdate, RotationLimits
from wanxport.gateway.rekey import KEEP_ROTATION_TIMES, DataKeys


class _Endpoint:
    def __init__(self) -> None:
        self.phases: list[int] = []

    def use_send_key(self, phase: int, key: Any) -> None:
        self.phases.append(phase)


def test_only_the_latest_rotation_times_are_kept() -> None:
    ticks = iter(range(10**6))
    keys = DataKeys("initiator->responder", "aes-256-gcm", RotationLimits(), lambda: float(next(ticks)))
    endpoint: Any = _Endpoint()
    rotations = KEEP_ROTATION_TIMES + 50
    for _ in range(rotations):
        offered = keys.schedule.rotate()
        keys.on_key_update(KeyUpdate(direction="initiator->responder", key_phase=offered.key_phase), endpoint)
    assert keys.rotations == rotations
    assert len(keys.rotation_times) == KEEP_ROTATION_TIMES
    assert keys.rotation_times[-1] == keys.phase_started  # the newest are the ones kept
    assert endpoint.phases[-1] == rotations
