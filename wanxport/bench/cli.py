"""``wanxport bench``: the loopback transfer and pacing benchmarks from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from wanxport.aio.config import MAX_WORKERS
from wanxport.bench.limits import (
    BASELINES,
    LAB_HINT,
    LAB_LIMITS,
    SLICED_LIMITS,
    combine_limits,
    compare_with_limits,
    expand_baselines,
    lab_installed,
    measure_limits,
)
from wanxport.presets import GATEWAY
from wanxport.units import format_rate, format_size, parse_size
from wanxport.wire import native
from wanxport.wire.protection import CIPHERS

SHARD_TARGET_BYTES = 64 << 20


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=("wanxport", "aioquic"), default="wanxport",
                        help="aioquic: the same transfer over one QUIC stream with the same TLS, "
                             "for comparison (needs --paths 1)")
    parser.add_argument("--paths", type=int, default=4, help="loopback paths (sockets per side)")
    parser.add_argument("--size", default="1GiB", help="payload, e.g. 64MiB, 1GiB")
    parser.add_argument("--mtu", type=int, default=1500, help="path MTU (datagram = MTU - 28)")
    parser.add_argument("--cipher", choices=CIPHERS, default="aes-256-gcm")
    parser.add_argument("--python-datapath", action="store_true",
                        help="use the pure-Python data path instead of the native one")
    parser.add_argument("--segments", type=int, default=GATEWAY.segments,
                        help="datagrams per core packet (segmentation below the core; default: the "
                             f"gateway preset's, {GATEWAY.segments}; another value is reported as "
                             "an override)")
    parser.add_argument("--shards", type=int, default=None, help="shards (default: one per 64 MiB)")
    parser.add_argument("--pacer-burst-us", type=float, default=500.0,
                        help="the native pacer sends what falls due within this window at once "
                             "(default: the endpoint's, 500)")
    parser.add_argument("--pacer-spin-us", type=float, default=0.0,
                        help="the native pacer spins this long before a release (default: the "
                             "endpoint's, 0)")
    parser.add_argument("--ack-every", type=int, default=None,
                        help="the receiver acknowledges every N datagrams (default: --segments)")
    parser.add_argument("--ack-delay-ms", type=float, default=GATEWAY.ack_delay_s * 1000,
                        help=f"... or within this delay at most: an eighth of the path's RTT, "
                             f"from the preset's {(GATEWAY.min_ack_delay_s or 0) * 1000:g} ms up to this "
                             f"(default: the preset's, {GATEWAY.ack_delay_s * 1000:g})")
    parser.add_argument("--fresh-buffers", action="store_true",
                        help="receive into untouched memory and send from untouched pacer rings (a "
                             "first step: the kernel zeroes each page on first write) instead of "
                             "memory touched before the clock starts")
    parser.add_argument("--digest-first", action="store_true",
                        help="hash every shard before the first datagram leaves (as a peer of control "
                             "protocol 4 needs) instead of while the shards are sent")
    parser.add_argument("--workers", type=int, default=1,
                        help="data-path worker threads at each end (native; at most one per path)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fec", choices=("off", "auto"), default="auto",
                        help="erasure-coded tail (default auto; off for the ablation)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    parser.add_argument("--baseline", action="append", choices=("none", *BASELINES, "all"),
                        help="also measure, in the same run (repeatable): iperf3 -u on loopback, "
                             "raw-udp (a C blast with GSO/GRO), aead (sealing through OpenSSL, no "
                             "I/O), digest (the shard digest, BLAKE3, alone; SHA-256 beside "
                             "it), or all of them")
    parser.add_argument("--pps", type=float, default=None,
                        help="pacing precision mode: the native pacer at this packet rate")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds, with --pps")
    parser.add_argument("--json", action="store_true", help="print the run report as JSON")


def _usage_error(message: str) -> int:
    print(f"wanxport bench: error: {message}", file=sys.stderr)
    return 2


def bench_main(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` asks for; exit status (2 on usage errors)."""
    if not native.NATIVE_AVAILABLE:
        print(native.import_error, file=sys.stderr)
        if args.pps is not None or not args.python_datapath:
            return _usage_error("the native data path is required (or pass --python-datapath)")
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        return _usage_error(f"--size: {exc}")
    checks = [(args.paths >= 1, "--paths must be >= 1"), (size >= 1, "--size must be at least 1 byte"),
              (576 <= args.mtu <= 65535, "--mtu must be between 576 and 65535"),
              (args.segments >= 1, "--segments must be >= 1"),
              (1 <= args.workers <= MAX_WORKERS, f"--workers must be between 1 and {MAX_WORKERS}"),
              (args.workers == 1 or not args.python_datapath, "--workers > 1 needs the native data path"),
              (args.shards is None or args.shards >= 1, "--shards must be >= 1"),
              (args.pps is None or args.pps > 0, "--pps must be > 0"),
              (args.duration > 0, "--duration must be > 0"),
              (0 <= args.pacer_burst_us <= 10_000, "--pacer-burst-us must be between 0 and 10000"),
              (0 <= args.pacer_spin_us <= 10_000, "--pacer-spin-us must be between 0 and 10000"),
              (args.ack_every is None or args.ack_every >= 1, "--ack-every must be >= 1"),
              (0 < args.ack_delay_ms <= 1000, "--ack-delay-ms must be in (0, 1000]")]
    checks.append((args.transport == "wanxport" or (args.paths == 1 and args.pps is None),
                   "--transport aioquic runs one QUIC stream: use --paths 1 and no --pps"))
    for ok, message in checks:
        if not ok:
            return _usage_error(message)
    args.baseline = expand_baselines(args.baseline)
    if args.transport == "aioquic" and not _lab_module("wanxport_lab.aioquic_bench"):
        return _usage_error(f"--transport aioquic is a lab baseline ({LAB_HINT})")
    lab_only = [name for name in args.baseline if name in LAB_LIMITS]
    if lab_only and not lab_installed():
        print(f"wanxport bench: skipping --baseline {', '.join(lab_only)}: {LAB_HINT}", file=sys.stderr)
        args.baseline = [name for name in args.baseline if name not in LAB_LIMITS]
    if "iperf3" in args.baseline:
        from wanxport.bench.iperf import iperf3_available

        if not iperf3_available():
            return _usage_error("--baseline iperf3: iperf3 is not installed")
    try:
        report = _run(args, size)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"wanxport bench: failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    else:
        _print_summary(report)
    return 0 if report["intact"] else 1


