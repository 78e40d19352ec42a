"""Training steps on one session: which shards make a step, when the next one starts, how long each took.

Why a module of its own: a training job does not send one big file, it
exchanges ``size`` bytes every step, ``steps`` times, on the same session
(docs/design.md sections 4-5). The bookkeeping that turns session events into
steps (shard ids per step, each side's readiness for the next step, step and
shard durations) is the same whatever carries the bytes, so it lives apart
from the simulator's packet plumbing and is a plain state machine: the caller
reports events with their times and is told when a side may submit again.

Rules (contract v1):

* step k's shards have ids ``k * shards + i``, so no id is reused on a session;
* a side submits step k+1 ``think_s`` after it knows step k is over for it:
  every shard it sent was acknowledged (the sender learns of the receiver's
  verification) and, with ``direction = "both"``, every shard it receives was
  verified;
* ``step_s[k]`` runs from step k's first submission to its last shard
  verified at a receiver, on the one clock the caller uses;
* each shard's completion runs from its submission at the sender to its
  verification at the receiver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SIDES = ("a", "b")
#: direction -> (sending side, receiving side)
ENDS = {"a->b": ("a", "b"), "b->a": ("b", "a")}


@dataclass
class _Step:
    """What is known about one step so far."""

    submitted_at: dict[str, float] = field(default_factory=dict)  # direction -> submission time
    acked: dict[str, int] = field(default_factory=dict)  # direction -> shards the sender saw confirmed
    verified: dict[str, int] = field(default_factory=dict)  # direction -> shards verified
    last_verified_at: float = 0.0
    ready: set[str] = field(default_factory=set)  # sides that have seen the step end


class StepTracker:
    """Turns shard submissions, verifications and acknowledgements into steps."""

    def __init__(self, steps: int, shards: int, directions: list[str], think_s: float) -> None:
        if steps < 1 or shards < 1:
            raise ValueError("steps and shards must be at least 1")
        if not directions or any(d not in ENDS for d in directions):
            raise ValueError(f"directions must be some of {tuple(ENDS)}")
        if think_s < 0:
            raise ValueError("think_s must be >= 0")
        self.steps = steps
        self.shards = shards
        self.directions = list(directions)
        self.think_s = think_s
        self._steps = [_Step() for _ in range(steps)]
        self._shard_submitted: dict[tuple[str, int], float] = {}
        self.shard_completion_s: list[float] = []

    def shard_ids(self, step: int) -> range:
        """The ids of step ``step``'s shards (the same for each direction)."""
        return range(step * self.shards, (step + 1) * self.shards)

    def step_of(self, shard_id: int) -> int:
        return shard_id // self.shards

    def sends(self, side: str) -> list[str]:
        """The directions in which ``side`` sends."""
        return [d for d in self.directions if ENDS[d][0] == side]

    def submitted(self, direction: str, step: int, now: float) -> None:
        """The sender of ``direction`` submitted every shard of ``step`` at ``now``."""
        self._steps[step].submitted_at[direction] = now
        for shard_id in self.shard_ids(step):
            self._shard_submitted[(direction, shard_id)] = now

    def verified(self, direction: str, shard_id: int, now: float) -> int | None:
        """A receiver verified a shard; returns the next step its side may submit, if now ready."""
        step = self._steps[self.step_of(shard_id)]
        step.verified[direction] = step.verified.get(direction, 0) + 1
        step.last_verified_at = max(step.last_verified_at, now)
        started = self._shard_submitted.pop((direction, shard_id), None)
        if started is not None:
            self.shard_completion_s.append(now - started)
        return self._check_ready(ENDS[direction][1], self.step_of(shard_id))

    def acknowledged(self, direction: str, shard_id: int) -> int | None:
        """The sender learned a shard was verified; returns its side's next step, if now ready."""
        step = self._steps[self.step_of(shard_id)]
        step.acked[direction] = step.acked.get(direction, 0) + 1
        return self._check_ready(ENDS[direction][0], self.step_of(shard_id))

    def _check_ready(self, side: str, index: int) -> int | None:
        step = self._steps[index]
        if side in step.ready:
            return None
        for direction in self.directions:
            sender, receiver = ENDS[direction]
            if sender == side and step.acked.get(direction, 0) < self.shards:
                return None
            if receiver == side and step.verified.get(direction, 0) < self.shards:
                return None
        step.ready.add(side)
        if index + 1 < self.steps and self.sends(side):
            return index + 1
        return None

    def done(self) -> bool:
        """Every shard of every step verified in every direction."""
        return all(s.verified.get(d, 0) == self.shards for s in self._steps for d in self.directions)

    def step_s(self) -> list[float]:
        """Duration of each finished step, in order (an unfinished step ends the list)."""
        result = []
        for step in self._steps:
            if any(step.verified.get(d, 0) < self.shards for d in self.directions):
                break
            result.append(step.last_verified_at - min(step.submitted_at.values()))
        return result
