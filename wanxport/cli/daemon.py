"""``wanxport gateway CONFIG.toml``, ``wanxport gateway reload|drain CONFIG.toml`` and
``wanxport transfer submit|status|watch|cancel|list``.

``gateway --check`` is ``nginx -t``: the file, then what it points at (``check.py``:
the identity against the CA and the site, expiry, the addresses to bind), without
binding anything: exit 0 with an ok line (and a warning line per certificate that
expires within 14 days), or exit 2 with one line per problem. A config that cannot
start (a port in use, another daemon on the data_dir) is also a usage error, exit 2. The
``transfer`` verbs talk to a running daemon through ``wanxport.daemon.client``; the
socket is the config's ``api_socket`` (``--config``) or ``--socket`` given directly.
``gateway reload`` and ``gateway drain`` do through the API what SIGHUP and SIGTERM
do (for an operator who is not the daemon's user, or not on a host with systemctl),
and print what the daemon answered: for a reload, the changes it applied.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from wanxport.daemon.check import check_config
from wanxport.daemon.client import ApiError, GatewayClient
from wanxport.daemon.config import ConfigError, DaemonConfig, describe, load_config
from wanxport.daemon.store import LIST_LIMIT, STATES
from wanxport.daemon.watch import watch
from wanxport.sources import SourceOpenError, raise_open_file_limit
from wanxport.usage import USAGE_ERROR, UsageError

FAILED = 1
CONTROL_VERBS = ("reload", "drain")  # `wanxport gateway VERB CONFIG.toml`: through the API


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("gateway", help="run the gateway daemon from a config file",
                              usage="wanxport gateway [-h] [--check] [--verbose] CONFIG.toml\n"
                                    "       wanxport gateway {reload,drain} (CONFIG.toml | --socket PATH)",
                              description="Run one long-lived gateway: bind every path's port, "
                                          "keep sessions with the configured peers, serve the "
                                          "transfer API (docs/operations.md).")
    p.add_argument("config", metavar="CONFIG.toml", type=Path,
                   help="the config to run; or `reload` / `drain` followed by the running daemon's "
                        "CONFIG.toml (or --socket): re-read its config / drain it, through its API")
    p.add_argument("verb_config", nargs="?", type=Path, metavar="CONFIG.toml", help=argparse.SUPPRESS)
    p.add_argument("--socket", type=Path, metavar="PATH", help="with reload/drain: the daemon's API socket")
    p.add_argument("--check", action="store_true",
                   help="check the config, its certificates and addresses, and exit (0 or 2)")
    p.add_argument("--verbose", "-v", action="store_true", help="log at INFO (default WARNING)")
    p.set_defaults(func=run_gateway)

    p = subparsers.add_parser("transfer", help="submit and follow transfers of a running gateway",
                              description="Talk to a running `wanxport gateway` over its API socket.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", type=Path, metavar="CONFIG.toml", help="the daemon's config")
    where.add_argument("--socket", type=Path, metavar="PATH", help="the daemon's API socket")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    submit = verbs.add_parser("submit", help="send a file or directory to a peer")
    submit.add_argument("peer")
    submit.add_argument("source", type=Path, help="file or directory on this host")
    submit.add_argument("--dest", help="name at the peer (default: the source's name)")
    submit.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    submit.add_argument("--key", help="idempotency key: submitting it again returns the same transfer "
                                      "(with --wait, one is made up when not given)")
    submit.add_argument("--follow-symlinks", action="store_true",
                        help="send what symlinks in the source point to (like rsync -L); by default "
                             "they are sent as symlinks when they stay inside the source, else skipped")
    submit.add_argument("--wait", action="store_true",
                        help="wait until the transfer is final, submitting it again (same key, new "
                             "descriptors) if the daemon restarted meanwhile")
    submit.add_argument("--progress", action="store_true",
                        help="show a live progress line until the transfer is final (as `watch`)")
    status = verbs.add_parser("status", help="one transfer's state and progress")
    status.add_argument("id")
    status.add_argument("--wait", action="store_true", help="wait until the transfer is final")
    watch_verb = verbs.add_parser("watch", help="a live progress line until the transfer is final")
    watch_verb.add_argument("id")
    cancel = verbs.add_parser("cancel", help="cancel a transfer that has not ended")
    cancel.add_argument("id")
    listing = verbs.add_parser("list", help="transfers, oldest first, across restarts")
    listing.add_argument("--state", choices=STATES, help="only transfers in this state")
    listing.add_argument("--peer", help="only transfers to this peer")
    listing.add_argument("--limit", type=int, default=LIST_LIMIT,
                         help=f"the newest N records (default {LIST_LIMIT})")
    p.set_defaults(func=run_transfer)


def run_gateway(args: argparse.Namespace) -> int:
    if str(args.config) in CONTROL_VERBS:
        return run_control(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.check:
        return _check(args.config, config)
    from wanxport.aio.loop import run
    from wanxport.daemon.service import DaemonError, run_daemon

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return run(run_daemon(config))
    except DaemonError as exc:
        raise UsageError(str(exc)) from None


def _check(path: Path, config: DaemonConfig) -> int:
    report = check_config(config)
    for warning in report.warnings:
        print(f"wanxport gateway: warning: {warning}", file=sys.stderr)
    for error in report.errors:
        print(f"wanxport gateway: {error}", file=sys.stderr)
    if report.errors:
        return USAGE_ERROR
    print(f"{path}: ok ({describe(config)})")
    return 0


def run_control(args: argparse.Namespace) -> int:
    """``gateway reload|drain``: the running daemon's API does what SIGHUP/SIGTERM do."""
    verb = str(args.config)
    if (args.verb_config is None) == (args.socket is None):
        raise UsageError(f"gateway {verb}: give the running daemon's CONFIG.toml or --socket PATH")
    socket_path = args.socket if args.socket is not None else _api_socket(args.verb_config)
    client = GatewayClient(str(socket_path))
    try:
        result = client.reload() if verb == "reload" else client.drain()
    except ApiError as exc:
        print(f"wanxport gateway {verb}: {exc}", file=sys.stderr)
        return FAILED
    except OSError as exc:
        print(f"wanxport gateway {verb}: no gateway answers on {socket_path} ({exc.strerror or exc})",
              file=sys.stderr)
        return FAILED
    if verb == "reload":
        print("reload: " + ("; ".join(result["changes"] + result["at_restart"]) or "no change"))
    else:
        print(f"draining: {result['active']} transfers get {result['drain_seconds']:g} s to finish")
    return 0


