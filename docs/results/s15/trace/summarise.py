"""Summarise an h1 loss trace (docs/results/s15.md): ProbeBW ACK samples that look sender-limited
(in flight under 0.6 x the window, the sample under 0.8 x the pacing rate, not app-limited), and PTOs.
    python3 docs/results/s15/trace/summarise.py docs/results/s15/trace/h1-trace-4.txt.gz"""
import gzip
import sys

for name in sys.argv[1:]:
    samples = limited = ptos = 0
    for line in gzip.open(name, "rt"):
        if line.startswith("P 0 "):
            ptos += 1
        if not line.startswith("A 0 "):
            continue
        kv = dict(x.split("=") for x in line.split()[3:])
        if kv["st"] != "probe_bw" or kv["al"] == "None":
            continue
        samples += 1
        if int(kv["infl"]) < 0.6 * int(kv["cwnd"]) and float(kv["smp"]) < 0.8 * float(kv["pace"]) \
                and kv["al"] == "False":
            limited += 1
    print(f"{name}: {samples} ProbeBW samples, {limited} ({limited / samples:.2f}) sender-limited-looking, {ptos} PTOs")
