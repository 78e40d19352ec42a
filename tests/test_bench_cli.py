"""``wanxport bench``: the CLI function returns well-formed run reports."""

from __future__ import annotations

import argparse
import json

import pytest

from wanxport.bench import add_bench_arguments, bench_main
from wanxport.bench.transfer import CHILD_START_TIMEOUT_S, TransferSpec, child_start_timeout_s
from wanxport.report import SCHEMA
from wanxport.wire import native

needs_native = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="wanxport bench")
    add_bench_arguments(parser)
    status = bench_main(parser.parse_args([*argv, "--json"]))
    out = capsys.readouterr().out
    return status, json.loads(out)


@needs_native
def test_loopback_transfer_report(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = run(capsys, "--paths", "2", "--size", "4MiB", "--shards", "2")
    assert status == 0
    assert report["schema"] == SCHEMA and report["mode"] == "loopback"
    assert report["transport"] == "wanxport" and report["intact"] is True
    assert report["payload_bytes"] == 4 << 20
    assert report["datapath"] == "native" and report["cipher"] == "aes-256-gcm"
    assert isinstance(report["pacer"], str) and report["pacer"]
    assert report["datagrams_rejected"] == 0
    assert report["completion_s"] > 0 and report["goodput_bps"] > 0  # type: ignore[operator]
    paths = report["paths"]
    assert isinstance(paths, list) and [p["name"] for p in paths] == ["lo0", "lo1"]
    assert sum(p["payload_bytes"] for p in paths) >= 4 << 20
    # Each end's CPU by thread role adds up to its CPU per GB; the sender hashed its
    # shards, its pacer released the datagrams, the receiver hashed what arrived.
    roles, per_gb = report["cpu"], report["cpu_s_per_gb"]
    assert isinstance(roles, dict) and isinstance(per_gb, dict)
    for end in ("sender", "receiver"):
        assert set(roles[end]) == {"loop", "release", "receive", "digest", "other"}
        assert all(v >= 0 for v in roles[end].values())
        assert sum(roles[end].values()) / (4 << 20) * 1e9 == pytest.approx(per_gb[end], rel=1e-3, abs=1e-3)
        assert roles[end]["loop"] > 0 and roles[end]["digest"] > 0
    assert roles["sender"]["release"] > 0
    assert report["pacer_send_rounds_per_gb"] > 0  # type: ignore[operator]
    # The loop's events: the sender decoded the receiver's ACKs in receive passes, handed out
    # at least one plan, and never more plans than datagrams.
    events = report["sender_loop_events_per_gb"]
    assert isinstance(events, dict)
    assert set(events) == {"control_packets", "receive_passes", "services", "plans", "timer_wakes"}
    assert events["control_packets"] > 0 and events["services"] > 0 and events["plans"] > 0
    assert 0 < events["receive_passes"] <= events["control_packets"]
    datagrams = sum(p["datagrams_sent"] for p in paths) / (4 << 20) * 1e9
    assert events["plans"] <= datagrams


@pytest.mark.parametrize("argv", [["--ack-every", "0"], ["--ack-delay-ms", "0"], ["--pacer-spin-us", "-1"]])
def test_pacer_and_ack_knobs_are_checked(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="wanxport bench")
    add_bench_arguments(parser)
    assert bench_main(parser.parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert argv[0] in err and "Traceback" not in err


def test_python_datapath_report(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = run(capsys, "--paths", "2", "--size", "1MiB", "--python-datapath",
                         "--cipher", "chacha20-poly1305")
    assert status == 0 and report["intact"] is True
    assert report["datapath"] == "python" and report["cipher"] == "chacha20-poly1305"
    assert report["pacer"] is None


@needs_native
def test_pacing_report(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = run(capsys, "--pps", "20000", "--duration", "0.2")
    assert status == 0 and report["intact"] is True
    assert report["target_pps"] == 20000
    assert report["datagrams_received"] == report["datagrams_sent"] == 4000
    # Not pacing (a loopback burst runs at hundreds of thousands per second), or pacing at a
    # multiple of the target, breaks the upper bound on any host. The bound is not tighter
    # because a stall is made up: a pacer more than 1 ms behind its schedule sends 4 x
    # closer until it is back (ext/datapath/pacer_ring.h), so a first datagram sent late
    # shortens the span the rate is measured over (a 16 ms stall there: 1.09 x). How close
    # to the target it gets and its gap error are precision figures of the benchmark,
    # which a busy host moves.
    target = 20000.0
    achieved = report["achieved_pps"]
    assert isinstance(achieved, float) and 0.0 < achieved <= 1.5 * target
    p50_us = report["gap_error_p50_us"]
    assert isinstance(p50_us, float) and p50_us >= 0.0


@pytest.mark.parametrize(("argv", "field"), [(["--paths", "0"], "--paths"), (["--size", "1XB"], "--size"),
                                             (["--mtu", "100"], "--mtu")])
def test_usage_errors_exit_2_naming_the_field(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              field: str) -> None:
    parser = argparse.ArgumentParser(prog="wanxport bench")
    add_bench_arguments(parser)
    assert bench_main(parser.parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_the_receivers_start_limit_covers_touching_its_buffers() -> None:
    def spec(size: int, fresh: bool = False) -> TransferSpec:
        return TransferSpec(4, size, 1500, "aes-256-gcm", "native", 128, 4, 0, 60.0, fresh_buffers=fresh)

    assert child_start_timeout_s(spec(1 << 20)) < CHILD_START_TIMEOUT_S + 1
    # 8 GiB took over 20 s to zero on a 2-core VM; the fixed 30 s failed such runs.
    assert child_start_timeout_s(spec(8 << 30)) >= CHILD_START_TIMEOUT_S + 40
    assert child_start_timeout_s(spec(8 << 30, fresh=True)) == CHILD_START_TIMEOUT_S


DIGEST_DELAY_S = 0.2  # each shard digest at least this long: far above the noise of the clock


@needs_native
def test_the_clock_starts_before_the_shard_digests(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The API hashes a shard inside ``send``, so the bench's clock must cover its digests:
    with digests made slow on purpose, completion holds their time and reports it."""
    import time

    from wanxport.bench import transfer

    real = transfer.shard_digest

    def slow_digest(data: memoryview) -> bytes:
        time.sleep(DIGEST_DELAY_S)  # a stand-in for a slow hash, not a synchronisation
        return real(data)

    monkeypatch.setattr(transfer, "shard_digest", slow_digest)
    status, report = run(capsys, "--paths", "1", "--size", "1MiB", "--shards", "2")
    assert status == 0 and report["intact"] is True
    digest_s, completion_s, verdict_s = report["digest_s"], report["completion_s"], report["verdict_s"]
    assert isinstance(digest_s, float) and isinstance(completion_s, float) and isinstance(verdict_s, float)
    assert digest_s >= 2 * DIGEST_DELAY_S
    assert completion_s > digest_s  # the digests, then the transfer, on one clock
    assert verdict_s > digest_s
    assert report["preset"] == "gateway" and report["preset_overrides"] == {}
