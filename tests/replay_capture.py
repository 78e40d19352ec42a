"""Run inside a fresh network namespace by tests/test_replay_netns.py (needs root).

Captures every datagram of a real gateway session on ``lo`` with an AF_PACKET
socket, then re-injects the captured IP packets through a raw socket (same
addresses, ports, datagram bytes), shuffled: during a later transfer of the
same session and after the session ended. Prints one JSON object of counts for
the test to check. The test turns UDP segmentation offload off on this ``lo``,
so the capture sees datagrams as a wire would, not 64 KiB GSO batches.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from gateway_helpers import transfer

from wanxport.control.certs import make_test_pki
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.handshake import initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.wire.header import is_quic

ETH_P_ALL, PACKET_HOST = 0x0003, 0
PORTS = [7700, 7701]


class Capture(threading.Thread):
    """Frames on ``lo`` delivered to the receiver's ports (each frame once: its PACKET_HOST copy)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 256 << 20)  # SO_RCVBUFFORCE: keep every frame
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.05)
        self.frames: list[bytes] = []
        self.running = True

    def run(self) -> None:
        while self.running:
            try:
                frame, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            if addr[2] != PACKET_HOST or len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
                continue
            ihl = (frame[14] & 0x0F) * 4
            (dport,) = struct.unpack_from("!H", frame, 14 + ihl + 2)
            if dport in PORTS:
                self.frames.append(frame)

    def stop(self) -> list[bytes]:
        self.running = False
        self.join()
        return list(self.frames)


def payload(frame: bytes) -> bytes:
    return frame[14 + (frame[14] & 0x0F) * 4 + 8:]


def _sum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def with_udp_checksum(frame: bytes) -> bytes:
    """The frame with its UDP checksum filled in. On ``lo`` the kernel leaves it to "the
    hardware" (checksum offload), so a captured frame carries only the pseudo-header sum;
    injected as is, the stack would drop it as corrupt before any socket saw it. The
    addresses, ports and datagram bytes stay exactly as captured."""
    ip = 14
    udp = ip + (frame[ip] & 0x0F) * 4
    (length,) = struct.unpack_from("!H", frame, udp + 4)
    segment = bytearray(frame[udp:udp + length])
    segment[6:8] = b"\0\0"
    pseudo = frame[ip + 12:ip + 20] + struct.pack("!BBH", 0, 17, length)
    checksum = (~_sum16(pseudo + bytes(segment))) & 0xFFFF or 0xFFFF
    return frame[:udp + 6] + struct.pack("!H", checksum) + frame[udp + 8:]


def inject(frames: list[bytes]) -> None:
    """The captured IP packets, as a raw socket sends them (an AF_PACKET send on ``lo`` is
    not delivered back up the stack), at about 16k/s: a rate the receiver's socket
    buffers absorb (this measures rejection, not overload)."""
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as out:
        for i, frame in enumerate(frames):
            out.sendto(with_udp_checksum(frame)[14:], ("127.0.0.1", 0))
            if i % 16 == 15:
                time.sleep(0.001)


async def until(condition, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            return  # the test reports the counts it got
        await asyncio.sleep(0.01)


async def main(pki: Path) -> dict[str, object]:
    make_test_pki(pki, ["gw-a", "gw-b"])
    rng = random.Random(23)
    listens = [("127.0.0.1", p) for p in PORTS]
    options = GatewayOptions()
    listener = GatewayListener(listens, pki / "gw-b", pki / "ca.pem", options)
    await listener.start()
    capture = Capture()
    capture.start()
    sender = await initiate(listens, pki / "gw-a", pki / "ca.pem", options)
    receiver = await listener.accept()
    first, second, third = rng.randbytes(4 << 20), rng.randbytes(4 << 20), rng.randbytes(1 << 20)
    intact = await transfer(sender, receiver, 0, first)
    frames = capture.stop()
    rng.shuffle(frames)  # late and out of order
    data_frames = [f for f in frames if not is_quic(payload(f))]
    quic_frames = len(frames) - len(data_frames)
    dp = receiver.endpoint.datapath
    before = dict(dp.counters)
    quic_before = listener.port_counters.get("quic", 0)

    # During: replays of the whole first transfer while the second one runs.
    moving = asyncio.ensure_future(transfer(sender, receiver, 1, second))
    await asyncio.get_running_loop().run_in_executor(None, inject, frames)
    intact = await moving and intact
    intact = await transfer(sender, receiver, 2, third) and intact  # read after the replays
    during = {k: dp.counters[k] - before[k] for k in dp.counters if dp.counters[k] != before[k]}
    quic_during = listener.port_counters.get("quic", 0) - quic_before
    accepted_data = sum(len(d) for d in (second, third))
    await sender.close()
    await receiver.close()
    listener.release()

    # After: the same frames again, with no session on the ports.
    # A replayed client Initial is, with the original connection gone, a new handshake
    # attempt: it goes to admission (counted by verdict) and can never complete.
    assert listener.server is not None
    admission = listener.server.admission
    ports_before, verdicts_before = dict(listener.port_counters), admission.verdicts.total()
    await asyncio.get_running_loop().run_in_executor(None, inject, frames)

    def handled() -> int:
        return (sum(listener.port_counters.values()) - sum(ports_before.values())
                + admission.verdicts.total() - verdicts_before)

    await until(lambda: handled() >= len(frames))
    after = {k: v - ports_before.get(k, 0) for k, v in listener.port_counters.items()
             if v != ports_before.get(k, 0)}
    after["handshake_attempts"] = admission.verdicts.total() - verdicts_before
    initials = sum(1 for f in frames if payload(f)[0] & 0xB0 == 0x80 and len(payload(f)) >= 1200)
    listener.close()
    return {"captured": len(frames), "captured_data": len(data_frames), "captured_quic": quic_frames,
            "captured_initials": initials, "during": during, "quic_during": quic_during,
            "after": after, "intact": intact,
            "accepted_data_bytes": accepted_data}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
