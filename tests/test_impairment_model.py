"""One impairment model: the simulator's link and the lab's engine decide a shared trace alike.

Both take a seeded trace of packets (offer time, size) and the random draws those
packets use (uniforms for loss and the Gilbert-Elliott chain, standard normals for
jitter), replayed in the order docs/notes/emulation.md "One impairment model" fixes.
Every packet must get the same fate from both: dropped for the same reason, or
delivered at the same time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from emulation._engine import Engine

from emulation.params import engine_params
from wanxport.scenario import BurstLoss, LinkParams
from wanxport.sim.network import EventLoop, PathDirection

Fate = tuple[str, float | None]  # ("ok", arrival time) or (drop reason, None)


@dataclass(frozen=True)
class Offer:
    at_s: float
    size: int


class ReplayedDraws:
    """The simulator's ``Draws`` read from a tape, counting what it hands out."""

    def __init__(self, uniforms: list[float], normals: list[float]) -> None:
        self.uniforms, self.normals = uniforms, normals
        self.used_uniforms = self.used_normals = 0

    def random(self) -> float:
        value = self.uniforms[self.used_uniforms]
        self.used_uniforms += 1
        return value

    def gauss(self, mu: float = 0.0, sigma: float = 1.0) -> float:
        value = self.normals[self.used_normals]
        self.used_normals += 1
        return mu + sigma * value

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        raise AssertionError("the shared model draws no integers")


def make_trace(seed: int, count: int, load: float, params: LinkParams) -> list[Offer]:
    """Poisson offers at ``load`` times the bottleneck, with bursts of back-to-back packets."""
    rng = random.Random(seed)
    bytes_per_s = params.bandwidth_mbps * 125_000.0
    offers, now = [], 0.0
    while len(offers) < count:
        size = rng.randint(64, 1500)
        burst = rng.randint(1, 12) if rng.random() < 0.1 else 1
        offers += [Offer(now, size)] * burst
        now += rng.expovariate(load * bytes_per_s / 800.0)
    return offers[:count]


def tape(seed: int, count: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed ^ 0x5EED)
    return [rng.random() for _ in range(3 * count)], [rng.gauss(0.0, 1.0) for _ in range(count)]


def run_simulator(
    offers: list[Offer], params: list[tuple[float, LinkParams]], draws: ReplayedDraws
) -> list[Fate]:
    loop = EventLoop()
    arrivals: dict[int, float] = {}
    link = PathDirection(params[0][1], draws, lambda packet, now: arrivals.setdefault(packet, now), loop)  # type: ignore[arg-type]
    fates: list[Fate] = []

    def offer(index: int, size: int) -> None:
        before = (link.dropped_down, link.dropped_loss, link.dropped_queue)
        link.send(index, size)
        after = (link.dropped_down, link.dropped_loss, link.dropped_queue)
        reasons = [name for name, a, b in zip(("down", "loss", "queue"), before, after, strict=True) if b > a]
        fates.append((reasons[0], None) if reasons else ("ok", None))

    for at_s, changed in params[1:]:
        loop.call_at(at_s, link.set_params, changed)
    for index, packet in enumerate(offers):
        loop.call_at(packet.at_s, offer, index, packet.size)
    loop.run()
    return [(reason, arrivals[i] if reason == "ok" else None) for i, (reason, _) in enumerate(fates)]


def run_engine(
    offers: list[Offer], params: list[tuple[float, LinkParams]], uniforms: list[float], normals: list[float]
) -> list[Fate]:
    engine = Engine(seed=0, header_bytes=0)
    engine.add_direction(1000, 1001, **engine_params(params[0][1]))  # fds never used in virtual time
    engine.replay_draws(0, uniforms, normals)
    changes = list(params[1:])
    fates: list[Fate] = []
    for packet in offers:
        while changes and changes[0][0] <= packet.at_s:
            engine.set_params(0, **engine_params(changes.pop(0)[1]))
        release, reason = engine.admit(0, packet.at_s, packet.size)
        fates.append((reason, release))
    return fates


BASE = LinkParams(rtt_ms=40.0, bandwidth_mbps=20.0, queue_ms=5.0)
CASES = {
    "iid-loss-jitter": [(0.0, replace(BASE, loss=0.03, jitter_ms=4.0))],
    "burst-loss-reorder": [
        (0.0, replace(BASE, burst_loss=BurstLoss(p=0.02, r=0.2, loss_bad=0.9, loss_good=0.01),
                      jitter_ms=6.0, reorder=True)),
    ],
    "queue-only": [(0.0, replace(BASE, queue_ms=2.0))],
    "changes-midway": [
        (0.0, replace(BASE, loss=0.01)),
        (0.2, replace(BASE, loss=0.08, jitter_ms=3.0, rtt_ms=60.0)),
        (0.4, replace(BASE, burst_loss=BurstLoss(p=0.05, r=0.3))),
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2])
def test_simulator_and_engine_decide_every_packet_alike(case: str, seed: int) -> None:
    params = CASES[case]
    offers = make_trace(seed, 4000, load=1.3, params=params[0][1])
    uniforms, normals = tape(seed, len(offers))
    draws = ReplayedDraws(uniforms, normals)
    simulated = run_simulator(offers, params, draws)
    # The engine gets exactly the draws the simulator used: it raises if it needs one more.
    emulated = run_engine(offers, params, uniforms[: draws.used_uniforms], normals[: draws.used_normals])

    reasons = {reason for reason, _ in simulated}
    assert "ok" in reasons and len(reasons) > 1  # the trace exercises drops, not only deliveries
    assert [r for r, _ in emulated] == [r for r, _ in simulated]
    delivered = [i for i, (reason, _) in enumerate(simulated) if reason == "ok"]
    assert [emulated[i][1] for i in delivered] == pytest.approx(
        [simulated[i][1] for i in delivered], rel=1e-12, abs=1e-12
    )


def test_engine_reports_a_tape_too_short_for_its_draws() -> None:
    engine = Engine(seed=0, header_bytes=0)
    engine.add_direction(1000, 1001, **engine_params(replace(BASE, loss=0.5)))
    engine.replay_draws(0, [0.9], [])
    assert engine.admit(0, 0.0, 100)[1] == "ok"
    with pytest.raises(ValueError, match="ran out"):
        engine.admit(0, 0.001, 100)


def test_replay_refuses_a_tape_of_non_numbers() -> None:
    engine = Engine(seed=0, header_bytes=0)
    engine.add_direction(1000, 1001, **engine_params(BASE))
    with pytest.raises(TypeError):
        engine.replay_draws(0, ["x"], [])
