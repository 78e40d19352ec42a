"""Example experiment with Mininet's Python API over a scenario's emulated WAN.

    sudo python3 emulation/mininet/example_experiment.py SCENARIO.toml [--backend engine|netem]

Builds the scenario topology (``wan.py``), starts the events timeline, measures
the RTT of every path with ping from its first site's gateway host to its
second's, optionally runs an iperf3 TCP transfer over path 1, and prints one
JSON object. Use it as the
skeleton of your own experiment: replace the measurement with your transport.
Runs under the system python3 (Mininet's); it always cleans Mininet up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mininet.log import setLogLevel  # noqa: E402
from mininet.net import Mininet  # noqa: E402
from wan import WanTopo, host_name, start_events  # noqa: E402

from emulation.naming import plan  # noqa: E402
from wanxport.scenario import load_scenario  # noqa: E402


def ping_stats(host, addr: str, count: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    host.cmd("ping -c 1 -W 5", addr)  # warm-up: ARP crosses the emulated path too
    out = host.cmd(f"ping -c {count} -i 0.02 -q {addr}")
    match = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", out)
    if match is None:
        raise RuntimeError(f"ping {addr} failed: {out.strip()}")
    lo, avg, hi, mdev = (float(x) for x in match.groups())
    received = int(re.search(r"(\d+) received", out).group(1))  # type: ignore[union-attr]
    return {"min_ms": lo, "avg_ms": avg, "max_ms": hi, "mdev_ms": mdev, "received": received}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--backend", choices=("engine", "netem"), default="")
    parser.add_argument("--count", type=int, default=20, help="pings per path")
    parser.add_argument("--iperf-seconds", type=float, default=0.0,
                        help="also run iperf3 TCP over path 1 for this long")
    args = parser.parse_args()
    setLogLevel("warning")
    scenario = load_scenario(args.scenario)
    layout = plan(scenario)
    net = Mininet(topo=WanTopo(scenario=args.scenario, backend=args.backend),
                  controller=None, autoSetMacs=True)
    result: dict[str, object] = {"scenario": scenario.name, "paths": []}
    try:
        net.start()
        start_events(net)
        for spec, p in zip(scenario.paths, layout.paths, strict=True):
            stats = ping_stats(net.get(host_name(scenario, spec.between[0])), p.b_addr, args.count)
            result["paths"].append(  # type: ignore[attr-defined]
                {"name": spec.name, "configured_rtt_ms": spec.forward.rtt_ms, **stats})
        if args.iperf_seconds > 0:
            a, b = (net.get(host_name(scenario, site)) for site in scenario.paths[0].between)
            server = b.popen(["iperf3", "-s", "-1", "-B", layout.paths[0].b_addr])
            out = a.cmd(f"iperf3 -c {layout.paths[0].b_addr} -t {args.iperf_seconds:g} --json")
            server.wait()
            result["iperf3_tcp_bps"] = json.loads(out)["end"]["sum_received"]["bits_per_second"]
    finally:
        net.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
