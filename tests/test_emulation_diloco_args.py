"""``python -m emulation diloco``'s command line, fault checks, path events and report, without root."""

from __future__ import annotations

import pytest

from emulation.bundled import resolve_scenario
from emulation.cli import _parser, main
from emulation.diloco import DilocoOptions, check_options
from emulation.diloco_report import RunLog, build_diloco_report, outer_steps
from emulation.faults import Fault, check_faults, cut_paths, with_fault_events

SCENARIO = resolve_scenario("mesh-3site-relay")  # sites east, west, central
SITES = ["east", "west", "central"]


def parse(*argv: str) -> list[Fault]:
    args = _parser().parse_args(["diloco", "mesh-3site-relay", "--sites", "3", *argv])
    _, faults = check_options(SCENARIO, args.sites, args.outer_steps, args.inner_steps, args.hidden,
                              args.faults)
    return faults


def test_each_time_belongs_to_the_fault_before_it() -> None:
    faults = parse("--blackhole", "central", "--at", "40", "--for", "5",
                   "--kill", "west", "--at", "10", "--rejoin-after", "8")
    assert [(f.kind, f.target, f.at_s, f.for_s, f.rejoin_after_s) for f in faults] == [
        ("kill", "west", 10.0, None, 8.0), ("blackhole", "central", 40.0, 5.0, None)]


def test_a_partition_names_its_groups_and_its_majority() -> None:
    (fault,) = parse("--partition", "east,west|central", "--at", "3", "--for", "4")
    assert fault.groups == (("east", "west"), ("central",))
    assert fault.cut_off() == ("central",)


@pytest.mark.parametrize(("argv", "message"), [
    (["--kill", "north", "--at", "5"],
     "--kill north: unknown site 'north'; the run's sites are east, west, central"),
    (["--kill", "west"], "--kill west: needs --at T"),
    (["--kill", "west", "--at", "5", "--for", "2"], "a kill has no --for"),
    (["--blackhole", "west", "--at", "5"], "--blackhole west: needs --for D > 0"),
    (["--blackhole", "west", "--at", "5", "--for", "2", "--rejoin-after", "3"],
     "--rejoin-after belongs to --kill"),
    (["--partition", "east|west", "--at", "1", "--for", "2"],
     "every site must be in a group; missing central"),
    (["--partition", "east,west|west,central", "--at", "1", "--for", "2"],
     "site(s) west in more than one group"),
    (["--partition", "east,west,central", "--at", "1", "--for", "2"],
     "expected groups of site names like A,B|C"),
    (["--kill", "west", "--at", "10", "--blackhole", "east", "--at", "12", "--for", "3"],
     "--blackhole east at 12 s overlaps --kill west at 10 s (for good): one fault at a time"),
    (["--kill", "west", "--at", "10", "--rejoin-after", "5", "--partition", "east|west,central",
      "--at", "14", "--for", "3"], "overlaps --kill west at 10 s (until 15 s)"),
])
def test_bad_faults_get_one_line_naming_the_option(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match="^[^\n]*$") as caught:
        parse(*argv)
    assert message in str(caught.value)


def test_a_partition_without_a_majority_is_refused() -> None:
    four = ["a", "b", "c", "d"]
    raw = [{"kind": "partition", "target": "a,b|c,d", "at_s": 1.0, "for_s": 2.0}]
    with pytest.raises(ValueError, match="no group holds a majority of the 4 sites"):
        check_faults(raw, four)


def test_faults_need_three_sites_and_sites_must_fit_the_scenario() -> None:
    with pytest.raises(ValueError, match="faults need at least 3 sites"):
        check_faults([{"kind": "kill", "target": "east", "at_s": 1.0}], ["east", "west"])
    with pytest.raises(ValueError, match=r"--sites: 4 is not valid for mesh-3site-relay .*use 2\.\.3"):
        check_options(SCENARIO, 4, 10, 20, 2048, [])
    with pytest.raises(ValueError, match="--inner-steps: 0 is not valid"):
        check_options(SCENARIO, 3, 10, 0, 2048, [])


