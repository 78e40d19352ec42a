"""The engine as the emulated hosts' NIC: UDP GSO super-frames cut into datagrams, checksums owed.

The first tests drive an engine with ``vnet`` through AF_UNIX datagram socketpairs,
writing frames with virtio-net headers as an AF_PACKET socket with PACKET_VNET_HDR
reads them, and check every datagram that leaves: its headers, its lengths and, once
its owed checksum is filled in as a NIC would, a valid UDP checksum. The last one runs
a real emulated path (root): a gateway's GSO burst crosses it and the peer's kernel
accepts every datagram.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from emulation._engine import Engine

VNET = struct.Struct("=BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
NEEDS_CSUM, GSO_NONE, GSO_TCPV4, GSO_UDP_L4 = 1, 0, 1, 5
ETH = bytes.fromhex("020000000002" "020000000001")
SRC4, DST4 = bytes([10, 1, 0, 1]), bytes([10, 1, 0, 2])
SRC6, DST6 = bytes.fromhex("fd00" + "00" * 13 + "01"), bytes.fromhex("fd00" + "00" * 13 + "02")


def fold(total: int) -> int:
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def words(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    return sum(struct.unpack(f"!{len(data) // 2}H", data))


def pseudo_sum(src: bytes, dst: bytes, udp_len: int) -> int:
    """The pseudo-header's folded sum: what a frame with its checksum owed holds in the field."""
    return fold(words(src) + words(dst) + 17 + udp_len)


def ipv4_checksum(header: bytes) -> int:
    return ~fold(words(header)) & 0xFFFF


def super_frame(payload: bytes, gso_size: int, v6: bool = False, gso_type: int = GSO_UDP_L4,
                ip_id: int = 0x1234) -> bytes:
    """A frame as the kernel hands it to a PACKET_VNET_HDR socket: header, Ethernet, IP,
    UDP with the pseudo-header's sum in its checksum field, payload."""
    udp_len = 8 + len(payload)
    if v6:
        ip = struct.pack("!IHBB", 6 << 28, udp_len, 17, 64) + SRC6 + DST6
        check = pseudo_sum(SRC6, DST6, udp_len)
    else:
        ip = struct.pack("!BBHHHBBH", 0x45, 0, 20 + udp_len, ip_id, 0x4000, 64, 17, 0) + SRC4 + DST4
        ip = ip[:10] + struct.pack("!H", ipv4_checksum(ip)) + ip[12:]
        check = pseudo_sum(SRC4, DST4, udp_len)
    l4 = 14 + len(ip)
    udp = struct.pack("!HHHH", 40000, 9000, udp_len, check)
    header = VNET.pack(NEEDS_CSUM, gso_type, l4 + 8, gso_size, l4, 6)
    return header + ETH + (b"\x86\xdd" if v6 else b"\x08\x00") + ip + udp + payload


def filled(frame: bytes, start: int, offset: int) -> bytes:
    """The frame with its owed checksum filled in, as the NIC (or the kernel) would."""
    check = ~fold(words(frame[start:])) & 0xFFFF
    at = start + offset
    return frame[:at] + struct.pack("!H", check or 0xFFFF) + frame[at + 2:]


@pytest.fixture
def engine() -> Iterator[tuple[Engine, socket.socket, socket.socket]]:
    """A vnet engine forwarding whatever is written to ``inlet`` to ``outlet``, unimpaired."""
    inlet, eng_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    eng_out, outlet = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for sock in (inlet, eng_in, eng_out, outlet):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 21)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    eng = Engine(seed=5, header_bytes=14, frame_bytes=2048, vnet=True)
    eng.add_direction(eng_in.fileno(), eng_out.fileno(), rate_bps=1e10, delay_s=0.0, queue_bytes=1e8)
    thread = threading.Thread(target=eng.run)
    thread.start()
    outlet.settimeout(5.0)
    try:
        yield eng, inlet, outlet
    finally:
        eng.stop()
        thread.join()
        for sock in (inlet, eng_in, eng_out, outlet):
            sock.close()


