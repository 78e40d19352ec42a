"""Fairness and background yielding in the simulator: flows sharing bottleneck links.

Runs named experiments on ``wanxport.sim.multi`` (virtual time, seeded, so the
numbers do not depend on this host's load) over two links of 100 Mb/s,
40 ms RTT and a 50 ms drop-tail buffer, and writes one JSON report and one
figure of per-flow throughput over time:

    .venv/bin/python benchmarks/fairness.py --out results/fairness
    .venv/bin/python benchmarks/fairness.py --only vs-cubic,background --jobs 2

Experiments (a flow's paths are listed by the links they cross):
- ``two-wanxport``: two wanxport sessions, one path each on l0, the second from 1 s;
- ``two-wanxport-2path``: the same with two paths each, both on l0 (single bottleneck);
- ``vs-bbr``/``vs-cubic``: one wanxport session (one path) next to a simulated TCP flow;
- ``2path-vs-bbr``/``2path-vs-cubic``: a wanxport session with both paths on l0 next to it;
- ``split-vs-cubic``: wanxport paths on l0 and l1, a CUBIC flow on l0 (its share is judged on l0);
- ``background``: a 64 MiB step exchange on l0+l1 from 3 s, alone, next to a ``ledbat``
  bulk transfer and next to a ``bbr`` one;
- ``tcp-bbr-pair``/``tcp-cubic-pair``: baselines, wanxport replaced by a second TCP flow;
- every competing-flow experiment again as ``NAME-shared``, wanxport's BBR with
  ``shared = true`` (coupled paths and a held min RTT, see core/cc/coupling.py);
- ``disjoint``: what ``shared = true`` costs on bundled scenarios whose paths share
  nothing (64 MiB, single runs).

Summaries: for competing flows, Jain's index per 500 ms window, the first time
(from the last flow's start) after which it stays >= 0.9, and each flow's share
of the link over the run's last ``duration - 10 s`` after the last start.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from wanxport.scenario import Scenario, parse_scenario, resolve
from wanxport.sim.multi import FlowSpec, MultiRun
from wanxport.sim.runner import SimOptions, simulate

BUNDLED = Path(__file__).resolve().parent.parent / "emulation" / "scenarios"

LINKS = """name = "two-links"
description = "Two bottleneck links that flows share: 100 Mb/s, 40 ms RTT, 50 ms of buffer."
seed = 11
[[paths]]
name = "l0"
rtt_ms = 40.0
bandwidth_mbps = 100.0
queue_ms = 50.0
[[paths]]
name = "l1"
rtt_ms = 40.0
bandwidth_mbps = 100.0
queue_ms = 50.0
"""
DURATION_S = 20.0
STEP_BYTES = 64 << 20
JAIN_TARGET = 0.9
SETTLE_S = 10.0
#: The simulated TCP BBR runs ProbeRTT as Linux's does; wanxport keeps its default (off).
TCP_BBR = {"probe_rtt": True}


def _tcp(cc: str, start_s: float = 1.0) -> FlowSpec:
    return FlowSpec(f"tcp-{cc}", ("l0",), kind="tcp", cc=cc, cc_options=TCP_BBR if cc == "bbr" else {},
                    start_s=start_s)


def _experiments(shared: bool) -> dict[str, list[FlowSpec]]:
    """The competing-flow experiments, with wanxport's BBR in its default mode or ``shared``."""
    options = {"shared": True} if shared else {}
    suffix = "-shared" if shared else ""

    def wanxport(name: str, paths: tuple[str, ...], start_s: float = 0.0) -> FlowSpec:
        return FlowSpec(name, paths, cc_options=options, start_s=start_s)

    return {f"{name}{suffix}": flows for name, flows in {
        "two-wanxport": [wanxport("wanxport-1", ("l0",)), wanxport("wanxport-2", ("l0",), 1.0)],
        "two-wanxport-2path": [wanxport("wanxport-1", ("l0", "l0")),
                               wanxport("wanxport-2", ("l0", "l0"), 1.0)],
        "vs-bbr": [wanxport("wanxport", ("l0",)), _tcp("bbr")],
        "vs-cubic": [wanxport("wanxport", ("l0",)), _tcp("cubic")],
        "2path-vs-bbr": [wanxport("wanxport", ("l0", "l0")), _tcp("bbr")],
        "2path-vs-cubic": [wanxport("wanxport", ("l0", "l0")), _tcp("cubic")],
        "split-vs-cubic": [wanxport("wanxport", ("l0", "l1")), _tcp("cubic")],
    }.items()}


#: Baselines: the wanxport flow replaced by a second TCP flow of the same controller.
BASELINES = {f"tcp-{cc}-pair": [FlowSpec(f"tcp-{cc}-0", ("l0",), kind="tcp", cc=cc,
                                         cc_options=TCP_BBR if cc == "bbr" else {}), _tcp(cc)]
             for cc in ("bbr", "cubic")}
