"""The same-run limits of ``wanxport bench --baseline``: AEAD, digest, raw UDP, and the ratios."""

from __future__ import annotations

import argparse
import json

import pytest

from wanxport.bench import add_bench_arguments, bench_main
from wanxport.bench.limits import (
    BASELINES,
    LIMIT_SLICES,
    aead_limit,
    combine_limits,
    compare_with_limits,
    digest_limit,
    expand_baselines,
    raw_udp_limit,
)
from wanxport.core.digest import DIGEST_NAME
from wanxport.wire import native

needs_native = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))


def test_baselines_repeat_and_all_expands_in_a_fixed_order() -> None:
    assert expand_baselines(None) == []
    assert expand_baselines(["none"]) == []
    assert expand_baselines(["digest", "aead", "digest"]) == ["aead", "digest"]
    assert expand_baselines(["all"]) == list(BASELINES)


@needs_native
@pytest.mark.parametrize("cipher", ["aes-256-gcm", "chacha20-poly1305"])
def test_aead_limit_costs_cpu_per_byte(cipher: str) -> None:
    got = aead_limit(cipher, 1472, total_bytes=8 << 20)
    assert got["datagram_bytes"] == 1472
    assert got["cpu_s_per_gb"] > 0 and got["gbytes_per_s"] > 0
    # The two figures are one measurement: seconds per 1e9 bytes and its inverse.
    assert got["cpu_s_per_gb"] * got["gbytes_per_s"] == pytest.approx(1.0, rel=0.02)
    slices = got["slices_cpu_s_per_gb"]
    assert len(slices) == LIMIT_SLICES and min(slices) <= got["cpu_s_per_gb"] <= max(slices)
    assert got["bytes"] >= 0.99 * (8 << 20)  # whole datagrams per slice: at most one short each


@needs_native
def test_aead_limit_rejects_an_unknown_cipher() -> None:
    with pytest.raises(ValueError, match="cipher"):
        aead_limit("rot13", 1472, total_bytes=1 << 20)


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_digest_limit_costs_cpu_per_byte(algorithm: str) -> None:
    got = digest_limit(total_bytes=64 << 20, algorithm=algorithm)
    assert got["cpu_s_per_gb"] > 0
    assert got["cpu_s_per_gb"] * got["gbytes_per_s"] == pytest.approx(1.0, rel=0.02)


def test_limits_from_both_sides_of_a_transfer_are_the_cost_over_every_slice() -> None:
    before = {"aead": {"cpu_s_per_gb": 0.5, "gbytes_per_s": 2.0, "cpu_s": 0.5, "bytes": 10**9,
                       "slices_cpu_s_per_gb": [0.4, 0.6], "datagram_bytes": 1472},
              "raw_udp": {"goodput_bps": 1e10}}
    after = {"aead": {"cpu_s_per_gb": 1.0, "gbytes_per_s": 1.0, "cpu_s": 3.0, "bytes": 3 * 10**9,
                      "slices_cpu_s_per_gb": [1.0, 1.0], "datagram_bytes": 1472},
             "digest": {"cpu_s_per_gb": 0.3, "cpu_s": 0.3, "bytes": 10**9, "slices_cpu_s_per_gb": [0.3]}}
    got = combine_limits(before, after)
    assert got["aead"]["cpu_s_per_gb"] == 0.875  # 3.5 CPU-s over 4e9 bytes, not the mean of 0.5 and 1.0
    assert got["aead"]["bytes"] == 4 * 10**9
    assert got["aead"]["gbytes_per_s"] == pytest.approx(1 / 0.875, abs=1e-3)
    assert got["aead"]["slices_cpu_s_per_gb"] == [0.4, 0.6, 1.0, 1.0]
    assert got["aead"]["datagram_bytes"] == 1472
    assert got["raw_udp"] == before["raw_udp"] and got["digest"] == after["digest"]
    assert before["aead"]["cpu_s_per_gb"] == 0.5, "the inputs are left as they were"


