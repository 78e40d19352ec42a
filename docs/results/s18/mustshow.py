"""Issue 17's loopback must-show, one row per run: goodput against iperf3 and the raw blast,
each end's CPU-s/GB against (AEAD + digest) of the same run.
    python docs/results/s18/mustshow.py docs/results/s18/mustshow/run-*.json"""
import json
import sys

print("| run | Gb/s | ÷ iperf3 | ÷ raw blast (blast Gb/s) | sender CPU-s/GB (÷ limit) "
      "| receiver CPU-s/GB (÷ limit) | AEAD | digest | intact |")
print("|---|---|---|---|---|---|---|---|---|")
for name in sys.argv[1:]:
    d = json.load(open(name))
    cpu, ratio, lim = d["cpu_s_per_gb"], d["cpu_vs_limit"], d["limits"]
    print(f"| {name.rsplit('/', 1)[-1]} | {d['goodput_bps'] / 1e9:.2f} | {d['goodput_vs_baseline']:.2f} "
          f"| {d['goodput_vs_raw_udp']:.3f} ({lim['raw_udp']['goodput_bps'] / 1e9:.0f}) "
          f"| {cpu['sender']:.3f} ({ratio['sender']:.2f}) | {cpu['receiver']:.3f} ({ratio['receiver']:.2f}) "
          f"| {lim['aead']['cpu_s_per_gb']:.3f} | {lim['digest']['cpu_s_per_gb']:.3f} | {d['intact']} |")
