"""ideal_time_s against hand-computed cases and an independent integral."""

import math
import random

import pytest

from wanxport.scenario import Scenario, ideal_time_s, parse_scenario

MB = 1_000_000


def scenario(paths: str, extra: str = "") -> Scenario:
    return parse_scenario(f'name = "t"\n{extra}\n{paths}', "t.toml")


def path(name: str, rtt_ms: float, mbps: float, rest: str = "") -> str:
    return f'[[paths]]\nname = "{name}"\nrtt_ms = {rtt_ms}\nbandwidth_mbps = {mbps}\n{rest}\n'


def test_one_path() -> None:
    # 80 Mb/s = 10 MB/s; 10 MB takes 1 s plus the 50 ms one-way delay.
    assert ideal_time_s(scenario(path("a", 100, 80)), 10 * MB) == pytest.approx(1.05)


def test_two_paths_with_different_delays() -> None:
    # a: 10 MB/s from 0.05 s; b: 20 MB/s from 0.15 s. By 0.15 a delivered 1 MB,
    # the remaining 9 MB at 30 MB/s take 0.3 s.
    s = scenario(path("a", 100, 80) + path("b", 300, 160))
    assert ideal_time_s(s, 10 * MB) == pytest.approx(0.45)
    # A transfer small enough to finish before b ever delivers uses a alone.
    assert ideal_time_s(s, MB // 2) == pytest.approx(0.1)


def test_down_interval() -> None:
    events = "[[paths.events]]\nat_s = 0.5\ndown = true\n[[paths.events]]\nat_s = 1.0\ndown = false"
    # 5 MB by 0.5 s (send-side time), nothing until 1.0, 5 MB more by 1.5; +0.05 delay.
    assert ideal_time_s(scenario(path("a", 100, 80, events)), 10 * MB) == pytest.approx(1.55)


def test_down_at_start() -> None:
    events = "[[paths.events]]\nat_s = 0\ndown = true\n[[paths.events]]\nat_s = 2\ndown = false"
    assert ideal_time_s(scenario(path("a", 0, 80, events)), 10 * MB) == pytest.approx(3.0)


def test_rate_change_event() -> None:
    events = "[[paths.events]]\nat_s = 0.5\nset = { bandwidth_mbps = 160.0 }"
    # 5 MB at 10 MB/s by 0.5, then 5 MB at 20 MB/s = 0.25 s; +0.05 delay.
    assert ideal_time_s(scenario(path("a", 100, 80, events)), 10 * MB) == pytest.approx(0.8)


def test_delay_is_taken_at_the_start_only() -> None:
    events = "[[paths.events]]\nat_s = 0.1\nset = { rtt_ms = 1000.0 }"
    assert ideal_time_s(scenario(path("a", 100, 80, events)), 10 * MB) == pytest.approx(1.05)


def test_burst_loss_counts_its_stationary_rate() -> None:
    # stationary loss = (0.01*1 + 0.09*0) / 0.1 = 0.1 -> 9 MB/s.
    rest = "burst_loss = { p = 0.01, r = 0.09 }"
    assert ideal_time_s(scenario(path("a", 100, 80, rest)), 9 * MB) == pytest.approx(1.05)
    rest = "burst_loss = { p = 0.01, r = 0.09, loss_bad = 0.5, loss_good = 0.1 }"
    # (0.01*0.5 + 0.09*0.1) / 0.1 = 0.14 -> 8.6 MB/s.
    assert ideal_time_s(scenario(path("a", 0, 80, rest)), round(8.6 * MB)) == pytest.approx(1.0)


def test_iid_loss_and_loss_event() -> None:
    events = "loss = 0.5\n[[paths.events]]\nat_s = 1.0\nset = { loss = 0.0 }"
    # 5 MB/s for 1 s, then 10 MB/s for the remaining 5 MB.
    assert ideal_time_s(scenario(path("a", 0, 80, events)), 10 * MB) == pytest.approx(1.5)


def test_both_directions_take_the_slower_with_reverse_overrides() -> None:
    s = scenario(
        path("a", 100, 80, "[paths.reverse]\nbandwidth_mbps = 40.0\nrtt_ms = 300.0"),
        '[transfer]\nsize = "10MB"\ndirection = "both"',
    )
    assert ideal_time_s(s, 10 * MB, "a->b") == pytest.approx(1.05)
    assert ideal_time_s(s, 10 * MB, "b->a") == pytest.approx(2.15)
    assert ideal_time_s(s) == pytest.approx(2.15)  # defaults come from [transfer]
    assert ideal_time_s(s, 10 * MB, "both") == pytest.approx(2.15)
    with pytest.raises(ValueError):
        ideal_time_s(s, 1, "up")


def test_never_delivered_is_infinite() -> None:
    down = "[[paths.events]]\nat_s = 0.5\ndown = true"
    assert ideal_time_s(scenario(path("a", 100, 80, down)), 10 * MB) == math.inf
    assert ideal_time_s(scenario(path("a", 100, 80, down)), 4 * MB) == pytest.approx(0.45)
    assert ideal_time_s(scenario(path("a", 100, 80, "loss = 1.0")), 1) == math.inf
    assert ideal_time_s(scenario(path("a", 100, 80)), 0) == 0.0


def _delivered_by(s: Scenario, t: float, direction: str) -> float:
    """Independent evaluation of the section-4 integral at time t (per-segment sums)."""
    total = 0.0
    for spec in s.paths:
        horizon = t - spec.params_at(0.0, direction).rtt_ms / 2000
        cuts = sorted({0.0, *spec.change_times(), max(horizon, 0.0)})
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            if hi > horizon:
                break
            p = spec.params_at(lo, direction)
            if not p.down:
                total += (hi - lo) * p.bandwidth_mbps * 125_000 * (1 - p.effective_loss)
    return total


def test_matches_independent_integral_on_random_timelines() -> None:
    rng = random.Random(1)
    for _ in range(40):
        text = ""
        for i in range(rng.randint(1, 5)):
            events = ""
            for _ in range(rng.randint(0, 4)):
                at = round(rng.uniform(0, 3), 3)
                if rng.random() < 0.4:
                    events += f"[[paths.events]]\nat_s = {at}\ndown = {str(rng.random() < 0.5).lower()}\n"
                else:
                    bw = rng.uniform(1, 100)
                    loss = rng.uniform(0, 0.3)
                    events += (
                        f"[[paths.events]]\nat_s = {at}\nset = {{ bandwidth_mbps = {bw}, loss = {loss} }}\n"
                    )
            text += path(f"p{i}", rng.uniform(0, 300), rng.uniform(1, 100), events)
        s = scenario(text)
        size = rng.randint(1, 50 * MB)
        t = ideal_time_s(s, size)
        if math.isinf(t):
            assert _delivered_by(s, 1e6, "a->b") < size
            continue
        assert _delivered_by(s, t, "a->b") == pytest.approx(size, rel=1e-9)
        assert _delivered_by(s, t * (1 - 1e-6) - 1e-9, "a->b") < size