def test_digest_limit_refuses_an_unknown_algorithm() -> None:
    with pytest.raises(ValueError, match="algorithm must be one of"):
        digest_limit(total_bytes=1 << 20, algorithm="md5")


@needs_native
def test_raw_udp_blast_delivers_over_loopback() -> None:
    got = raw_udp_limit(seconds=0.2, datagram_bytes=1472)
    assert got["datagrams_sent"] > 0 and got["goodput_bps"] > 0
    assert 0 < got["delivered"] <= 1.0
    cpu = got["cpu_s_per_gb"]
    assert cpu["sender"] > 0 and cpu["receiver"] > 0


def test_ratios_only_where_both_sides_were_measured() -> None:
    report = {"goodput_bps": 2e9, "cpu_s_per_gb": {"sender": 2.0, "receiver": 3.0}}
    compare_with_limits(report, {"aead": {"cpu_s_per_gb": 0.5}, "digest": {"cpu_s_per_gb": 0.5},
                                 "raw_udp": {"goodput_bps": 10e9}})
    assert report["cpu_limit_s_per_gb"] == 1.0
    assert report["cpu_vs_limit"] == {"sender": 2.0, "receiver": 3.0}
    assert report["goodput_vs_raw_udp"] == 0.2
    only_aead: dict[str, object] = {"goodput_bps": 1e9, "cpu_s_per_gb": {"sender": 1.0, "receiver": 1.0}}
    compare_with_limits(only_aead, {"aead": {"cpu_s_per_gb": 0.5}})
    assert "cpu_vs_limit" not in only_aead and "goodput_vs_raw_udp" not in only_aead


@needs_native
def test_bench_reports_cpu_per_gb_next_to_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="wanxport bench")
    add_bench_arguments(parser)
    args = parser.parse_args(["--paths", "2", "--size", "4MiB", "--shards", "2", "--baseline", "aead",
                              "--baseline", "digest", "--json"])
    assert bench_main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["intact"] is True and report["fresh_buffers"] is False
    cpu = report["cpu_s_per_gb"]
    assert cpu["sender"] > 0 and cpu["receiver"] > 0
    assert set(report["limits"]) == {"aead", "digest", "digest_sha256"}
    assert report["limits"]["digest"]["algorithm"] == DIGEST_NAME, "the limit is the digest shards use"
    floor = report["limits"]["aead"]["cpu_s_per_gb"] + report["limits"]["digest"]["cpu_s_per_gb"]
    assert report["cpu_limit_s_per_gb"] == pytest.approx(floor, abs=1e-3)
    assert report["cpu_vs_limit"]["receiver"] == pytest.approx(cpu["receiver"] / floor, abs=0.01)
    for name in ("aead", "digest"):  # timed before and after the transfer, each slice kept
        assert len(report["limits"][name]["slices_cpu_s_per_gb"]) == 2 * LIMIT_SLICES


@needs_native
@pytest.mark.parametrize("mtu", [1500, 9000])
def test_each_datagram_fills_the_path_mtu(capsys: pytest.CaptureFixture[str], mtu: int) -> None:
    """Jumbo frames: at MTU 9000 a datagram carries ~6x what it does at 1500, so the
    per-datagram work (seal, send, receive, open) is paid ~6x less often per byte."""
    parser = argparse.ArgumentParser(prog="wanxport bench")
    add_bench_arguments(parser)
    size = 8 << 20
    args = parser.parse_args(["--paths", "2", "--size", "8MiB", "--shards", "2", "--mtu", str(mtu),
                              "--json"])
    assert bench_main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["intact"] is True and report["mtu"] == mtu
    sent = sum(p["datagrams_sent"] for p in report["paths"])
    carried = sum(p["payload_bytes"] for p in report["paths"])  # re-sent bytes included
    full = mtu - 28 - 16 - 16 - 32  # IP/UDP, header, tag, a generous DATA frame header
    assert sent >= size / (mtu - 28)
    assert carried / sent >= 0.85 * full  # a few control datagrams (open, done, probes) dilute it