def _lab_module(name: str) -> bool:
    """Whether ``name``, a module of the lab side, is installed (it is optional here)."""
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except ImportError:  # its package is absent
        return False


def _run(args: argparse.Namespace, size: int) -> dict[str, Any]:
    baseline = None
    if "iperf3" in args.baseline:
        from wanxport.bench.iperf import run_iperf3_udp

        baseline = run_iperf3_udp()
    limits = measure_limits(args.baseline, args.cipher, args.mtu)
    if args.transport == "aioquic":
        from wanxport_lab.aioquic_bench import run_aioquic_bench

        report = run_aioquic_bench(size, args.seed)
    elif args.pps is not None:
        from wanxport.bench.pacing import run_pacing

        report = run_pacing(args.pps, args.duration, args.mtu - 28)
    else:
        from wanxport.bench.transfer import TransferSpec, run_transfer

        shards = args.shards or max(1, -(-size // SHARD_TARGET_BYTES))
        timeout = args.timeout or max(60.0, size / 10e6)
        spec = TransferSpec(args.paths, size, args.mtu, args.cipher,
                            "python" if args.python_datapath else "native", args.segments, shards,
                            args.seed, timeout, pacer_spin_ns=round(args.pacer_spin_us * 1000),
                            pacer_burst_ns=round(args.pacer_burst_us * 1000),
                            ack_every=args.ack_every, ack_delay_s=args.ack_delay_ms / 1000,
                            fresh_buffers=args.fresh_buffers, fec=args.fec, workers=args.workers,
                            digest_first=args.digest_first)
        report = run_transfer(spec)
    if baseline is not None:
        report["baseline_iperf3_udp_bps"] = round(baseline.received_bps)
        report["baseline_iperf3_udp_sent_bps"] = round(baseline.sent_bps)
        report["baseline_iperf3_udp_lost_percent"] = round(baseline.lost_percent, 2)
        if args.pps is None and baseline.received_bps > 0:
            report["goodput_vs_baseline"] = round(report["goodput_bps"] / baseline.received_bps, 3)
    if limits:
        sliced = [name for name in args.baseline if name in SLICED_LIMITS]
        again = measure_limits(sliced, args.cipher, args.mtu)
        compare_with_limits(report, combine_limits(limits, again))
    return report


def _print_summary(report: dict[str, Any]) -> None:
    if "target_pps" in report:
        print(f"pacer {report['pacer']}: target {report['target_pps']:.0f} pps, achieved "
              f"{report['achieved_pps']:.0f} pps, gap error p50 {report['gap_error_p50_us']} us, "
              f"p99 {report['gap_error_p99_us']} us")
    else:
        datapath = report.get("datapath", report["transport"])  # aioquic's report has none
        print(f"{format_size(report['payload_bytes'])} over {len(report['paths'])} loopback paths "
              f"({datapath} data path, {report['cipher']}): {report['completion_s']:.3f} s, "
              f"goodput {format_rate(report['goodput_bps'])}, intact {report['intact']}, "
              f"{report['datagrams_rejected']} datagrams rejected")
        if "digest_s" in report:
            print(f"clock from the first shard digest: last digest at {report['digest_s']:.3f} s "
                  f"({'before the first datagram' if report['digest_first'] else 'while sending'}), "
                  f"verdict at {report['verdict_s']:.3f} s; preset {report['preset']}"
                  + (f" with {report['preset_overrides']}" if report["preset_overrides"] else ""))
    if "cpu_s_per_gb" in report:
        cpu = report["cpu_s_per_gb"]
        print(f"CPU per GB: sender {cpu['sender']:.3f} s, receiver {cpu['receiver']:.3f} s")
    for end, roles in report.get("cpu", {}).items():
        print(f"  {end} CPU-s by thread role: " + ", ".join(f"{role} {s:.3f}" for role, s in roles.items()))
    if "baseline_iperf3_udp_bps" in report:
        print(f"baseline iperf3 -u (1472 B): {format_rate(report['baseline_iperf3_udp_bps'])} received")
    limits = report.get("limits", {})
    if "aead" in limits:
        print(f"limit AEAD ({report.get('cipher', 'aes-256-gcm')}, {limits['aead']['datagram_bytes']} B, "
              f"no I/O): {limits['aead']['cpu_s_per_gb']:.3f} CPU-s/GB")
    if "digest" in limits:
        print(f"limit digest (BLAKE3): {limits['digest']['cpu_s_per_gb']:.3f} CPU-s/GB "
              f"(SHA-256: {limits['digest_sha256']['cpu_s_per_gb']:.3f})")
    if "cpu_vs_limit" in report:
        ratio = report["cpu_vs_limit"]
        print(f"CPU per GB / (AEAD + digest): sender {ratio['sender']:.2f}x, "
              f"receiver {ratio['receiver']:.2f}x")
    if "raw_udp" in limits:
        raw = limits["raw_udp"]
        print(f"limit raw UDP (C, GSO/GRO, {raw['datagram_bytes']} B): {format_rate(raw['goodput_bps'])}, "
              f"CPU per GB sender {raw['cpu_s_per_gb']['sender']:.3f} s, "
              f"receiver {raw['cpu_s_per_gb']['receiver']:.3f} s")


def main_for_scripts(argv: list[str] | None = None) -> int:
    """Stand-alone entry (benchmarks/, before ``wanxport bench`` exists in the CLI)."""
    parser = argparse.ArgumentParser(prog="wanxport bench")
    add_bench_arguments(parser)
    return bench_main(parser.parse_args(argv))
