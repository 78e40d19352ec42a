"""Scenario parser: contract v1 (docs/design.md section 4) and its one-line errors."""

from pathlib import Path

import pytest

from wanxport.scenario import (
    BurstLoss,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

FULL = """
name = "us-east-west-4"
description = "free text"
seed = 7

[transfer]
size = "1GiB"
shards = 16
direction = "both"

[[paths]]
name = "p1"
rtt_ms = 62.0
bandwidth_mbps = 100
jitter_ms = 1.5
reorder = true
queue_ms = 20.0
mtu = 9000
  [paths.burst_loss]
  p = 0.01
  r = 0.30
  [paths.reverse]
  loss = 0.01
  bandwidth_mbps = 10.0
  [[paths.events]]
  at_s = 5.0
  down = true
  [[paths.events]]
  at_s = 3.0
  set = { bandwidth_mbps = 50.0, burst_loss = { p = 0.1, r = 0.1 } }
  [[paths.events]]
  at_s = 7.0
  down = false

[[paths]]
name = "p2"
rtt_ms = 10
bandwidth_mbps = 1000.0
"""

MINIMAL_PATH = '[[paths]]\nname = "a"\nrtt_ms = 10\nbandwidth_mbps = 100\n'


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.toml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("s.toml: ")
    return message


def test_full_example_parses() -> None:
    s = parse_scenario(FULL, "full.toml")
    assert (s.name, s.description, s.seed, s.source) == (
        "us-east-west-4",
        "free text",
        7,
        "full.toml",
    )
    assert (s.transfer.size_bytes, s.transfer.shards, s.transfer.direction) == (1 << 30, 16, "both")
    p1, p2 = s.paths
    assert p1.forward.bandwidth_mbps == 100.0 and isinstance(p1.forward.bandwidth_mbps, float)
    assert p1.forward.burst_loss == BurstLoss(p=0.01, r=0.30)
    assert p1.forward.mtu == 9000 and p1.forward.reorder and p1.forward.jitter_ms == 1.5
    # reverse = forward with overrides; a plain `loss` override replaces burst loss.
    assert p1.reverse.loss == 0.01 and p1.reverse.burst_loss is None
    assert p1.reverse.bandwidth_mbps == 10.0 and p1.reverse.rtt_ms == 62.0
    assert [e.at_s for e in p1.events] == [3.0, 5.0, 7.0]
    assert p2.forward.loss == 0.0 and p2.forward.queue_ms == 50.0 and p2.events == ()
    assert s.path("p2") is p2


def test_params_at_applies_events_in_order_both_directions() -> None:
    p1 = parse_scenario(FULL).paths[0]
    assert p1.params_at(2.999) == p1.forward
    at3 = p1.params_at(3.0)
    assert at3.bandwidth_mbps == 50.0 and at3.burst_loss == BurstLoss(p=0.1, r=0.1)
    rev3 = p1.params_at(3.0, "b->a")
    assert rev3.bandwidth_mbps == 50.0 and rev3.effective_loss == pytest.approx(0.5)
    assert p1.params_at(5.0).down and p1.params_at(6.0, "b->a").down
    assert not p1.params_at(7.0).down and p1.params_at(100.0).bandwidth_mbps == 50.0
    assert p1.change_times() == (3.0, 5.0, 7.0)
    with pytest.raises(ValueError):
        p1.params_at(0.0, "sideways")


def test_defaults_and_with_transfer() -> None:
    s = parse_scenario('name = "x"\n' + MINIMAL_PATH)
    assert s.seed == 0 and s.transfer.direction == "a->b" and s.transfer.shards == 1
    t = s.with_transfer(size_bytes=4096, shards=4)
    assert (t.transfer.size_bytes, t.transfer.shards, t.paths) == (4096, 4, s.paths)
    with pytest.raises(ValueError):
        s.with_transfer(shards=0)
    with pytest.raises(ValueError):
        s.with_transfer(direction="b->a")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'name = "x"\n' + MINIMAL_PATH + "[paths.burst_loss]\np = 0.1\nr = 0.2\nq = 1\n",
            "s.toml: paths[0].burst_loss.q: unknown key; valid keys here: p, r, loss_bad, loss_good",
        ),
        ('name = "x"\ncolour = 1\n' + MINIMAL_PATH, "s.toml: colour: unknown key;"),
        ('name = "x"\n' + MINIMAL_PATH + "speed = 1\n", "s.toml: paths[0].speed: unknown key;"),
        (
            'name = "x"\n' + MINIMAL_PATH + "[paths.reverse]\nname = 'b'\n",
            "s.toml: paths[0].reverse.name: unknown key;",
        ),
        (
            'name = "x"\n' + MINIMAL_PATH + "[[paths.events]]\nat_s = 1\nset = {lost = 1}\n",
            "s.toml: paths[0].events[0].set.lost: unknown key;",
        ),
        ('name = "x"\n[transfer]\nsized = 1\n' + MINIMAL_PATH, "s.toml: transfer.sized: unknown"),
        (MINIMAL_PATH, "s.toml: name: missing required field;"),
        ('name = "x"\n', "s.toml: paths: missing required field; at least one [[paths]]"),
        ('name = "x"\npaths = []\n', "s.toml: paths: expected an array of tables"),
        (
            'name = "x"\n[[paths]]\nname = "a"\nrtt_ms = 10\n',
            "s.toml: paths[0].bandwidth_mbps: missing required field; a number > 0",
        ),
        ('name = "x"\n[[paths]]\nrtt_ms = 1\n', "s.toml: paths[0].name: missing required"),
        (
            'name = "x"\n' + MINIMAL_PATH + MINIMAL_PATH,
            "s.toml: paths[1].name: duplicate path name 'a' (also paths[0])",
        ),
        ('name = "x"\n' + MINIMAL_PATH + "rtt_ms = 3\n", "TOML syntax error: Cannot overwrite"),
        ("name = " + "[" * 1000 + "]" * 1000 + "\n", "TOML syntax error: arrays or tables nested too deeply"),
        ("name = 3\n" + MINIMAL_PATH, "s.toml: name: expected a string, got 3 (integer)"),
        ('name = " "\n' + MINIMAL_PATH, "s.toml: name: empty name"),
        ('name = "x"\nseed = -1\n' + MINIMAL_PATH, "s.toml: seed: out of range: -1"),
        ('name = "x"\nseed = 1.5\n' + MINIMAL_PATH, "s.toml: seed: expected an integer"),
    ],
)
def test_structural_errors(text: str, expected: str) -> None:
    assert expected in error_of(text)


