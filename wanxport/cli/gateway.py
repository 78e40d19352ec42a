"""``wanxport certs``, ``wanxport send`` and ``wanxport recv``.

Mistakes the user can fix (bad arguments, missing identity files, a port in
use, an unwritable output directory) raise ``UsageError`` (one line, exit 2).
Failures at run time (unreachable peer, refused certificate, a transfer that
did not complete) print one line and exit 1. ``--json`` prints one run report
per session on stdout; a progress bar appears on stderr only on a terminal.
``--metrics HOST:PORT`` serves Prometheus metrics (``metrics.py``) for as long
as the process runs; with ``-v`` the bound address is logged (port 0 picks one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from wanxport.control import CertificateError, ControlConnectError, RotationLimits
from wanxport.control.certs import KEY_TYPES, issue_certificates
from wanxport.gateway.config import DEFAULT_CONTROL_TIMEOUT_S, GatewayOptions, parse_hostport
from wanxport.gateway.files import FileError, FileSink, check_output_dir, plan_files
from wanxport.gateway.handshake import SetupError, initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.metrics import GatewayMetrics, MetricsServer, parse_metrics_address
from wanxport.gateway.session import SessionFailed
from wanxport.gateway.transfer import receive_files, send_files
from wanxport.units import format_rate, format_size, parse_size
from wanxport.usage import UsageError

FAILED = 1
CIPHER_CHOICES = ("aes-256-gcm", "chacha20-poly1305")


def register(subparsers: Any) -> None:
    """Add ``certs``, ``send`` and ``recv`` to the ``wanxport`` command."""
    p = subparsers.add_parser("certs", help="write a test CA and gateway certificates",
                              description="Write DIR/<name>.pem + DIR/<name>.key per name, signed by "
                                          "the CA in DIR/ca.pem (+ ca.key), which is created when "
                                          "there is none; for test deployments. An existing CA and "
                                          "existing names are kept.")
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("--names", nargs="+", required=True, metavar="NAME", help="gateway names")
    p.add_argument("--key-type", choices=KEY_TYPES, default="ec", help="ec (P-256, default) or ed25519")
    p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    p.add_argument("--force", action="store_true",
                   help="replace the CA in DIR and the named certificates (invalidates every "
                        "certificate the old CA signed)")
    p.set_defaults(func=run_certs)

    p = subparsers.add_parser("recv", help="receive files from a sending gateway",
                              description="Listen on one or more paths and write received files "
                                          "to --out. Each --listen HOST:PORT is one path: data and "
                                          "QUIC control share UDP PORT (consecutive ports can be "
                                          "separate paths).")
    _common(p)
    p.add_argument("--listen", action="append", required=True, metavar="HOST:PORT",
                   help="one path (repeat for more); the first is listed first to senders")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="where files arrive")
    p.add_argument("--keep", action="store_true", help="serve sessions until interrupted")
    p.add_argument("--credit", default="1GiB", metavar="SIZE",
                   help="receive budget granted to the sender (default 1GiB)")
    p.set_defaults(func=run_recv)

    p = subparsers.add_parser("send", help="send files to a receiving gateway",
                              description="Send files over one or more paths. Each --to HOST:PORT is "
                                          "one path (data and control share UDP PORT); the control "
                                          "channel starts on the first path that answers.")
    _common(p)
    p.add_argument("--to", action="append", required=True, metavar="HOST:PORT",
                   help="the receiver's address on one path (repeat for more)")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--cipher", choices=CIPHER_CHOICES, default="aes-256-gcm")
    p.add_argument("--fec", choices=("off", "auto"), default="auto",
                   help="erasure-coded tail (default auto; off for the ablation)")
    p.add_argument("--piece", default="64MiB", metavar="SIZE",
                   help="files are sent as shards of this size (default 64MiB)")
    p.set_defaults(func=run_send)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--identity", required=True, metavar="PREFIX",
                   help="our certificate and key: PREFIX.pem and PREFIX.key")
    p.add_argument("--ca", required=True, type=Path, metavar="CA.pem", help="the trusted CA")
    p.add_argument("--json", action="store_true", help="print one run report (JSON) per session")
    p.add_argument("--control-timeout", type=float, default=DEFAULT_CONTROL_TIMEOUT_S, metavar="S",
                   help="seconds of silence before the control channel moves to another path")
    p.add_argument("--rekey-bytes", metavar="SIZE", help="rotate data keys after this many bytes "
                                                         "(default 64GiB)")
    p.add_argument("--rekey-seconds", type=float, metavar="S", help="rotate data keys after S seconds "
                                                                    "(default 3600)")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (e.g. 0.0.0.0:9464)")
    p.add_argument("--verbose", "-v", action="store_true", help="log what happens (stderr)")


def _options(args: argparse.Namespace, **extra: Any) -> GatewayOptions:
    limits: dict[str, Any] = {}
    if args.rekey_bytes is not None:
        limits["bytes"] = _size(args.rekey_bytes, "--rekey-bytes")
    if args.rekey_seconds is not None:
        limits["seconds"] = args.rekey_seconds
    try:
        return GatewayOptions(rotation=RotationLimits(**limits), control_timeout_s=args.control_timeout,
                              **extra)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _size(text: str, what: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
    if value <= 0:
        raise UsageError(f"{what}: must be more than 0 bytes")
    return value


def _addresses(values: list[str], what: str) -> list[tuple[str, int]]:
    try:
        return [parse_hostport(v, what) for v in values]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _metrics_address(args: argparse.Namespace) -> tuple[str, int] | None:
    if args.metrics is None:
        return None
    try:
        return parse_metrics_address(args.metrics)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _serve_metrics(metrics: GatewayMetrics, address: tuple[str, int] | None) -> None:
    """Start the exporter; it lives on a daemon thread until the process exits."""
    if address is None:
        return
    try:
        MetricsServer(metrics, address)
    except OSError as exc:
        raise UsageError(f"--metrics: cannot listen on {address[0]}:{address[1]}: "
                         f"{exc.strerror or exc}") from None


def _setup_logging(verbose: bool) -> None:
    """Library warnings would repeat the one line the command prints; show them with -v only."""
    logging.basicConfig(level=logging.INFO if verbose else logging.CRITICAL,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _fail(command: str, message: str) -> int:
    print(f"wanxport {command}: {message}", file=sys.stderr)
    return FAILED


# -- certs ---------------------------------------------------------------------


def run_certs(args: argparse.Namespace) -> int:
    try:
        changes = issue_certificates(args.dir, args.names, days=args.days, key_type=args.key_type,
                                     force=args.force)
    except (ValueError, CertificateError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{args.dir}: cannot write ({exc.strerror or exc})") from None
    if changes.invalidated:
        print(f"wanxport certs: warning: replaced the CA {changes.ca}; these certificates it signed no "
              f"longer verify: {', '.join(map(str, changes.invalidated))} (issue them again, and give "
              "every gateway the new ca.pem)", file=sys.stderr)
    for prefix in changes.issued:
        print(f"{prefix}.pem  {prefix}.key")
    for prefix in changes.kept:
        print(f"{prefix}.pem  kept: it exists already (--force replaces the CA and the named certificates)")
    print(f"{changes.ca}{'' if changes.ca_created else '  (the existing CA signed the new names)'}")
    return 0


# -- send ----------------------------------------------------------------------


def run_send(args: argparse.Namespace) -> int:
    from wanxport.aio.loop import run

    _setup_logging(args.verbose)
    paths = _addresses(args.to, "--to")
    metrics_address = _metrics_address(args)
    options = _options(args, cipher=args.cipher, piece_bytes=_size(args.piece, "--piece"), fec=args.fec)
    try:
        pieces = plan_files(args.files, options.piece_bytes)
    except FileError as exc:
        raise UsageError(str(exc)) from None
    metrics = GatewayMetrics("sender")
    _serve_metrics(metrics, metrics_address)
    try:
        result = run(_send(paths, args, options, pieces, metrics))
    except CertificateError as exc:
        if "does not exist" in str(exc) or "not readable" in str(exc):
            raise UsageError(str(exc)) from None
        return _fail("send", str(exc))
    except ControlConnectError as exc:
        return _fail("send", f"cannot reach the receiver: {exc}")
    except (SetupError, SessionFailed) as exc:
        return _fail("send", str(exc))
    if args.json:
        print(json.dumps(result.report))
    elif sys.stderr.isatty():
        _summary(result.report, "sent")
    if not result.ok:
        return _fail("send", result.report.get("error") or "the receiver did not confirm every file")
    return 0


async def _send(paths: list[tuple[str, int]], args: argparse.Namespace, options: GatewayOptions,
                pieces: list[Any], metrics: GatewayMetrics) -> Any:
    session = await initiate(paths, args.identity, args.ca, options)
    with metrics.tracking(session):
        try:
            return await send_files(session, pieces)
        finally:
            await session.close()


def _summary(report: dict[str, Any], verb: str) -> None:
    print(f"{verb} {format_size(report['payload_bytes'])} in {report['completion_s']:.2f} s "
          f"({format_rate(report['goodput_bps'])}), {len(report['paths'])} paths, "
          f"{report['datagrams_rejected']} datagrams rejected", file=sys.stderr)


# -- recv ----------------------------------------------------------------------


def run_recv(args: argparse.Namespace) -> int:
    from wanxport.aio.loop import run

    _setup_logging(args.verbose)
    listens = _addresses(args.listen, "--listen")
    metrics_address = _metrics_address(args)
    options = _options(args, credit_bytes=_size(args.credit, "--credit"))
    try:
        check_output_dir(args.out)
    except FileError as exc:
        raise UsageError(str(exc)) from None
    metrics = GatewayMetrics("receiver")
    _serve_metrics(metrics, metrics_address)
    try:
        return run(_recv(listens, args, options, metrics))
    except CertificateError as exc:
        raise UsageError(str(exc)) from None


async def _recv(listens: list[tuple[str, int]], args: argparse.Namespace, options: GatewayOptions,
                metrics: GatewayMetrics) -> int:
    sink_holder: list[FileSink] = []

    def allocate(shard_id: int, size: int, meta: bytes) -> Any:
        return sink_holder[-1].allocate(shard_id, size, meta)

    listener = GatewayListener(listens, args.identity, args.ca, options, allocator=allocate)
    metrics.listener = listener
    try:
        await listener.start()
    except OSError as exc:
        raise UsageError(f"--listen: port in use or not available: {exc.strerror or exc}") from None
    reporter = asyncio.create_task(_report_rejections(listener))
    status = 0
    try:
        while True:
            sink_holder.append(FileSink(args.out))
            try:
                session = await listener.accept()
            except (SetupError, OSError) as exc:
                print(f"wanxport recv: {exc}", file=sys.stderr)
                status = FAILED
                if not args.keep:
                    return status
                continue
            with metrics.tracking(session):
                try:
                    result = await receive_files(session, sink_holder[-1])
                finally:
                    await session.close()
                    listener.release()
            if args.json:
                print(json.dumps(result.report), flush=True)
            elif sys.stderr.isatty():
                _summary(result.report, "received")
            status = 0 if result.ok else FAILED
            if not result.ok:
                print(f"wanxport recv: {result.error}", file=sys.stderr)
            if not args.keep:
                return status
    finally:
        reporter.cancel()
        listener.close()


async def _report_rejections(listener: GatewayListener) -> None:
    while True:
        exc = await listener.rejections.get()
        print(f"wanxport recv: refused a sender: {exc}", file=sys.stderr, flush=True)
