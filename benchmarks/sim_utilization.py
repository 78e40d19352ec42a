"""Where a simulated transfer leaves its paths under-used: payload deficit over time.

    .venv/bin/python benchmarks/sim_utilization.py emulation/scenarios/failover-4path.toml [--step 0.1]

Runs ``wanxport sim`` on the scenario (a -> b) and, every ``--step`` seconds,
compares the payload the receiver placed (new bytes only) with what the paths
that are up could have carried: each path's bandwidth x (1 - loss), shifted by
its one-way delay, x the share of a full datagram that is payload (the rest is
IP/UDP, header, tag and DATA frame). The running sum of the difference is the
*deficit*; divided by the final aggregate rate, it is the completion time the
transfer loses against a transport that kept every path full from t = 0.

The receiver's new bytes are counted by wrapping ``IncomingShard.place``, the
one place a receiver learns them; nothing else in the run changes.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wanxport.core import shards  # noqa: E402
from wanxport.core.config import PathConfig, datagram_payload  # noqa: E402
from wanxport.scenario import Scenario, load_scenario  # noqa: E402
from wanxport.sim.runner import SimOptions, simulate  # noqa: E402


def payload_share(scenario: Scenario, path_index: int) -> float:
    """Payload bytes per IP byte of a full DATA datagram on this path (links count IP bytes)."""
    mtu = scenario.paths[path_index].forward.mtu
    return datagram_payload(PathConfig("p", mtu), tag_bytes=16) / mtu


def capacity_Bps(scenario: Scenario, t_s: float) -> float:
    """Payload bytes per second the paths can deliver at the receiver at ``t_s``."""
    total = 0.0
    for i, spec in enumerate(scenario.paths):
        sent_at = t_s - spec.params_at(0.0).rtt_ms / 2000.0
        if sent_at < 0:
            continue
        params = spec.params_at(sent_at)
        if not params.down:
            rate = params.bandwidth_mbps * 1e6 / 8 * (1 - params.effective_loss)
            total += rate * payload_share(scenario, i)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="scenario TOML file")
    parser.add_argument("--step", type=float, default=0.1, help="interval in seconds (default 0.1)")
    args = parser.parse_args()
    if not args.step > 0:
        parser.error("--step must be > 0")
    scenario = load_scenario(args.scenario)
    if scenario.transfer.direction != "a->b":
        parser.error("only a->b transfers: the deficit of one direction")

    placed: collections.Counter[int] = collections.Counter()
    original = shards.IncomingShard.place

    def counting(self: shards.IncomingShard, offset: int, data: object, length: int, now: float) -> int:
        new = original(self, offset, data, length, now)  # type: ignore[arg-type]
        placed[int(now / args.step)] += new
        return new

    shards.IncomingShard.place = counting  # type: ignore[method-assign]
    report = simulate(scenario, SimOptions())
    shards.IncomingShard.place = original  # type: ignore[method-assign]

    deficit = 0.0
    print(f"{'t (s)':>6} {'placed Mb/s':>12} {'could Mb/s':>11} {'deficit MB':>11}")
    completion = report["completion_s"]
    for k in range(int(completion / args.step) + 1):
        t = k * args.step
        span = min(args.step, completion - t)  # the last interval ends at completion
        if span <= 0:
            break
        could = capacity_Bps(scenario, t + span / 2) * span
        deficit += could - placed[k]
        print(f"{t:6.1f} {placed[k] * 8 / span / 1e6:12.0f} {could * 8 / span / 1e6:11.0f} "
              f"{deficit / 1e6:11.2f}")
    final_rate = capacity_Bps(scenario, completion)
    print(f"completion {completion:.3f} s, ideal {report['ideal_s']:.3f} s; deficit "
          f"{deficit / 1e6:.2f} MB = {deficit / final_rate:.3f} s at the final rate" if final_rate else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
