"""Side-by-side experiments without namespaces: payload, options, tuning maths, table, plots."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest

from emulation import plots
from emulation.baselines import netconfig, payload, tcpinfo
from emulation.baselines.tcp_app import HEADER, Incoming, tiled
from emulation.baselines.transports import Direction, launch
from emulation.compare import Column, parse_columns, table
from emulation.run import RunOptions, check_options, default_deadline_s
from wanxport.report import PathReport, build_report
from wanxport.scenario import parse_scenario

TWO_PATHS = """
name = "unit-two"
seed = 5
[[paths]]
name = "slow"
rtt_ms = 10.0
bandwidth_mbps = 100.0
[[paths]]
name = "fast-far"
rtt_ms = 80.0
bandwidth_mbps = 200.0
queue_ms = 20.0
[[paths]]
name = "fast-near"
rtt_ms = 40.0
bandwidth_mbps = 200.0
"""


def test_payload_ranges_equal_the_whole_stream() -> None:
    whole = b"".join(payload.chunks(9, 0, 3 * payload.BLOCK))
    assert len(whole) == 3 * payload.BLOCK
    start, length = payload.BLOCK - 100, payload.BLOCK + 300
    assert b"".join(payload.chunks(9, start, length)) == whole[start:start + length]
    assert payload.block(9, 0) != payload.block(10, 0)


def test_split_tiles_the_payload_evenly() -> None:
    slices = payload.split(10, 3)
    assert slices == [(0, 4), (4, 3), (7, 3)]
    with pytest.raises(ValueError):
        payload.split(10, 0)


def test_payload_digest_is_order_independent_and_content_bound() -> None:
    a, b = hashlib.sha256(b"x").hexdigest(), hashlib.sha256(b"y").hexdigest()
    assert payload.payload_digest([(5, b), (0, a)]) == payload.payload_digest([(0, a), (5, b)])
    assert payload.payload_digest([(0, a), (5, b)]) != payload.payload_digest([(0, b), (5, a)])


def test_receiver_hashes_its_slice_after_the_header() -> None:
    conn = Incoming(sock=None, peer="x")  # type: ignore[arg-type]
    data = HEADER.pack(4, 6) + b"abcdef" + b"ignored"
    for k in range(0, len(data), 5):  # header split across reads
        conn.take(memoryview(data[k:k + 5]))
    assert (conn.offset, conn.length, conn.received) == (4, 6, 6)
    assert conn.hasher.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()
    first = Incoming(sock=None, peer="y")  # type: ignore[arg-type]
    first.take(memoryview(HEADER.pack(0, 4) + b"0123"))
    assert tiled([conn, first], 10)
    assert not tiled([conn], 10)


def test_best_path_is_fastest_then_nearest_and_buffers_cover_twice_the_bdp() -> None:
    scenario = parse_scenario(TWO_PATHS)
    assert netconfig.best_path(scenario) == 2
    # 200 Mb/s x (80 + 20 ms) = 2.5 MB; twice that.
    assert netconfig.buffer_bytes(scenario, [1]) == 5_000_000
    assert netconfig.buffer_bytes(scenario, [0]) == netconfig.MIN_BUFFER
    # All three at the longest delay: 500 Mb/s x 100 ms x 2.
    assert netconfig.buffer_bytes(scenario, [0, 1, 2]) == 12_500_000


def test_launch_gives_each_parallel_connection_its_path_and_slice() -> None:
    from emulation.api import PathInfo

    paths = [PathInfo(f"p{k}", f"10.0.{k}.1", f"10.0.{k}.2", f"wan{k}") for k in (1, 2, 3)]
    plan = launch("tcp-parallel", paths, 2, Direction("b", "a", 7000), seed=1, size=10,
                  cc="bbr", buffer=1 << 22, mtu=1500)
    conns = plan.sender["conns"]
    assert [(c["src"], c["dst"]) for c in conns] == [(p.b_addr, p.a_addr) for p in paths]
    assert [(c["offset"], c["length"]) for c in conns] == [(0, 4), (4, 3), (7, 3)]
    assert plan.receiver["connections"] == 3
    single = launch("mptcp", paths, 2, Direction("a", "b", 7000), seed=1, size=10, cc=None,
                    buffer=1 << 22, mtu=1500)
    assert single.sender["proto"] == "mptcp"
    assert [c["dst"] for c in single.sender["conns"]] == [paths[2].b_addr]


def test_wanxport_paths_get_consecutive_ports_that_both_ends_share() -> None:
    from emulation.api import PathInfo

    paths = [PathInfo(f"p{k}", f"10.0.{k}.1", f"10.0.{k}.2", f"wan{k}") for k in (1, 2, 3)]
    forward = launch("wanxport", paths, 0, Direction("a", "b", 5201), seed=1, size=10, cc=None,
                     buffer=1 << 22, mtu=1500)
    backward = launch("wanxport", paths, 0, Direction("b", "a", 5202), seed=1, size=10, cc=None,
                      buffer=1 << 22, mtu=1500)
    ports = [p["port"] for p in forward.receiver["paths"]]
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]  # one UDP port per path
    assert [p["port"] for p in forward.sender["paths"]] == ports
    # On each path (one address per end) the two directions' ports differ.
    assert all(b["port"] != f["port"] for f, b in zip(forward.receiver["paths"],
                                                      backward.receiver["paths"], strict=True))


def test_options_are_checked_in_one_line() -> None:
    assert check_options(RunOptions(transport="tcp")) == "cubic"
    assert check_options(RunOptions(transport="mptcp", cc="bbr")) == "bbr"
    with pytest.raises(ValueError, match="aioquic has no bbr"):
        check_options(RunOptions(transport="aioquic", cc="bbr"))
    with pytest.raises(ValueError, match="--deadline"):
        check_options(RunOptions(transport="tcp", deadline_s=0))
    with pytest.raises(ValueError, match="--transports 'udp'"):
        parse_columns("tcp,udp")
    assert parse_columns("tcp, mptcp:bbr") == [Column("tcp"), Column("mptcp", "bbr")]
    assert default_deadline_s(1.0) == 60.0
    assert default_deadline_s(10.0) == 200.0


def test_tcp_info_fields_come_from_their_offsets() -> None:
    raw = bytearray(tcpinfo.TCP_INFO_LEN)
    struct.pack_into("I", raw, 68, 20_000)
    struct.pack_into("Q", raw, 208, 1448)
    info = tcpinfo.parse_tcp_info(bytes(raw))
    assert info["rtt_us"] == 20_000 and info["bytes_retrans"] == 1448
    assert "bytes_retrans" not in tcpinfo.parse_tcp_info(bytes(raw[:104]))


def fake_report(transport: str, completion: float, cc: str | None = "cubic", mode: str = "emulated",
                intact: bool = True, **extra: Any) -> dict[str, Any]:
    return build_report(scenario="s1", mode=mode, transport=transport, payload_bytes=1 << 20,
                        completion_s=completion, ideal_s=0.5, intact=intact, wall_s=1.0,
                        paths=[PathReport("p1", 1 << 20, 0, 0.02, "active")], cc=cc,
                        backend="engine", **extra)


def test_table_has_median_cells_sim_column_and_failures() -> None:
    reports = [fake_report("tcp", 1.0, repeat=0), fake_report("tcp", 3.0, repeat=1),
               fake_report("tcp", 2.0, repeat=2, intact=False),
               fake_report("mptcp", 1.5, cc="bbr", repeat=0),
               fake_report("wanxport", 0.8, cc="bbr", mode="sim")]
    text = table(reports, ["tcp", "mptcp:bbr", "wanxport"],
                 {("s1", "wanxport"): "wanxport transport not available yet: x"})
    lines = text.splitlines()
    assert "repeat(s)" in lines[0] and "UTC" in lines[0]
    assert lines[2] == "| scenario | payload | ideal | wanxport (sim) | tcp | mptcp:bbr | wanxport |"
    row = lines[4].split(" | ")
    assert row[3] == "0.80 s · 10 Mb/s"
    assert row[4] == "2.00 s · 4 Mb/s ✗1/3"
    assert row[5] == "1.50 s · 6 Mb/s"
    assert row[6].startswith("n/a: wanxport transport not available yet")


def test_plots_write_pngs_and_timeline_needs_data(tmp_path: Path) -> None:
    reports = [fake_report("tcp", 1.0), fake_report("tcp-parallel", 0.7),
               fake_report("wanxport", 0.6, mode="sim")]
    plots.goodput_bars(reports, tmp_path / "g.png")
    plots.completion_distribution(reports, tmp_path / "c.png")
    assert not plots.path_timeline(reports[0], tmp_path / "none.png")
    timeline = [{"t_s": t / 10, "path": p, "bytes": 125_000} for t in range(20) for p in ("p1", "p2")]
    assert plots.path_timeline(fake_report("wanxport", 2.0, timeline=timeline), tmp_path / "t.png")
    for name in ("g.png", "c.png", "t.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "none.png").exists()


def test_timeline_bins_spread_samples_and_show_a_failed_path_at_zero() -> None:
    """Samples every ~0.1 s in 0.25 s bins: a steady path is flat (no 2-vs-3-samples
    sawtooth), and a path silent for a while is drawn at zero, not joined across."""
    timeline: list[dict[str, object]] = []
    previous = 0.0
    for tick in range(1, 41):
        t = round(tick * 0.102, 4)  # the sampler drifts a little late
        timeline.append({"t_s": t, "path": "steady", "bytes": round(1_250_000 * (t - previous))})
        if not 10 <= tick < 25:
            timeline.append({"t_s": t, "path": "flaps", "bytes": 50_000})
        previous = t
    rates = plots.binned_rates(timeline, 0.25)
    steady = rates["steady"][:-1]  # the last bin is cut short by the end of the run
    assert max(steady) - min(steady) < 0.01 * max(steady)
    assert abs(steady[0] - 10.0) < 0.1  # 1.25 MB/s = 10 Mb/s
    flaps = rates["flaps"]
    assert flaps[5] == 0.0 and flaps[8] == 0.0  # 1.25-1.5 s and 2.0-2.25 s: down
    assert flaps[1] > 0.0 and flaps[12] > 0.0


def test_step_timing_uses_the_first_submission_and_the_last_arrival_of_each_step() -> None:
    from emulation.run import step_timing

    sent = [{"submitted": [10.0, 12.0]}, {"submitted": [10.1, 11.9]}]
    received = [{"verified": [[0, 10.5], [1, 10.8], [2, 12.4], [3, 12.3]]},
                {"verified": [[0, 11.0], [1, 10.9], [2, 12.2], [3, 12.6]]}]
    steps, shards = step_timing("wanxport", 2, sent, received)
    assert steps == pytest.approx([1.0, 0.7])  # 10.0 -> 11.0, 11.9 -> 12.6
    assert sorted(shards) == pytest.approx(sorted([0.5, 0.8, 0.4, 0.3, 0.9, 0.8, 0.3, 0.7]))
    tcp = step_timing("tcp", 1, [{"submitted": [1.0, 3.0]}], [{"step_ends": [2.5, 3.5]}])
    assert tcp == (pytest.approx([1.5, 0.5]), [])


def test_steps_need_a_transport_that_keeps_its_session() -> None:
    from emulation.run import RunOptions, run_experiment

    scenario = parse_scenario('name = "x"\n[[paths]]\nname = "p"\nrtt_ms = 1\nbandwidth_mbps = 1\n')
    with pytest.raises(ValueError, match="--steps: aioquic"):
        run_experiment(scenario, RunOptions(transport="aioquic", steps=2))
    with pytest.raises(ValueError, match="transfer steps"):
        run_experiment(scenario, RunOptions(transport="tcp", steps=0))
