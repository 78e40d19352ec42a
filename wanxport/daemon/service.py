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

A destination the peer refuses to write (read-only, permission denied: its reason
names ``EROFS``, ``EACCES``, ``EPERM``; ``desterrors.py``) fails the transfer at once,
at both ends. A session that ends without finishing anything is not dialled again at
once either: the worker backs off as for an unreachable peer, so no error path spins.

Every state change is an event of ``lifecycle.py``'s table; a transfer with no byte
acknowledged for ``[transfer] stall_seconds`` shows ``stalled`` with what its peer
looks like, and goes back to ``active`` when bytes move again. The log has one INFO
line per transfer submitted, finished (bytes, seconds, rate) or failed (the reason,
at WARNING), and a WARNING for a peer unreachable longer than
``PEER_UNREACHABLE_WARN_S``.

Reload (SIGHUP or ``POST /v1/reload``) applies the new rate caps to the running
sessions (``GatewaySession``'s core session, ``set_rate_caps``); a peer whose paths
changed gets a new session after its current transfer.

Drain: submissions are refused from the first moment, running transfers get
``drain_seconds`` to finish; what is still running then is interrupted and stays
queued for the next start.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from wanxport.control import CertificateError, ControlConnectError
from wanxport.gateway.config import Address
from wanxport.gateway.files import SOURCE_CHANGED, SourceChanged
from wanxport.gateway.handshake import SetupError, initiate
from wanxport.gateway.metrics import GatewayMetrics, MetricsServer
from wanxport.gateway.session import GatewaySession
from wanxport.gateway.transfer import receive_files
from wanxport.sources import raise_open_file_limit
from wanxport.units import format_rate, format_size

from .api import ApiServer, TlsListen
from .cancels import UnsentCancels
from .certwatch import IdentityUnusable, check_at_start, watch_expiry
from .config import ConfigError, DaemonConfig, PeerConfig, check_receive_group, describe
from .desterrors import DestError, DestErrorKind, classify
from .durable import remove_stale_temporaries
from .inbox import Inbox
from .lifecycle import TransferEvent
from .listener import DaemonListener
from .lock import DataDirBusy, DataDirLock
from .memtrim import trim_periodically
from .metrics import DaemonCollector
from .notify import Notifier
from .outbox import HeldSource, OutgoingPiece, SourceError, plan, resume, send, source_ids, tagged
from .outcomes import CountingStore
from .pathcache import PathCache
from .peers import ABORTED, CANCELLED, IDLE, RECONNECT, RETRY_REASONS, SHUTDOWN, PeerSessions
from .ports import PeerPorts
from .reload import ReloadResult, certificate_digest, reload
from .routes import Routes
from .store import Transfer
from .submission import reopen
from .tally import Tally

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 30.0
DISK_FULL_RETRY_START_S = 1.0
DISK_FULL_RETRY_MAX_S = 60.0
DRAIN_GRACE_S = 5.0  # after drain_seconds: for the workers to record and close
# A peer unreachable this long is worth a WARNING: shorter absences are restarts and
# reconnects that heal by themselves (and are logged at INFO); a minute without a session
# is what an operator must look at (a host down, a firewall, an expired certificate).
PEER_UNREACHABLE_WARN_S = 60.0
E = TransferEvent


class DaemonError(Exception):
    """The daemon cannot start as configured (one line)."""


class GatewayDaemon:
    def __init__(self, config: DaemonConfig, notifier: Notifier | None = None, *,
                 signals: bool = True) -> None:
        self.config = config
        self.signals = signals  # in-process tests run two daemons on one loop: no handlers
        self.notifier = notifier or Notifier()
        self.metrics = GatewayMetrics("gateway")
        self.store: CountingStore | None = None
        self.listener: DaemonListener | None = None
        self.metrics_server: MetricsServer | None = None
        self.api: ApiServer | None = None
        self.draining = False
        self.identity_digest = certificate_digest(config.identity)  # a reload tells a renewal by it
        self._stopped = asyncio.Event()
        self._wake = asyncio.Event()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._work: dict[str, asyncio.Event] = {}  # per peer: a transfer was submitted
        self._refresh: set[str] = set()  # peers whose paths a reload changed
        self.peers = PeerSessions(config.site)  # the one session with each peer
        self.inboxes: dict[GatewaySession, Inbox] = {}  # each live session's received files
        self.received_skipped: Counter[str] = Counter()  # entries not recreated, by reason (metrics)
        self.dialled = 0  # sessions this gateway dialled that were kept
        self._active: dict[str, tuple[asyncio.Task[str | None], GatewaySession, int]] = {}
        self._cancelled: set[str] = set()
        self._held: dict[str, int] = {}  # transfer id -> bytes the peer held when this attempt began
        self._last_progress: dict[str, tuple[int, float]] = {}  # active transfer -> (bytes, since)
        self._away_since: dict[str, float] = {}  # peer -> when dialling it first failed
        self._away_warned: set[str] = set()
        self._unsent_cancels = UnsentCancels(config.piece_bytes)
        self._disk_full: dict[str, int] = {}  # transfer id -> pauses in a row for a full disk
        self._sources: dict[str, HeldSource] = {}  # transfer id -> its open source, until final
        self._slots = asyncio.Semaphore(config.limits.concurrent_transfers)
        self._tasks: list[asyncio.Task[Any]] = []
        self._receiving: set[asyncio.Task[None]] = set()  # one per live session
        self.lock = DataDirLock(config.data_dir)

    # -- start and stop --------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            self.lock.release()  # a start that failed leaves the data_dir to the next one
            raise

    async def _start(self) -> None:
        config = self.config
        try:
            check_at_start(config.identity, config.ca, config.site)
            check_receive_group(config)
        except (IdentityUnusable, ConfigError) as exc:
            raise DaemonError(str(exc)) from None
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()  # before anything else in data_dir (or the API socket) is touched
            config.received_dir.mkdir(exist_ok=True)
        except DataDirBusy as exc:
            raise DaemonError(str(exc)) from None
        except OSError as exc:
            raise DaemonError(f"data_dir: {config.data_dir}: cannot create ({exc.strerror or exc})") from None
        log.info("open files: up to %d (each queued or active transfer holds its source's)",
                 raise_open_file_limit())
        stale = remove_stale_temporaries(config.data_dir)
        if stale:
            log.info("removed %d temporary state files a previous run left mid-write", stale)
        self.store = CountingStore(config.data_dir / "transfers.json")
        self.store.on_final = self._release_source
        self.path_cache = PathCache(config.data_dir / "path-cache.json")
        self.listener = DaemonListener(config.listen, config.identity, config.ca, config.gateway_options(),
                                       self._peer_dir, self._inbox, PeerPorts(config.dscp), self.peers,
                                       self._adopt)
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
                       asyncio.create_task(self._watch_stalls()),
                       asyncio.create_task(self.notifier.feed_watchdog()),
                       asyncio.create_task(trim_periodically()),
                       asyncio.create_task(watch_expiry(self._identity_pem))]
        if self.signals:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        log.info("gateway ready: %s; API on %s%s", describe(config), config.api_socket,
                 f" and TLS {self.api.tcp_address}" if self.api.tcp_address else "")
        self.notifier.ready(describe(config))

    def _on_sighup(self) -> None:
        self.reload()

    def _identity_pem(self) -> Path:
        return self.config.identity.with_name(self.config.identity.name + ".pem")

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
        self.lock.release()  # last: the data_dir is ours until everything above let go of it

    def reload(self) -> ReloadResult:
        """SIGHUP or ``POST /v1/reload``: re-read the file and apply what changed
        (``reload.py``)."""
        self.notifier.reloading()
        before = {p.name: p for p in self.config.peers}
        result = reload(self)
        if result.taken:
            for name, peer in before.items():
                if _route_changed(peer, self.config.peer(name)):  # or the peer was removed
                    self._refresh.add(name)  # its warm session ends after the current transfer
                    self._work_for(name).set()
            for session in self.peers.current.values():
                self._apply_rates(session)
            self._wake.set()  # a peer may have come back into the config
        self.notifier.ready(describe(self.config))
        return result

    def _apply_rates(self, session: GatewaySession) -> None:
        """The config's rate caps for the session's peer (its own, or ``[limits]``'s), in
        force on the running session from its next packet."""
        peer = self.config.peer(session.peer_name)
        caps = self.config.gateway_options(peer).rate_caps_bps if peer is not None else ()
        session.set_rate_caps(tuple(caps))

    # -- receiving -------------------------------------------------------------

    def _inbox(self, directory: Path) -> Inbox:
        return Inbox(directory, self.config.receive.policy, self.received_skipped)

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
        self._apply_rates(session)  # a session the peer dialled was set up with [limits]' caps
        task = asyncio.create_task(self._receive_session(session, inbox))
        self._receiving.add(task)
        task.add_done_callback(self._receiving.discard)
        self._work_for(session.peer_name).set()

    async def _receive_session(self, session: GatewaySession, inbox: Inbox) -> None:
        with self.metrics.tracking(session):
            reason = SHUTDOWN  # cancelled: the daemon is closing
            try:
                result = await receive_files(session, inbox, show_progress=False)
                # Still open only when receiving failed here without a word to the peer.
                reason = f"receiving failed at {self.config.site}: {result.error}"
            finally:
                await session.close(reason)
                self.peers.ended(session)
                self.inboxes.pop(session, None)
                if self.listener is not None:
                    self.listener.session_ended()
        # Whose reason it is: the peer's "shutting down" is its restart, not ours.
        by = f"by {session.peer_name}" if session.peer_reason is not None else "here"
        log.info("session with %s ended %s (%s): %d files received%s", session.peer_name, by,
                 session.end_reason, result.file_count, f" ({result.error})" if result.error else "")

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

    def _files_at_peer(self, transfer: Transfer) -> dict[str, int]:
        """The files (name at the peer -> size) an attempt of ``transfer`` sent; empty when
        its source is gone (a passed descriptor after a restart: the peer keeps them)."""
        try:
            held = self._source_of(transfer)
            pieces = plan(transfer.submission, held, self.config.piece_bytes) if held else []
        except (SourceError, OSError) as exc:
            pieces = []
            log.info("transfer %s: its files cannot be named for the peer (%s)", transfer.id, exc)
        if not pieces:
            log.info("transfer %s was cancelled without its source at hand: %s keeps what it "
                     "received of it", transfer.id, transfer.submission.peer)
        return {p.name: p.file_size for p in pieces if p.file_size}

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
                        self._fail(transfer, f"peer {peer_name!r} was removed from the config")
                    return
                session = self._live(peer_name)
                if session is None:
                    if not queue and not warm_up and not self._unsent_cancels.waiting(peer_name):
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
                                self.store.fire(transfer, E.RETRY, reason=reason)
                        self._peer_away(peer_name, dialled)
                        log.info("%s (retry in %.1f s)", reason, backoff)
                        await self._until(asyncio.sleep(backoff))
                        backoff = min(backoff * 2, BACKOFF_MAX_S)
                        continue
                    session = dialled
                self._peer_back(peer_name)
                outcome = await self._serve_session(session, peer_name, peer.paths)
                warm_up = outcome != IDLE
                if outcome == ABORTED:  # it ended with nothing done: not again at once
                    await self._until(asyncio.sleep(backoff))
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                else:
                    backoff = BACKOFF_START_S
        finally:
            self._workers.pop(peer_name, None)
            self._wake.set()  # a submission that came while we finished gets a new worker

    def _peer_away(self, peer: str, why: Exception) -> None:
        """A dial to ``peer`` failed: a WARNING once it has been away for long."""
        now = time.monotonic()
        since = self._away_since.setdefault(peer, now)
        if peer not in self._away_warned and now - since >= PEER_UNREACHABLE_WARN_S:
            self._away_warned.add(peer)
            log.warning("peer %s unreachable for %.0f s: %s; its transfers wait", peer, now - since, why)

    def _peer_back(self, peer: str) -> None:
        since = self._away_since.pop(peer, None)
        if peer in self._away_warned and since is not None:
            self._away_warned.discard(peer)
            log.warning("peer %s reachable again after %.0f s", peer, time.monotonic() - since)

    def _live(self, peer_name: str) -> GatewaySession | None:
        session = self.peers.current.get(peer_name)
        return session if session is not None and session.end_reason is None else None

    async def _dial(self, peer: PeerConfig) -> GatewaySession | Exception:
        """Set up a session to ``peer`` on its data ports, unless the one-per-pair rule keeps
        the peer's own dial (then the exception says so)."""
        assert self.listener is not None
        directory = self._peer_dir(peer.name)
        assert directory is not None
        inbox = self._inbox(directory)
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
                             paths: tuple[Address, ...]) -> str:
        """Send the peer's queue over ``session``; close it once idle both ways for
        ``warm_seconds``. Returns how it ended: ``IDLE`` (no need to redial), ``RECONNECT``
        (redial now), or ``ABORTED`` when it ended having settled no transfer (redial after
        a backoff: a peer that ends every session at once must not be dialled in a loop)."""
        next_shard = 0
        work = self._work_for(peer_name)
        self.path_cache.resume(peer_name, paths, session)
        reason = SHUTDOWN  # the loop below ends by itself only for a drain (or a session that ended)
        settled = False  # a transfer left the queue for good (or for a pause) over this session
        try:
            while not self.draining and session.end_reason is None:
                if peer_name in self._refresh:  # its paths changed: the next session takes them
                    self._refresh.discard(peer_name)
                    reason = RECONNECT
                    return RECONNECT
                if await self._unsent_cancels.send(session):
                    return RECONNECT  # the session carried the cancels' goodbye: a new one for the rest
                queue = self._queued_for(peer_name)
                if queue:
                    next_shard = await self._run_one(session, queue[0], next_shard)
                    settled = settled or queue[0].state != "queued"
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
                    return IDLE
                finally:
                    ended.cancel()
            if session.end_reason == IDLE:
                return IDLE
            return RECONNECT if settled or self.draining else ABORTED
        except ConnectionError as exc:  # SessionFailed, or the endpoint closed under a send
            reason = session.end_reason or f"{ABORTED}: {exc}"
            return RECONNECT if settled else ABORTED
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
                self.store.fire(transfer, E.RESTART_WITHOUT_SOURCE,
                                reason="the source's descriptors are gone: submit it again with the "
                                       "same idempotency key")
                return first_shard
            pieces = plan(transfer.submission, held, self.config.piece_bytes, first_shard)
        except (SourceError, OSError) as exc:
            self._fail(transfer, str(exc))
            return first_shard
        async with self._slots:
            resuming = transfer.attempts > 0  # an earlier attempt may have left pieces there
            self.store.fire(transfer, E.START, reason=None, attempts=transfer.attempts + 1,
                            bytes_total=sum(p.size for p in pieces))
            tally = Tally(session)
            task = asyncio.create_task(self._send(session, transfer, pieces, resuming))
            self._active[transfer.id] = (task, session, session.acked_bytes())
            try:
                reason = await task
            except asyncio.CancelledError:
                held_now = self.progress(transfer)  # bytes_done counts what the peer holds
                if transfer.id in self._cancelled:
                    self.store.fire(transfer, E.CANCEL, reason="cancelled by request", bytes_done=held_now)
                    log.info("transfer %s to %s cancelled while active (%s of %s at the peer)",
                             transfer.id, transfer.submission.peer, format_size(held_now),
                             format_size(transfer.bytes_total))
                    close = CANCELLED  # the peer removes the files' partial data (inbox.py)
                else:
                    self.store.fire(transfer, E.RETRY, reason="interrupted by shutdown", bytes_done=held_now)
                    close = SHUTDOWN
                # The peer stops receiving it; the peer's own transfers on this session are
                # queued again there and resume on the next session (peers.RETRY_REASONS).
                await session.close(close)
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the daemon is closing, not just this transfer
                return first_shard + len(pieces)
            except ConnectionError as exc:  # SessionFailed, or the endpoint closed under the send
                reason = str(exc)
            finally:
                held_now = self.progress(transfer)  # before it leaves _active
                self._active.pop(transfer.id, None)
                self._last_progress.pop(transfer.id, None)
                self._cancelled.discard(transfer.id)
        skipped = self._held.pop(transfer.id, 0)
        if reason is not None and reason.startswith(SOURCE_CHANGED):
            # The peer learns why over the cancel path (the session ends with the reason
            # and is dialled again); its partial file of this version is never resumed.
            self._fail(transfer, reason, bytes_done=held_now)
            await session.close(f"{CANCELLED}: {reason}")
            return first_shard + len(pieces)
        if reason is None:
            self._finish(transfer, tally, skipped)
            return first_shard + len(pieces)
        dest = classify(reason)
        kind = dest.verdict if dest is not None else None
        if dest is not None and kind == "pause" and not self.draining:
            self._pause(transfer, reason, dest, skipped)
            return first_shard + len(pieces)
        if kind != "fail" and (session.failure is not None or self.draining or _retry(session)):
            self.store.fire(transfer, E.RETRY, reason=f"session lost, will retry: {reason}",
                            bytes_done=held_now)
            log.info("transfer %s to %s: session lost, will retry (%s)", transfer.id,
                     transfer.submission.peer, reason)
        else:
            self._fail(transfer, reason, bytes_done=held_now)
        self._disk_full.pop(transfer.id, None)  # the next pause starts its backoff afresh
        return first_shard + len(pieces)

    def _finish(self, transfer: Transfer, tally: Tally, skipped: int) -> None:
        """Every file verified at the peer: done, with what this run cost and moved."""
        assert self.store is not None
        stats = tally.finish(transfer.bytes_total - skipped)  # goodput: bytes sent in this run
        stats["skipped_bytes"] = skipped
        self.store.fire(transfer, E.FINISH, bytes_done=transfer.bytes_total, stats=stats)
        self._disk_full.pop(transfer.id, None)
        log.info("transfer %s to %s done: %s in %.2f s (%s)%s", transfer.id, transfer.submission.peer,
                 format_size(transfer.bytes_total), stats["elapsed_s"], format_rate(stats["goodput_bps"]),
                 f", {format_size(skipped)} already at the peer" if skipped else "")

    def _fail(self, transfer: Transfer, reason: str, **changes: Any) -> None:
        assert self.store is not None
        self.store.fire(transfer, E.FAIL, reason=reason, **changes)
        log.warning("transfer %s to %s failed: %s", transfer.id, transfer.submission.peer, reason)

    def _pause(self, transfer: Transfer, reason: str, dest: DestError, held: int) -> None:
        """The peer's disk is full (or it could not write for a reason that may pass): wait
        (backing off), then queue the transfer again. Its bytes_done stays what the peer held
        when the attempt began: which of this attempt's pieces it kept is only known at the
        next resume."""
        pauses = self._disk_full[transfer.id] = self._disk_full.get(transfer.id, 0) + 1
        delay = min(DISK_FULL_RETRY_START_S * 2 ** (pauses - 1), DISK_FULL_RETRY_MAX_S)
        assert self.store is not None
        self.store.fire(transfer, E.PAUSE, bytes_done=held,
                        reason=f"paused, {_why_paused(dest)}; retry in {delay:.0f} s: {reason}")
        log.warning("transfer %s paused (%s); retry in %.0f s", transfer.id, reason, delay)
        asyncio.get_running_loop().call_later(delay, self._unpause, transfer.id)

    def _unpause(self, transfer_id: str) -> None:
        assert self.store is not None
        transfer = self.store.get(transfer_id)
        if transfer is not None and transfer.state == "paused" and not self.draining:
            self.store.fire(transfer, E.RESUME)
            self.submitted(transfer.submission.peer)

    async def _send(self, session: GatewaySession, transfer: Transfer, pieces: list[OutgoingPiece],
                    resuming: bool) -> str | None:
        assert self.store is not None
        sent_ids = transfer.source_ids
        self.store.update(transfer, source_ids=source_ids(pieces))
        held = 0
        if resuming:
            try:
                pieces, held = await resume(session, pieces, self.config.piece_bytes, sent_ids)
            except SourceChanged as exc:  # while its pieces were hashed for the receiver
                return str(exc)
            log.info("transfer %s resumes: the peer holds %d of %d bytes", transfer.id, held,
                     transfer.bytes_total)
        self._held[transfer.id] = held
        return await send(session, tagged(pieces, transfer.id))

    @property
    def active_count(self) -> int:
        """Transfers being sent right now."""
        return len(self._active)

    def progress(self, transfer: Transfer) -> int:
        """Bytes the peer holds: what it held when this attempt began (a resume's answer)
        plus what it acknowledged since; the recorded figure while none runs."""
        active = self._active.get(transfer.id)
        held = self._held.get(transfer.id)
        if active is None or held is None:
            return transfer.bytes_done
        _, session, baseline = active
        return min(transfer.bytes_total, held + max(0, session.acked_bytes() - baseline))

    async def _watch_stalls(self) -> None:
        """Mark an active transfer ``stalled`` when no byte moved for ``stall_seconds``
        (the reason says what its peer looks like), ``active`` again when bytes move."""
        while True:
            await asyncio.sleep(min(1.0, self.config.stall_s / 4))
            self.check_stalls(time.monotonic())

    def check_stalls(self, now: float) -> None:
        """``stalled`` after ``stall_seconds`` without progress, or at once when no path to
        the peer is usable (a killed peer's session can outlive it by the control channel's
        resume window: it must not look active meanwhile); ``active`` when bytes move."""
        assert self.store is not None
        for transfer_id, (_, session, _) in list(self._active.items()):
            transfer = self.store.transfers.get(transfer_id)
            if transfer is None:
                continue
            done = self.progress(transfer)
            last = self._last_progress.get(transfer_id)
            if last is None or done != last[0]:
                self._last_progress[transfer_id] = (done, now)
                if transfer.state == "stalled":
                    self.store.fire(transfer, E.PROGRESS, reason=None)
                continue
            reachable, condition = self._peer_condition(session)
            if now - last[1] >= self.config.stall_s or not reachable:
                reason = f"no progress for {now - last[1]:.0f} s: {condition}"
                if transfer.state == "stalled" and (transfer.reason or "").endswith(condition):
                    continue
                if transfer.state != "stalled":  # one line when it stalls, not one per change of paths
                    log.warning("transfer %s to %s stalled: %s", transfer.id, transfer.submission.peer,
                                reason)
                self.store.fire(transfer, E.STALL, reason=reason)

    def _peer_condition(self, session: GatewaySession) -> tuple[bool, str]:
        """(any path to the peer usable, what the peer looks like in a few words)."""
        peer = session.peer_name
        if session.end_reason is not None:
            return False, f"the session with peer {peer} ended ({session.end_reason})"
        states = [p.state for p in session.stats().paths]
        if not any(state in ("active", "probing") for state in states):
            return False, f"peer {peer} unreachable (paths {', '.join(states)})"
        return True, f"peer {peer} acknowledges nothing (paths {', '.join(states)})"

    def cancel(self, transfer: Transfer) -> bool:
        """Cancel a transfer that has not ended; False when it already ended."""
        assert self.store is not None
        if transfer.state in ("queued", "paused", "needs-resubmit"):
            self._disk_full.pop(transfer.id, None)
            # Named now: the cancel closes the source, and the files are what the peer holds.
            files = self._files_at_peer(transfer) if transfer.attempts else {}
            self.store.fire(transfer, E.CANCEL, reason="cancelled by request")
            log.info("transfer %s to %s cancelled", transfer.id, transfer.submission.peer)
            if files:  # an attempt may have left partial files at the peer
                self._unsent_cancels.add(transfer.submission.peer, files)
                self.submitted(transfer.submission.peer)
            return True
        active = self._active.get(transfer.id)
        if active is None:
            return False
        self._cancelled.add(transfer.id)
        active[0].cancel()
        return True


def _why_paused(dest: DestError) -> str:
    return "the peer's disk is full" if dest.kind is DestErrorKind.NO_SPACE else \
        "the peer cannot write it for now"


def _route_changed(old: PeerConfig, new: PeerConfig | None) -> bool:
    """What a running session cannot take: the peer's paths, our data ports for it, its
    DSCP (or the peer is gone). Its rate caps are applied live (``_apply_rates``)."""
    return new is None or (old.paths, old.data_ports, old.dscp) != (new.paths, new.data_ports, new.dscp)


def _retry(session: GatewaySession) -> bool:
    """The session ended for a reason that says nothing about its transfers (``peers.py``)."""
    return (session.end_reason or "").startswith(RETRY_REASONS)


def _activity(session: GatewaySession) -> tuple[int, ...]:
    """What moved over ``session`` so far, both ways (a shard still arriving counts by its
    bytes): the session is idle while this stays put."""
    stats = session.stats()
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
