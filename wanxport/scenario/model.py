"""Scenario files, contract v1 (docs/design.md section 4): the data model.

A scenario describes an emulated WAN. The same object drives the simulator
(``wanxport sim``) and the real emulation (``python -m emulation``), so the two
can be compared. The parser is ``wanxport.scenario.parse``; the ideal bound,
``wanxport.scenario.ideal``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DIRECTIONS = ("a->b", "b->a")  # one direction of one path
TRANSFER_DIRECTIONS = ("a->b", "both")  # what a [transfer] may ask for
MAX_STEPS = 1_000_000
MAX_SHARD_IDS = 1 << 32  # every shard of every step has its own 32-bit id on one session
MAX_THINK_MS = 3_600_000.0  # an hour of compute between steps is already no longer a step


class ScenarioError(ValueError):
    """A scenario file is unusable; the message is one line naming file and field."""


@dataclass(frozen=True)
class BurstLoss:
    """Gilbert-Elliott loss: a two-state Markov chain stepped once per packet."""

    p: float  # P(good -> bad) per packet
    r: float  # P(bad -> good) per packet
    loss_bad: float = 1.0
    loss_good: float = 0.0

    @property
    def stationary_loss(self) -> float:
        """Long-run loss rate (p*loss_bad + r*loss_good) / (p + r), per docs/design.md section 4."""
        if self.p + self.r == 0:
            return self.loss_good
        return (self.p * self.loss_bad + self.r * self.loss_good) / (self.p + self.r)


@dataclass(frozen=True)
class LinkParams:
    """Impairment of one direction of one path at one moment."""

    rtt_ms: float
    bandwidth_mbps: float
    loss: float = 0.0
    jitter_ms: float = 0.0
    reorder: bool = False
    queue_ms: float = 50.0
    mtu: int = 1500
    burst_loss: BurstLoss | None = None
    down: bool = False

    @property
    def effective_loss(self) -> float:
        """Loss probability used by the ideal-time bound (burst loss counts stationary)."""
        return self.burst_loss.stationary_loss if self.burst_loss else self.loss


@dataclass(frozen=True)
class PathEvent:
    """A change on the timeline, seconds after transfer start.

    ``changes`` holds field overrides (any LinkParams field name except ``down``);
    ``down`` is True/False when the event blackholes or restores the path, None otherwise.
    The event applies to both directions.
    """

    at_s: float
    changes: dict[str, object] = field(default_factory=dict)
    down: bool | None = None


@dataclass(frozen=True)
class PathSpec:
    """One long-haul path: forward (a->b) parameters, reverse (b->a) overrides, timeline."""

    name: str
    forward: LinkParams
    reverse: LinkParams
    events: tuple[PathEvent, ...] = ()

    def params_at(self, t_s: float, direction: str = "a->b") -> LinkParams:
        """Parameters in force ``t_s`` seconds after transfer start in one direction.

        Events with ``at_s <= t_s`` apply in order, to both directions; a ``set``
        event replaces the named fields (so it also overrides a ``reverse``
        override of the same field), a ``down`` event flips the down state.
        """
        if direction == "a->b":
            params = self.forward
        elif direction == "b->a":
            params = self.reverse
        else:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        for event in self.events:
            if event.at_s > t_s:
                break
            params = apply_event(params, event)
        return params

    def change_times(self) -> tuple[float, ...]:
        """Distinct event times, ascending: the moments the parameters may change."""
        return tuple(sorted({event.at_s for event in self.events}))


@dataclass(frozen=True)
class Transfer:
    """Default transfer of a run."""

    size_bytes: int = 64 * 1024 * 1024
    shards: int = 1
    direction: str = "a->b"  # or "both"
    #: Exchanges of ``size_bytes`` on one session, one after another (training steps).
    steps: int = 1
    #: The compute phase: from the sender learning step k verified to submitting step k+1.
    think_ms: float = 0.0


@dataclass(frozen=True)
class Scenario:
    """A parsed, validated scenario file."""

    name: str
    paths: tuple[PathSpec, ...]
    description: str = ""
    seed: int = 0
    transfer: Transfer = Transfer()
    source: str = "<memory>"

    def with_transfer(
        self,
        size_bytes: int | None = None,
        shards: int | None = None,
        direction: str | None = None,
        steps: int | None = None,
        think_ms: float | None = None,
    ) -> Scenario:
        """Return a copy whose transfer defaults are overridden (e.g. from CLI flags).

        Raises ValueError (one line) for values the file itself could not hold.
        """
        old = self.transfer
        new = Transfer(
            size_bytes=old.size_bytes if size_bytes is None else size_bytes,
            shards=old.shards if shards is None else shards,
            direction=old.direction if direction is None else direction,
            steps=old.steps if steps is None else steps,
            think_ms=old.think_ms if think_ms is None else think_ms,
        )
        _check_transfer(new)
        if new.steps > 1 and self.has_events():
            raise ValueError(steps_with_events_message(new.steps))
        return replace(self, transfer=new)

    def has_events(self) -> bool:
        """Whether any path has an events timeline."""
        return any(spec.events for spec in self.paths)

    def path(self, name: str) -> PathSpec:
        """The path called ``name``; KeyError if there is none."""
        for spec in self.paths:
            if spec.name == name:
                return spec
        raise KeyError(name)


def apply_event(params: LinkParams, event: PathEvent) -> LinkParams:
    """The parameters after one timeline event (``changes`` are already normalised)."""
    if event.changes:
        params = replace(params, **event.changes)  # type: ignore[arg-type]
    if event.down is not None:
        params = replace(params, down=event.down)
    return params


def steps_with_events_message(steps: int) -> str:
    """Why contract v1 refuses repeated steps on a timeline: event times count from the
    transfer's start, and which step's start that would be is not defined yet."""
    return (f"steps = {steps} with an events timeline is not supported in contract v1 "
            "(event times count from one transfer's start); use steps = 1 or remove the events")


def _check_transfer(transfer: Transfer) -> None:
    if transfer.size_bytes < 1:
        raise ValueError(f"transfer size must be >= 1 byte, got {transfer.size_bytes}")
    if not 1 <= transfer.shards <= transfer.size_bytes:
        raise ValueError(f"transfer shards must be between 1 and the size in bytes, got {transfer.shards}")
    steps = transfer.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"transfer steps must be an integer in [1, {MAX_STEPS}], got {steps!r}")
    if steps * transfer.shards > MAX_SHARD_IDS:
        raise ValueError(f"transfer steps x shards must be at most {MAX_SHARD_IDS} (32-bit shard ids), "
                         f"got {steps} x {transfer.shards}")
    if not (isinstance(transfer.think_ms, int | float) and 0.0 <= transfer.think_ms <= MAX_THINK_MS):
        raise ValueError(f"transfer think_ms must be a number in [0, {MAX_THINK_MS:g}] (milliseconds), "
                         f"got {transfer.think_ms!r}")
    if transfer.direction not in TRANSFER_DIRECTIONS:
        raise ValueError(
            f"transfer direction must be one of {TRANSFER_DIRECTIONS}, got {transfer.direction!r}"
        )
