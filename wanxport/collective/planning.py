"""Which schedule each all-reduce among three or more sites runs: one site decides, all follow.

Each site measures its own sessions (a pair's rate: the sum of its paths' delivery-rate
estimates; its one-way delay: half the least path RTT) and reports them to the
decider, the group's rank 0 (while a group is open all its members are alive, so
that is the lowest-index live site). The decider assembles a ``Mesh`` from the
latest reports and sends it to every site in a "plan" covering a window of call
numbers. For each call every site evaluates ``costmodel.choose`` on that same mesh,
so all sites choose the same schedule however differently they measured, and the
call's header carries the schedule and the plan's first call: a site that chose
otherwise is a mismatch error, never a wrong sum.

Windows: a plan covers the calls [start, until): ``WINDOW`` calls, or only one while the
mesh it carries is not measured yet (some pair has carried no bulk data: its
delivery-rate estimate is an app-limited guess), so that the first calls of a group,
and those after a site joins, do not run on a guess for a whole window. The decider
sends the first plan once every site has reported (right after the group forms) and
the next one when it takes the last call a plan covers: with the freshest reports, and
still before any site can finish that call (the decider takes part in it), so a site
running its calls one after another finds the plan in place; one that runs ahead
waits for it within the call's timeout. Sites
report again after their all-reduces (at most every ``REPORT_EVERY_S``), so the
rates follow the steps. ``deterministic``: plan 0 covers every call and carries the
sessions only (no rates), so every run of the program uses the same schedules and
sums in the same order.

Reports and plans travel only over pairs with a session: a site forwards one it sees
for the first time to its other neighbours, so a mesh missing some pairs still
carries them.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wanxport.core.stats import PathStats

from .costmodel import NO_SESSION, Mesh, Wire, choose, unmeasured
from .errors import CollectiveError
from .message import HEADER_BYTES, Call, Header, new_payload
from .schedule import SCHEDULES, Plan

WINDOW = 4  # calls per plan
FOREVER = 1 << 52  # a deterministic plan's end (exact in float64)
REPORT_EVERY_S = 0.2
KINDS = ("auto", *SCHEDULES)
CHOICES_KEPT = 64
RATES_KEPT = 8  # measurements a reported rate is the largest of
PLANS_KEPT = 64  # windows behind the newest plan still held (a site may lag that far)
Send = Callable[[int, Header, npt.NDArray[np.uint8]], object]
Row = tuple[list[float], list[float]]  # rates (bytes/s) and one-way delays (s), per group rank


@dataclass(frozen=True)
class Published:
    """A plan as every site holds it: calls [start, until) choose their schedule on ``mesh``."""

    start: int
    until: int
    mesh: Mesh
    kind: str  # "auto" or the schedule the decider was told to use

    @property
    def ident(self) -> int:
        """What the header carries (32 bits of ``start``)."""
        return self.start & 0xFFFF_FFFF


def measure_link(stats: tuple[PathStats, ...]) -> tuple[float, float]:
    """(rate in bytes/s, one-way delay in s) of one session from its paths' figures; 0 when
    not measured yet. A path's rate is the scheduler's delivery rate (measured samples
    only: a controller's estimate in startup is a guess). Failed paths do not count."""
    live = [p for p in stats if p.state != "failed"]
    rate = sum(p.bandwidth_bps for p in live) / 8
    rtts = [p.min_rtt_s for p in live if p.min_rtt_s is not None]
    return rate, (min(rtts) / 2 if rtts else 0.0)


class Planner:
    """One site's part in choosing schedules: it reports, forwards, and (at rank 0) decides.

    ``neighbours``: the group ranks this site has sessions with; ``send`` queues a
    message to one of them; ``measure`` returns this site's row (tests replace it)."""

    def __init__(self, gid: int, site: int, size: int, neighbours: list[int], send: Send,
                 measure: Callable[[], Row], kind: str = "auto", deterministic: bool = False) -> None:
        if kind not in KINDS:
            raise ValueError(f"schedule: unknown {kind!r}; valid: {', '.join(map(repr, KINDS))}")
        self.gid = gid
        self.site = site
        self.size = size
        self.neighbours = sorted(neighbours)
        self.measure = measure
        self.kind = kind
        self.deterministic = deterministic
        self.decider = 0
        self.plans: dict[int, Published] = {}
        self.reports_sent = 0
        self._send = send
        self._rows: dict[int, Row] = {}  # the decider's latest report of each site
        self._seen: dict[int, int] = {}  # origin rank -> latest report version seen here
        self._published_until = 0  # the first call no plan the decider sent covers
        self._wanted_until = 1  # the decider publishes plans until they cover the calls before this
        self._waiters: dict[int, list[asyncio.Future[Published]]] = {}
        self._choices: OrderedDict[tuple[int, int, str], tuple[Plan, float | None]] = OrderedDict()
        self._last_report = float("-inf")
        self._recent: deque[list[float]] = deque(maxlen=RATES_KEPT)
        self.closed = False

    # -- reports ---------------------------------------------------------------------

    def report(self, force: bool = False) -> None:
        """Send this site's measurements toward the decider (unless one went out recently)."""
        now = time.monotonic()
        if self.closed or not force and now - self._last_report < REPORT_EVERY_S:
            return
        self._last_report = now
        rates, delays = self._remembered()
        version = self.reports_sent
        self.reports_sent += 1
        body = np.array([*rates, *delays], dtype=np.float64)
        call = Call(version, "report", body.size, "<f8", group=self.gid, root=self.site)
        self._take_report(self.site, call, body, came_from=None)

    def _remembered(self) -> Row:
        """This site's measurement now, each rate the largest of its last ``RATES_KEPT``: a
        session's estimates sink while it idles between steps (or while the schedule leaves
        it idle), and a schedule chosen on the idle figures would avoid a pair for nothing."""
        rates, delays = self.measure()
        self._recent.append(rates)
        return [max(row[k] for row in self._recent) for k in range(len(rates))], delays

    def _take_report(self, origin: int, call: Call, body: npt.NDArray[np.float64], came_from: int | None,
                     ) -> None:
        if call.seq <= self._seen.get(origin, -1):
            return
        self._seen[origin] = call.seq
        if self.site == self.decider:
            n = self.size
            self._rows[origin] = (list(body[:n]), list(body[n:2 * n]))
            self._publish()
        else:
            self._flood(call, body, came_from, origin)

    # -- plans -----------------------------------------------------------------------

    def on_take(self, seq: int) -> None:
        """Call ``seq`` takes its number here; the decider then makes sure the plan of the call
        after it is out."""
        if self.site == self.decider and seq + 1 >= self._published_until:
            self._wanted_until = max(self._wanted_until, seq + 2)
            self._publish()

    def _publish(self) -> None:
        if self.closed or any(k not in self._rows for k in range(self.size) if k != self.site):
            return
        if self.deterministic and self._published_until > 0:
            return
        rates, delays = self._remembered()
        self._rows[self.site] = (rates, delays)
        rows = [self._rows[k] for k in range(self.size)]
        mesh = Mesh(tuple(tuple(r[0]) for r in rows), tuple(tuple(r[1]) for r in rows))
        if self.deterministic:
            mesh = unmeasured(self.size, mesh.links)
        window = WINDOW if mesh.measured() else 1
        while self._published_until < self._wanted_until:
            start = self._published_until
            until = FOREVER if self.deterministic else start + window
            body = np.array([until, KINDS.index(self.kind), *np.ravel(mesh.rate), *np.ravel(mesh.delay)],
                            dtype=np.float64)
            call = Call(start, "plan", body.size, "<f8", group=self.gid, root=self.site)
            self._take_plan(call, body, came_from=None)
            self._published_until = until

    def _take_plan(self, call: Call, body: npt.NDArray[np.float64], came_from: int | None) -> None:
        n = self.size
        if call.seq in self.plans or body.size != 2 + 2 * n * n:
            return
        until, kind = int(body[0]), KINDS[int(body[1])]
        rate = body[2:2 + n * n].reshape(n, n)
        delay = body[2 + n * n:].reshape(n, n)
        mesh = Mesh(tuple(tuple(float(x) for x in row) for row in rate),
                    tuple(tuple(float(x) for x in row) for row in delay))
        published = self.plans[call.seq] = Published(call.seq, until, mesh, kind)
        for old in [s for s in self.plans if s < call.seq - PLANS_KEPT * WINDOW]:
            del self.plans[old]
        self._flood(call, body, came_from, self.decider)
        for seq in [s for s in self._waiters if call.seq <= s < until]:
            for fut in self._waiters.pop(seq):
                if not fut.done():
                    fut.set_result(published)

    def covering(self, seq: int) -> Published | None:
        for published in self.plans.values():
            if published.start <= seq < published.until:
                return published
        return None

    async def plan_for(self, seq: int) -> Published:
        """The plan call ``seq`` chooses from (waiting for the decider's when needed)."""
        published = self.covering(seq)
        if published is not None:
            return published
        fut: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(seq, []).append(fut)
        return await fut

    def waiting(self, seq: int) -> bool:
        return seq in self._waiters

    def choose(self, published: Published, count: int, wire: Wire, what: str) -> tuple[Plan, float | None]:
        """``costmodel.choose`` on the plan's mesh (kept for repeated calls of one size);
        ``what``: a name for ``wire`` (dtype and codec). CollectiveError when the mesh
        does not allow the schedule the decider was told to use."""
        key = (published.start, count, what)
        got = self._choices.get(key)
        if got is None:
            try:
                got = choose(published.mesh, count, wire, published.kind)
            except ValueError as exc:
                raise CollectiveError(f"all_reduce: {exc}") from None
            self._choices[key] = got
            if len(self._choices) > CHOICES_KEPT:
                self._choices.popitem(last=False)
        return got

    # -- messages --------------------------------------------------------------------

    def receive(self, peer: int, header: Header, body: npt.NDArray[np.uint8]) -> None:
        """A report or plan from neighbour ``peer`` (copied: its buffer goes back at once)."""
        call = header.call
        if self.closed or body.nbytes % 8 or not 0 <= call.root < self.size:
            return
        values = body.view(np.float64).copy()
        if call.op == "report" and values.size == 2 * self.size:
            self._take_report(call.root, call, values, came_from=peer)
        elif call.op == "plan" and call.root == self.decider:
            self._take_plan(call, values, came_from=peer)

    def _flood(self, call: Call, body: npt.NDArray[np.float64], came_from: int | None, origin: int) -> None:
        """Pass a report or plan on to every neighbour but the one it came from (and its
        origin); a report goes straight to the decider when it is a neighbour."""
        targets = [p for p in self.neighbours if p not in (came_from, origin)]
        if call.op == "report" and self.decider in self.neighbours:
            targets = [self.decider] if self.decider != came_from else []
        raw = body.view(np.uint8)
        for peer in targets:
            payload = new_payload(raw.nbytes)
            payload[HEADER_BYTES:] = raw
            self._send(peer, Header(call, 0, 0, body.size), payload)

    def fail(self, error: CollectiveError) -> None:
        """The group stopped: every call waiting for a plan fails with ``error``."""
        self.closed = True
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(error)
                    fut.exception()
        self._waiters.clear()


def session_row(size: int, stats: dict[int, tuple[PathStats, ...]]) -> Row:
    """This site's row from its sessions' path figures (``stats``: neighbour rank -> paths)."""
    rates, delays = [NO_SESSION] * size, [0.0] * size
    for peer, paths in stats.items():
        rates[peer], delays[peer] = measure_link(paths)
    return rates, delays
