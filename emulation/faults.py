"""The faults ``python -m emulation diloco`` injects, from the command line to the path timeline.

    --kill SITE --at T [--rejoin-after D]    SIGKILL the site's processes T s after "go"
                                             (and start the site again D s later)
    --blackhole SITE --at T --for D          every path touching the site drops everything
    --partition A,B|C --at T --for D         every path between two groups drops everything

``--at``, ``--for`` and ``--rejoin-after`` belong to the fault option before them, so one
command line can hold several faults in turn. Blackholes and partitions become ``down``
events on the scenario's paths (the impairment engine applies them on its own clock, which
starts at "go" as the runner's does); kills are the runner's. The control network is never
touched: a site cut off from the others still reaches the store.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from wanxport.scenario import Scenario
from wanxport.scenario.model import PathEvent

KINDS = ("kill", "blackhole", "partition")


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, as given on the command line, and when."""

    kind: str
    target: str
    at_s: float
    for_s: float | None = None
    rejoin_after_s: float | None = None
    #: partition: the groups of sites; kill/blackhole: one group, the site.
    groups: tuple[tuple[str, ...], ...] = ()

    @property
    def label(self) -> str:
        return f"--{self.kind} {self.target} at {self.at_s:g} s"

    @property
    def end_s(self) -> float:
        """When the fault stops mattering: its end, a kill's rejoin, or never (a kill for good)."""
        if self.kind == "kill":
            return self.at_s + self.rejoin_after_s if self.rejoin_after_s is not None else math.inf
        assert self.for_s is not None
        return self.at_s + self.for_s

    def cut_off(self) -> tuple[str, ...]:
        """The sites that leave the job: the killed or blackholed site, or every site outside
        the partition's majority group."""
        if self.kind != "partition":
            return self.groups[0]
        return tuple(s for g in self.groups if g is not self.majority_group() for s in g)

    def majority_group(self) -> tuple[str, ...] | None:
        total = sum(len(g) for g in self.groups)
        return next((g for g in self.groups if 2 * len(g) > total), None)


class FaultAction(argparse.Action):
    """``--kill``, ``--blackhole``, ``--partition``: start a new fault (in command-line order)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        faults = list(getattr(namespace, "faults", None) or [])
        faults.append({"kind": self.dest, "target": values})
        namespace.faults = faults


class FaultTimeAction(argparse.Action):
    """``--at``, ``--for``, ``--rejoin-after``: a time of the fault option just before."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        faults = getattr(namespace, "faults", None) or []
        if not faults:
            parser.error(f"{option_string} must follow --kill, --blackhole or --partition")
        if self.dest in faults[-1]:
            parser.error(f"{option_string} given twice for --{faults[-1]['kind']} {faults[-1]['target']}")
        faults[-1][self.dest] = values


