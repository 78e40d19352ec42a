"""The scenario parser, contracts v1 and v2 (DESIGN.md section 4): TOML text to a validated ``Scenario``.

Every error is one ``ScenarioError`` line, ``<file>: <field path>: <problem>; <valid>``,
so a user can fix the file without reading code. A file without ``[[sites]]``
is v1 (sites ``a`` and ``b``, every path between them); with ``[[sites]]``,
every path names the two sites it joins (``wanxport.scenario.sites`` checks
how the sites and paths fit together).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from wanxport.scenario.model import (
    MAX_SHARD_IDS,
    MAX_STEPS,
    MAX_THINK_MS,
    TRANSFER_DIRECTIONS,
    V1_SITES,
    BurstLoss,
    LinkParams,
    PathEvent,
    PathSpec,
    Scenario,
    ScenarioError,
    Transfer,
    steps_with_events_message,
)
from wanxport.scenario.sites import check_mesh, site_pair, sites
from wanxport.scenario.validators import (
    Invalid,
    Validator,
    boolean,
    describe,
    fields,
    integer,
    name,
    number,
    table,
    text,
)
from wanxport.tomltext import TOMLDecodeError, loads_toml
from wanxport.units import parse_size

MIN_MTU = 68  # IPv4 minimum MTU (RFC 791)
MAX_MTU = 65535  # largest IP datagram
MAX_PATHS = 65536  # path_id is 16 bits on the wire


def _burst_loss(value: object, path: str) -> BurstLoss:
    values = fields(table(value, path), path, _BURST_FIELDS, required=("p", "r"), hints=_HINTS)
    burst = BurstLoss(**values)
    if burst.p + burst.r <= 0:
        raise Invalid(f"{path}.p", "p + r must be > 0", "p and r in [0, 1], not both 0")
    return burst


_BURST_FIELDS: dict[str, Validator] = {
    "p": number(0.0, 1.0),
    "r": number(0.0, 1.0),
    "loss_bad": number(0.0, 1.0),
    "loss_good": number(0.0, 1.0),
}

# The link fields: allowed on a path, in `reverse`, and in an event's `set`.
_LINK_FIELDS: dict[str, Validator] = {
    "rtt_ms": number(0.0, math.inf, unit=" (milliseconds)"),
    "bandwidth_mbps": number(0.0, math.inf, lo_open=True, unit=" (Mb/s)"),
    "loss": number(0.0, 1.0),
    "jitter_ms": number(0.0, math.inf, unit=" (milliseconds)"),
    "reorder": boolean,
    "queue_ms": number(0.0, math.inf, lo_open=True, unit=" (milliseconds)"),
    "mtu": integer(MIN_MTU, MAX_MTU),
    "burst_loss": _burst_loss,
}

_HINTS = {
    "name": 'a string, e.g. name = "p1"',
    "paths": "at least one [[paths]] table",
    "between": 'the two sites the path joins, e.g. between = ["east", "west"]',
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
    values = fields(raw, path, _LINK_FIELDS)
    if "loss" in values and "burst_loss" in values:
        prefix = f"{path}." if path else ""
        raise Invalid(
            f"{prefix}burst_loss",
            "both loss and burst_loss given",
            "give one of them: burst_loss replaces loss",
        )
    if "loss" in values:
        values["burst_loss"] = None
    return values


def _event(value: object, path: str) -> PathEvent:
    raw = dict(table(value, path))
    spec: dict[str, Validator] = {
        "at_s": number(0.0, math.inf, unit=" (seconds after transfer start)"),
        "set": table,
        "down": boolean,
    }
    values = fields(raw, path, spec, required=("at_s",), hints=_HINTS)
    if ("set" in values) == ("down" in values):
        raise Invalid(
            path,
            "an event needs exactly one of set or down",
            "set = { field = value, ... } or down = true/false",
        )
    if "down" in values:
        return PathEvent(at_s=values["at_s"], down=values["down"])
    changes_raw: dict[str, object] = values["set"]
    if "down" in changes_raw:
        raise Invalid(
            f"{path}.set.down", "down is not a link field", "write down = true as its own event key"
        )
    if not changes_raw:
        raise Invalid(f"{path}.set", "empty set", "name at least one link field to change")
    changes = _link_overrides(changes_raw, f"{path}.set")
    return PathEvent(at_s=values["at_s"], changes=changes)


def _events(value: object, path: str) -> tuple[PathEvent, ...]:
    if not isinstance(value, list):
        raise Invalid(path, f"expected an array of tables, got {describe(value)}", "[[paths.events]]")
    events = [_event(item, f"{path}[{i}]") for i, item in enumerate(value)]
    return tuple(sorted(events, key=lambda e: e.at_s))  # stable: ties keep file order


def _path(value: object, path: str) -> PathSpec:
    raw = dict(table(value, path))
    reverse_raw = raw.pop("reverse", {})
    events_raw = raw.pop("events", [])
    between_raw = raw.pop("between", None)
    spec = {"name": name, **_LINK_FIELDS}
    for key in raw:
        if key not in spec:
            raise Invalid(
                f"{path}.{key}",
                "unknown key",
                f"valid keys here: {', '.join([*spec, 'between', 'reverse', 'events'])}",
            )
    for key in ("name", "rtt_ms", "bandwidth_mbps"):
        if key not in raw:
            raise Invalid(f"{path}.{key}", "missing required field", _HINTS[key])
    path_name = name(raw.pop("name"), f"{path}.name")
    between = V1_SITES if between_raw is None else site_pair(between_raw, f"{path}.between")
    link = _link_overrides(raw, path)
    forward = LinkParams(**link)
    reverse = replace(forward, **_link_overrides(table(reverse_raw, f"{path}.reverse"), f"{path}.reverse"))
    events = _events(events_raw, f"{path}.events")
    return PathSpec(name=path_name, forward=forward, reverse=reverse, events=events, between=between)


def _transfer(value: object, path: str) -> Transfer:
    def size(raw: object, where: str) -> int:
        try:
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise ValueError(f"expected a string or integer, got {describe(raw)}")
            result = parse_size(raw)
        except ValueError as exc:
            raise Invalid(where, str(exc), 'e.g. size = "1GiB" or size = 1048576') from None
        if result < 1:
            raise Invalid(where, f"out of range: {raw!r}", "at least 1 byte")
        return result

    def direction(raw: object, where: str) -> str:
        chosen = text(raw, where)
        if chosen not in TRANSFER_DIRECTIONS:
            raise Invalid(where, f"unknown direction {chosen!r}", '"a->b" or "both"')
        return chosen

    spec = {
        "size": size,
        "shards": integer(1, 2**31 - 1),
        "direction": direction,
        "steps": integer(1, MAX_STEPS),
        "think_ms": number(0.0, MAX_THINK_MS, unit=" (milliseconds)"),
        "from": name,
        "to": name,
    }
    values = fields(table(value, path), path, spec)
    if "size" in values:
        values["size_bytes"] = values.pop("size")
    if ("from" in values) != ("to" in values):
        missing = "to" if "from" in values else "from"
        raise Invalid(f"{path}.{missing}", "missing required field",
                      "give both from and to (the two sites of the transfer), or neither")
    if "from" in values:
        values["from_site"], values["to_site"] = values.pop("from"), values.pop("to")
    transfer = Transfer(**values)
    if transfer.shards > transfer.size_bytes:
        raise Invalid(
            f"{path}.shards",
            f"{transfer.shards} shards for {transfer.size_bytes} bytes",
            "at most one shard per byte",
        )
    if transfer.steps * transfer.shards > MAX_SHARD_IDS:
        raise Invalid(
            f"{path}.steps",
            f"{transfer.steps} steps of {transfer.shards} shards",
            f"steps x shards at most {MAX_SHARD_IDS} (32-bit shard ids)",
        )
    return transfer


def _paths(value: object, path: str) -> tuple[PathSpec, ...]:
    if not isinstance(value, list) or not value:
        raise Invalid(path, f"expected an array of tables, got {describe(value)}", _HINTS[path])
    if len(value) > MAX_PATHS:
        raise Invalid(path, f"{len(value)} paths", f"at most {MAX_PATHS} (16-bit path id)")
    specs = [_path(item, f"{path}[{i}]") for i, item in enumerate(value)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise Invalid(
                f"{path}[{i}].name",
                f"duplicate path name {spec.name!r} (also paths[{seen[spec.name]}])",
                "a name unique within the scenario",
            )
        seen[spec.name] = i
    return tuple(specs)


_TOP_FIELDS: dict[str, Validator] = {
    "name": text,
    "description": text,
    "seed": integer(0, 2**63 - 1),
    "transfer": _transfer,
    "paths": _paths,
    "sites": sites,
}


def parse_scenario(text: str, source: str = "<memory>") -> Scenario:
    """Parse and validate scenario TOML; ``source`` names the file in error messages.

    Raises ScenarioError with one line: ``<file>: <field path>: <problem>; <valid>``.
    Field paths index arrays from 0, e.g. ``paths[2].burst_loss.q``.
    """
    try:
        document = loads_toml(text)
    except TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: TOML syntax error: {exc}; fix the file to be valid TOML") from None
    try:
        values = fields(document, "", _TOP_FIELDS, required=("name", "paths"), hints=_HINTS)
        check_mesh(values.get("sites"), values["paths"], values.get("transfer"), document["paths"])
    except Invalid as exc:
        raise ScenarioError(f"{source}: {exc.path}: {exc.problem}; {exc.valid}") from None
    if not values["name"].strip():
        raise ScenarioError(f"{source}: name: empty name; {_HINTS['name']}")
    scenario = Scenario(source=source, **values)
    if scenario.transfer.steps > 1 and scenario.has_events():
        raise ScenarioError(f"{source}: transfer.steps: {steps_with_events_message(scenario.transfer.steps)}")
    return scenario


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