def test_a_time_before_any_fault_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["diloco", "mesh-3site-relay", "--sites", "3", "--at", "4"])
    assert caught.value.code == 2
    assert "--at must follow --kill, --blackhole or --partition" in capsys.readouterr().err


def test_the_cli_says_one_line_for_a_bad_fault(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diloco", "mesh-3site-relay", "--sites", "3", "--kill", "mars", "--at", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --kill mars: unknown site 'mars'; the run's sites are east, west, central"


def test_blackhole_and_partition_become_down_events_on_the_cut_paths() -> None:
    blackhole, partition = parse("--blackhole", "central", "--at", "2", "--for", "3",
                                 "--partition", "east,central|west", "--at", "10", "--for", "1")
    names = [p.name for p in SCENARIO.paths]
    assert [names[k] for k in cut_paths(SCENARIO, blackhole)] == ["east-central", "central-west"]
    assert [names[k] for k in cut_paths(SCENARIO, partition)] == ["east-west", "central-west"]
    faulted = with_fault_events(SCENARIO, [blackhole, partition])
    by_name = {p.name: p for p in faulted.paths}
    central_west = by_name["central-west"]
    assert [(e.at_s, e.down) for e in central_west.events] == [(2.0, True), (5.0, False), (10.0, True),
                                                               (11.0, False)]
    assert central_west.params_at(3.0).down and not central_west.params_at(6.0).down
    assert [(e.at_s, e.down) for e in by_name["east-west"].events] == [(10.0, True), (11.0, False)]


def _log_with_a_kill() -> RunLog:
    """east, west, central train from go = 100; west is killed at 103 and back as west#2 at 106."""
    log = RunLog(SITES)
    for site in SITES:
        log.started(site, site, 90.0)
        log.line(site, {"event": "ready", "params": 1000, "state_bytes": 20_000}, 95.0)
    log.go(100.0, [Fault("kill", "west", 3.0, rejoin_after_s=6.0, groups=(("west",),))])
    for site, ends in (("east", [101.0, 102.0, 105.5, 108.0]), ("central", [101.2, 102.1, 105.0, 108.2]),
                       ("west", [101.1, 102.2])):
        for step, t1 in enumerate(ends, start=1):
            members = [0, 2] if step == 3 else [0, 1, 2]
            row = {"event": "outer", "step": step, "t_sync": t1 - 0.5, "t1": t1, "members": members}
            log.line(site, row, t1)
    for label, epoch, members, t in (("east", 0, SITES, 100.5), ("central", 1, ["east", "central"], 104.2),
                                     ("east", 1, ["east", "central"], 104.0), ("east", 2, SITES, 107.0)):
        log.line(label, {"event": "membership", "t": t, "epoch": epoch, "members": members}, t)
    log.killed("west", 103.0)
    log.ended("west", 103.0, -9, "")
    log.started("west#2", "west", 106.0)
    log.line("west#2", {"event": "ready", "t": 106.8}, 106.8)
    log.line("west#2", {"event": "membership", "t": 107.1, "epoch": 2, "members": SITES}, 107.1)
    log.line("west#2", {"event": "outer", "step": 4, "t_sync": 107.6, "t1": 108.1}, 108.1)
    for label, loss in (("east", 0.5), ("central", 0.5), ("west#2", 0.5)):
        done = {"event": "done", "t": 108.5, "final_loss": loss, "digest": "d", "error": None}
        log.line(label, done, 108.5)
    return log


def test_the_report_times_recovery_and_rejoin_from_the_log() -> None:
    log = _log_with_a_kill()
    steps = outer_steps(log)
    assert [(s["step"], s["duration_s"], s["sites"]) for s in steps] == [
        (1, 1.2, SITES), (2, 1.0, SITES), (3, 3.3, ["east", "central"]), (4, 2.7, SITES)]
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit="abc", host={"name": "h"}, wall_s=20.0)
    assert report["recovery_s"] == 2.5  # step 3 at the last survivor (105.5) - the kill (103.0)
    assert report["rejoin_s"] == 2.1  # west#2's first step (108.1) - its start (106.0)
    (fault,) = report["faults"]
    assert fault["recovery_sync_s"] == 0.5  # step 3's all-reduce began at 105.0 at the last survivor
    assert fault["rejoin_phases_s"] == {"to_joined": 0.8, "to_state": 0.3, "first_step": 1.0}
    assert report["intact"] and report["identical_across_sites"]
    assert report["final_loss"] == 0.5 and report["state_bytes"] == 20_000
    assert report["workload"] == "diloco" and report["commit"] == "abc"
    assert report["membership_changes"] == [
        {"epoch": 1, "members": ["east", "central"], "first_seen_s": 4.0, "seen_by": ["east", "central"]},
        {"epoch": 2, "members": SITES, "first_seen_s": 7.0, "seen_by": ["east", "west#2"]}]


