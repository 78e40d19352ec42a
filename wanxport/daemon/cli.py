"""``wanxport gateway CONFIG.toml`` and ``wanxport transfer submit|status|cancel|list``.

``gateway --check`` validates the file (and that the identity and CA exist)
without binding anything: exit 0, or exit 2 with the one line naming the field.
A config that cannot start (a port in use) is also a usage error, exit 2. The
``transfer`` verbs talk to a running daemon through ``wanxport.client``; the
socket is the config's ``api_socket`` (``--config``) or ``--socket`` given directly.
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

from wanxport.client import ApiError, GatewayClient
from wanxport.sources import SourceOpenError, raise_open_file_limit
from wanxport.usage import UsageError

from .config import ConfigError, check_files, describe, load_config

FAILED = 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("gateway", help="run the gateway daemon from a config file",
                              description="Run one long-lived gateway: bind every path's port, "
                                          "keep sessions with the configured peers, serve the "
                                          "transfer API (docs/operations.md).")
    p.add_argument("config", metavar="CONFIG.toml", type=Path)
    p.add_argument("--check", action="store_true", help="validate the config and exit (0 or 2)")
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
    status = verbs.add_parser("status", help="one transfer's state and progress")
    status.add_argument("id")
    status.add_argument("--wait", action="store_true", help="wait until the transfer is final")
    cancel = verbs.add_parser("cancel", help="cancel a queued or active transfer")
    cancel.add_argument("id")
    verbs.add_parser("list", help="every transfer the daemon knows")
    p.set_defaults(func=run_transfer)


def run_gateway(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        check_files(config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.check:
        print(f"{args.config}: ok ({describe(config)})")
        return 0
    from wanxport.aio.loop import run

    from .service import DaemonError, run_daemon

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return run(run_daemon(config))
    except DaemonError as exc:
        raise UsageError(str(exc)) from None


def run_transfer(args: argparse.Namespace) -> int:
    if args.config is not None:
        try:
            socket_path = load_config(args.config).api_socket
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    else:
        socket_path = args.socket
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

        def submit() -> dict[str, Any]:
            return client.submit(args.peer, os.path.abspath(args.source), args.dest,
                                 overwrite=args.overwrite, key=key, follow_symlinks=args.follow_symlinks)

        transfer = submit()
        return client.wait(transfer["id"], resubmit=submit) if args.wait else transfer
    if args.verb == "status":
        return client.wait(args.id) if args.wait else client.get(args.id)
    if args.verb == "cancel":
        return client.cancel(args.id)
    return client.list()
