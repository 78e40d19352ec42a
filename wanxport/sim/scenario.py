"""Scenario files, contract v1 (DESIGN.md section 4): the data model.

A scenario describes an emulated WAN. The same object drives the simulator
(``wanxport sim``) and the real emulation (``python -m emulation``), so the two
can be compared. The parser (``load_scenario``) lives below the model.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wanxport.units import parse_size

DIRECTIONS = ("a->b", "b->a")  # one direction of one path
TRANSFER_DIRECTIONS = ("a->b", "both")  # what a [transfer] may ask for


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
    ) -> Scenario:
        """Return a copy whose transfer defaults are overridden (e.g. from CLI flags).

        Raises ValueError (one line) for values the file itself could not hold.
        """
        new = Transfer(
            size_bytes=self.transfer.size_bytes if size_bytes is None else size_bytes,
            shards=self.transfer.shards if shards is None else shards,
            direction=self.transfer.direction if direction is None else direction,
        )
        _check_transfer(new)
        return replace(self, transfer=new)

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


def _check_transfer(transfer: Transfer) -> None:
    if transfer.size_bytes < 1:
        raise ValueError(f"transfer size must be >= 1 byte, got {transfer.size_bytes}")
    if not 1 <= transfer.shards <= transfer.size_bytes:
        raise ValueError(f"transfer shards must be between 1 and the size in bytes, got {transfer.shards}")
    if transfer.direction not in TRANSFER_DIRECTIONS:
        raise ValueError(
            f"transfer direction must be one of {TRANSFER_DIRECTIONS}, got {transfer.direction!r}"
        )


# --------------------------------------------------------------------------- parser
#
# The parser walks the TOML document with explicit field tables, so that every
# key is known (unknown keys are errors naming their full path) and every error
# carries the field path.  Validators return the converted value or raise
# _Invalid(what is wrong, what would be valid); the walker adds file and path.


class _Invalid(Exception):
    def __init__(self, path: str, problem: str, valid: str) -> None:
        super().__init__(path, problem, valid)
        self.path = path
        self.problem = problem
        self.valid = valid


_Validator = Callable[[object, str], Any]
MIN_MTU = 68  # IPv4 minimum MTU (RFC 791)
MAX_MTU = 65535  # largest IP datagram
MAX_PATHS = 65536  # path_id is 16 bits on the wire
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


def _describe(value: object) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        type(value), "table" if isinstance(value, dict) else "array"
    )
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({kind})"


def _number(lo: float, hi: float, lo_open: bool = False, unit: str = "") -> _Validator:
    """A finite int-or-float in [lo, hi] (or (lo, hi] when ``lo_open``)."""
    bound = (
        f"{'>' if lo_open else '>='} {lo:g}"
        if hi == math.inf
        else (f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    )
    valid = f"a number {bound}{unit}"

    def check(value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(path, f"expected a number, got {_describe(value)}", valid)
        number = float(value)
        too_low = number <= lo if lo_open else number < lo
        if not math.isfinite(number) or too_low or number > hi:
            raise _Invalid(path, f"out of range: {value!r}", valid)
        return number

    return check


def _integer(lo: int, hi: int) -> _Validator:
    valid = f"an integer in [{lo}, {hi}]"

    def check(value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(path, f"expected an integer, got {_describe(value)}", valid)
        if not lo <= value <= hi:
            raise _Invalid(path, f"out of range: {value!r}", valid)
        return value

    return check


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(path, f"expected a boolean, got {_describe(value)}", "true or false")
    return value


def _text(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(path, f"expected a string, got {_describe(value)}", "a quoted string")
    return value


def _name(value: object, path: str) -> str:
    text = _text(value, path)
    if not _NAME_RE.match(text):
        raise _Invalid(
            path,
            f"invalid name {text!r}",
            "1-32 characters of letters, digits, '_', '.', '-', starting with a letter or digit",
        )
    return text


def _table(value: object, path: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _Invalid(path, f"expected a table, got {_describe(value)}", "a TOML table")
    return value


def _fields(
    raw: dict[str, object],
    path: str,
    spec: Mapping[str, _Validator],
    required: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Validate every key of ``raw`` against ``spec``; unknown or missing keys are errors."""
    prefix = f"{path}." if path else ""
    for key in raw:
        if key not in spec:
            raise _Invalid(f"{prefix}{key}", "unknown key", f"valid keys here: {', '.join(spec)}")
    for key in required:
        if key not in raw:
            raise _Invalid(f"{prefix}{key}", "missing required field", _HINTS.get(key, key))
    return {key: spec[key](value, f"{prefix}{key}") for key, value in raw.items()}


