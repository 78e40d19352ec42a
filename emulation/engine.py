"""The impairment daemon: ``python -m emulation.engine --spec FILE``.

One process per scenario. It enters the middle namespace, installs the base
parameters of every path (engine: AF_PACKET sockets on both veth ends handed to
the native engine, which forwards on its own thread with the GIL released;
netem: qdiscs), tells its parent it is ready, then waits for signals:

* SIGUSR1 -- the start signal: the events clock starts now (a runner sends it at
  the first byte); a later SIGUSR1 restarts the timeline from the base parameters.
* SIGUSR2 -- write counters to the stats file.
* SIGTERM/SIGINT/SIGHUP -- stop, write counters, exit.

Signals are taken synchronously (sigtimedwait) by the main thread, which also
applies timeline changes when they fall due. Runs under Mininet's system
python3 too, so it imports pyroute2 only for the netem backend.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from emulation.hostenv import setns
from emulation.params import DIRECTIONS, engine_params, link_from_dict
from wanxport.aio.sockets import set_buffers
from wanxport.scenario import LinkParams

log = logging.getLogger("emulation.engine")

SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_QDISC_BYPASS = 20
PACKET_VNET_HDR = 15
ETH_P_ALL = 3
SO_TIMESTAMPNS = 35  # Linux (x86, Arm); the socket module does not export it
ETH_HEADER_BYTES = 14
SOCKET_BUFFER_BYTES = 16 << 20
SIGNALS = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}

Params = dict[str, LinkParams]  # direction ("a->b" | "b->a") -> parameters


def packet_socket(ifname: str, vnet: bool = False) -> socket.socket:
    """A raw socket on ``ifname`` that does not see its own transmissions and skips the qdisc;
    with ``vnet``, every frame read or written has its virtio-net header before it.

    Created with protocol 0 and bound with ETH_P_ALL, so it never queues frames
    of other interfaces in the instant between socket() and bind().
    """
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    if vnet:
        sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    # The engine is the link's queue; the veth's own qdisc would only add work.
    sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    # Frames enter the emulated queue at their kernel receive timestamp (taken as the
    # sender transmits), not when the engine's thread gets a CPU to read them.
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    set_buffers(sock, SOCKET_BUFFER_BYTES, SOCKET_BUFFER_BYTES)
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return sock


class EngineBackend:
    """Every path through one native engine; the engine thread runs until ``stop``.

    The engine's default release window applies: a packet leaves at most 100 us before its
    release time, never after."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from emulation._engine import Engine

        max_mtu = max(link_from_dict(p["base"][d]).mtu for p in spec["paths"] for d in DIRECTIONS)
        # ``vnet``: the topology left the veths their offloads (hostenv.nic_offloads), so
        # a sender's GSO burst arrives whole and the engine cuts it into datagrams.
        vnet = bool(spec.get("vnet", False))
        self.engine = Engine(
            seed=int(spec.get("seed", 0)),
            header_bytes=ETH_HEADER_BYTES,
            frame_bytes=max(2048, max_mtu + ETH_HEADER_BYTES + 4),
            vnet=vnet,
        )
        self.sockets: list[socket.socket] = []
        self.index: list[dict[str, int]] = []
        for path in spec["paths"]:
            side_a, side_b = packet_socket(path["if_a"], vnet), packet_socket(path["if_b"], vnet)
            self.sockets += [side_a, side_b]
            base = {d: link_from_dict(path["base"][d]) for d in DIRECTIONS}
            self.index.append({
                "a->b": self.engine.add_direction(
                    side_a.fileno(), side_b.fileno(), **engine_params(base["a->b"])),
                "b->a": self.engine.add_direction(
                    side_b.fileno(), side_a.fileno(), **engine_params(base["b->a"])),
            })
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.engine.run()
        except OSError as exc:
            self.error = exc
            log.error("engine stopped: %s", exc)
            os.kill(os.getpid(), signal.SIGTERM)

    def set(self, path: int, params: Params) -> None:
        for direction, lp in params.items():
            self.engine.set_params(self.index[path][direction], **engine_params(lp))

    def stats(self) -> list[dict[str, Any]]:
        return [{d: self.engine.stats(i) for d, i in dirs.items()} for dirs in self.index]

    def stop(self) -> None:
        self.engine.stop()
        self.thread.join()
        for sock in self.sockets:
            sock.close()


