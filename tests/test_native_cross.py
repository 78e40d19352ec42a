"""The native data path against the pure-Python reference (wanxport/wire/datapath.py).

Same bytes out of both senders; each side accepts what the other sealed; over a
random stream of good, tampered, replayed and misaddressed datagrams both
receivers accept the same packets and count the same drops.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire import native
from wanxport.wire.datapath import PacketOpener, PacketSealer
from wanxport.wire.frames import (
    AckFrame,
    DataFrame,
    Frame,
    ProbeFrame,
    ShardAckFrame,
    decode_frames,
)
from wanxport.wire.protection import AeadProtection, NullProtection, Protection

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

CONN = 0xC0FFEE
KEY = bytes(range(7, 39))
IV = bytes(range(90, 102))
SHARD = 4
CIPHERS = ["aes-256-gcm", "chacha20-poly1305", "none"]

# native counter -> reference PacketOpener.drops reasons it covers
REASONS = {
    "rejected_short": {"short"},
    "rejected_marker": {"marker", "flags", "packet_number"},
    "rejected_conn": {"conn"},
    "rejected_path": {"path"},
    "rejected_key": {"key_phase"},
    "rejected_replay": {"replay"},
    "rejected_auth": {"auth"},
}


def keys(cipher: str, key: bytes = KEY) -> tuple[native.Protector, Protection]:
    if cipher == "none":
        return native.Protector("none", b"", b""), NullProtection()
    return native.Protector(cipher, key, IV), AeadProtection(cipher, key, IV)


@pytest.mark.parametrize("cipher", CIPHERS)
def test_senders_produce_identical_bytes(cipher: str) -> None:
    nkey, rkey = keys(cipher)
    data = random.Random(3).randbytes(5000)
    for key_phase in (0, 1):
        burst = native.build_data_datagrams(nkey, CONN, 3, 77, key_phase, SHARD, data, 100, 4321, 1000)
        sealer = PacketSealer(CONN, {key_phase: rkey}, key_phase)
        for i in range(burst.count):
            pn, off, ln = burst.chunk(i)
            ref = sealer.seal(3, pn, [DataFrame(SHARD, off, ln, data[off : off + ln])])
            assert bytes(burst.datagram(i)) == ref


@pytest.mark.parametrize("cipher", CIPHERS)
def test_reference_opens_native_and_native_places_reference(cipher: str) -> None:
    nkey, rkey = keys(cipher)
    data = random.Random(4).randbytes(3000)
    burst = native.build_data_datagrams(nkey, CONN, 1, 0, 0, SHARD, data, 0, 3000, 700)
    opener = PacketOpener(CONN, 2, {0: rkey})
    for i in range(burst.count):
        opened = opener.open(bytes(burst.datagram(i)))
        assert opened is not None
        (frame,) = opened.frames
        assert isinstance(frame, DataFrame)
        assert (opened.header.packet_number, frame.offset, frame.length) == burst.chunk(i)
        assert (
            frame.data is not None and bytes(frame.data) == data[frame.offset : frame.offset + frame.length]
        )

    sealer = PacketSealer(CONN, {0: rkey})
    controls: list[list[Frame]] = [
        [AckFrame(1, 250, ((5, 9), (0, 2)))],
        [ShardAckFrame(SHARD, ((0, 700), (1400, 2100)))],
        [ProbeFrame(0xDEAD)],
    ]
    datagrams = [
        sealer.seal(0, pn, [DataFrame(SHARD, pn * 300, 300, data[pn * 300 : (pn + 1) * 300])])
        for pn in range(10)
    ]
    datagrams += [sealer.seal(1, 100 + i, frames) for i, frames in enumerate(controls)]
    rx = native.Receiver(CONN, 2)
    rx.set_key(0, nkey)
    dest = bytearray(3000)
    rx.add_shard(SHARD, dest)
    result = rx.process(native.DatagramBatch.from_datagrams(random.Random(5).sample(datagrams, 13)))
    assert bytes(dest) == data and len(result.records) == 10
    parsed = {c.packet_number: decode_frames(c.plaintext) for c in result.controls}
    assert parsed == {100 + i: frames for i, frames in enumerate(controls)}


def mutate(rng: random.Random, dg: bytes) -> bytes:
    kind = rng.randrange(8)
    b = bytearray(dg)
    if kind == 0:
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[rng.randrange(len(b)) :]
    elif kind == 2:
        b[0] = rng.choice([0x20, 0x22, 0x41, 0x61, 0xA1])  # 0x41, 0x61: QUIC-looking
    elif kind == 3:
        b[1] |= rng.choice([2, 4, 0x80])
    elif kind == 4:
        b[4:8] = (CONN + 1).to_bytes(4, "big")
    elif kind == 5:
        b[2:4] = rng.choice([2, 3, 65535]).to_bytes(2, "big")
    elif kind == 6:
        b[1] ^= 1  # the other key phase
    return bytes(b)  # kind 7: an exact replay


@settings(max_examples=25, derandomize=True, deadline=None)
@given(cipher=st.sampled_from(CIPHERS[:2]), seed=st.integers(0, 2**32 - 1))
def test_random_streams_are_judged_identically(cipher: str, seed: int) -> None:
    rng = random.Random(seed)
    nkey, rkey = keys(cipher)
    data = rng.randbytes(4000)
    stream: list[bytes] = []
    for path in (0, 1):
        first = rng.randrange(0, 10_000)
        burst = native.build_data_datagrams(nkey, CONN, path, first, 0, SHARD, data, 0, 4000, 250)
        stream += [bytes(burst.datagram(i)) for i in range(burst.count)]
    stream += [mutate(rng, rng.choice(stream)) for _ in range(60)]
    rng.shuffle(stream)

    rx = native.Receiver(CONN, 2)
    rx.set_key(0, nkey)
    rx.add_shard(SHARD, bytearray(4000))
    result = rx.process(native.DatagramBatch.from_datagrams(stream))
    # QUIC-looking datagrams go back untouched for the control channel; the
    # Python data path demultiplexes them before its opener (is_data_plane).
    quic = [(i, dg) for i, dg in enumerate(stream) if dg[:1] and dg[0] & 0x40]
    assert result.quic == quic and rx.counters["passed_quic"] == len(quic)
    opener = PacketOpener(CONN, 2, {0: rkey})
    accepted_ref = []
    for dg in (dg for dg in stream if not (dg[:1] and dg[0] & 0x40)):
        opened = opener.open(dg)
        if opened is not None:
            accepted_ref.append((opened.header.path_id, opened.header.packet_number))
    accepted_native = list(
        zip(result.records["path_id"].tolist(), result.records["pn"].tolist(), strict=True)
    )
    assert result.controls == [] and accepted_native == accepted_ref
    counters = rx.counters
    for name, reasons in REASONS.items():
        assert counters[name] == sum(opener.drops[r] for r in reasons), name
    assert counters["rejected_frame"] == 0
    assert sum(Counter(opener.drops).values()) == sum(
        v for k, v in counters.items() if k.startswith("rejected")
    )


def test_a_run_whose_last_packet_number_passes_the_limit_is_refused() -> None:
    """Packet numbers are 62-bit: a run of 5 datagrams may start at 2^62 - 5, not one later."""
    nkey, _ = keys(CIPHERS[0])
    data = bytes(3000)
    last_start = (1 << 62) - 5
    assert native.build_data_datagrams(nkey, CONN, 0, last_start, 0, SHARD, data, 0, 3000, 700).count == 5
    with pytest.raises(ValueError, match=r"first_pn: .* \+ 5 datagrams exceeds 2\^62-1"):
        native.build_data_datagrams(nkey, CONN, 0, last_start + 1, 0, SHARD, data, 0, 3000, 700)
