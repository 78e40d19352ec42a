"""A/B of two checkouts over the same emulated scenarios, runs interleaved.

Why interleaved: on a small shared host the machine's speed drifts over
minutes, so "all of A, then all of B" compares two moments as much as two
commits. Alternating A B A B ... gives each commit the same drift.

Each checkout needs its own ``.venv`` (``./dev setup`` there); every run is
``CHECKOUT/.venv/bin/python -m emulation run SCENARIO --transport wanxport
--json`` with the checkout as working directory, as root (namespaces).

    sudo .venv/bin/python benchmarks/ab_emulated.py --a /path/to/old --b . \\
        --runs 5 hetero-8path failover-4path --out results/ab.json

Prints, per scenario, each side's completion times, medians and B's median
over A's, and each end's CPU per GB (in all and in the event loop's thread) with the
engine's CPU beside them; ``--out`` keeps every report.

``--workload allreduce`` runs ``python -m emulation allreduce SCENARIO --comm
wanxport --json`` instead (``-- --ranks-per-site 2 --steps 10`` and the like go
after ``--``) and compares the mean step, the efficiency and each rank's CPU per
GB moved, in all and in the event loop's thread:

    sudo .venv/bin/python benchmarks/ab_emulated.py --workload allreduce --a /path/to/old \
        --b . --runs 5 --out results/ab-allreduce.json allreduce-4route -- --steps 10

``--workload daemon`` sends a file through two gateway daemons on loopback with this
checkout's ``benchmarks/daemon_cpu.py``, run on each side's code (each checkout's
python, working directory and ``PYTHONPATH``), and compares each end's CPU per GB:

    .venv/bin/python benchmarks/ab_emulated.py --workload daemon --a /path/to/old --b . \
        --runs 5 daemon-4path -- --size 1GiB --paths 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DAEMON_SCRIPT = Path(__file__).resolve().parent / "daemon_cpu.py"


def run_once(checkout: Path, scenario: str, deadline_s: float, extra: list[str],
             workload: str = "run") -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    if workload == "allreduce":
        cmd = [str(python), "-m", "emulation", "allreduce", scenario, "--comm", "wanxport", "--json", *extra]
    elif workload == "bench":  # "scenario" names the run; the bench takes its arguments from extra
        cmd = [str(python), "-m", "wanxport", "bench", "--json", *extra]
    elif workload == "daemon":  # this checkout's measuring script, run on each side's code
        cmd = [str(python), str(DAEMON_SCRIPT), "--runs", "1", "--only", "daemon", "--json", *extra]
    else:
        cmd = [str(python), "-m", "emulation", "run", scenario, "--transport", "wanxport", "--json",
               "--deadline", str(deadline_s), *extra]
    env = {**os.environ, "PYTHONPATH": f"{checkout}:{checkout / 'tests'}"} if workload == "daemon" else None
    done = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(cmd[1:])} failed ({done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (the change)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--out", type=Path, help="write every report and the summary here (JSON)")
    parser.add_argument("--workload", choices=("run", "allreduce", "bench", "daemon"), default="run",
                        help="one transfer over an emulated scenario (completion time), a run of "
                             "all-reduce steps (step, CPU), `wanxport bench` on loopback, or a file "
                             "through two gateway daemons on loopback (benchmarks/daemon_cpu.py; "
                             "SCENARIO is then only the run's name)")
    parser.add_argument("--key", help="with --out: keep this run under KEY in that file, beside "
                                      "what other runs keep there")
    parser.epilog = ("after --: more flags for every run (`emulation run`, `emulation allreduce`, "
                     "`wanxport bench`, `benchmarks/daemon_cpu.py`)")
    argv = sys.argv[1:] if argv is None else argv
    # split by hand: argparse would give what follows "--" to the scenarios
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    sides = {"a": args.a.resolve(), "b": args.b.resolve()}
    reports: dict[str, dict[str, list[dict[str, Any]]]] = {s: {"a": [], "b": []} for s in args.scenarios}
    for i in range(args.runs):
        for scenario in args.scenarios:
            for side, checkout in sides.items():
                report = run_once(checkout, scenario, args.deadline, extra, args.workload)
                reports[scenario][side].append(report)
                print(f"run {i + 1}/{args.runs} {scenario} {side}: {report['completion_s']:.2f} s "
                      f"intact={report['intact']}", file=sys.stderr, flush=True)
    summaries = {"allreduce": allreduce_summary, "bench": bench_summary, "daemon": bench_summary,
                 "run": transfer_summary}
    summary = summaries[args.workload](reports)
    if args.out:
        record = {"a": str(sides["a"]), "b": str(sides["b"]), "summary": summary, "reports": reports}
        if args.key:
            kept = json.loads(args.out.read_text()) if args.out.exists() else {}
            record = {**kept, args.key: record}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return 0


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def compared(by_side: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Each side's runs and their medians, and B's medians over A's."""
    entry: dict[str, Any] = {}
    for side, figures in by_side.items():
        entry[f"{side}_runs"] = figures
        entry[f"{side}_median"] = medians(figures)
    entry["b_over_a"] = {key: entry["b_median"][key] / entry["a_median"][key]
                         for key in entry["a_median"] if entry["a_median"][key]}
    return entry


def summarised(reports: dict[str, dict[str, list[dict[str, Any]]]],
               figures: Callable[[dict[str, Any]], dict[str, float]], verdict: str,
               line: Callable[[dict[str, float], dict[str, float]], str]) -> dict[str, Any]:
    """Per comparison: each side's runs as ``figures``, their medians and B's over A's, and
    ``all_<verdict>`` (every report's ``verdict`` true); prints ``line(A medians, B medians)``."""
    summary: dict[str, Any] = {}
    for name, by_side in reports.items():
        entry = compared({side: [figures(r) for r in runs] for side, runs in by_side.items()})
        entry[f"all_{verdict}"] = all(r[verdict] for runs in by_side.values() for r in runs)
        summary[name] = entry
        print(f"{name}: {line(entry['a_median'], entry['b_median'])}")
    return summary


