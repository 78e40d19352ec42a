"""Markdown table of a cpu4-ab.sh JSONL (one bench report a line), with per-variant medians."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
cols = ["goodput Gb/s", "vs iperf3", "vs raw", "CPU-s/GB sender", "receiver", "sender loop", "digest", "pacer",
        "ACKs/GB", "services/GB", "AEAD", "digest lim", "sender/(A+D)", "receiver/(A+D)"]
print("| round | variant | " + " | ".join(cols) + " | load |")
print("|" + "---|" * (len(cols) + 3))
by: dict[str, list[list[float]]] = {}
for d in rows:
    ab, t, ev, lim = d["ab"], d["sender_cpu_s_per_gb_by_thread"], d["sender_loop_events_per_gb"], d["limits"]
    vals = [d["goodput_bps"] / 1e9, d["goodput_vs_baseline"], d["goodput_vs_raw_udp"], d["cpu_s_per_gb"]["sender"],
            d["cpu_s_per_gb"]["receiver"], t["loop"], t["digest"], t["pacer"], ev["control_packets"], ev["services"],
            lim["aead"]["cpu_s_per_gb"], lim["digest"]["cpu_s_per_gb"], d["cpu_vs_limit"]["sender"],
            d["cpu_vs_limit"]["receiver"]]
    by.setdefault(ab["variant"], []).append(vals)
    fmt = ["%.2f", "%.2f", "%.3f", "%.2f", "%.2f", "%.2f", "%.2f", "%.2f", "%d", "%d", "%.3f", "%.3f", "%.2f", "%.2f"]
    print(f"| {ab['round']} | {ab['variant']} | " + " | ".join(f % v for f, v in zip(fmt, vals, strict=True))
          + f" | {ab['load_1min']} |" + ("" if d["intact"] else " NOT INTACT"))
for variant, vs in by.items():
    med = [statistics.median(col) for col in zip(*vs, strict=True)]
    print(f"| **median** | {variant} | " + " | ".join(f % v for f, v in zip(fmt, med, strict=True)) + " | |")