class NetemBackend:
    """Every path as netem qdiscs on the middle namespace's veths (see ``emulation.netem``)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from pyroute2 import IPRoute

        from emulation import netem

        self.netem = netem
        self.ipr = IPRoute()
        # a->b leaves the middle towards b, b->a towards a.
        self.ifindex = [
            {"a->b": self.ipr.link_lookup(ifname=p["if_b"])[0],
             "b->a": self.ipr.link_lookup(ifname=p["if_a"])[0]}
            for p in spec["paths"]
        ]
        self.current: list[dict[str, Any]] = [{} for _ in spec["paths"]]
        for k, path in enumerate(spec["paths"]):
            self.set(k, {d: link_from_dict(path["base"][d]) for d in DIRECTIONS})

    def set(self, path: int, params: Params) -> None:
        for direction, lp in params.items():
            cfg = self.netem.netem_config(lp)
            self.netem.apply(self.ipr, self.ifindex[path][direction], cfg,
                             self.current[path].get(direction))
            self.current[path][direction] = cfg

    def stats(self) -> list[dict[str, Any]]:
        return [{} for _ in self.current]

    def stop(self) -> None:
        self.ipr.close()


class Timeline:
    """Pending changes of all paths, ordered by time since the start signal."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.base = [{d: link_from_dict(p["base"][d]) for d in DIRECTIONS} for p in spec["paths"]]
        self.all = sorted(
            (float(c["at_s"]), k, {d: link_from_dict(c["params"][d]) for d in DIRECTIONS})
            for k, p in enumerate(spec["paths"])
            for c in p["changes"]
        )
        self.pending: list[tuple[float, int, Params]] = []
        self.start: float | None = None

    def restart(self, now: float) -> None:
        self.start = now
        self.pending = list(self.all)

    def due(self, now: float) -> list[tuple[int, Params]]:
        out = []
        while self.pending and self.start is not None and self.start + self.pending[0][0] <= now:
            _, k, params = self.pending.pop(0)
            out.append((k, params))
        return out

    def wait_s(self, now: float) -> float | None:
        if not self.pending or self.start is None:
            return None
        return max(0.0, self.start + self.pending[0][0] - now)


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def serve(spec: dict[str, Any], ready_fd: int | None, stats_path: str | None) -> int:
    """Run the daemon until a stop signal; returns the exit status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # before any thread starts
    if spec.get("netns"):
        setns(spec["netns"])
    backend: EngineBackend | NetemBackend
    backend = EngineBackend(spec) if spec["backend"] == "engine" else NetemBackend(spec)
    timeline = Timeline(spec)
    names = [p["name"] for p in spec["paths"]]
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    log.info("ready: backend %s, paths %s", spec["backend"], ", ".join(names))
    while True:
        wait = timeline.wait_s(time.monotonic())
        info = signal.sigtimedwait(SIGNALS, wait) if wait is not None else signal.sigwaitinfo(
            SIGNALS)
        if info is not None and info.si_signo == signal.SIGUSR1:
            timeline.restart(time.monotonic())
            for k, base in enumerate(timeline.base):
                backend.set(k, base)
            log.info("start signal: events clock at 0")
        elif info is not None and info.si_signo == signal.SIGUSR2 and stats_path:
            _write_json(stats_path, dict(zip(names, backend.stats(), strict=True)))
        elif info is not None and info.si_signo not in (signal.SIGUSR1, signal.SIGUSR2):
            break
        for k, params in timeline.due(time.monotonic()):
            backend.set(k, params)
            log.info("event on %s applied", names[k])
    backend.stop()
    stats = dict(zip(names, backend.stats(), strict=True))
    if stats_path:
        _write_json(stats_path, stats)
    log.info("stopped; counters %s", json.dumps(stats))
    return 1 if isinstance(backend, EngineBackend) and backend.error else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulation.engine", description=__doc__)
    parser.add_argument("--spec", required=True, help="JSON spec written by emulation.api")
    parser.add_argument("--ready-fd", type=int, help="write 'ready' to this fd once forwarding")
    parser.add_argument("--pidfile", help="write our pid here")
    parser.add_argument("--stats", help="write counters (JSON) here on SIGUSR2 and at exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with open(args.spec) as fh:
        spec = json.load(fh)
    if args.pidfile:
        with open(args.pidfile, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    return serve(spec, args.ready_fd, args.stats)


if __name__ == "__main__":
    raise SystemExit(main())