def bench_figures(report: dict[str, Any]) -> dict[str, float]:
    """One transfer's goodput and each end's CPU per GB (and against the host's AEAD + digest limit)."""
    out = {"goodput_bps": float(report["goodput_bps"]), "completion_s": float(report["completion_s"])}
    for end in ("sender", "receiver"):
        out[f"{end}_cpu_s_per_gb"] = float(report["cpu_s_per_gb"][end])
        if "cpu_vs_limit" in report:
            out[f"{end}_vs_limit"] = float(report["cpu_vs_limit"][end])
    return out


def bench_summary(reports: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return summarised(reports, bench_figures, "intact", lambda a, b: (
        f"CPU-s/GB sender {a['sender_cpu_s_per_gb']:.3f} -> {b['sender_cpu_s_per_gb']:.3f}, "
        f"receiver {a['receiver_cpu_s_per_gb']:.3f} -> {b['receiver_cpu_s_per_gb']:.3f}; "
        f"goodput {a['goodput_bps'] / 1e9:.2f} -> {b['goodput_bps'] / 1e9:.2f} Gb/s"))


def transfer_summary(reports: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per scenario: each side's completion times, their medians and B's over A's; and where
    every report has each end's CPU, the CPU figures compared too (``cpu``, as ``compared``)."""
    summary = {}
    for scenario, by_side in reports.items():
        medians = {side: statistics.median(r["completion_s"] for r in runs) for side, runs in by_side.items()}
        summary[scenario] = {
            "a_completion_s": [r["completion_s"] for r in by_side["a"]],
            "b_completion_s": [r["completion_s"] for r in by_side["b"]],
            "a_median_s": medians["a"], "b_median_s": medians["b"],
            "b_over_a": medians["b"] / medians["a"],
            "all_intact": all(r["intact"] for runs in by_side.values() for r in runs),
        }
        line = (f"{scenario}: A median {medians['a']:.2f} s, B median {medians['b']:.2f} s, "
                f"B/A {medians['b'] / medians['a']:.3f}")
        if all("cpu_s_per_gb" in r and "cpu" in r for runs in by_side.values() for r in runs):
            cpu = compared({side: [transfer_cpu_figures(r) for r in runs] for side, runs in by_side.items()})
            summary[scenario]["cpu"] = cpu
            a, b = cpu["a_median"], cpu["b_median"]
            line += (f"; CPU-s/GB sender {a['sender_cpu_s_per_gb']:.2f} -> {b['sender_cpu_s_per_gb']:.2f}, "
                     f"receiver {a['receiver_cpu_s_per_gb']:.2f} -> {b['receiver_cpu_s_per_gb']:.2f}")
        print(line)
    return summary


def transfer_cpu_figures(report: dict[str, Any]) -> dict[str, float]:
    """One emulated transfer's CPU per GB at each end, in all and in its event loop's thread
    (the loop's share of the end's CPU times that), and the impairment engine's CPU seconds."""
    out: dict[str, float] = {}
    for end in ("sender", "receiver"):
        per_gb = float(report["cpu_s_per_gb"][end])
        out[f"{end}_cpu_s_per_gb"] = per_gb
        out[f"{end}_loop_cpu_s_per_gb"] = role_cpu_s_per_gb(report["cpu"][end], "loop", per_gb)
    engine = (report.get("cpu_other") or {}).get("engine")
    if engine is not None:
        out["engine_cpu_s"] = float(engine)
    return out


def role_cpu_s_per_gb(roles: dict[str, float], role: str, cpu_s_per_gb: float) -> float:
    """A process's CPU per GB in one thread role: the role's share of its CPU times its CPU per GB."""
    total = sum(roles.values())
    return roles[role] / total * cpu_s_per_gb if total else 0.0


def rank_figures(report: dict[str, Any]) -> dict[str, float]:
    """One all-reduce run's figures: its mean step and efficiency, and its ranks' CPU per GB
    moved (the mean over ranks), in all and in each role's thread; and, since the impairment
    engine shares the host, its CPU seconds beside all ranks' over the same timed steps."""
    ranks = report["ranks"]
    out = {"mean_step_s": float(report["mean_step_s"]), "efficiency": float(report["efficiency"]),
           "cpu_s_per_gb": statistics.fmean(r["cpu_s_per_gb"] for r in ranks),
           "ranks_step_cpu_s": sum(sum(steps) for steps in report["rank_step_cpu_s"])}
    engine = (report.get("cpu_other") or {}).get("engine")
    if engine is not None:
        out["engine_cpu_s"] = float(engine)
    for role in ranks[0]["cpu"]:
        out[f"{role}_cpu_s_per_gb"] = statistics.fmean(
            role_cpu_s_per_gb(r["cpu"], role, r["cpu_s_per_gb"]) for r in ranks)
    return out


def allreduce_summary(reports: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return summarised(reports, rank_figures, "correct", lambda a, b: (
        f"CPU-s/GB per rank A {a['cpu_s_per_gb']:.2f} B {b['cpu_s_per_gb']:.2f} "
        f"(loop {a['loop_cpu_s_per_gb']:.2f} -> {b['loop_cpu_s_per_gb']:.2f}); efficiency "
        f"{a['efficiency']:.3f} -> {b['efficiency']:.3f}"))


if __name__ == "__main__":
    sys.exit(main())