def _burst_loss(value: object, path: str) -> BurstLoss:
    values = _fields(_table(value, path), path, _BURST_FIELDS, required=("p", "r"))
    burst = BurstLoss(**values)
    if burst.p + burst.r <= 0:
        raise _Invalid(f"{path}.p", "p + r must be > 0", "p and r in [0, 1], not both 0")
    return burst


_BURST_FIELDS: dict[str, _Validator] = {
    "p": _number(0.0, 1.0),
    "r": _number(0.0, 1.0),
    "loss_bad": _number(0.0, 1.0),
    "loss_good": _number(0.0, 1.0),
}

# The link fields: allowed on a path, in `reverse`, and in an event's `set`.
_LINK_FIELDS: dict[str, _Validator] = {
    "rtt_ms": _number(0.0, math.inf, unit=" (milliseconds)"),
    "bandwidth_mbps": _number(0.0, math.inf, lo_open=True, unit=" (Mb/s)"),
    "loss": _number(0.0, 1.0),
    "jitter_ms": _number(0.0, math.inf, unit=" (milliseconds)"),
    "reorder": _boolean,
    "queue_ms": _number(0.0, math.inf, lo_open=True, unit=" (milliseconds)"),
    "mtu": _integer(MIN_MTU, MAX_MTU),
    "burst_loss": _burst_loss,
}

_HINTS = {
    "name": 'a string, e.g. name = "p1"',
    "paths": "at least one [[paths]] table",
    "rtt_ms": "a number >= 0 (milliseconds), e.g. rtt_ms = 40.0",
    "bandwidth_mbps": "a number > 0 (Mb/s), e.g. bandwidth_mbps = 100.0",
    "at_s": "a number >= 0 (seconds after transfer start), e.g. at_s = 3.0",
    "p": "a number in [0, 1]: P(good -> bad) per packet",
    "r": "a number in [0, 1]: P(bad -> good) per packet",
}


def _link_overrides(raw: dict[str, object], path: str) -> dict[str, Any]:
    """Validated link-field overrides, normalised so ``replace(params, **result)`` is right.

    Setting ``loss`` without ``burst_loss`` switches that direction or moment to
    i.i.d. loss (``burst_loss`` becomes None): the latest loss model named wins.
    Naming both at one level is ambiguous and refused.
    """
    values = _fields(raw, path, _LINK_FIELDS)
    if "loss" in values and "burst_loss" in values:
        prefix = f"{path}." if path else ""
        raise _Invalid(
            f"{prefix}burst_loss",
            "both loss and burst_loss given",
            "give one of them: burst_loss replaces loss",
        )
    if "loss" in values:
        values["burst_loss"] = None
    return values


def _event(value: object, path: str) -> PathEvent:
    raw = dict(_table(value, path))
    spec: dict[str, _Validator] = {
        "at_s": _number(0.0, math.inf, unit=" (seconds after transfer start)"),
        "set": _table,
        "down": _boolean,
    }
    values = _fields(raw, path, spec, required=("at_s",))
    if ("set" in values) == ("down" in values):
        raise _Invalid(
            path,
            "an event needs exactly one of set or down",
            "set = { field = value, ... } or down = true/false",
        )
    if "down" in values:
        return PathEvent(at_s=values["at_s"], down=values["down"])
    changes_raw: dict[str, object] = values["set"]
    if "down" in changes_raw:
        raise _Invalid(
            f"{path}.set.down", "down is not a link field", "write down = true as its own event key"
        )
    if not changes_raw:
        raise _Invalid(f"{path}.set", "empty set", "name at least one link field to change")
    changes = _link_overrides(changes_raw, f"{path}.set")
    return PathEvent(at_s=values["at_s"], changes=changes)


def _events(value: object, path: str) -> tuple[PathEvent, ...]:
    if not isinstance(value, list):
        raise _Invalid(path, f"expected an array of tables, got {_describe(value)}", "[[paths.events]]")
    events = [_event(item, f"{path}[{i}]") for i, item in enumerate(value)]
    return tuple(sorted(events, key=lambda e: e.at_s))  # stable: ties keep file order