@pytest.mark.parametrize(
    ("line", "field", "valid"),
    [
        ("rtt_ms = -1", "rtt_ms", ">= 0"),
        ("bandwidth_mbps = 0", "bandwidth_mbps", "> 0"),
        ("bandwidth_mbps = inf", "bandwidth_mbps", "> 0"),
        ("bandwidth_mbps = nan", "bandwidth_mbps", "> 0"),
        ("loss = 1.5", "loss", "[0, 1]"),
        ("loss = -0.1", "loss", "[0, 1]"),
        ("loss = true", "loss", "expected a number"),
        ("jitter_ms = -2", "jitter_ms", ">= 0"),
        ("queue_ms = 0", "queue_ms", "> 0"),
        ("mtu = 67", "mtu", "[68, 65535]"),
        ("mtu = 65536", "mtu", "[68, 65535]"),
        ("mtu = 1500.0", "mtu", "expected an integer"),
        ("reorder = 1", "reorder", "true or false"),
        ("burst_loss = { p = 0, r = 0 }", "burst_loss.p", "not both 0"),
        ("burst_loss = { p = 2, r = 0 }", "burst_loss.p", "[0, 1]"),
        ("burst_loss = { p = 0.1 }", "burst_loss.r", "missing required field"),
        ("burst_loss = { p = 0.1, r = 0.1, loss_bad = 3 }", "burst_loss.loss_bad", "[0, 1]"),
        ("burst_loss = { p = 0.1, r = 0.1, loss_good = -1 }", "burst_loss.loss_good", "[0, 1]"),
        ("burst_loss = { p = 0.1, r = 0.1 }\nloss = 0.1", "burst_loss", "give one of them"),
        ("burst_loss = 3", "burst_loss", "expected a table"),
        ("name = 'a b'", "name", "invalid name"),
    ],
)
def test_link_field_errors_everywhere(line: str, field: str, valid: str) -> None:
    """Every link field is validated the same on a path, in reverse, and in an event's set."""
    key, _, value = line.partition(" = ")
    base = '[[paths]]\nname = "a"\nrtt_ms = 10\nbandwidth_mbps = 100\n'
    as_path = 'name = "x"\n' + base.replace(f"{key} = ", "#") + line + "\n"
    assert f"s.toml: paths[0].{field}: " in error_of(as_path)
    assert valid in error_of(as_path)
    if key == "name":
        return
    as_reverse = 'name = "x"\n' + base + "[paths.reverse]\n" + line + "\n"
    assert f"s.toml: paths[0].reverse.{field}: " in error_of(as_reverse)
    if "\n" not in line:
        as_event = 'name = "x"\n' + base + f"[[paths.events]]\nat_s = 1\nset = {{ {line} }}\n"
        assert f"s.toml: paths[0].events[0].set.{field}: " in error_of(as_event)
        assert valid in error_of(as_event)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ("at_s = -1\ndown = true", "paths[0].events[0].at_s: out of range"),
        ("down = true", "paths[0].events[0].at_s: missing required field"),
        ("at_s = 1", "paths[0].events[0]: an event needs exactly one of set or down"),
        ("at_s = 1\ndown = true\nset = {loss = 0.1}", "exactly one of set or down"),
        ("at_s = 1\ndown = 'yes'", "paths[0].events[0].down: expected a boolean"),
        ("at_s = 1\nset = {}", "paths[0].events[0].set: empty set"),
        ("at_s = 1\nset = {down = true}", "paths[0].events[0].set.down: down is not a link field"),
        ("at_s = 1\nset = 3", "paths[0].events[0].set: expected a table"),
    ],
)
def test_event_errors(event: str, expected: str) -> None:
    assert expected in error_of('name = "x"\n' + MINIMAL_PATH + "[[paths.events]]\n" + event + "\n")


