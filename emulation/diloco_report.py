"""What a ``python -m emulation diloco`` run saw, and its report (DESIGN §5).

``RunLog`` records every site process's lines (``ready``, ``outer``, ``membership``,
``done``), its start and end, the kills and the engine's counters, all on CLOCK_MONOTONIC;
``build_diloco_report`` turns that into one report with times from "go":

* ``outer_steps``: per outer step, when its last site completed it, the time since the
  previous step's, and the sites that completed it.
* per fault, ``recovery_s``: from the fault to the survivors' next completed outer step
  (the first step every survivor completed after the fault with the cut-off sites out of
  its members, at its last survivor), and ``recovery_sync_s``, its part after the
  survivors' inner steps;
  for a kill with a restart, ``rejoin_s``: from the new process's start (before Python
  imports torch) to its first completed step, the state transfer included; for a
  blackhole or partition, ``back_after_heal_s``: from the heal to the cut-off sites'
  first completed step.
* ``held_from_step``: the outer step from which the sites trained past ``--outer-steps``
  to wait for a site the faults bring back (null when none had to).
* ``final_loss`` (the held-out loss of the global model at the lowest-index site that
  finished), ``final_excess_loss`` (its part above the targets' noise floor) and whether
  every finished site holds the same parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from emulation.api import Emulation
from emulation.faults import Fault
from wanxport.report import build_report
from wanxport.scenario import Scenario


class RunLog:
    """Everything the runner learnt, keyed by process label (a site, or ``site#2`` restarted)."""

    def __init__(self, sites: Sequence[str]) -> None:
        self.sites = list(sites)
        self.site_of: dict[str, str] = {}
        self.start: dict[str, float] = {}
        self.ready: dict[str, dict[str, Any]] = {}
        self.outer: dict[str, list[dict[str, Any]]] = {}
        self.done: dict[str, dict[str, Any]] = {}
        self.ends: dict[str, tuple[float, int | None, str]] = {}
        self.membership: list[dict[str, Any]] = []
        self.holds: list[dict[str, Any]] = []
        self.kills: dict[str, float] = {}
        self.go_at: float | None = None
        self.faults: tuple[Fault, ...] = ()
        self.timeout_s: float | None = None
        self.engine: dict[str, Any] = {}
        self._engine_cpu: float | None = None

    # -- recording ---------------------------------------------------------

    def started(self, label: str, site: str, at: float) -> None:
        self.site_of[label], self.start[label] = site, at
        self.outer[label] = []

    def line(self, label: str, obj: dict[str, Any], at: float) -> None:
        event = obj.get("event")
        if event == "ready":
            self.ready[label] = obj
        elif event == "outer" and label in self.outer:
            self.outer[label].append(obj)
        elif event == "membership":
            self.membership.append({**obj, "label": label})
        elif event == "hold":
            self.holds.append({**obj, "label": label})
        elif event == "done":
            self.done[label] = obj

    def ended(self, label: str, at: float, returncode: int | None, stderr_tail: str) -> None:
        self.ends[label] = (at, returncode, stderr_tail)

    def killed(self, site: str, at: float) -> None:
        self.kills[site] = at

    def go(self, at: float, faults: Sequence[Fault]) -> None:
        self.go_at, self.faults = at, tuple(faults)

    def timed_out(self, deadline_s: float) -> None:
        self.timeout_s = deadline_s

    def meter_start(self, emu: Emulation) -> None:
        self._engine_cpu = emu.engine_cpu_s()

    def meter_stop(self, emu: Emulation) -> None:
        after = emu.engine_cpu_s()
        if self._engine_cpu is not None and after is not None:
            self.engine["engine_cpu_s"] = round(after - self._engine_cpu, 2)
        self.engine["lag_max_s"] = emu.lag_max_s()

    # -- questions ---------------------------------------------------------

    def ready_labels(self) -> set[str]:
        return set(self.ready)

    def ended_labels(self) -> set[str]:
        return set(self.ends)

    def end_reason(self, label: str) -> str:
        _, code, tail = self.ends[label]
        return f"exit status {code}: {tail}"

    def finished(self, label: str) -> bool:
        return label in self.done or label in self.ends

    def rel(self, t: float) -> float:
        assert self.go_at is not None
        return round(t - self.go_at, 3)


def outer_steps(log: RunLog) -> list[dict[str, Any]]:
    """Per outer step: its end at the last site that completed it, the time since the previous
    step's end (the first: since "go"), and the sites that completed it."""
    ends: dict[int, list[tuple[float, str]]] = {}
    for label, rows in log.outer.items():
        for row in rows:
            ends.setdefault(row["step"], []).append((row["t1"], log.site_of[label]))
    out, previous = [], log.go_at
    for step in sorted(ends):
        end = max(t for t, _ in ends[step])
        assert previous is not None
        out.append({"step": step, "end_s": log.rel(end), "duration_s": round(end - previous, 3),
                    "sites": sorted({s for _, s in ends[step]}, key=log.sites.index)})
        previous = end
    return out


def _completions(log: RunLog, site: str) -> dict[int, float]:
    """Each outer step ``site`` completed (any of its processes) -> when."""
    out: dict[int, float] = {}
    for label, rows in log.outer.items():
        if log.site_of[label] == site:
            for row in rows:
                out[row["step"]] = row["t1"]
    return out


def _fault_time(log: RunLog, fault: Fault) -> float:
    assert log.go_at is not None
    killed = log.kills.get(fault.target) if fault.kind == "kill" else None
    return killed if killed is not None else log.go_at + fault.at_s


def _recovery_rows(log: RunLog, fault: Fault) -> list[dict[str, Any]]:
    """The survivors' rows of the first outer step they all completed after the fault without
    the cut-off sites (a step whose all-reduce had every contribution before the fault and
    ends just after it is no recovery); empty if there was none."""
    at, gone = _fault_time(log, fault), {log.sites.index(s) for s in fault.cut_off()}
    survivors = [s for s in log.sites if s not in fault.cut_off()]
    rows: dict[str, dict[int, dict[str, Any]]] = {s: {} for s in survivors}
    for label, outer in log.outer.items():
        if log.site_of[label] in rows:
            for row in outer:
                if row["t1"] > at and not gone & set(row.get("members", ())):
                    rows[log.site_of[label]][row["step"]] = row
    common = sorted(set.intersection(*(set(by_step) for by_step in rows.values())))
    return [rows[s][common[0]] for s in survivors] if common else []


def recovery_s(log: RunLog, fault: Fault) -> float | None:
    """From the fault to the survivors' next completed outer step (``_recovery_rows``), at the
    last survivor to complete it."""
    rows = _recovery_rows(log, fault)
    return round(max(r["t1"] for r in rows) - _fault_time(log, fault), 3) if rows else None


def recovery_sync_s(log: RunLog, fault: Fault) -> float | None:
    """The part of ``recovery_s`` after the survivors' inner steps: from the later of the fault
    and the last survivor's start of that step's all-reduce to its end at the last survivor
    (liveness, the new epoch and the all-reduce among the survivors)."""
    rows = _recovery_rows(log, fault)
    if not rows:
        return None
    sync = max(r.get("t_sync", r["t1"]) for r in rows)
    return round(max(r["t1"] for r in rows) - max(_fault_time(log, fault), sync), 3)


def rejoin_phases_s(log: RunLog, label: str | None) -> dict[str, float] | None:
    """A restarted process's way back: start to joined (Python, torch, the group's admission at
    the survivors' next boundary), joined to holding the state (its transfer), then its first
    outer step (inner steps and the all-reduce)."""
    if label is None or label not in log.ready or not log.outer.get(label):
        return None
    start, ready = log.start[label], log.ready[label]["t"]
    state = next((m["t"] for m in log.membership if m["label"] == label), ready)
    return {"to_joined": round(ready - start, 3), "to_state": round(state - ready, 3),
            "first_step": round(log.outer[label][0]["t1"] - state, 3)}


def rejoin_s(log: RunLog, fault: Fault) -> tuple[float | None, str | None]:
    """A restarted site: from its new process's start to its first completed step."""
    restarted = [label for label in log.start if log.site_of[label] == fault.target and "#" in label]
    if fault.kind != "kill" or not restarted:
        return None, None
    label = restarted[0]
    rows = log.outer.get(label) or []
    return (round(rows[0]["t1"] - log.start[label], 3) if rows else None), label


def back_after_heal_s(log: RunLog, fault: Fault) -> float | None:
    """A blackhole or partition: from the heal to the first step every cut-off site completed."""
    if fault.kind == "kill" or fault.for_s is None:
        return None
    assert log.go_at is not None
    healed = log.go_at + fault.at_s + fault.for_s
    done = [_completions(log, s) for s in fault.cut_off()]
    steps = sorted(set.intersection(*(set(k for k, t in d.items() if t > healed) for d in done)))
    return round(max(d[steps[0]] for d in done) - healed, 3) if steps else None


def membership_changes(log: RunLog) -> list[dict[str, Any]]:
    """Each epoch after the first, once: its live sites, when a site first saw it, and which
    processes saw it."""
    epochs: dict[int, dict[str, Any]] = {}
    for m in sorted(log.membership, key=lambda m: m["t"]):
        if m["epoch"] > 0:
            row = epochs.setdefault(m["epoch"], {"epoch": m["epoch"], "members": m["members"],
                                                 "first_seen_s": log.rel(m["t"]), "seen_by": []})
            row["seen_by"].append(m["label"])
    return [epochs[k] for k in sorted(epochs)]


def _unfinished(log: RunLog, final: dict[str, str]) -> str:
    """Where each site's last process was when the run was stopped: its last completed outer
    step, or that it had not joined."""
    out = []
    for site in log.sites:
        label = final[site]
        if log.finished(label):
            continue
        rows = log.outer.get(label) or []
        where = f"after outer step {rows[-1]['step']}" if rows else (
            "joined, before its first outer step" if label in log.ready else "not joined")
        out.append(f"{label} {where}")
    return "unfinished: " + (", ".join(out) if out else "none")


def build_diloco_report(scenario: Scenario, options: Any, log: RunLog, *, backend: str | None,
                        commit: str | None, host: dict[str, Any], wall_s: float) -> dict[str, Any]:
    steps = outer_steps(log)
    final = {log.site_of[label]: label for label in log.start}  # each site's last process
    gone_for_good = {f.target for f in log.faults if f.kind == "kill" and f.rejoin_after_s is None}
    expected = [s for s in log.sites if s not in gone_for_good]
    finished = {s: log.done[final[s]] for s in expected if final[s] in log.done}
    errors = [f"{final[s]}: {d['error']}" for s, d in finished.items() if d.get("error")]
    errors += [f"{final[s]}: ended without a result ({log.end_reason(final[s])})"
               for s in expected if s not in finished and final[s] in log.ends]
    if log.timeout_s is not None:
        errors.append(f"the run passed its {log.timeout_s:.0f} s deadline; {_unfinished(log, final)}")
    identical = len({d["digest"] for d in finished.values()}) == 1
    intact = not errors and len(finished) == len(expected) and identical
    first = next(iter(finished.values()), None)
    ready = next((log.ready[label] for label in log.start if label in log.ready), {})
    faults = []
    for fault in log.faults:
        back, label = rejoin_s(log, fault)
        faults.append({"kind": fault.kind, "target": fault.target, "at_s": fault.at_s, "for_s": fault.for_s,
                       "rejoin_after_s": fault.rejoin_after_s, "cut_off": list(fault.cut_off()),
                       "recovery_s": recovery_s(log, fault), "recovery_sync_s": recovery_sync_s(log, fault),
                       "rejoin_s": back, "rejoined_as": label, "rejoin_phases_s": rejoin_phases_s(log, label),
                       "back_after_heal_s": back_after_heal_s(log, fault)})
    params = ready.get("params", 0)
    end = max((d["t"] for d in log.done.values()), default=log.go_at)
    assert end is not None and log.go_at is not None
    return build_report(
        scenario=scenario.name, mode="emulated", transport="wanxport",
        payload_bytes=4 * params * len(steps), completion_s=max(0.0, end - log.go_at), ideal_s=None,
        intact=intact, wall_s=wall_s, paths=[], steps=max(1, options.outer_steps),
        step_s=[s["duration_s"] for s in steps],
        workload="diloco", comm="wanxport", sites=log.sites, ranks_per_site=1, compress=options.compress,
        correct=intact, identical_across_sites=identical,
        model={"params": params, "hidden": options.hidden, "inner_optimizer": "Adam",
               "outer_optimizer": "Nesterov SGD", "inner_steps": options.inner_steps,
               "outer_steps": options.outer_steps, "seed": options.seed, "noise": ready.get("noise")},
        state_bytes=ready.get("state_bytes"), outer_steps=steps,
        outer_step_s=[s["duration_s"] for s in steps],
        faults=faults,
        recovery_s=next((f["recovery_s"] for f in faults), None),
        rejoin_s=next((f["rejoin_s"] for f in faults if f["rejoin_s"] is not None), None),
        initial_loss=ready.get("initial_loss"), final_loss=first["final_loss"] if first else None,
        final_excess_loss=first.get("final_excess_loss") if first else None,
        final_loss_per_site={s: d["final_loss"] for s, d in finished.items()},
        membership_changes=membership_changes(log),
        held_from_step=min((h["step"] for h in log.holds), default=None),
        site_cpu_s={label: d.get("cpu_s") for label, d in log.done.items()},
        lag_max_s=log.engine.get("lag_max_s"), cpu_other={"engine": log.engine.get("engine_cpu_s")},
        backend=backend, commit=commit, host=host, errors=errors)


def summary(report: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    steps = report["outer_step_s"]
    mean = sum(steps) / len(steps) if steps else math.nan
    lines = [f"{report['scenario']}: DiLoCo among {', '.join(report['sites'])}, "
             f"{report['model']['params']:,} parameters (state {report['state_bytes']:,} B), "
             f"{len(steps)} outer steps of H = {report['model']['inner_steps']}, mean {mean:.2f} s; "
             f"held-out loss {report['initial_loss']} -> {report['final_loss']}, identical across sites: "
             f"{'yes' if report['identical_across_sites'] else 'NO'}"]
    for fault in report["faults"]:
        lines.append(f"  --{fault['kind']} {fault['target']} at {fault['at_s']:g} s: recovery_s "
                     f"{fault['recovery_s']} (of which after the inner steps {fault['recovery_sync_s']}), "
                     f"rejoin_s {fault['rejoin_s']} {fault['rejoin_phases_s'] or ''}, back_after_heal_s "
                     f"{fault['back_after_heal_s']}")
    if report["held_from_step"] is not None:
        lines.append(f"  trained on from outer step {report['held_from_step']} until the sites the faults "
                     f"took out were back")
    lines.append(f"  engine lag_max_s {report['lag_max_s']}, engine CPU {report['cpu_other']['engine']} s")
    lines += [f"  error: {e}" for e in report["errors"]]
    return "\n".join(lines)
