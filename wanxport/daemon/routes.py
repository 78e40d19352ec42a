"""The transfer API's routes under ``/v1/`` (JSON in, JSON out).

=======  ==========================  =============================================
POST     /v1/transfers               submit {peer, source, dest?, overwrite?,
                                     idempotency_key?, follow_symlinks?, entries?,
                                     fds?} (or an Idempotency-Key header): 201 new,
                                     200 the same key again, 403 a source this
                                     submitter may not send, 409 the key with
                                     other parameters, 422 a source that cannot
                                     be sent (at once)
GET      /v1/transfers               list, newest last: the newest 1,000 (``?limit=N``),
                                     across restarts (finished ones from the archive);
                                     ``?state=S`` and ``?peer=P`` filter
GET      /v1/transfers/ID            one transfer: state, reason, progress
POST     /v1/transfers/ID/cancel     cancel a queued or active transfer
GET      /v1/status                  site, instance, paths, peers (their data ports and
                                     session), draining, asyncio_tasks
POST     /v1/reload                  re-read the config file, as SIGHUP does: 200 with
                                     {taken, changes, at_restart}, 422 when refused
POST     /v1/drain                   drain and exit, as SIGTERM does: 202
=======  ==========================  =============================================

While the daemon drains, submissions get 503.

What may be sent is what the submitter may read, and only from under the roots the
config gives it (``submission.py``): a local submitter passes the source's
descriptors (``entries`` name each file and its descriptor's index, ``fds`` counts
them); a path alone is opened by the daemon only for root or the daemon's own
user, and for an ``api_tcp`` certificate with roots of its own. A refusal is 403
with the reason, logged at WARNING with who asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Protocol
from urllib.parse import parse_qs

from wanxport import __version__
from wanxport.control import PROTOCOL_VERSION
from wanxport.gateway.config import format_endpoint
from wanxport.sources import describe_skipped

from .api import Requester
from .config import DaemonConfig
from .lifecycle import TransferEvent
from .listener import DaemonListener
from .outbox import SourceError, default_dest, plan
from .peers import PeerSessions, dialled_by
from .reload import ReloadResult
from .store import FINAL, LIST_LIMIT, STATES, Submission, SubmitConflict, Transfer, TransferStore
from .submission import HeldSource, Refused, held_source

log = logging.getLogger(__name__)

_SUBMIT_FIELDS = {"peer", "source", "dest", "overwrite", "idempotency_key", "follow_symlinks", "entries",
                  "fds", "skipped"}


class TransferDesk(Protocol):
    """What the routes need of the daemon: its state to show, and the verbs they forward."""

    @property
    def config(self) -> DaemonConfig: ...

    @property
    def store(self) -> TransferStore | None: ...

    @property
    def draining(self) -> bool: ...

    @property
    def active_count(self) -> int: ...

    @property
    def peers(self) -> PeerSessions: ...

    @property
    def listener(self) -> DaemonListener | None: ...

    def reload(self) -> ReloadResult: ...

    def request_stop(self) -> None: ...

    def cancel(self, transfer: Transfer) -> bool: ...

    def hold(self, transfer: Transfer, held: HeldSource) -> None: ...

    def submitted(self, peer: str) -> None: ...

    def progress(self, transfer: Transfer) -> int: ...


class Routes:
    def __init__(self, daemon: TransferDesk) -> None:
        self.daemon = daemon

    async def handle(self, method: str, target: str, headers: dict[str, str], body: Any,
                     requester: Requester | None = None) -> tuple[int, Any]:
        requester = requester or Requester()
        path = target.split("?", 1)[0].rstrip("/")
        parts = path.split("/")[1:]
        if parts[:1] != ["v1"]:
            return 404, {"error": f"{path}: not found; the API is under /v1/"}
        rest = parts[1:]
        if rest == ["status"] and method == "GET":
            return 200, self._status()
        if rest == ["reload"] and method == "POST":
            result = self.daemon.reload()
            return (200 if result.taken else 422), dataclasses.asdict(result)
        if rest == ["drain"] and method == "POST":
            active = self.daemon.active_count
            self.daemon.request_stop()
            return 202, {"draining": True, "active": active, "drain_seconds": self.daemon.config.drain_s}
        if rest == ["transfers"]:
            if method == "POST":
                return self._submit(headers, body, requester)
            if method == "GET":
                return self._list(target)
        if len(rest) >= 2 and rest[0] == "transfers":
            transfer = self._store().get(rest[1])
            if transfer is None:
                return 404, {"error": f"transfer {rest[1]}: not found"}
            if len(rest) == 2 and method == "GET":
                return 200, self._view(transfer)
            if rest[2:] == ["cancel"] and method == "POST":
                if not self.daemon.cancel(transfer):
                    return 409, {"error": f"transfer {transfer.id} already {transfer.state}",
                                 **self._view(transfer)}
                return 200, self._view(transfer)
        return 405 if path.startswith("/v1/") else 404, {"error": f"{method} {path}: not supported"}

    def _list(self, target: str) -> tuple[int, Any]:
        query = {k: v[-1] for k, v in parse_qs(target.partition("?")[2]).items()}
        state, peer, limit = query.get("state"), query.get("peer"), query.get("limit", str(LIST_LIMIT))
        if state is not None and state not in STATES:
            return 400, {"error": f"state: {state!r} is not valid; use one of {', '.join(STATES)}"}
        if not limit.isdigit() or int(limit) < 1:
            return 400, {"error": f"limit: {limit!r} is not valid; use a whole number >= 1"}
        transfers = self._store().history(int(limit), state, peer)
        return 200, {"transfers": [self._view(t) for t in transfers]}

    def _store(self) -> TransferStore:
        assert self.daemon.store is not None
        return self.daemon.store

    def _status(self) -> dict[str, Any]:
        config = self.daemon.config
        return {"site": config.site, "version": __version__, "protocol_version": PROTOCOL_VERSION,
                "paths": [format_endpoint(a) for a in config.listen],
                "instance": self.daemon.peers.instance,
                "peers": [{"name": p.name, "paths": [format_endpoint(a) for a in p.paths],
                           **self._peer_state(p.name)} for p in config.peers],
                "draining": self.daemon.draining,
                "asyncio_tasks": len(asyncio.all_tasks())}  # a leak shows here (benchmarks/soak.py)

    def _peer_state(self, name: str) -> dict[str, Any]:
        """Our data ports for the peer (bound at start) and the one session with it, if any."""
        listener = self.daemon.listener
        ports = [] if listener is None else [format_endpoint(p.address) for p in listener.data_ports(name)]
        session = self.daemon.peers.current.get(name)
        live = None
        if session is not None and session.end_reason is None:
            live = {"dialled_by": dialled_by(session, self.daemon.config.site),
                    "peer_instance": session.peer_instance}
        return {"data_ports": ports, "session": live}

    def _submit(self, headers: dict[str, str], body: Any, requester: Requester) -> tuple[int, Any]:
        if self.daemon.draining:
            return 503, {"error": "the gateway is draining (shutting down); submit again after restart"}
        if not isinstance(body, dict):
            return 400, {"error": "the body must be a JSON object {peer, source, dest?, overwrite?}"}
        unknown = set(body) - _SUBMIT_FIELDS
        if unknown:
            valid = ", ".join(sorted(_SUBMIT_FIELDS))
            return 400, {"error": f"{sorted(unknown)[0]}: unknown field; valid: {valid}"}
        peer, source = body.get("peer"), body.get("source")
        if not isinstance(peer, str) or self.daemon.config.peer(peer) is None:
            names = ", ".join(p.name for p in self.daemon.config.peers) or "none configured"
            return 400, {"error": f"peer: {peer!r} is not a configured peer; use one of: {names}"}
        if not isinstance(source, str) or not source.startswith("/"):
            return 400, {"error": "source: give the absolute path of a file or directory"}
        dest = body.get("dest", default_dest(source))
        overwrite = body.get("overwrite", False)
        follow = body.get("follow_symlinks", self.daemon.config.follow_symlinks)
        key = body.get("idempotency_key", headers.get("idempotency-key"))
        flags_ok = isinstance(overwrite, bool) and isinstance(follow, bool)
        if not isinstance(dest, str) or not flags_ok or not (
                key is None or isinstance(key, str) and 0 < len(key) <= 200):
            return 400, {"error": "dest must be a string, overwrite and follow_symlinks booleans, "
                                  "idempotency_key a string of 1..200 characters"}
        submission = Submission(peer, source, dest, overwrite)
        store = self._store()
        existing = store.get_by_key(key) if key is not None else None
        if existing is not None and existing.state != "needs-resubmit":
            if existing.submission != submission:
                return 409, {"error": str(SubmitConflict(f"idempotency key {key!r} was used for another "
                                                         f"submission ({existing.id})"))}
            return 200, self._view(existing)  # the same key again: its descriptors are not needed
        try:
            held = held_source(self.daemon.config, body, requester, follow)
        except Refused as exc:
            return self._refuse(requester, source, str(exc))
        except SourceError as exc:
            return 422, {"error": str(exc)}
        try:
            pieces = plan(submission, held, self.daemon.config.piece_bytes)
            transfer, new = store.record_submission(submission, key)
        except (SourceError, SubmitConflict) as exc:
            held.close()
            return (409 if isinstance(exc, SubmitConflict) else 422), {"error": str(exc)}
        who = requester.describe()
        if new:
            store.update(transfer, bytes_total=sum(p.size for p in pieces), source_kind=held.kind,
                         requester=who, api_client=requester.certificate, follow_symlinks=follow)
        else:  # needs-resubmit: fresh descriptors continue it
            store.fire(transfer, TransferEvent.RESUBMIT, reason=None, requester=who,
                       source_kind=held.kind, api_client=requester.certificate)
        self.daemon.hold(transfer, held)
        log.info("transfer %s %s by %s: %s -> %s:%s (%d files%s)", transfer.id,
                 "submitted" if new else "resubmitted", who, source, peer, dest,
                 sum(1 for i in held.items if i.file is not None),
                 f"; {describe_skipped(held.skipped)}" if held.skipped else "")
        self.daemon.submitted(peer)
        return (201 if new else 200), self._view(transfer)

    def _refuse(self, requester: Requester, source: str, reason: str) -> tuple[int, Any]:
        log.warning("refused a submission of %s from %s: %s", source, requester.describe(), reason)
        return 403, {"error": reason}

    def _view(self, transfer: Transfer) -> dict[str, Any]:
        out = transfer.to_json()
        out["bytes_done"] = self.daemon.progress(transfer)
        out["final"] = transfer.state in FINAL
        return out
