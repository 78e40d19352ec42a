"""Figures of a comparison (matplotlib, Agg; files only, never a window).

Each function takes run reports (v1) and writes one PNG; they share nothing
but the labelling, so a figure can be redrawn from saved reports alone.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from emulation.ratios import DNF, finished  # noqa: E402

Report = dict[str, Any]


def label(report: Report) -> str:
    """Column name of a report: transport, with its congestion control unless the default."""
    name = str(report["transport"])
    if report.get("mode") == "sim":
        return f"{name} (sim)"
    cc = report.get("cc")
    return f"{name}:{cc}" if cc and cc != "cubic" and name != "wanxport" else name


def _grouped(reports: list[Report], key: str) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        if r.get(key) is not None:
            out[r["scenario"]][label(r)].append(float(r[key]))
    return out


def goodput_bars(reports: list[Report], path: Path) -> None:
    """Median goodput per transport, grouped by scenario; whiskers span the repeats."""
    data = _grouped(reports, "goodput_bps")
    scenarios = sorted(data)
    labels = sorted({lab for s in scenarios for lab in data[s]})
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(scenarios) + 2), 4.0))
    for j, lab in enumerate(labels):
        xs, med, lo, hi = [], [], [], []
        for i, s in enumerate(scenarios):
            values = [v / 1e6 for v in data[s].get(lab, [])]
            if not values:
                continue
            m = statistics.median(values)
            xs.append(i + (j - (len(labels) - 1) / 2) * width)
            med.append(m)
            lo.append(m - min(values))
            hi.append(max(values) - m)
        ax.bar(xs, med, width, yerr=[lo, hi], label=lab, capsize=2)
    ax.set_xticks(range(len(scenarios)), scenarios, rotation=15)
    ax.set_ylabel("goodput (Mb/s)")
    ax.set_title("Goodput per transport (median of repeats)")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def completion_distribution(reports: list[Report], path: Path) -> None:
    """Completion time of every repeat, one panel per scenario (box plus the points).

    A run that did not finish is drawn at its deadline as an upward triangle: its
    completion is only known to be later."""
    data = _grouped(reports, "completion_s")
    unfinished = _grouped([r for r in reports if not finished(r)], "completion_s")
    scenarios = sorted(data)
    fig, axes = plt.subplots(1, max(1, len(scenarios)), figsize=(4.5 * max(1, len(scenarios)), 4.0),
                             squeeze=False)
    for ax, s in zip(axes[0], scenarios, strict=False):
        labels = sorted(data[s])
        values = [data[s][lab] for lab in labels]
        ax.boxplot(values)
        for i, (lab, vs) in enumerate(zip(labels, values, strict=True), start=1):
            bounds = unfinished.get(s, {}).get(lab, [])
            done = list(vs)
            for b in bounds:
                done.remove(b)
            ax.plot([i] * len(done), done, "o", alpha=0.6, markersize=4)
            if bounds:
                ax.plot([i] * len(bounds), bounds, "^", color="red", markersize=6)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, fontsize="small")
        ax.set_title(f"{s}\n(▲ {DNF}: at its deadline)" if unfinished.get(s) else s)
        ax.set_ylabel("completion (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def path_timeline(report: Report, path: Path, bin_s: float = 0.25) -> bool:
    """Per-path payload sent over time from a report's ``timeline`` ([{t_s, path, bytes}]).

    The sender's count: retransmissions included, so Startup's overshoot shows.

    Returns False (and writes nothing) when the report has no timeline.
    """
    timeline = report.get("timeline") or []
    if not timeline:
        return False
    rates = binned_rates(timeline, bin_s)
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for name in sorted(rates):
        ax.plot([k * bin_s for k in range(len(rates[name]))], rates[name],
                label=name, drawstyle="steps-post")
    ax.set_xlabel("time since first byte (s)")
    ax.set_ylabel("payload sent (Mb/s), retransmissions included")
    ax.set_title(f"{report['scenario']}: {label(report)} per-path payload sent")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def binned_rates(timeline: list[dict[str, Any]], bin_s: float) -> dict[str, list[float]]:
    """Each path's Mb/s per ``bin_s`` bin, from samples of bytes since the previous sample.

    A sample covers the time since the previous sampling instant (of any path: the
    sampler visits all paths at once, and leaves out those that moved nothing), so
    its bytes are spread over that interval rather than dropped into the bin of its
    timestamp: samples every 0.1 s in 0.25 s bins would otherwise alternate 2 and 3
    per bin and draw a steady path as a 30 % sawtooth. A path that moved nothing in
    a bin (a failed one) is drawn at zero, not joined across the gap.
    """
    instants = sorted({float(e["t_s"]) for e in timeline})
    previous = dict(zip(instants, [0.0, *instants[:-1]], strict=True))
    count = int(instants[-1] / bin_s) + 1
    per_bin: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    for entry in timeline:
        end = float(entry["t_s"])
        start = previous[end]
        spread = per_bin[str(entry["path"])]
        if end <= start:  # a sample at t = 0 covers no time: count it where it is
            spread[min(int(end / bin_s), count - 1)] += int(entry["bytes"])
            continue
        rate = int(entry["bytes"]) / (end - start)
        k = int(start / bin_s)
        while k * bin_s < end and k < count:
            overlap = min(end, (k + 1) * bin_s) - max(start, k * bin_s)
            spread[k] += rate * max(overlap, 0.0)
            k += 1
    return {name: [b * 8 / bin_s / 1e6 for b in bins] for name, bins in per_bin.items()}


