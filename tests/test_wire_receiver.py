"""The pure-Python reference receiver (wanxport/wire/receiver.py) against the native one.

Both open, replay-check and place the same random streams — good DATA for
registered and unregistered shards, out-of-bounds and short frames, control
packets, tampered, replayed and misaddressed datagrams, QUIC-looking ones
(first byte & 0x40: the control channel's, on a shared port) and empty ones,
freezes in between — and must agree byte for byte: records, runs, controls,
the QUIC hand-off, counters, ranges and the shard buffers.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire import native
from wanxport.wire.datapath import PacketSealer
from wanxport.wire.frames import AckFrame, DataFrame, Frame, ProbeFrame
from wanxport.wire.protection import AeadProtection, NullProtection, Protection
from wanxport.wire.receiver import Placed, ReferenceReceiver, fold_runs

CONN = 0xBEEF
KEY = bytes(range(3, 35))
IV = bytes(range(40, 52))
SHARD, OTHER, SIZE = 4, 9, 6000

needs_native = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))


def reference_key(cipher: str) -> Protection:
    return NullProtection() if cipher == "none" else AeadProtection(cipher, KEY, IV)


def datagrams(rng: random.Random, cipher: str) -> list[bytes]:
    """Sealed DATA (in and out of bounds, registered shard or not), controls, and damage."""
    sealer = PacketSealer(CONN, {0: reference_key(cipher)})
    data = rng.randbytes(SIZE + 1000)
    out: list[bytes] = []
    for path in (0, 1):
        pn = rng.randrange(0, 5000)
        for _ in range(rng.randrange(5, 25)):
            shard = rng.choice([SHARD, SHARD, SHARD, OTHER])
            offset = rng.randrange(0, SIZE + 200)
            length = rng.randrange(0, 700)
            frames: list[Frame] = [DataFrame(shard, offset, length, data[offset:offset + length])]
            if rng.random() < 0.15:
                frames = [AckFrame(path, 5, ((0, 3),)), ProbeFrame(pn)]
            elif rng.random() < 0.1:
                frames.append(ProbeFrame(1))  # DATA followed by more: not placeable
            out.append(sealer.seal(path, pn, frames))
            pn += rng.choice([1, 1, 1, 2, 70])
    out += [damage(rng, rng.choice(out)) for _ in range(len(out) // 3)]
    out += [bytes([rng.randrange(256) | 0x40]) + rng.randbytes(rng.randrange(0, 300)) for _ in range(4)]
    out.append(b"")
    rng.shuffle(out)
    return out


def damage(rng: random.Random, datagram: bytes) -> bytes:
    b = bytearray(datagram)
    kind = rng.randrange(7)
    if kind == 0:
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[rng.randrange(len(b)):]
    elif kind == 2:
        b[0] = rng.choice([0x20, 0x41])
    elif kind == 3:
        b[4:8] = (CONN + 1).to_bytes(4, "big")
    elif kind == 4:
        b[2:4] = (7).to_bytes(2, "big")
    elif kind == 5:
        b[1] ^= 1  # the other key phase (no key installed)
    return bytes(b)  # kind 6: an exact replay


def native_records(result: native.ProcessResult) -> list[Placed]:
    r = result.records
    return [Placed(int(p), int(n), int(s), int(o), int(length)) for p, n, s, o, length in
            zip(r["path_id"], r["pn"], r["shard_id"], r["offset"], r["length"], strict=True)]


@needs_native
@settings(max_examples=40, derandomize=True, deadline=None)
@given(cipher=st.sampled_from(["aes-256-gcm", "chacha20-poly1305", "none"]), seed=st.integers(0, 2**32 - 1))
def test_native_and_reference_receivers_agree_byte_for_byte(cipher: str, seed: int) -> None:
    rng = random.Random(seed)
    stream = datagrams(rng, cipher)
    nkey = native.Protector("none", b"", b"") if cipher == "none" else native.Protector(cipher, KEY, IV)
    fast, ref = native.Receiver(CONN, 2), ReferenceReceiver(CONN, 2)
    fast.set_key(0, nkey)
    ref.set_key(0, reference_key(cipher))
    fast_buffer, ref_buffer = bytearray(SIZE), bytearray(SIZE)
    fast.add_shard(SHARD, fast_buffer)
    ref.add_shard(SHARD, ref_buffer)
    at = 0
    while at < len(stream):
        batch = stream[at:at + rng.randrange(1, 20)]
        at += len(batch)
        result = fast.process(native.DatagramBatch.from_datagrams(batch))
        processed = ref.process(batch)
        placed, controls = processed.placed, processed.controls
        assert native_records(result) == placed
        assert native.fold_runs(result.records) == fold_runs(placed)
        assert [(c.path_id, c.packet_number, c.plaintext) for c in result.controls] == \
            [(c.path_id, c.packet_number, c.plaintext) for c in controls]
        assert result.quic == processed.quic
        if rng.random() < 0.3:
            upto = rng.randrange(0, SIZE + 1)
            fast.freeze(SHARD, upto)
            ref.freeze(SHARD, upto)
    assert fast.counters == ref.counters
    assert fast.ranges(SHARD) == ref.ranges(SHARD)
    assert fast.received_bytes(SHARD) == ref.received_bytes(SHARD)
    assert fast_buffer == ref_buffer


def test_reference_places_folds_and_never_rewrites_frozen_bytes() -> None:
    sealer = PacketSealer(CONN, {0: NullProtection()})
    rx = ReferenceReceiver(CONN, 1)
    rx.set_key(0, NullProtection())
    buffer = bytearray(30)
    rx.add_shard(SHARD, buffer)
    payload = bytes(range(1, 31))
    stream = [sealer.seal(0, pn, [DataFrame(SHARD, pn * 10, 10, payload[pn * 10:pn * 10 + 10])])
              for pn in range(3)]
    first = rx.process(stream[:2])
    placed, controls = first.placed, first.controls
    assert fold_runs(placed) == [(0, 0, 2, SHARD, 0, 20)] and controls == []
    rx.freeze(SHARD, 20)
    buffer[0] = 0xFF  # a hasher's view: a duplicate below the freeze must not rewrite it
    dup = sealer.seal(0, 7, [DataFrame(SHARD, 0, 10, payload[:10])])
    placed = rx.process([stream[2], dup, stream[0]]).placed
    assert [p.pn for p in placed] == [2, 7]  # the exact replay of pn 0 is refused
    assert buffer[0] == 0xFF and bytes(buffer[20:]) == payload[20:]
    assert rx.ranges(SHARD) == [(0, 30)] and rx.received_bytes(SHARD) == 30
    assert rx.counters["rejected_replay"] == 1 and rx.counters["accepted_data"] == 4


def test_reference_hands_unplaceable_datagrams_over_as_control() -> None:
    sealer = PacketSealer(CONN, {0: NullProtection()})
    rx = ReferenceReceiver(CONN, 1)
    rx.set_key(0, NullProtection())
    rx.add_shard(SHARD, bytearray(10))
    unknown = sealer.seal(0, 0, [DataFrame(OTHER, 0, 4, b"abcd")])
    beyond = sealer.seal(0, 1, [DataFrame(SHARD, 8, 4, b"abcd")])  # past the buffer's end
    probe = sealer.seal(0, 2, [ProbeFrame(3)])
    result = rx.process([unknown, beyond, probe])
    assert result.placed == [] and [c.packet_number for c in result.controls] == [0, 2]
    assert rx.counters["rejected_frame"] == 1


def test_reference_hands_quic_looking_datagrams_back_untouched_before_any_check() -> None:
    """The first byte decides, as in the C receiver: 0x40 set is the control channel's
    (handed back with its batch index, counted passed_quic), even when it is too short
    or its second byte is garbage; an empty datagram is short; 0x80 alone is not QUIC."""
    sealer = PacketSealer(CONN, {0: NullProtection()})
    rx = ReferenceReceiver(CONN, 1)
    rx.set_key(0, NullProtection())
    probe = sealer.seal(0, 0, [ProbeFrame(1)])
    initial = bytes([0xC3]) + bytes(1199)
    stream = [initial, probe, b"\x40", b"", b"\x80" + bytes(40), b"\x7f" + probe[1:]]
    result = rx.process(stream)
    assert result.quic == [(0, initial), (2, b"\x40"), (5, b"\x7f" + probe[1:])]
    assert [c.packet_number for c in result.controls] == [0]
    assert rx.counters["passed_quic"] == 3 and rx.counters["rejected_short"] == 1
    assert rx.counters["rejected_marker"] == 1