def seconds(text: str) -> float:
    """A time in seconds, >= 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(faults=[])
    parser.add_argument("--kill", dest="kill", action=FaultAction, metavar="SITE",
                        help="SIGKILL the site's process group at --at T")
    parser.add_argument("--blackhole", dest="blackhole", action=FaultAction, metavar="SITE",
                        help="drop everything on the site's paths from --at T for --for D")
    parser.add_argument("--partition", dest="partition", action=FaultAction, metavar="A,B|C",
                        help="cut the paths between the groups from --at T for --for D")
    parser.add_argument("--at", dest="at_s", action=FaultTimeAction, type=seconds, metavar="T",
                        help="the fault's time, seconds after every site started training")
    parser.add_argument("--for", dest="for_s", action=FaultTimeAction, type=seconds, metavar="D",
                        help="how long a blackhole or partition lasts")
    parser.add_argument("--rejoin-after", dest="rejoin_after_s", action=FaultTimeAction, type=seconds,
                        metavar="D", help="start a killed site again D seconds after the kill")


def check_faults(raw: Sequence[dict[str, Any]], sites: Sequence[str]) -> list[Fault]:
    """The faults of the command line, checked against the running sites; ValueError (one
    line naming the option) for anything the run cannot do."""
    faults = [_check_one(spec, sites) for spec in raw]
    if faults and len(sites) < 3:
        raise ValueError(f"faults need at least 3 sites (a majority must survive); --sites is {len(sites)}")
    ordered = sorted(faults, key=lambda f: f.at_s)
    for first, second in zip(ordered, ordered[1:], strict=False):
        if second.at_s < first.end_s:
            until = "for good" if math.isinf(first.end_s) else f"until {first.end_s:g} s"
            raise ValueError(f"{second.label} overlaps {first.label} ({until}): one fault at a time")
    return ordered


def _check_one(spec: dict[str, Any], sites: Sequence[str]) -> Fault:
    kind, target = spec["kind"], spec["target"]
    option = f"--{kind} {target}"
    if "at_s" not in spec:
        raise ValueError(f"{option}: needs --at T (seconds after training starts)")
    if kind == "kill":
        if "for_s" in spec:
            raise ValueError(f"{option}: a kill has no --for; --rejoin-after D starts the site again")
        if spec.get("rejoin_after_s") == 0:
            raise ValueError(f"{option}: --rejoin-after must be > 0")
    else:
        if "rejoin_after_s" in spec:
            raise ValueError(f"{option}: --rejoin-after belongs to --kill (a {kind}ed site keeps running)")
        if not spec.get("for_s"):
            raise ValueError(f"{option}: needs --for D > 0 (how long it lasts)")
    if kind == "partition":
        groups = _partition_groups(target, sites)
    else:
        _known(target, sites, option)
        groups = ((target,),)
    fault = Fault(kind, target, spec["at_s"], spec.get("for_s"), spec.get("rejoin_after_s"), groups)
    if kind == "partition" and fault.majority_group() is None:
        raise ValueError(f"{option}: no group holds a majority of the {len(sites)} sites, so no side "
                         f"could continue; make one group larger")
    return fault


def _known(site: str, sites: Sequence[str], option: str) -> None:
    if site not in sites:
        raise ValueError(f"{option}: unknown site {site!r}; the run's sites are {', '.join(sites)}")


def _partition_groups(target: str, sites: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    option = f"--partition {target}"
    groups = tuple(tuple(s.strip() for s in part.split(",")) for part in target.split("|"))
    if len(groups) < 2 or any(not s for g in groups for s in g):
        raise ValueError(f"{option}: expected groups of site names like A,B|C (at least two, none empty)")
    named = [s for g in groups for s in g]
    for site in named:
        _known(site, sites, option)
    twice = sorted({s for s in named if named.count(s) > 1})
    if twice:
        raise ValueError(f"{option}: site(s) {', '.join(twice)} in more than one group")
    missing = [s for s in sites if s not in named]
    if missing:
        raise ValueError(f"{option}: every site must be in a group; missing {', '.join(missing)}")
    return groups


def cut_paths(scenario: Scenario, fault: Fault) -> list[int]:
    """Indexes of the paths a blackhole or partition takes down (none for a kill)."""
    if fault.kind == "blackhole":
        return [k for k, p in enumerate(scenario.paths) if fault.target in p.between]
    if fault.kind == "partition":
        group_of = {s: i for i, g in enumerate(fault.groups) for s in g}
        return [k for k, p in enumerate(scenario.paths)
                if p.between[0] in group_of and p.between[1] in group_of
                and group_of[p.between[0]] != group_of[p.between[1]]]
    return []


def with_fault_events(scenario: Scenario, faults: Sequence[Fault]) -> Scenario:
    """``scenario`` with each blackhole and partition as ``down`` events on the paths it cuts
    (times from "go", when the runner starts the engine's timeline)."""
    added: dict[int, list[PathEvent]] = {}
    for fault in faults:
        for k in cut_paths(scenario, fault):
            assert fault.for_s is not None
            added.setdefault(k, []).extend([PathEvent(at_s=fault.at_s, down=True),
                                            PathEvent(at_s=fault.at_s + fault.for_s, down=False)])
    paths = tuple(replace(p, events=tuple(sorted((*p.events, *added[k]), key=lambda e: e.at_s)))
                  if k in added else p for k, p in enumerate(scenario.paths))
    return replace(scenario, paths=paths)
