"""The two-stage pipeline step bound (``pipeline_step_ideal_s``), checked by hand."""

from __future__ import annotations

import pytest

from wanxport.scenario import parse_scenario
from wanxport.scenario.ideal import pipeline_step_ideal_s


def one_path(extra: str = "") -> str:
    # 80 Mb/s = 10 MB/s each way, 10 ms one way
    return f'name = "t"\n[[paths]]\nname = "p"\nrtt_ms = 20.0\nbandwidth_mbps = 80.0\n{extra}'


def test_all_activations_then_the_last_gradient() -> None:
    s = parse_scenario(one_path())
    # 4 x 1 MB a->b: 0.01 + 0.4; then the last 1 MB gradient b->a: 0.01 + 0.1
    assert pipeline_step_ideal_s(s, 1_000_000, 4) == pytest.approx(0.52)


def test_a_slow_reverse_direction_bounds_the_step_on_its_own() -> None:
    s = parse_scenario(one_path("[paths.reverse]\nbandwidth_mbps = 8.0\n"))
    # b->a at 1 MB/s: the four gradients alone take 0.01 + 4.0
    assert pipeline_step_ideal_s(s, 1_000_000, 4) == pytest.approx(0.01 + 4.0)
    # one microbatch: its activation, then its gradient
    assert pipeline_step_ideal_s(s, 1_000_000, 1) == pytest.approx(0.01 + 0.1 + 0.01 + 1.0)