def _path(value: object, path: str) -> PathSpec:
    raw = dict(_table(value, path))
    reverse_raw = raw.pop("reverse", {})
    events_raw = raw.pop("events", [])
    spec = {"name": _name, **_LINK_FIELDS}
    for key in raw:
        if key not in spec:
            raise _Invalid(
                f"{path}.{key}",
                "unknown key",
                f"valid keys here: {', '.join([*spec, 'reverse', 'events'])}",
            )
    for key in ("name", "rtt_ms", "bandwidth_mbps"):
        if key not in raw:
            raise _Invalid(f"{path}.{key}", "missing required field", _HINTS[key])
    name = _name(raw.pop("name"), f"{path}.name")
    link = _link_overrides(raw, path)
    forward = LinkParams(**link)
    reverse = replace(forward, **_link_overrides(_table(reverse_raw, f"{path}.reverse"), f"{path}.reverse"))
    return PathSpec(name=name, forward=forward, reverse=reverse, events=_events(events_raw, f"{path}.events"))


def _transfer(value: object, path: str) -> Transfer:
    def size(raw: object, where: str) -> int:
        try:
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise ValueError(f"expected a string or integer, got {_describe(raw)}")
            result = parse_size(raw)
        except ValueError as exc:
            raise _Invalid(where, str(exc), 'e.g. size = "1GiB" or size = 1048576') from None
        if result < 1:
            raise _Invalid(where, f"out of range: {raw!r}", "at least 1 byte")
        return result

    def direction(raw: object, where: str) -> str:
        text = _text(raw, where)
        if text not in TRANSFER_DIRECTIONS:
            raise _Invalid(where, f"unknown direction {text!r}", '"a->b" or "both"')
        return text

    spec = {"size": size, "shards": _integer(1, 2**31 - 1), "direction": direction}
    values = _fields(_table(value, path), path, spec)
    if "size" in values:
        values["size_bytes"] = values.pop("size")
    transfer = Transfer(**values)
    if transfer.shards > transfer.size_bytes:
        raise _Invalid(
            f"{path}.shards",
            f"{transfer.shards} shards for {transfer.size_bytes} bytes",
            "at most one shard per byte",
        )
    return transfer


def _paths(value: object, path: str) -> tuple[PathSpec, ...]:
    if not isinstance(value, list) or not value:
        raise _Invalid(path, f"expected an array of tables, got {_describe(value)}", _HINTS[path])
    if len(value) > MAX_PATHS:
        raise _Invalid(path, f"{len(value)} paths", f"at most {MAX_PATHS} (16-bit path id)")
    specs = [_path(item, f"{path}[{i}]") for i, item in enumerate(value)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise _Invalid(
                f"{path}[{i}].name",
                f"duplicate path name {spec.name!r} (also paths[{seen[spec.name]}])",
                "a name unique within the scenario",
            )
        seen[spec.name] = i
    return tuple(specs)


_TOP_FIELDS: dict[str, _Validator] = {
    "name": _text,
    "description": _text,
    "seed": _integer(0, 2**63 - 1),
    "transfer": _transfer,
    "paths": _paths,
}


def parse_scenario(text: str, source: str = "<memory>") -> Scenario:
    """Parse and validate scenario TOML; ``source`` names the file in error messages.

    Raises ScenarioError with one line: ``<file>: <field path>: <problem>; <valid>``.
    Field paths index arrays from 0, e.g. ``paths[2].burst_loss.q``.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: TOML syntax error: {exc}; fix the file to be valid TOML") from None
    try:
        values = _fields(document, "", _TOP_FIELDS, required=("name", "paths"))
    except _Invalid as exc:
        raise ScenarioError(f"{source}: {exc.path}: {exc.problem}; {exc.valid}") from None
    if not values["name"].strip():
        raise ScenarioError(f"{source}: name: empty name; {_HINTS['name']}")
    return Scenario(source=source, **values)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (see ``parse_scenario``)."""
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ScenarioError(
            f"{source}: cannot read: {exc.strerror or exc}; give the path of a readable scenario .toml file"
        ) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not UTF-8 at byte {exc.start}; save the file as UTF-8 TOML") from None
    return parse_scenario(text, source)
