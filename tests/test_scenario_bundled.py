"""Every bundled scenario parses and is sized for a 5-20 s ideal transfer."""

import math
from pathlib import Path

import pytest

from emulation import bundled
from wanxport.scenario import ScenarioError, ideal_time_s, load_scenario

SCENARIOS = sorted(bundled.DIRECTORY.glob("*.toml"))


def test_the_expected_scenarios_are_bundled() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {
        "clean-2path",
        "hetero-8path",
        "lossy-long-2path",
        "failover-4path",
        "ack-loss-jitter",
        "wide-256path",
        "east-west-us",
        "near-far-6path",
    } <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_bundled_scenario_parses_and_is_sized(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem and scenario.description
    ideal = ideal_time_s(scenario)
    assert not math.isinf(ideal) and 5.0 <= ideal <= 20.0


def test_wide_scenario_shape() -> None:
    wide = load_scenario(SCENARIOS[[p.stem for p in SCENARIOS].index("wide-256path")])
    assert len(wide.paths) == 256 and wide.transfer.size_bytes == 2 << 40
    rtts = [p.forward.rtt_ms for p in wide.paths]
    assert min(rtts) == 20.0 and max(rtts) == 150.0
    assert {p.forward.bandwidth_mbps for p in wide.paths} == {10_000.0}


def test_a_bundled_name_resolves_to_its_file_and_a_path_wins_over_a_name(tmp_path: Path) -> None:
    assert bundled.resolve_scenario("clean-2path").source == str(bundled.DIRECTORY / "clean-2path.toml")
    own = tmp_path / "clean-2path"
    own.write_text('name = "mine"\n[[paths]]\nname = "p"\nrtt_ms = 1\nbandwidth_mbps = 1\n')
    assert bundled.resolve_scenario(str(own)).name == "mine"
    assert "hetero-8path" in bundled.names()


def test_an_unknown_name_is_one_line_listing_the_bundled_names() -> None:
    with pytest.raises(ScenarioError) as info:
        bundled.resolve_scenario("no-such-scenario")
    message = str(info.value)
    assert "\n" not in message and message.startswith("no-such-scenario: no such file")
    assert "clean-2path" in message and "wide-256path" in message
