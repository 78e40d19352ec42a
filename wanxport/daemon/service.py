"""``wanxport gateway CONFIG.toml``: one long-lived gateway process, composed.

Start binds everything the daemon will ever listen on (every path's UDP port, every
configured peer's data ports, the metrics address, the API socket) before it announces
READY, so nothing can take a port in between and a port in use is a one-line error at
start. Then three things run on one event loop:

* one session per peer, whoever dialled it (``peers.py`` keeps one when two meet), on
  that peer's data ports (``ports.py``); files arrive over it into
  ``DATA_DIR/received/<peer>/`` and ours leave over it;
* one worker per configured peer: it dials the peer when there is no session (at start,
  and when there is work; backing off while the peer is away), sends the transfers one
  after another over the session, and re-queues a transfer whose session failed;
* the API (``routes.py``), the systemd watchdog, and the signal handlers: SIGHUP
  reloads (``reload.py``), SIGTERM/SIGINT drain.

A transfer the peer refused for a full disk (its reason names ``ENOSPC``) is
paused, not failed and not retried at once: the peer keeps the pieces it verified
(``inbox.py``), and the transfer is queued again after a backoff (1 s, doubling up
to 60 s) until the space returns, resuming from those pieces. Automatic because the
space comes back through someone else's action on the receiving host (files moved
away, a volume grown), which the sending side's operator does not see; a transfer
that waited for a human to say "retry" would sit there forever. Backoff because
each attempt costs a session and the digests of the source's pieces.

Drain: submissions are refused from the first moment, running transfers get
``drain_seconds`` to finish; what is still running then is interrupted and stays
queued for the next start.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from wanxport.control import CertificateError, ControlConnectError
from wanxport.gateway.config import Address
from wanxport.gateway.files import SOURCE_CHANGED, SourceChanged
from wanxport.gateway.handshake import SetupError, initiate
from wanxport.gateway.metrics import GatewayMetrics, MetricsServer
from wanxport.gateway.progress import acked_bytes
from wanxport.gateway.session import GatewaySession
from wanxport.gateway.transfer import receive_files
from wanxport.sources import raise_open_file_limit

from .api import ApiServer, TlsListen
from .config import DaemonConfig, PeerConfig, describe
from .durable import remove_stale_temporaries
from .heap import trim_periodically
from .inbox import Inbox
from .listener import DaemonListener
from .metrics import DaemonCollector
from .notify import Notifier
from .outbox import HeldSource, OutgoingPiece, SourceError, plan, resume, send, source_ids
from .pathcache import PathCache
from .peers import CANCELLED, IDLE, RECONNECT, RETRY_REASONS, SHUTDOWN, PeerSessions
from .ports import PeerPorts
from .reload import reload
from .routes import Routes
from .store import Transfer, TransferStore
from .submission import reopen
from .tally import Tally

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 30.0
DISK_FULL_RETRY_START_S = 1.0
DISK_FULL_RETRY_MAX_S = 60.0
DRAIN_GRACE_S = 5.0  # after drain_seconds: for the workers to record and close


class DaemonError(Exception):
    """The daemon cannot start as configured (one line)."""


class GatewayDaemon:
    def __init__(self, config: DaemonConfig, notifier: Notifier | None = None, *,
                 signals: bool = True) -> None:
        self.config = config
        self.signals = signals  # in-process tests run two daemons on one loop: no handlers
        self.notifier = notifier or Notifier()
        self.metrics = GatewayMetrics("gateway")
        self.store: TransferStore | None = None
        self.listener: DaemonListener | None = None
        self.metrics_server: MetricsServer | None = None
        self.api: ApiServer | None = None
        self.draining = False
        self._stopped = asyncio.Event()
        self._wake = asyncio.Event()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._work: dict[str, asyncio.Event] = {}  # per peer: a transfer was submitted
        self._refresh: set[str] = set()  # peers whose paths a reload changed
        self.peers = PeerSessions(config.site)  # the one session with each peer
        self.inboxes: dict[GatewaySession, Inbox] = {}  # each live session's received files
        self.dialled = 0  # sessions this gateway dialled that were kept
        self._active: dict[str, tuple[asyncio.Task[str | None], GatewaySession, int]] = {}
        self._cancelled: set[str] = set()
        self._skipped: dict[str, int] = {}  # transfer id -> bytes the peer held at a resume
        self._disk_full: dict[str, int] = {}  # transfer id -> pauses in a row for a full disk
        self._sources: dict[str, HeldSource] = {}  # transfer id -> its open source, until final
        self._slots = asyncio.Semaphore(config.limits.concurrent_transfers)
        self._tasks: list[asyncio.Task[Any]] = []
        self._receiving: set[asyncio.Task[None]] = set()  # one per live session

    # -- start and stop --------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        try:
            config.received_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DaemonError(f"data_dir: {config.data_dir}: cannot create ({exc.strerror or exc})") from None
        log.info("open files: up to %d (each queued or active transfer holds its source's)",
                 raise_open_file_limit())
        stale = remove_stale_temporaries(config.data_dir)
        if stale:
            log.info("removed %d temporary state files a previous run left mid-write", stale)
        self.store = TransferStore(config.data_dir / "transfers.json")
        self.store.on_final = self._release_source
        self.path_cache = PathCache(config.data_dir / "path-cache.json")
        self.listener = DaemonListener(config.listen, config.identity, config.ca, config.gateway_options(),
                                       self._peer_dir, Inbox, PeerPorts(config.dscp), self.peers, self._adopt)
        try:
            await self.listener.start()
            self.listener.peer_ports.bind(config.peers, config.listen)
        except OSError as exc:
            self.listener.close()
            raise DaemonError(f"listen: port in use or not available: {exc.strerror or exc}") from None
        except CertificateError as exc:
            raise DaemonError(f"identity: {exc}") from None
        self.metrics.listener = self.listener
        try:
            if config.metrics is not None:
                self.metrics_server = MetricsServer(self.metrics, config.metrics)
                self.metrics_server.registry.register(DaemonCollector(self))
                log.info("metrics on %s", self.metrics_server.url)
            tls = None
            if config.api_tcp is not None:
                tls = TlsListen(*config.api_tcp, self.listener.cert, self.listener.key, self.listener.ca,
                                frozenset(config.api_clients))
            self.api = ApiServer(config.api_socket, Routes(self).handle, tls)
            await self.api.start()
        except OSError as exc:
            self.listener.close()
            raise DaemonError(f"cannot listen: {exc.strerror or exc} ({exc.filename or ''})") from None
        self._tasks = [asyncio.create_task(self._schedule_loop()),
                       asyncio.create_task(self.notifier.feed_watchdog()),
                       asyncio.create_task(trim_periodically())]
        if self.signals:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, self.reload)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        log.info("gateway ready: %s; API on %s%s", describe(config), config.api_socket,
                 f" and TLS {self.api.tcp_address}" if self.api.tcp_address else "")
        self.notifier.ready(describe(config))

    def request_stop(self) -> None:
        if not self.draining:
            log.info("draining: no new submissions; %d transfers get %.0f s to finish",
                     len(self._active), self.config.drain_s)
            self.draining = True
            self.notifier.stopping()
            self._wake.set()
            self._stopped.set()

    async def serve(self) -> None:
        """Until SIGTERM/SIGINT (or ``request_stop``), then drain and close."""
        await self._stopped.wait()
        await self._drain()
        await self.close()

    async def _drain(self) -> None:
        """Transfers in flight get ``drain_seconds``; then they are interrupted (and stay
        queued), and the workers get a few seconds to record that and say goodbye (a
        worker still dialling is cancelled by ``close``)."""
        active = [task for task, _, _ in self._active.values()]
        if active:
            _, pending = await asyncio.wait(active, timeout=self.config.drain_s)
            for task in pending:
                task.cancel()  # interrupted: the transfer stays queued (see _run_one)
        workers = list(self._workers.values())
        if workers:
            await asyncio.wait(workers, timeout=DRAIN_GRACE_S)

    async def close(self) -> None:
        if self.signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        tasks = [*self._tasks, *self._receiving, *self._workers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.api is not None:
            await self.api.close()
        if self.listener is not None:
            self.listener.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        for held in self._sources.values():
            held.close()
        self._sources.clear()

    def reload(self) -> None:
        """SIGHUP: re-read the file and apply what changed (``reload.py``)."""
        self.notifier.reloading()
        before = {p.name: p for p in self.config.peers}
        if reload(self):
            after = {p.name: p for p in self.config.peers}
            for name, peer in before.items():
                if after.get(name) != peer:  # paths or rate caps changed, or the peer was removed
                    self._refresh.add(name)  # its warm session ends after the current transfer
                    self._work_for(name).set()
            self._wake.set()  # a peer may have come back into the config
        self.notifier.ready(describe(self.config))

    # -- receiving -------------------------------------------------------------

    def _peer_dir(self, peer_name: str) -> Path | None:
        peer = self.config.peer(peer_name)
        return None if peer is None else self.config.received_dir / peer.name

    @property
    def sessions(self) -> dict[str, GatewaySession]:
        """The live session with each peer (ours or theirs: one per pair)."""
        return self.peers.current

    def _adopt(self, session: GatewaySession, inbox: Inbox) -> None:
        """A session with a peer was set up (dialled or accepted): receive over it from now
        on, and wake the peer's worker, which sends over it."""
        inbox.bind(session)  # before its control reader first runs: no resume query unanswered
        self.inboxes[session] = inbox
        task = asyncio.create_task(self._receive_session(session, inbox))
        self._receiving.add(task)
        task.add_done_callback(self._receiving.discard)
        self._work_for(session.peer_name).set()

    async def _receive_session(self, session: GatewaySession, inbox: Inbox) -> None:
        with self.metrics.tracking(session):
            try:
                result = await receive_files(session, inbox, show_progress=False)
            finally:
                await session.close(SHUTDOWN)  # still open here only when we are closing
                self.peers.ended(session)
                self.inboxes.pop(session, None)
                if self.listener is not None:
                    self.listener.session_ended()
        log.info("session with %s ended (%s): %d files received%s", session.peer_name, session.end_reason,
                 result.file_count, f" ({result.error})" if result.error else "")

    # -- sending ---------------------------------------------------------------

    def hold(self, transfer: Transfer, held: HeldSource) -> None:
        """Keep a submission's open source until the transfer is final."""
        old = self._sources.pop(transfer.id, None)
        if old is not None:
            old.close()
        self._sources[transfer.id] = held

    def _release_source(self, transfer: Transfer) -> None:
        held = self._sources.pop(transfer.id, None)
        if held is not None:
            held.close()

    def _source_of(self, transfer: Transfer) -> HeldSource | None:
        """The transfer's open source; a "path" one opened again after a restart (None:
        a passed descriptor that is gone, the transfer then needs a resubmission)."""
        held = self._sources.get(transfer.id)
        if held is None and transfer.source_kind == "path":
            held = self._sources[transfer.id] = reopen(self.config, transfer.submission.source,
                                                       transfer.api_client, transfer.follow_symlinks)
        return held

    def submitted(self, peer: str) -> None:
        self._work_for(peer).set()
        self._wake.set()

    def _work_for(self, peer: str) -> asyncio.Event:
        return self._work.setdefault(peer, asyncio.Event())

    async def _schedule_loop(self) -> None:
        """One worker per configured peer (started at start and for peers a reload adds),
        plus one for any peer that only queued transfers name (a removed one)."""
        assert self.store is not None
        while not self.draining:
            names = [p.name for p in self.config.peers] + [t.submission.peer for t in self.store.queued()]
            for peer in dict.fromkeys(names):
                if peer not in self._workers:
                    self._workers[peer] = asyncio.create_task(self._peer_worker(peer))
            await self._wake.wait()
            self._wake.clear()

    def _queued_for(self, peer: str) -> list[Transfer]:
        assert self.store is not None
        return [t for t in self.store.queued() if t.submission.peer == peer]

    async def _peer_worker(self, peer_name: str) -> None:
        """Serve the session with ``peer_name`` (sending its queue over it): dial one at start
        and whenever there is work and none, redial with backoff while the peer is away; a
        session idle both ways for ``warm_seconds`` is closed."""
        assert self.store is not None
        backoff = BACKOFF_START_S
        warm_up = True  # the first session is set up before any transfer asks for it
        work = self._work_for(peer_name)
        try:
            while not self.draining:
                peer = self.config.peer(peer_name)
                queue = self._queued_for(peer_name)
                if peer is None:
                    for transfer in queue:
                        self.store.update(transfer, state="failed",
                                          reason=f"peer {peer_name!r} was removed from the config")
                    return
                session = self._live(peer_name)
                if session is None:
                    if not queue and not warm_up:
                        work.clear()
                        await self._until(work.wait())  # a submission, or the peer dialled us
                        continue
                    dialled = await self._dial(peer)
                    if isinstance(dialled, Exception):
                        if self._live(peer_name) is not None:
                            continue  # the peer's dial is the one kept (peers.py)
                        reason = f"waiting for peer {peer_name}: {dialled}"
                        for transfer in queue:
                            if transfer.reason != reason:
                                self.store.update(transfer, reason=reason)
                        log.info("%s (retry in %.1f s)", reason, backoff)
                        await self._until(asyncio.sleep(backoff))
                        backoff = min(backoff * 2, BACKOFF_MAX_S)
                        continue
                    session = dialled
                backoff = BACKOFF_START_S
                warm_up = not await self._serve_session(session, peer_name, peer.paths)
        finally:
            self._workers.pop(peer_name, None)
            self._wake.set()  # a submission that came while we finished gets a new worker

    def _live(self, peer_name: str) -> GatewaySession | None:
        session = self.peers.current.get(peer_name)
        return session if session is not None and session.end_reason is None else None

    async def _dial(self, peer: PeerConfig) -> GatewaySession | Exception:
        """Set up a session to ``peer`` on its data ports, unless the one-per-pair rule keeps
        the peer's own dial (then the exception says so)."""
        assert self.listener is not None
        directory = self._peer_dir(peer.name)
        assert directory is not None
        inbox = Inbox(directory)
        ports = self.listener.data_ports(peer.name)
        try:
            async with self.peers.admission(peer.name, dialler=self.config.site) as admission:
                session = await initiate(list(peer.paths[:len(ports)]), self.config.identity, self.config.ca,
                                         self.config.gateway_options(peer), inbox.allocate, ports=ports,
                                         instance=self.peers.instance, decide=admission.decide,
                                         watch_receiving=True)
                admission.adopt(session)
                self._adopt(session, inbox)
        except (ControlConnectError, SetupError, CertificateError, OSError) as exc:
            return exc
        self.dialled += 1
        return session

    async def _until(self, awaitable: Any) -> None:
        """Wait for ``awaitable`` or the start of a drain, whichever comes first."""
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, stop):
                pending.cancel()

    async def _serve_session(self, session: GatewaySession, peer_name: str,
                             paths: tuple[Address, ...]) -> bool:
        """Send the peer's queue over ``session``; close it once idle both ways for
        ``warm_seconds``. Returns True when it ended idle (no need to redial), False else."""
        next_shard = 0
        work = self._work_for(peer_name)
        self.path_cache.resume(peer_name, paths, session)
        reason = SHUTDOWN  # the loop below ends by itself only for a drain (or a session that ended)
        try:
            while not self.draining and session.end_reason is None:
                if peer_name in self._refresh:  # its paths changed: the next session takes them
                    self._refresh.discard(peer_name)
                    reason = RECONNECT
                    return False
                queue = self._queued_for(peer_name)
                if queue:
                    next_shard = await self._run_one(session, queue[0], next_shard)
                    self.path_cache.save(peer_name, paths, session)
                    continue
                work.clear()
                seen = _activity(session)
                ended = asyncio.ensure_future(session.wait_ended())
                try:
                    await asyncio.wait_for(self._until(_first(work.wait(), ended)), self.config.warm_s)
                except TimeoutError:
                    if _activity(session) != seen:
                        continue  # the peer is sending to us
                    log.info("session with %s idle for %.0f s: closed", peer_name, self.config.warm_s)
                    reason = IDLE
                    return True
                finally:
                    ended.cancel()
            return session.end_reason == IDLE
        except ConnectionError:  # SessionFailed, or the endpoint closed under a send
            return False
        finally:
            self.peers.ended(session)
            self.path_cache.save(peer_name, paths, session)
            await session.close(reason)

    async def _run_one(self, session: GatewaySession, transfer: Transfer, first_shard: int) -> int:
        """Send one transfer; returns the next free shard id of the session."""
        assert self.store is not None
        try:
            held = self._source_of(transfer)
            if held is None:
                self.store.update(transfer, state="needs-resubmit",
                                  reason="the source's descriptors are gone: submit it again with the "
                                         "same idempotency key")
                return first_shard
            pieces = plan(transfer.submission, held, self.config.piece_bytes, first_shard)
        except (SourceError, OSError) as exc:
            self.store.update(transfer, state="failed", reason=str(exc))
            return first_shard
        async with self._slots:
            resuming = transfer.attempts > 0  # an earlier attempt may have left pieces there
            self.store.update(transfer, state="active", reason=None, attempts=transfer.attempts + 1,
                              bytes_total=sum(p.size for p in pieces), bytes_done=0)
            tally = Tally(session)
            task = asyncio.create_task(self._send(session, transfer, pieces, resuming))
            self._active[transfer.id] = (task, session, acked_bytes(session.endpoint))
            try:
                reason = await task
            except asyncio.CancelledError:
                if transfer.id in self._cancelled:
                    self.store.update(transfer, state="cancelled", reason="cancelled by request")
                else:
                    self.store.update(transfer, state="queued", reason="interrupted by shutdown")
                # The peer stops receiving it; the peer's own transfers on this session are
                # queued again there and resume on the next session (peers.RETRY_REASONS).
                await session.close(CANCELLED)
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the daemon is closing, not just this transfer
                return first_shard + len(pieces)
            except ConnectionError as exc:  # SessionFailed, or the endpoint closed under the send
                reason = str(exc)
            finally:
                self._active.pop(transfer.id, None)
                self._cancelled.discard(transfer.id)
        if reason is not None and reason.startswith(SOURCE_CHANGED):
            # The peer learns why over the cancel path (the session ends with the reason
            # and is dialled again); its partial file of this version is never resumed.
            log.warning("transfer %s failed: %s", transfer.id, reason)
            self.store.update(transfer, state="failed", reason=reason)
            await session.close(f"{CANCELLED}: {reason}")
            return first_shard + len(pieces)
        if reason is None:
            stats = tally.finish(transfer.bytes_total)
            stats["skipped_bytes"] = self._skipped.pop(transfer.id, 0)
            self.store.update(transfer, state="done", bytes_done=transfer.bytes_total, stats=stats)
        elif "(ENOSPC)" in reason and not self.draining:
            self._pause(transfer, reason)
            return first_shard + len(pieces)
        elif session.failure is not None or self.draining or _retry(session):
            self.store.update(transfer, state="queued", reason=f"session lost, will retry: {reason}")
        else:
            self.store.update(transfer, state="failed", reason=reason)
        self._disk_full.pop(transfer.id, None)  # the next pause starts its backoff afresh
        return first_shard + len(pieces)

    def _pause(self, transfer: Transfer, reason: str) -> None:
        """The peer's disk is full: wait (backing off), then queue the transfer again."""
        pauses = self._disk_full[transfer.id] = self._disk_full.get(transfer.id, 0) + 1
        delay = min(DISK_FULL_RETRY_START_S * 2 ** (pauses - 1), DISK_FULL_RETRY_MAX_S)
        assert self.store is not None
        self.store.update(transfer, state="paused", bytes_done=0,
                          reason=f"paused, the peer's disk is full; retry in {delay:.0f} s: {reason}")
        log.warning("transfer %s paused (%s); retry in %.0f s", transfer.id, reason, delay)
        asyncio.get_running_loop().call_later(delay, self._unpause, transfer.id)

    def _unpause(self, transfer_id: str) -> None:
        assert self.store is not None
        transfer = self.store.get(transfer_id)
        if transfer is not None and transfer.state == "paused" and not self.draining:
            self.store.update(transfer, state="queued")
            self.submitted(transfer.submission.peer)

    async def _send(self, session: GatewaySession, transfer: Transfer, pieces: list[OutgoingPiece],
                    resuming: bool) -> str | None:
        assert self.store is not None
        sent_ids = transfer.source_ids
        self.store.update(transfer, source_ids=source_ids(pieces))
        if resuming:
            try:
                pieces, held = await resume(session, pieces, self.config.piece_bytes, sent_ids)
            except SourceChanged as exc:  # while its pieces were hashed for the receiver
                return str(exc)
            self._skipped[transfer.id] = held
            log.info("transfer %s resumes: the peer holds %d of %d bytes", transfer.id, held,
                     transfer.bytes_total)
        return await send(session, pieces)

    def progress(self, transfer: Transfer) -> int:
        active = self._active.get(transfer.id)
        if active is None:
            return transfer.bytes_done
        _, session, baseline = active
        return min(transfer.bytes_total, max(0, acked_bytes(session.endpoint) - baseline))

    def cancel(self, transfer: Transfer) -> bool:
        """Cancel a queued or active transfer; False when it already ended."""
        assert self.store is not None
        if transfer.state in ("queued", "paused", "needs-resubmit"):
            self._disk_full.pop(transfer.id, None)
            self.store.update(transfer, state="cancelled", reason="cancelled by request")
            return True
        active = self._active.get(transfer.id)
        if active is None:
            return False
        self._cancelled.add(transfer.id)
        active[0].cancel()
        return True


def _retry(session: GatewaySession) -> bool:
    """The session ended for a reason that says nothing about its transfers (``peers.py``)."""
    return (session.end_reason or "").startswith(RETRY_REASONS)


def _activity(session: GatewaySession) -> tuple[int, ...]:
    """What moved over ``session`` so far, both ways (a shard still arriving counts by its
    bytes): the session is idle while this stays put."""
    stats = session.endpoint.session.stats()
    return (stats.shards_submitted, stats.acked_bytes, stats.shards_received, stats.bytes_received,
            stats.receiving_bytes)


async def _first(*awaitables: Any) -> None:
    """Until the first of ``awaitables`` is done (the others are cancelled)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def run_daemon(config: DaemonConfig, notifier: Notifier | None = None) -> int:
    daemon = GatewayDaemon(config, notifier)
    await daemon.start()
    await daemon.serve()
    return 0
