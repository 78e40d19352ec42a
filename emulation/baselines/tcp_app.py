"""Sender and receiver of the TCP-based baselines: ``tcp``, ``tcp-parallel``, ``mptcp``.

    python -m emulation.baselines.tcp_app recv '<json spec>'   # in gateway b
    python -m emulation.baselines.tcp_app send '<json spec>'   # in gateway a

One program for the three because they differ only in the socket protocol
(IPPROTO_MPTCP for mptcp) and in how many connections carry which slice. Every
connection starts with a 16-byte header (offset, length of its slice; network
order) so the receiver can hash each slice and check that the slices tile the
payload. Both sides use non-blocking sockets and one selector, so a stalled
connection never holds the others up and SIGTERM (the runner's deadline) is
handled at once.

Protocol with the runner, one JSON object per stdout line:
receiver ``{"event": "listening"}`` then ``{"event": "done", ...}``; sender
``{"event": "ready"}`` (all connections established), waits for a line on
stdin ("go"), then ``{"event": "done", ...}``. The receiver sends one byte back
on every connection once the whole payload is in, so the sender reads its
TCP_INFO while the connections are still open, after every byte was acknowledged.

With ``steps`` > 1 (training steps) the same connections carry the payload
``steps`` times: the receiver acknowledges each step with its one byte, the
sender sends the next step's headers and slices ``think_ms`` after it reads
them; both report each step's times on CLOCK_MONOTONIC, shared by the
namespaces of one host.

Per connection the sender reports ``active_s``, each step from its submission to the
receiver's byte (or to the deadline): the time an MPTCP connection had data to send
(a TCP connection's own is the kernel's ``busy_time_us`` in its TCP_INFO, which stops
when its slice is acknowledged), and ``samples``: its TCP_INFO (or, for MPTCP, every
subflow's) every ``SAMPLE_S``, which shows whether a slow path was slow from the
start, after a loss burst or after idling.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from emulation.baselines import payload, tcpinfo
from wanxport.aio.sockets import set_buffers

HEADER = struct.Struct("!QQ")
RECV_CHUNK = 1 << 20
IPPROTO_MPTCP = getattr(socket, "IPPROTO_MPTCP", 262)
LINGER_S = 10.0
SAMPLE_S = 0.5
# TCP_INFO fields kept per sample: enough to tell slow start, loss recovery, a closed
# receive window and a full send buffer apart.
SAMPLED = ("bytes_acked", "snd_cwnd", "snd_ssthresh", "rtt_us", "ca_state", "pacing_rate_Bps",
           "delivery_rate_Bps", "notsent_bytes", "snd_wnd", "busy_time_us", "rwnd_limited_us",
           "sndbuf_limited_us", "total_retrans")


class Deadline(Exception):
    """SIGTERM from the runner: report what arrived and stop."""


def _on_term(signum: int, frame: object) -> None:
    raise Deadline


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_async_role(argv: list[str], receive: Callable[[dict[str, Any]], Awaitable[None]],
                   send: Callable[[dict[str, Any]], Awaitable[None]],
                   run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run) -> int:
    """``main`` of an asyncio baseline (``recv|send '<json spec>'``): SIGTERM cancels the role,
    which still emits its report."""
    role, spec = argv[0], json.loads(argv[1])

    async def runner() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await (receive(spec) if role == "recv" else send(spec))

    try:
        run(runner())
    except asyncio.CancelledError:
        pass
    return 0


def make_socket(proto: str, cc: str | None, sndbuf: int | None, rcvbuf: int | None) -> socket.socket:
    """A TCP or MPTCP socket with the requested congestion control and buffers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM,
                         IPPROTO_MPTCP if proto == "mptcp" else 0)
    if cc:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    set_buffers(sock, rcvbuf, sndbuf)
    return sock


def buffers(sock: socket.socket) -> dict[str, int]:
    """The buffer sizes the kernel actually granted (it doubles the request)."""
    return {"sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}


# -- receiver ----------------------------------------------------------------


@dataclass
class Slice:
    """A stream's header (offset, length), then its slice, hashed as it arrives.

    Shared by every baseline that sends a slice over a byte stream (TCP, MPTCP, QUIC).
    """

    head: bytearray = field(default_factory=bytearray)
    offset: int = -1
    length: int = -1
    received: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)

    @property
    def complete(self) -> bool:
        return self.length >= 0 and self.received == self.length

    def restart(self) -> None:
        """Expect the next step's header and slice on the same stream."""
        self.head = bytearray()
        self.offset = self.length = -1
        self.received = 0
        self.hasher = hashlib.sha256()

    def take(self, data: memoryview) -> None:
        if self.length < 0:
            need = HEADER.size - len(self.head)
            self.head += data[:need]
            data = data[need:]
            if len(self.head) == HEADER.size:
                self.offset, self.length = HEADER.unpack(self.head)
        if len(data) and self.length >= 0:
            data = data[:self.length - self.received]
            self.hasher.update(data)
            self.received += len(data)

    def summary(self, peer: str | None) -> dict[str, Any]:
        return {"peer": peer, "offset": self.offset, "length": self.length,
                "received": self.received, "sha256": self.hasher.hexdigest()}