EXPERIMENTS = {**_experiments(False), **_experiments(True), **BASELINES}
BACKGROUND = {"alone": None, "next-to-ledbat": "ledbat", "next-to-bbr": "bbr"}
#: What ``shared = true`` costs where nothing is shared: bundled scenarios, disjoint paths.
DISJOINT = ("clean-2path", "hetero-8path", "lossy-long-2path")
DISJOINT_BYTES = 64 << 20


def links() -> Scenario:
    return parse_scenario(LINKS, "benchmarks/fairness.py")


def fairness(name: str) -> dict[str, Any]:
    """One competing-flows experiment with its summary."""
    flows = EXPERIMENTS[name]
    report = MultiRun(links(), flows, DURATION_S).run()
    window = report["window_s"]
    last_start = max(f.start_s for f in flows)
    first = math.ceil((last_start + SETTLE_S) / window - 1e-9)
    # Judged on l0, the link every competing flow crosses.
    on_l0 = [f["throughput_bps_by_link"].get("l0", []) for f in report["flows"]]
    jain = report["jain"]
    converged = None
    for w in range(len(jain)):
        if w * window >= last_start and all(j is None or j >= JAIN_TARGET for j in jain[w:]):
            converged = w * window - last_start
            break
    totals = [sum(rates[first:]) for rates in on_l0]
    report["summary"] = {
        "experiment": name,
        "jain_converged_after_s": converged,
        "jain_min_after_settle": min((j for j in jain[first:] if j is not None), default=None),
        "share_on_l0_after_settle": {f["name"]: t / sum(totals) for f, t in zip(report["flows"], totals,
                                                                                 strict=True)},
    }
    return report


def background(name: str) -> dict[str, Any]:
    """A step exchange alone or next to a bulk transfer; its completion time."""
    flows = [FlowSpec("step", ("l0", "l1"), start_s=3.0, size_bytes=STEP_BYTES)]
    bulk = BACKGROUND[name]
    if bulk is not None:
        flows.append(FlowSpec(f"bulk-{bulk}", ("l0", "l1"), cc=bulk))
    report = MultiRun(links(), flows, 30.0).run()
    report["summary"] = {"experiment": f"background/{name}", "step_s": report["flows"][0]["completion_s"]}
    return report


def disjoint(name: str) -> dict[str, Any]:
    """One bundled scenario's transfer, BBR by default and with ``shared = true``."""
    scenario = resolve(name, BUNDLED)
    runs = {mode: simulate(scenario, SimOptions(size_bytes=DISJOINT_BYTES, payload_mode="virtual",
                                                cc_options=options))
            for mode, options in (("default", {}), ("shared", {"shared": True}))}
    return {"summary": {"experiment": f"disjoint/{name}",
                        **{f"{mode}_completion_s": r["completion_s"] for mode, r in runs.items()},
                        "ideal_s": runs["default"]["ideal_s"]}}


def _run(job: tuple[str, str]) -> dict[str, Any]:
    kind, name = job
    return {"fairness": fairness, "background": background, "disjoint": disjoint}[kind](name)


def plot(reports: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = math.ceil(len(reports) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.8 * rows), squeeze=False, sharex=False)
    for ax, report in zip(axes.flat, reports, strict=False):
        window = report["window_s"]
        for flow in report["flows"]:
            rates = flow["throughput_bps"]
            times = [(i + 0.5) * window for i in range(len(rates))]
            ax.plot(times, [r / 1e6 for r in rates], label=f"{flow['name']} ({flow['cc']})")
        summary = report["summary"]
        title = summary["experiment"]
        if "step_s" in summary:
            title += f": step {summary['step_s']:.2f} s" if summary["step_s"] else ": step unfinished"
        elif summary["jain_min_after_settle"] is not None:
            title += f": min Jain after 10 s {summary['jain_min_after_settle']:.2f}"
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("Mb/s")
        ax.set_xlabel("virtual time, s")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(reports):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/fairness"),
                        help="directory for fairness.json and fairness.png")
    parser.add_argument("--only", default="", help="comma-separated experiment names "
                        f"({', '.join(EXPERIMENTS)}, background, disjoint)")
    parser.add_argument("--jobs", type=int, default=1, help="experiments run in parallel processes")
    args = parser.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    unknown = only - set(EXPERIMENTS) - {"background", "disjoint"}
    if unknown or args.jobs < 1:
        parser.error(f"unknown experiment(s) {', '.join(sorted(unknown))}" if unknown
                     else "--jobs must be >= 1")
    jobs = [("fairness", n) for n in EXPERIMENTS if not only or n in only]
    if not only or "background" in only:
        jobs += [("background", n) for n in BACKGROUND]
    if not only or "disjoint" in only:
        jobs += [("disjoint", n) for n in DISJOINT]
    with ProcessPoolExecutor(args.jobs) as pool:
        reports = list(pool.map(_run, jobs))
    for report in reports:
        print(json.dumps(report["summary"]), file=sys.stdout)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fairness.json").write_text(json.dumps(reports, separators=(",", ":")) + "\n")
    plot([r for r in reports if "flows" in r], args.out / "fairness.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
