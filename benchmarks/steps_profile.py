"""Where a warm training step's time goes, beyond the ideal: headers, the bulk phase, the tail.

    .venv/bin/python benchmarks/steps_profile.py emulation/scenarios/lossy-long-2path.toml \
        --size 64MiB --steps 20 [--payload virtual]

Simulator, virtual time, so the figures do not depend on machine load. For each step after
the first it splits ``step_s`` at the moment the sender had handed out the last byte of the
step once (every later send is a retransmission or a hedge):

* ``bulk_s``: submission -> last first transmission handed out. Against
  ``header_bound_s`` (the ideal with every datagram's header bytes counted, i.e. the ideal
  x wire bytes / payload bytes) the difference is the rate the paths did not reach
  (start-up, pacing, congestion);
* ``tail_s``: -> last shard verified: one one-way delay at best, plus whatever loss
  recovery needs (a lost datagram near the end costs a round trip to detect and resend).

Prints one JSON object: the run's step figures and the medians of the split over steps 2..N.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from wanxport.cli import size_argument
from wanxport.scenario import load_scenario
from wanxport.sim.runner import SimOptions, SimRun


class ProfiledRun(SimRun):
    """A simulated run that notes when each step's first transmissions were all handed out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submitted_at: list[float] = []
        self.bulk_done_at: list[float | None] = []

    def _submit_step(self, side: str, step: int) -> None:
        if side == "a":
            self.submitted_at.append(self.loop.now)
            self.bulk_done_at.append(None)
        super()._submit_step(side, step)

    def _service(self, endpoint: Any) -> None:
        super()._service(endpoint)
        if endpoint is self.a and self.bulk_done_at and self.bulk_done_at[-1] is None:
            if self.a.session.outgoing.unsent_bytes == 0:
                self.bulk_done_at[-1] = self.loop.now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--size", type=size_argument, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--payload", choices=("bytes", "virtual"), default="virtual")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario).with_transfer(size_bytes=args.size, steps=args.steps)
    run = ProfiledRun(scenario, SimOptions(payload_mode=args.payload))
    report = run.run()
    config = run.a.session.config
    payload = min(config.datagram_payload(p) for p in config.paths)
    wire = min(p.mtu for p in config.paths)  # a full datagram is one MTU on the wire, IP and UDP included
    header_bound = report["ideal_s"] * wire / payload
    steps = report["step_s"]
    bulk = [d - s for s, d in zip(run.submitted_at, run.bulk_done_at, strict=True) if d is not None]
    tails = [steps[k] - bulk[k] for k in range(1, min(len(steps), len(bulk)))]
    print(json.dumps({
        "scenario": report["scenario"], "size_bytes": args.size, "steps": args.steps,
        "payload_mode": args.payload, "ideal_s": report["ideal_s"],
        "header_bound_s": round(header_bound, 6),
        "datagram_payload_bytes": payload, "datagram_wire_bytes": wire,
        "first_step_s": report["first_step_s"], "mean_step_s": report["mean_step_s"],
        "p90_step_s": report["p90_step_s"], "worst_step_s": report["worst_step_s"],
        "steady_step_s": report["steady_step_s"], "efficiency": report["efficiency"],
        "efficiency_basis": report["efficiency_basis"],
        "steady_bulk_s": round(statistics.median(bulk[1:]), 6),
        "steady_tail_s": round(statistics.median(tails), 6),
        "first_bulk_s": round(bulk[0], 6),
        "retransmitted_bytes": sum(p["retransmitted_bytes"] for p in report["paths"]),
        "payload_bytes": report["payload_bytes"],
    }))


if __name__ == "__main__":
    main()