@pytest.mark.parametrize(
    ("transfer", "expected"),
    [
        ('size = "1gb"', "transfer.size: unknown size unit 'gb'"),
        ("size = 0", "transfer.size: out of range"),
        ("size = 1.5", "transfer.size: expected a string or integer"),
        ("shards = 0", "transfer.shards: out of range: 0; an integer in [1,"),
        ("size = 4\nshards = 5", "transfer.shards: 5 shards for 4 bytes"),
        ('direction = "b->a"', 'transfer.direction: unknown direction \'b->a\'; "a->b" or "both"'),
        ("steps = 0", "transfer.steps: out of range: 0; an integer in [1,"),
        ("steps = 2.5", "transfer.steps: expected an integer"),
        ("steps = true", "transfer.steps: expected an integer"),
        ("think_ms = -1", "transfer.think_ms: out of range: -1; a number in [0,"),
        ('think_ms = "5"', "transfer.think_ms: expected a number"),
        ("shards = 2147483647\nsize = \"4GiB\"\nsteps = 3", "transfer.steps: 3 steps of 2147483647 shards"),
    ],
)
def test_transfer_errors(transfer: str, expected: str) -> None:
    assert expected in error_of('name = "x"\n[transfer]\n' + transfer + "\n" + MINIMAL_PATH)


def test_steps_and_think_time_parse_and_default() -> None:
    s = parse_scenario('name = "x"\n[transfer]\nsteps = 20\nthink_ms = 150\n' + MINIMAL_PATH)
    assert (s.transfer.steps, s.transfer.think_ms) == (20, 150.0)
    plain = parse_scenario('name = "x"\n' + MINIMAL_PATH)
    assert (plain.transfer.steps, plain.transfer.think_ms) == (1, 0.0)
    t = plain.with_transfer(steps=5, think_ms=2.5)
    assert (t.transfer.steps, t.transfer.think_ms) == (5, 2.5)
    assert t.transfer.size_bytes == plain.transfer.size_bytes
    for bad in ({"steps": 0}, {"think_ms": -0.1}, {"think_ms": float("nan")}):
        with pytest.raises(ValueError, match="transfer (steps|think_ms)"):
            plain.with_transfer(**bad)  # type: ignore[arg-type]


def test_steps_with_an_events_timeline_is_refused() -> None:
    timeline = MINIMAL_PATH + "[[paths.events]]\nat_s = 1.0\ndown = true\n"
    message = error_of('name = "x"\n[transfer]\nsteps = 2\n' + timeline)
    assert "transfer.steps: steps = 2 with an events timeline is not supported in contract v1" in message
    one_step = parse_scenario('name = "x"\n[transfer]\nsteps = 1\n' + timeline)
    with pytest.raises(ValueError, match="events timeline"):
        one_step.with_transfer(steps=3)
    assert one_step.with_transfer(steps=1).transfer.steps == 1


def test_toml_syntax_error_names_line_and_column() -> None:
    message = error_of('name = "x"\n\n[[paths]\n')
    assert "TOML syntax error" in message and "line 3" in message and "column" in message


def test_load_scenario_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ScenarioError, match=r"nope\.toml: cannot read: No such file"):
        load_scenario(missing)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b'name = "\xff"\n')
    with pytest.raises(ScenarioError, match=r"bin\.toml: not UTF-8 at byte 8"):
        load_scenario(binary)
    good = tmp_path / "good.toml"
    good.write_text('name = "x"\n' + MINIMAL_PATH)
    assert load_scenario(good).source == str(good)