def _api_socket(config: Path) -> Path:
    try:
        return load_config(config).api_socket
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def run_transfer(args: argparse.Namespace) -> int:
    socket_path = _api_socket(args.config) if args.config is not None else args.socket
    raise_open_file_limit()  # submit holds every file of a directory open at once
    client = GatewayClient(str(socket_path))
    try:
        result = _verb(client, args)
    except ApiError as exc:
        print(f"wanxport transfer {args.verb}: {exc}", file=sys.stderr)
        return 2 if 400 <= exc.status < 500 and exc.status != 409 else FAILED
    except SourceOpenError as exc:  # this user cannot read it: nothing was sent
        print(f"wanxport transfer {args.verb}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"wanxport transfer: no gateway answers on {socket_path} ({exc.strerror or exc})",
              file=sys.stderr)
        return FAILED
    print(json.dumps(result))
    if isinstance(result, dict) and result.get("state") in ("failed", "cancelled") and args.verb != "cancel":
        return FAILED
    return 0


def _verb(client: GatewayClient, args: argparse.Namespace) -> Any:
    if args.verb == "submit":
        key = args.key or (uuid.uuid4().hex if args.wait else None)  # --wait may need to resubmit

        def submit_transfer() -> dict[str, Any]:
            return client.submit(args.peer, os.path.abspath(args.source), args.dest,
                                 overwrite=args.overwrite, key=key, follow_symlinks=args.follow_symlinks)

        transfer = submit_transfer()
        if args.progress:
            return watch(client, transfer["id"], sys.stderr)
        return client.wait(transfer["id"], resubmit=submit_transfer) if args.wait else transfer
    if args.verb == "status":
        return client.wait(args.id) if args.wait else client.get(args.id)
    if args.verb == "watch":
        return watch(client, args.id, sys.stderr)
    if args.verb == "cancel":
        return client.cancel(args.id)
    return client.list(args.state, args.peer, args.limit)
