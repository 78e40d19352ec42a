"""Scenario files, contracts v1 and v2 (DESIGN.md section 4): the data model.

A scenario describes an emulated WAN. The same object drives the simulator
(``wanxport sim``) and the real emulation (``python -m emulation``), so the two
can be compared. The parser is ``wanxport.scenario.parse``; the ideal bounds,
``wanxport.scenario.ideal``.

Contract v2 names N sites and says which two sites each path joins; a v1 file
is the same model with the two sites ``a`` and ``b`` and every path between
them, so code written for two sites keeps working on a v1 scenario unchanged,
and on any pair of an N-site scenario through ``Scenario.pair``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DIRECTIONS = ("a->b", "b->a")  # one direction of one path
V1_SITES = ("a", "b")  # the two sites of a file without [[sites]]
MAX_SITES = 16
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
        """Long-run loss rate (p*loss_bad + r*loss_good) / (p + r), per DESIGN.md section 4."""
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
    """One long-haul path: forward (a->b) parameters, reverse (b->a) overrides, timeline.

    ``between`` names the two sites the path joins: "a->b" (``forward``) is the
    direction from ``between[0]`` to ``between[1]``, "b->a" (``reverse``) the
    other one.
    """

    name: str
    forward: LinkParams
    reverse: LinkParams
    events: tuple[PathEvent, ...] = ()
    between: tuple[str, str] = V1_SITES

    def direction_from(self, site: str) -> str:
        """The direction ("a->b" or "b->a") that leaves ``site``; ValueError if the path does not touch it."""
        if site == self.between[0]:
            return "a->b"
        if site == self.between[1]:
            return "b->a"
        raise ValueError(f"path {self.name!r} joins {self.between[0]} and {self.between[1]}, not {site!r}")

    def joins(self, one: str, other: str) -> bool:
        """Whether the path runs between sites ``one`` and ``other`` (either order)."""
        return {one, other} == set(self.between) and one != other

    def oriented(self, src: str) -> PathSpec:
        """The same path with ``forward`` leaving ``src`` (swapped when ``src`` is its second site).

        Timeline events apply to both directions, so they carry over unchanged.
        """
        if self.direction_from(src) == "a->b":
            return self
        return replace(self, forward=self.reverse, reverse=self.forward,
                       between=(self.between[1], self.between[0]))

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
    #: The two sites the transfer runs between; None: the scenario's first two sites.
    from_site: str | None = None
    to_site: str | None = None


@dataclass(frozen=True)
class Scenario:
    """A parsed, validated scenario file."""

    name: str
    paths: tuple[PathSpec, ...]
    description: str = ""
    seed: int = 0
    transfer: Transfer = Transfer()
    source: str = "<memory>"
    #: Site names in file order; a v1 file has the two sites ``a`` and ``b``.
    sites: tuple[str, ...] = V1_SITES

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
        new = replace(
            old,
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

    @property
    def transfer_pair(self) -> tuple[str, str]:
        """(from, to) of the ``[transfer]``: its named sites, else the first two sites."""
        return (self.transfer.from_site or self.sites[0], self.transfer.to_site or self.sites[1])

    def paths_between(self, one: str, other: str) -> tuple[PathSpec, ...]:
        """The paths joining two sites directly, in file order, as written (not re-oriented)."""
        return tuple(spec for spec in self.paths if spec.joins(one, other))

    def paths_of(self, site: str) -> tuple[PathSpec, ...]:
        """The paths touching ``site``, in file order."""
        return tuple(spec for spec in self.paths if site in spec.between)

    def pair(self, src: str, dst: str) -> Scenario:
        """The two-site scenario of a transfer from ``src`` to ``dst`` over their direct paths.

        Every path is oriented so that "a->b" leaves ``src``; the transfer runs
        ``src`` -> ``dst``. Code that models two sites runs any pair of an
        N-site scenario through this view; on a v1 scenario ``pair("a", "b")``
        is the scenario itself. Raises ScenarioError (one line) for an unknown
        site, a site paired with itself, or a pair with no direct path.
        """
        for site in (src, dst):
            if site not in self.sites:
                raise ScenarioError(f"{self.source}: unknown site {site!r}; sites: {', '.join(self.sites)}")
        if src == dst:
            raise ScenarioError(f"{self.source}: a transfer needs two different sites, got {src!r} twice")
        paths = tuple(spec.oriented(src) for spec in self.paths_between(src, dst))
        if not paths:
            raise ScenarioError(f"{self.source}: no direct path between {src} and {dst}; "
                                f"a transfer runs over the paths joining its two sites "
                                f"(pairs with paths: {', '.join(self.linked_pairs())})")
        if (src, dst) == self.sites and self.transfer_pair == (src, dst) and paths == self.paths:
            return self
        transfer = replace(self.transfer, from_site=src, to_site=dst)
        return replace(self, paths=paths, sites=(src, dst), transfer=transfer)

    def linked_pairs(self) -> list[str]:
        """"x-y" for every pair of sites with at least one direct path, in site order."""
        return [f"{x}-{y}" for i, x in enumerate(self.sites) for y in self.sites[i + 1:]
                if self.paths_between(x, y)]


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