@dataclass(kw_only=True)
class Incoming(Slice):
    """One accepted connection and the slice it carries."""

    sock: socket.socket
    peer: str
    eof: bool = False
    carried: int = 0  # slice bytes of the steps before this one

    def restart(self) -> None:
        self.carried += self.received
        super().restart()


def tiled(conns: list[Incoming], size: int) -> bool:
    """True when the completed slices cover [0, size) exactly."""
    pos = 0
    for c in sorted(conns, key=lambda c: c.offset):
        if not c.complete or c.offset != pos:
            return False
        pos += c.length
    return pos == size


def receive(spec: dict[str, Any]) -> int:
    listener = make_socket(spec["proto"], spec.get("cc"), None, spec.get("rcvbuf"))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((spec.get("bind", "0.0.0.0"), spec["port"]))
    listener.listen(64)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    conns: list[Incoming] = []
    buf = bytearray(RECV_CHUNK)
    view = memoryview(buf)
    t_first: float | None = None
    t_end: float | None = None
    steps = int(spec.get("steps", 1))
    step_ends: list[float] = []  # when each step's payload was all in (CLOCK_MONOTONIC)
    step_digests: list[str] = []
    emit({"event": "listening", "buffers": buffers(listener)})
    try:
        while t_end is None:
            for key, _ in sel.select():
                if key.data is None:
                    sock, addr = listener.accept()
                    sock.setblocking(False)
                    conn = Incoming(sock=sock, peer=addr[0])
                    conns.append(conn)
                    sel.register(sock, selectors.EVENT_READ, conn)
                    continue
                conn = key.data
                try:
                    n = conn.sock.recv_into(buf)
                except (BlockingIOError, InterruptedError):
                    continue
                if n == 0:
                    conn.eof = True
                    sel.unregister(conn.sock)
                    continue
                if t_first is None:
                    t_first = time.monotonic()
                conn.take(view[:n])
            if len(conns) >= spec["connections"] and tiled(conns, spec["size"]):
                step_ends.append(time.monotonic())
                step_digests.append(payload.payload_digest([(c.offset, c.hasher.hexdigest()) for c in conns]))
                if len(step_ends) == steps:
                    t_end = step_ends[-1]
                    break
                # Training steps: the same connections carry the next step once the
                # sender learns this one is in (the one-byte acknowledgement).
                for c in conns:
                    c.sock.send(b"\x01")
                    c.restart()
    except Deadline:
        pass
    emit({"event": "done", "complete": t_end is not None, "t_first": t_first, "t_end": t_end,
          "step_ends": step_ends, "step_digests": step_digests,
          "bytes": sum(c.carried + c.received for c in conns),
          "slices": [{**c.summary(c.peer), "carried": c.carried + c.received} for c in conns]})
    if t_end is not None:
        _linger(sel, conns)
    return 0


def _linger(sel: selectors.BaseSelector, conns: list[Incoming]) -> None:
    """Tell every sender we are done, then wait (bounded) for them to close."""
    for c in conns:
        try:
            c.sock.send(b"\x01")
        except OSError:
            c.eof = True
    stop = time.monotonic() + LINGER_S
    while not all(c.eof for c in conns) and time.monotonic() < stop:
        for key, _ in sel.select(timeout=stop - time.monotonic()):
            if key.data is None:
                continue
            try:
                if not key.data.sock.recv(RECV_CHUNK):
                    key.data.eof = True
                    sel.unregister(key.data.sock)
            except OSError:
                key.data.eof = True
                sel.unregister(key.data.sock)
    for c in conns:
        c.sock.close()


# -- sender ------------------------------------------------------------------


@dataclass
class Outgoing:
    """One connection and the rest of its slice."""

    sock: socket.socket
    src: str
    offset: int
    length: int
    chunks: Iterator[memoryview]
    pending: memoryview = field(default_factory=lambda: memoryview(b""))
    hasher: Any = field(default_factory=hashlib.sha256)
    sent: int = 0
    acked: bool = False
    active_s: float = 0.0  # seconds of the steps up to the receiver's byte (or the deadline)
    step_start: float = 0.0
    samples: list[list[Any]] = field(default_factory=list)

    def restart(self, chunks: Iterator[memoryview], header: memoryview) -> None:
        """Send the slice again (the next step), header first."""
        self.chunks = chunks
        self.pending = header
        self.hasher = hashlib.sha256()
        self.acked = False

    def next_chunk(self) -> bool:
        chunk = next(self.chunks, None)
        if chunk is None:
            return False
        self.hasher.update(chunk)
        self.pending = chunk
        return True