def settled(eng: Engine, packets: int) -> dict[str, int]:
    """The direction's counters once ``packets`` datagrams were counted in (5 s at most)."""
    deadline = time.monotonic() + 5.0
    while eng.stats(0)["rx_packets"] < packets and time.monotonic() < deadline:
        time.sleep(0.005)
    return eng.stats(0)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("size", "gso_size", "v6"), [
    (14000, 1400, False),  # an exact multiple
    (3001, 1400, False),   # a short last datagram
    (900, 1400, False),    # one datagram
    (5000, 1232, True),
])
def test_a_udp_gso_super_frame_leaves_as_the_datagrams_it_stands_for(
        engine: tuple[Engine, socket.socket, socket.socket], size: int, gso_size: int, v6: bool) -> None:
    eng, inlet, outlet = engine
    payload = os.urandom(size)
    inlet.send(super_frame(payload, gso_size, v6))
    count = -(-size // gso_size)
    l3, l4 = 14, 14 + (40 if v6 else 20)
    got = b""
    for i in range(count):
        raw = outlet.recv(65536)
        flags, gso_type, hdr_len, seg, start, offset = VNET.unpack(raw[:10])
        assert (flags, gso_type, hdr_len, seg, start, offset) == (NEEDS_CSUM, GSO_NONE, 0, 0, l4, 6)
        frame = raw[10:]
        part = frame[l4 + 8:]
        assert len(part) == min(gso_size, size - i * gso_size)
        got += part
        assert frame[:l4 - (40 if v6 else 20)] == ETH + (b"\x86\xdd" if v6 else b"\x08\x00")
        udp_len = struct.unpack("!H", frame[l4 + 4:l4 + 6])[0]
        assert udp_len == 8 + len(part)
        if v6:
            assert struct.unpack("!H", frame[l3 + 4:l3 + 6])[0] == udp_len
            src, dst = SRC6, DST6
        else:
            ip = frame[l3:l4]
            assert struct.unpack("!H", ip[2:4])[0] == 20 + udp_len
            assert struct.unpack("!H", ip[4:6])[0] == 0x1234 + i  # numbered as the kernel numbers them
            assert fold(words(ip)) == 0xFFFF  # a valid header checksum
            src, dst = SRC4, DST4
        assert struct.unpack("!H", frame[l4 + 6:l4 + 8])[0] == pseudo_sum(src, dst, udp_len)
        # Once the owed checksum is filled in, the datagram checks out against its pseudo-header.
        done = filled(frame, l4, 6)
        assert fold(words(src) + words(dst) + 17 + udp_len + words(done[l4:])) == 0xFFFF
    assert got == payload
    stats = settled(eng, count)
    assert (stats["rx_packets"], stats["drop_oversize"]) == (count, 0)


def test_a_single_frame_passes_as_it_came_with_only_its_owed_checksum_kept(
        engine: tuple[Engine, socket.socket, socket.socket]) -> None:
    eng, inlet, outlet = engine
    owed = super_frame(b"x" * 500, 0, gso_type=GSO_NONE)
    inlet.send(owed)
    out = outlet.recv(65536)
    assert VNET.unpack(out[:10]) == (NEEDS_CSUM, GSO_NONE, 0, 0, 34, 6)  # hdr_len not passed on
    assert out[10:] == owed[10:]
    plain = VNET.pack(0, GSO_NONE, 0, 0, 0, 0) + ETH + b"\x08\x06" + bytes(28)  # an ARP frame
    inlet.send(plain)
    assert outlet.recv(65536) == plain
    stats = settled(eng, 2)
    assert (stats["rx_packets"], stats["drop_oversize"], stats["drop_nomem"]) == (2, 0, 0)


def test_an_offload_the_engine_does_not_cut_is_a_counted_drop_not_a_stall(
        engine: tuple[Engine, socket.socket, socket.socket]) -> None:
    eng, inlet, outlet = engine
    inlet.send(super_frame(b"t" * 4000, 1400, gso_type=GSO_TCPV4))
    truncated = super_frame(b"u" * 4000, 1400)[:10 + 14 + 20 + 4]  # headers cut short
    inlet.send(truncated)
    inlet.send(b"\x01\x05")  # shorter than a virtio-net header
    inlet.send(super_frame(b"s" * 4000, 8))  # 500 datagrams: more than the kernel ever cuts
    after = super_frame(b"y" * 100, 0, gso_type=GSO_NONE)
    inlet.send(after)
    assert outlet.recv(65536)[10:] == after[10:]  # what follows still passes
    stats = settled(eng, 5)
    assert stats["drop_oversize"] == 4
    assert stats["rx_packets"] == 5


def test_loss_is_drawn_for_each_datagram_of_a_super_frame() -> None:
    inlet, eng_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    eng_out, outlet = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    eng = Engine(seed=9, header_bytes=14, vnet=True)
    eng.add_direction(eng_in.fileno(), eng_out.fileno(), rate_bps=1e10, delay_s=0.0, queue_bytes=1e8,
                      loss=0.5)
    thread = threading.Thread(target=eng.run)
    thread.start()
    try:
        inlet.send(super_frame(os.urandom(40 * 1000), 1000))
        settled(eng, 40)
    finally:
        eng.stop()
        thread.join()
        for sock in (inlet, eng_in, eng_out, outlet):
            sock.close()
    stats = eng.stats(0)
    assert stats["rx_packets"] == 40
    assert stats["tx_packets"] + stats["drop_loss"] == 40
    assert 5 < stats["drop_loss"] < 35  # some of one burst lost, not the whole burst or none


GSO_BURST = """
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_UDP, 103, 1200)  # UDP_SEGMENT
u.sendto(bytes(range(200)) * 60, (sys.argv[1], 9000))
"""
COUNT_DATAGRAMS = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 9000))
s.settimeout(10)
print("ready", flush=True)
sizes = [len(s.recv(65536)) for _ in range(10)]
print(sizes, flush=True)
"""


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces")
def test_a_gateways_gso_burst_crosses_an_emulated_path_as_datagrams_the_peer_accepts() -> None:
    from emulation.api import Emulation
    from emulation.hostenv import popen_in, run_in
    from wanxport.scenario import LinkParams, PathSpec, Scenario

    link = LinkParams(rtt_ms=10.0, bandwidth_mbps=100.0)
    emu = Emulation(Scenario(name="t-gso-burst", paths=(PathSpec(name="p1", forward=link, reverse=link),)),
                    backend="engine")
    receiver = None
    try:
        emu.up()
        path = emu.paths[0]
        features = run_in(emu.plan.ns_a, ["ethtool", "-k", path.ifname]).stdout
        assert "tx-udp-segmentation: on" in features
        receiver = popen_in(emu.plan.ns_b, [sys.executable, "-c", COUNT_DATAGRAMS, path.b_addr],
                            stdout=subprocess.PIPE, text=True)
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        run_in(emu.plan.ns_a, [sys.executable, "-c", GSO_BURST, path.b_addr])
        assert receiver.stdout.readline().strip() == str([1200] * 10)
        assert receiver.wait(10) == 0
        counters = emu.counters()["p1"]["a->b"]
        assert counters["rx_packets"] >= 10 and counters["drop_oversize"] == 0
    finally:
        if receiver is not None and receiver.poll() is None:
            receiver.kill()
            receiver.wait()
        emu.down()
