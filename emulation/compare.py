"""``python -m emulation compare``: scenarios x transports x repeats, side by side.

Writes into ``--out``: ``reports/*.json`` (one run report v1 per run, plus the
simulator's report per scenario), ``goodput.png``, ``completion.png``,
``timeline-<scenario>.png`` for runs that carry a per-path ``timeline``, and
``results.md``: a Markdown table (median completion and goodput per cell, the
simulator's wanxport completion next to the emulated ones) headed by the date
and the machine, for the README to embed.

A transport that cannot run here (e.g. wanxport before its endpoint exists)
gets its one-line reason in the table instead of numbers; the rest still run.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulation import plots
from emulation.bundled import resolve_scenario
from emulation.errors import EmulationError
from emulation.ratios import DNF, finished, speedup
from emulation.run import (
    TRANSPORTS,
    RunOptions,
    check_deadline,
    check_options,
    exit_on_sigterm,
    run_experiment,
)
from wanxport.report import dumps, with_wall_time
from wanxport.scenario import Scenario

log = logging.getLogger(__name__)

Report = dict[str, Any]


@dataclass(frozen=True)
class Column:
    """One transport with its congestion control (None: the transport's default)."""

    transport: str
    cc: str | None = None

    @property
    def name(self) -> str:
        return f"{self.transport}:{self.cc}" if self.cc else self.transport


def parse_columns(text: str) -> list[Column]:
    """``tcp,mptcp:bbr,aioquic`` -> columns; ValueError (one line) for an unknown one."""
    columns = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        transport, _, cc = item.partition(":")
        column = Column(transport, cc or None)
        try:
            check_options(RunOptions(transport=transport, cc=column.cc))
        except ValueError as exc:
            raise ValueError(f"--transports {item!r}: {exc}") from None
        columns.append(column)
    if not columns:
        raise ValueError(f"--transports: name at least one of {', '.join(TRANSPORTS)}")
    return columns


def machine() -> str:
    """One line about the host the numbers come from."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.node()}: {os.cpu_count()} cores ({cpu}), Linux {platform.release()}"


def simulate_scenario(scenario: Scenario, size: int | None) -> Report:
    """wanxport in the simulator on the same scenario and size (sizes only: virtual payload)."""
    from wanxport.sim.runner import SimOptions, simulate

    return with_wall_time(lambda: simulate(scenario, SimOptions(size_bytes=size, payload_mode="virtual")))


def compare(scenarios: list[Scenario], columns: list[Column], repeat: int, out: Path, *,
            size: int | None = None, deadline_s: float | None = None,
            backend: str | None = None, with_sim: bool = True) -> list[Report]:
    """Run the matrix; write reports, figures and results.md into ``out``; return the reports."""
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    for scenario in scenarios:  # refuse a too-short deadline before the matrix starts
        for column in columns:
            check_deadline(column.transport, deadline_s, scenario)
    reports_dir = out / "reports"
    reports_dir.mkdir(parents=True, exist_ok=True)
    reports: list[Report] = []
    failures: dict[tuple[str, str], str] = {}
    for scenario in scenarios:
        if with_sim:
            sim = simulate_scenario(scenario, size)
            (reports_dir / f"{scenario.name}__wanxport-sim.json").write_text(dumps(sim))
            reports.append(sim)
        for column in columns:
            for i in range(repeat):
                options = RunOptions(transport=column.transport, cc=column.cc, size_bytes=size,
                                     deadline_s=deadline_s, backend=backend)
                try:
                    report = run_experiment(scenario, options)
                except EmulationError as exc:
                    failures[(scenario.name, column.name)] = str(exc)
                    log.warning("%s %s: %s", scenario.name, column.name, exc)
                    break
                log.info("%s %s #%d: %.2f s intact=%s", scenario.name, column.name, i,
                         report["completion_s"], report["intact"])
                report["repeat"] = i
                name = f"{scenario.name}__{column.name.replace(':', '-')}__{i}.json"
                (reports_dir / name).write_text(dumps(report))
                reports.append(report)
    write_figures(reports, out)
    (out / "results.md").write_text(table(reports, [c.name for c in columns], failures))
    return reports


def render(out: Path, columns: list[str] | None = None) -> list[Report]:
    """Figures and results.md again from ``out/reports/*.json``.

    So a matrix can be completed piecewise (a re-run of one transport, a scenario
    added later) without re-running what is already measured.
    """
    paths = sorted((out / "reports").glob("*.json"))
    if not paths:
        raise ValueError(f"{out / 'reports'}: no run reports to render")
    reports: list[Report] = []
    for path in paths:
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a run report ({exc})") from None
    if columns is None:
        columns = list(dict.fromkeys(_column_of(r) for r in reports if r["mode"] != "sim"))
    write_figures(reports, out)
    (out / "results.md").write_text(table(reports, columns, {}))
    return reports


def write_figures(reports: list[Report], out: Path) -> None:
    plots.goodput_bars(reports, out / "goodput.png")
    plots.completion_distribution([r for r in reports if r["mode"] != "sim"],
                                  out / "completion.png")
    for r in reports:
        if r.get("timeline") and r.get("repeat", 0) == 0:
            plots.path_timeline(r, out / f"timeline-{r['scenario']}.png")


def _column_of(report: Report) -> str:
    cc = report.get("cc")
    if report["transport"] == "wanxport" or not cc or cc == "cubic":
        return str(report["transport"])
    return f"{report['transport']}:{cc}"


def _median_run(runs: list[Report]) -> Report:
    """The run at the median completion; a run that did not finish sorts after every one that
    did (its true completion is later than its deadline), so the median is a bound when it is one."""
    if all(finished(r) for r in runs):  # the usual median (of the middle two for an even count)
        return {**runs[0], "completion_s": statistics.median(r["completion_s"] for r in runs)}
    ordered = sorted(runs, key=lambda r: (not finished(r), r["completion_s"]))
    return ordered[(len(ordered) - 1) // 2]


def _cell(runs: list[Report], ours: list[Report] | None = None) -> str:
    median = _median_run(runs)
    goodput = statistics.median(r["goodput_bps"] for r in runs) / 1e6
    broken = sum(1 for r in runs if not r["intact"])
    unfinished = sum(1 for r in runs if not finished(r))
    suspect = sum(1 for r in runs if r.get("suspect"))
    marks = (f" ✗{broken}/{len(runs)}" if broken else "") + \
        (f" ({DNF}: {unfinished}/{len(runs)})" if unfinished else "") + \
        (f" ⚠ suspect {suspect}/{len(runs)}" if suspect else "")
    versus = f" · wanxport {speedup(median, _median_run(ours)).text()} faster" if ours else ""
    completion = (f"{median['completion_s']:.2f} s" if finished(median)
                  else f"> {median['completion_s']:.2f} s")
    return f"{completion} · {goodput:.0f} Mb/s{marks}{versus}"


def table(reports: list[Report], columns: list[str], failures: dict[tuple[str, str], str]) -> str:
    """The Markdown results table (see the module docstring)."""
    by_cell: dict[tuple[str, str], list[Report]] = defaultdict(list)
    info: dict[str, Report] = {}
    for r in reports:
        key = "wanxport (sim)" if r["mode"] == "sim" else _column_of(r)
        by_cell[(r["scenario"], key)].append(r)
        info.setdefault(r["scenario"], r)
    names = list(columns)
    has_sim = any(r["mode"] == "sim" for r in reports)
    header = ["scenario", "payload", "ideal"] + (["wanxport (sim)"] if has_sim else []) + names
    repeats = max((r.get("repeat", 0) + 1 for r in reports if r["mode"] != "sim"), default=0)
    lines = [
        f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{machine()}; `python -m emulation compare`, {repeats} repeat(s), emulated paths "
        f"({', '.join(sorted({str(r.get('backend')) for r in reports if r['mode'] != 'sim'}))} "
        f"backend). Cells: median completion · median goodput; ✗ marks runs not intact; '> T s' a "
        f"median run that {DNF} (T its deadline), and a ratio against it is a bound, never a plain "
        f"ratio; ⚠ marks runs flagged suspect (a clean path under half its capacity).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for scenario in sorted(info):
        first = info[scenario]
        per_direction = first["payload_bytes"]
        row = [scenario, f"{per_direction / 2**20:.0f} MiB",
               f"{first['ideal_s']:.2f} s" if first.get("ideal_s") else "-"]
        ours = by_cell.get((scenario, "wanxport"))
        for column in (["wanxport (sim)"] if has_sim else []) + names:
            runs = by_cell.get((scenario, column))
            if runs:
                row.append(_cell(runs, ours if column not in ("wanxport", "wanxport (sim)") else None))
            else:
                row.append(f"n/a: {failures[(scenario, column)]}" if (scenario, column) in failures
                           else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def scenario_with_size(arg: str, default_size: int | None) -> Scenario:
    """``NAME`` or ``NAME@SIZE`` (e.g. ``lossy-long-2path@8MiB``): a per-scenario payload size."""
    from wanxport.units import parse_size

    name, at, size = arg.rpartition("@")
    if not at:
        scenario = resolve_scenario(arg)
        return scenario.with_transfer(size_bytes=default_size) if default_size else scenario
    try:
        size_bytes = parse_size(size)
    except ValueError as exc:
        raise ValueError(f"scenario {arg!r}: size after '@': {exc}") from None
    return resolve_scenario(name).with_transfer(size_bytes=size_bytes)


def main_compare(args: Any) -> int:
    """``python -m emulation compare``: 0 when every run was intact."""
    exit_on_sigterm()
    columns = parse_columns(args.transports)
    scenarios = [scenario_with_size(s, args.size) for s in args.scenarios]
    out = Path(args.out)
    reports = compare(scenarios, columns, args.repeat, out,
                      deadline_s=args.deadline, backend=args.backend, with_sim=not args.no_sim)
    print((out / "results.md").read_text(), end="")
    print(json.dumps({"out": str(out), "runs": len(reports)}))
    return 0 if all(r["intact"] for r in reports) else 1


def main_render(args: Any) -> int:
    """``python -m emulation render DIR``: figures and table from the reports already there."""
    columns = [c.name for c in parse_columns(args.transports)] if args.transports else None
    out = Path(args.out)
    reports = render(out, columns)
    print((out / "results.md").read_text(), end="")
    print(json.dumps({"out": str(out), "runs": len(reports)}))
    return 0