def test_a_site_that_should_have_finished_and_did_not_fails_the_report() -> None:
    log = _log_with_a_kill()
    del log.done["west#2"]
    log.ended("west#2", 109.0, 1, "Traceback: boom")
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit=None, host={}, wall_s=20.0)
    assert not report["intact"]
    assert report["errors"] == ["west#2: ended without a result (exit status 1: Traceback: boom)"]


def test_a_step_that_had_every_contribution_before_the_fault_is_no_recovery() -> None:
    log = _log_with_a_kill()
    for site in ("east", "central"):
        log.outer[site][2]["members"] = [0, 1, 2]  # step 3 ended after the kill, but with west's share
        log.outer[site][3]["members"] = [0, 2]
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit=None, host={}, wall_s=20.0)
    assert report["recovery_s"] == 5.2  # step 4 at the last survivor (108.2) - the kill (103.0)


def test_a_run_past_its_deadline_names_where_each_unfinished_site_stopped() -> None:
    log = _log_with_a_kill()
    del log.done["west#2"], log.done["central"]
    log.timed_out(150.0)
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit=None, host={}, wall_s=20.0)
    assert not report["intact"]
    assert report["errors"] == ["the run passed its 150 s deadline; unfinished: west#2 after outer step 4, "
                                "central after outer step 4"]
    log.outer["west#2"].clear()
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit=None, host={}, wall_s=20.0)
    assert report["errors"][-1].endswith("unfinished: west#2 joined, before its first outer step, "
                                         "central after outer step 4")


def test_the_sites_await_those_the_faults_bring_back_and_not_a_site_killed_for_good() -> None:
    faults = parse("--kill", "west", "--at", "1", "--rejoin-after", "2",
                   "--partition", "east,west|central", "--at", "9", "--for", "3")
    assert DilocoOptions(sites=3, faults=tuple(faults)).awaited() == ["west", "central"]
    faults = parse("--kill", "west", "--at", "1", "--rejoin-after", "2", "--kill", "west", "--at", "9")
    assert DilocoOptions(sites=3, faults=tuple(faults)).awaited() == []
    assert DilocoOptions(sites=3, faults=tuple(parse("--blackhole", "east", "--at", "1", "--for", "2"))
                         ).awaited() == ["east"]


def test_the_report_says_from_which_step_the_sites_held_for_a_site_to_come_back() -> None:
    log = _log_with_a_kill()
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit=None, host={}, wall_s=20.0)
    assert report["held_from_step"] is None
    log.line("central", {"event": "hold", "t": 106.0, "step": 4}, 106.0)
    log.line("west#2", {"event": "hold", "t": 107.1, "step": 5}, 107.1)
    report = build_diloco_report(SCENARIO, DilocoOptions(sites=3, outer_steps=4), log, backend="engine",
                                 commit=None, host={}, wall_s=20.0)
    assert report["held_from_step"] == 4
