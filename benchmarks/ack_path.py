"""CPU of the sender's ACK handling, core only: two sessions in one process, no sockets.

Why: on this 2-core host, shared with a soak and other work, the bench's CPU per
GB moves by more than the ACK path costs (~0.5 of ~3.5 CPU-s/GB when measured). This
runs a transfer of the bench's shape (4 paths, MTU 1500, 128 datagrams a core
packet, an ACK every 128 datagrams or 1 ms) and measures exactly the calls a
sender's loop makes for its ACKs (decoding the control datagrams and handing
them to the session): their thread CPU time (still load-sensitive, +-20 % here)
and, with ``--opcodes``, the bytecode instructions they run, which the load
cannot move.

Each path's link moves ``--rate-mbps``. The sender wakes every ``--wake-us``
(its loop's drain: all ACKs that arrived meanwhile, one call per path as
``aio.Endpoint._absorb`` makes), the receiver handles every datagram as it
arrives; one-way delay ``--owd-us``. ``--mode``
``batch`` hands a drain's ACKs in one ``Session.receive_packets`` call, ``single``
one ``receive_packet`` each; run it with ``PYTHONPATH=OTHER_TREE`` to measure
another checkout (``single`` is what a tree without ``receive_packets`` does).

    .venv/bin/python benchmarks/ack_path.py --size 256MiB --mode batch --json
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import sys
import time
from types import FrameType
from typing import Any

from wanxport.core.config import SessionConfig
from wanxport.core.session import Session
from wanxport.presets import GATEWAY, Preset, overrides, session_config
from wanxport.units import parse_size
from wanxport.wire.frames import AckFrame, DataFrame, Frame, decode_frames, encode_frames

# Datagrams per core packet and receive credit: above the gateway preset's, so the ACK
# path alone limits a run; the result names the difference (preset_overrides).
SEGMENTS = 128
CREDIT_BYTES = 1 << 31


class OpcodeCounter:
    """Counts the Python bytecode instructions run while enabled: a measure of the ACK
    path's Python work that the host's load cannot move (its time can, by +-20 % here)."""

    def __init__(self) -> None:
        self.count = 0

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            self.count += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        return self._local

    def start(self) -> None:
        sys.settrace(self._global)

    def stop(self) -> None:
        sys.settrace(None)


def bench_preset(mtu: int) -> Preset:
    return dataclasses.replace(GATEWAY, mtu=mtu, segments=SEGMENTS, credit_bytes=CREDIT_BYTES)


def config(paths: int, mtu: int) -> SessionConfig:
    return session_config([f"lo{i}" for i in range(paths)], bench_preset(mtu))


def run(size: int, paths: int, mtu: int, mode: str, wake_s: float, owd_s: float, rate_bps: float,
        opcodes: OpcodeCounter | None = None) -> dict[str, Any]:
    sender = Session(config(paths, mtu))
    receiver = Session(config(paths, mtu), allocator=lambda shard_id, size, meta: None)
    shard = 64 << 20
    for shard_id, offset in enumerate(range(0, size, shard)):
        sender.submit(shard_id, None, 0.0, size=min(shard, size - offset))
    to_receiver: list[tuple[float, int, Any]] = []  # (arrival, seq, Transmit)
    to_sender: list[tuple[float, int, tuple[int, int, bytes]]] = []
    seq = 0
    cpu_ns = acks = calls = 0
    batch = mode == "batch"
    now = 0.0
    link_free = [0.0] * paths  # each path's link to the receiver serialises at rate_bps

    def receiver_poll(at: float) -> None:
        nonlocal seq
        for tx in receiver.poll_transmit(at):
            seq += 1
            heapq.heappush(to_sender, (max(at, tx.not_before) + owd_s, seq,
                                       (tx.path_id, tx.first_pn, encode_frames(tx.frames))))

    while not sender.sending_done and now < 600.0:
        now += wake_s
        while to_receiver and to_receiver[0][0] <= now:
            at, _, tx = heapq.heappop(to_receiver)
            frame = tx.frames[0]
            if isinstance(frame, DataFrame):
                receiver.receive_data_run(tx.path_id, tx.first_pn, tx.count, frame.shard_id, frame.offset,
                                          frame.length, at)
            else:
                receiver.receive_packet(tx.path_id, tx.first_pn, tx.frames, at)
            receiver_poll(at)
        deadline = receiver.next_deadline()
        if deadline is not None and deadline <= now:
            receiver.on_deadline(now)
            receiver_poll(now)
        drained: dict[int, list[tuple[int, int, bytes]]] = {}
        while to_sender and to_sender[0][0] <= now:
            _, _, datagram = heapq.heappop(to_sender)
            drained.setdefault(datagram[0], []).append(datagram)
        for datagrams in drained.values():  # one drain per path's socket
            if opcodes is not None:
                opcodes.start()
            start = time.thread_time_ns()
            opened: list[tuple[int, int, list[Frame]]] = [(p, pn, decode_frames(d)) for p, pn, d in datagrams]
            if batch:
                sender.receive_packets(opened, now)
            else:
                for p, pn, frames in opened:
                    sender.receive_packet(p, pn, frames, now)
            cpu_ns += time.thread_time_ns() - start
            if opcodes is not None:
                opcodes.stop()
            acks += sum(isinstance(f, AckFrame) for _, _, frames in opened for f in frames)
            calls += 1
        deadline = sender.next_deadline()
        if deadline is not None and deadline <= now:
            sender.on_deadline(now)
        for tx in sender.poll_transmit(now):
            seq += 1
            done = max(now, tx.not_before, link_free[tx.path_id]) + tx.size * 8 / rate_bps
            link_free[tx.path_id] = done
            heapq.heappush(to_receiver, (done + owd_s, seq, tx))
        sender.events()
        receiver.events()
    per_gb = 1e9 / size
    extra = {} if opcodes is None else {"opcodes_per_ack": round(opcodes.count / max(acks, 1))}
    return {**extra, "preset_overrides": overrides(GATEWAY, bench_preset(mtu)), "mode": mode, "size": size,
            "done": sender.sending_done, "virtual_s": round(now, 4),
            "ack_cpu_s_per_gb": round(cpu_ns / 1e9 * per_gb, 4), "acks_per_gb": round(acks * per_gb),
            "drains_per_gb": round(calls * per_gb), "acks_per_drain": round(acks / max(calls, 1), 2),
            "ack_cpu_us_per_ack": round(cpu_ns / 1e3 / max(acks, 1), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--mode", choices=("batch", "single"), default="batch")
    parser.add_argument("--wake-us", type=float, default=4000.0)
    parser.add_argument("--rate-mbps", type=float, default=400.0, help="each path's link rate")
    parser.add_argument("--owd-us", type=float, default=50.0)
    parser.add_argument("--opcodes", action="store_true",
                        help="count the bytecode instructions of the ACK calls (slow: CPU times void)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(parse_size(args.size), args.paths, args.mtu, args.mode, args.wake_us / 1e6,
                 args.owd_us / 1e6, args.rate_mbps * 1e6, OpcodeCounter() if args.opcodes else None)
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