def send(spec: dict[str, Any]) -> int:
    outs: list[Outgoing] = []
    for c in spec["conns"]:
        sock = make_socket(spec["proto"], spec.get("cc"), spec.get("sndbuf"), spec.get("rcvbuf"))
        sock.bind((c["src"], 0))
        sock.connect((c["dst"], c["port"]))
        header = memoryview(HEADER.pack(c["offset"], c["length"]))
        out = Outgoing(sock, c["src"], c["offset"], c["length"],
                       payload.chunks(spec["seed"], c["offset"], c["length"]), pending=header)
        outs.append(out)
    emit({"event": "ready", "buffers": buffers(outs[0].sock)})
    sys.stdin.readline()
    t0 = time.monotonic()
    sel = selectors.DefaultSelector()
    for out in outs:
        out.sock.setblocking(False)
    steps = int(spec.get("steps", 1))
    think_s = float(spec.get("think_ms", 0.0)) / 1000.0
    submitted: list[float] = []
    sampler = Sampler(outs, spec["proto"], t0)
    finished = False
    try:
        for step in range(steps):
            # Step k+1 goes think_ms after the receiver's acknowledgement of step k, on the
            # same connections (their congestion state carries over, as a training job's).
            if step:
                time.sleep(think_s)
                for out in outs:
                    out.restart(payload.chunks(spec["seed"], out.offset, out.length),
                                memoryview(HEADER.pack(out.offset, out.length)))
            submitted.append(time.monotonic())
            for out in outs:
                out.step_start = submitted[-1]
                sel.register(out.sock, selectors.EVENT_WRITE, out)
            _pump(sel, outs, sampler)
        finished = True
    except Deadline:
        stopped = time.monotonic()
        for out in outs:
            if not out.acked:
                out.active_s += stopped - out.step_start
    report: dict[str, Any] = {"event": "done", "t0": t0, "finished": finished, "submitted": submitted,
                              "slices": [_out_summary(o, spec["proto"]) for o in outs]}
    if spec["proto"] == "mptcp":
        try:
            report["subflows"] = tcpinfo.mptcp_subflows(outs[0].sock)
        except OSError as exc:
            report["subflows_error"] = str(exc)
    emit(report)
    for out in outs:
        out.sock.close()
    return 0


class Sampler:
    """Every connection's TCP_INFO (MPTCP: every subflow's) each ``SAMPLE_S`` while sending."""

    def __init__(self, outs: list[Outgoing], proto: str, t0: float) -> None:
        self.outs, self.proto, self.t0 = outs, proto, t0
        self.due = t0

    def timeout(self) -> float:
        """Seconds until the next sample: the selector's timeout."""
        now = time.monotonic()
        if now >= self.due:
            self.sample(now)
        return max(0.0, self.due - time.monotonic())

    def sample(self, now: float) -> None:
        self.due = now + SAMPLE_S
        at = round(now - self.t0, 3)
        for out in self.outs:
            try:
                if self.proto == "mptcp":
                    rows = [[sub.get("local"), *(sub.get(k) for k in SAMPLED)]
                            for sub in tcpinfo.mptcp_subflows(out.sock)]
                    out.samples.append([at, rows])
                else:
                    info = tcpinfo.tcp_info(out.sock)
                    out.samples.append([at, *(info.get(k) for k in SAMPLED)])
            except OSError:
                continue


def _pump(sel: selectors.BaseSelector, outs: list[Outgoing], sampler: Sampler) -> None:
    """Write every slice, then wait for the receiver's one-byte acknowledgement on each."""
    while not all(o.acked for o in outs):
        for key, events in sel.select(sampler.timeout()):
            out: Outgoing = key.data
            if events & selectors.EVENT_READ:
                if out.sock.recv(16):
                    out.acked = True
                    out.active_s += time.monotonic() - out.step_start
                    sel.unregister(out.sock)
                continue
            while True:
                if not out.pending and not out.next_chunk():
                    sel.modify(out.sock, selectors.EVENT_READ, out)
                    break
                try:
                    n = out.sock.send(out.pending)
                except (BlockingIOError, InterruptedError):
                    break
                out.sent += n
                out.pending = out.pending[n:]


def _out_summary(out: Outgoing, proto: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"src": out.src, "offset": out.offset, "length": out.length,
                               "sha256": out.hasher.hexdigest(), "active_s": round(out.active_s, 4),
                               "sample_fields": ["t_s", *SAMPLED] if proto != "mptcp"
                               else ["t_s", ["local", *SAMPLED]],
                               "samples": out.samples}
    try:
        summary["info"] = tcpinfo.tcp_info(out.sock) if proto != "mptcp" else {}
    except OSError:
        summary["info"] = {}
    return summary


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    role, spec = argv[0], json.loads(argv[1])
    return receive(spec) if role == "recv" else send(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
