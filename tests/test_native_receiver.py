"""Receiver: open, validate, replay-check and place batches; drops are counted, never raised."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire import native
from wanxport.wire.replay import WINDOW

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

KEY = bytes(range(32))
IV = bytes(12)
CONN = 0x10203040
SHARD = 9


def protector(cipher: str = "aes-256-gcm", key: bytes = KEY) -> native.Protector:
    return native.Protector(cipher, key, IV)


def burst_datagrams(
    data: bytes,
    first_pn: int = 0,
    path_id: int = 0,
    max_payload: int = 100,
    key: native.Protector | None = None,
    key_phase: int = 0,
    offset: int = 0,
    length: int | None = None,
    conn_id: int = CONN,
    shard_id: int = SHARD,
) -> list[bytes]:
    burst = native.build_data_datagrams(
        key or protector(),
        conn_id,
        path_id,
        first_pn,
        key_phase,
        shard_id,
        data,
        offset,
        len(data) - offset if length is None else length,
        max_payload,
    )
    return [bytes(burst.datagram(i)) for i in range(burst.count)]


def make_receiver(size: int, n_paths: int = 2) -> tuple[native.Receiver, bytearray]:
    rx = native.Receiver(CONN, n_paths)
    rx.set_key(0, protector())
    buf = bytearray(size)
    rx.add_shard(SHARD, buf)
    return rx, buf


def process(rx: native.Receiver, datagrams: list[bytes], t: int = 5) -> native.ProcessResult:
    return rx.process(native.DatagramBatch.from_datagrams(datagrams, rx_time_ns=t))


def rejected(rx: native.Receiver) -> dict[str, int]:
    return {k: v for k, v in rx.counters.items() if k.startswith("rejected") and v}


def test_places_a_burst_and_reports_records() -> None:
    data = random.Random(2).randbytes(1000)
    rx, buf = make_receiver(1000)
    res = process(rx, burst_datagrams(data, first_pn=10), t=777)
    assert bytes(buf) == data
    assert rx.ranges(SHARD) == [(0, 1000)] and rx.received_bytes(SHARD) == 1000
    assert rx.is_complete(SHARD) and res.controls == []
    assert res.records["pn"].tolist() == list(range(10, 20))
    assert res.records["offset"].tolist() == list(range(0, 1000, 100))
    assert set(res.records["length"].tolist()) == {100}
    assert set(res.records["rx_time_ns"].tolist()) == {777}
    assert set(res.records["shard_id"].tolist()) == {SHARD}
    assert rx.counters["accepted_data"] == 10 and rejected(rx) == {}
    assert rx.highest_pn(0) == 19 and rx.highest_pn(1) is None


def test_out_of_order_ranges_merge_and_duplicates_are_replays() -> None:
    data = bytes(range(256)) * 4
    rx, buf = make_receiver(1024)
    dgs = burst_datagrams(data, max_payload=128)  # 8 datagrams
    process(rx, [dgs[5], dgs[1], dgs[2]])
    assert rx.ranges(SHARD) == [(128, 384), (640, 768)]
    process(rx, [dgs[7], dgs[0], dgs[6], dgs[1]])
    assert rx.ranges(SHARD) == [(0, 384), (640, 1024)]
    assert rx.counters["rejected_replay"] == 1
    process(rx, [dgs[4], dgs[3]])
    assert rx.ranges(SHARD) == [(0, 1024)] and bytes(buf) == data
    assert rx.received_bytes(SHARD) == 1024


def test_frozen_bytes_are_never_written_again() -> None:
    """A hasher reads the frozen prefix while the rest arrives: a later duplicate (here with
    other contents, from a sender whose buffer changed) must not change those bytes."""
    original = bytes(range(256)) * 4
    changed = bytes(255 - b for b in original)
    rx, buf = make_receiver(1024)
    first = burst_datagrams(original, max_payload=128)
    process(rx, [first[0], first[1], first[2], first[5]])  # prefix [0, 384), then a gap
    rx.freeze(SHARD, 384)
    # Resent with new packet numbers (not replays) and different bytes, straddling the prefix.
    process(rx, burst_datagrams(changed, first_pn=100, max_payload=128, offset=256, length=256))
    assert bytes(buf[:384]) == original[:384], "frozen bytes were overwritten"
    assert bytes(buf[384:512]) == changed[384:512], "bytes above it are placed as usual"
    assert rx.counters["accepted_data"] == 6 and rx.ranges(SHARD) == [(0, 512), (640, 768)]
    rx.freeze(SHARD, 100)  # it only rises
    process(rx, burst_datagrams(changed, first_pn=200, max_payload=128, offset=256, length=128))
    assert bytes(buf[256:384]) == original[256:384]


def test_freeze_checks_its_arguments() -> None:
    rx, _ = make_receiver(1024)
    with pytest.raises(ValueError, match="upto"):
        rx.freeze(SHARD, 1025)
    with pytest.raises(KeyError):
        rx.freeze(SHARD + 1, 0)


@pytest.mark.parametrize("cipher", ["aes-256-gcm", "chacha20-poly1305"])
def test_tampering_is_counted_and_buffer_untouched(cipher: str) -> None:
    data = b"\xff" * 300
    rx = native.Receiver(CONN, 2)
    rx.set_key(0, protector(cipher))
    buf = bytearray(300)
    rx.add_shard(SHARD, buf)
    good = burst_datagrams(data, key=protector(cipher))
    flipped = bytearray(good[0])
    flipped[40] ^= 1
    wrong_key = burst_datagrams(data, key=protector(cipher, key=bytes(32)))
    hdr_changed = bytearray(good[1])
    hdr_changed[2:4] = b"\x00\x01"  # path id is authenticated too
    bad_marker = b"\xa1" + good[2][1:]  # neither ours nor QUIC (fixed bit 0x40 clear)
    bad_flags = good[2][:1] + b"\x02" + good[2][2:]
    huge_pn = good[2][:8] + struct.pack(">Q", 1 << 62) + good[2][16:]
    batch = [
        bytes(flipped),
        wrong_key[1],
        bytes(hdr_changed),
        good[2][:15],
        good[2][:31],
        bad_marker,
        bad_flags,
        huge_pn,
        good[2][:4] + b"\0\0\0\0" + good[2][8:],
        good[2][:2] + b"\0\x07" + good[2][4:],
        b"",
    ]
    res = process(rx, batch)
    assert len(res.records) == 0 and res.controls == []
    assert bytes(buf) == bytes(300) and rx.ranges(SHARD) == []
    assert rejected(rx) == {
        "rejected_auth": 3,
        "rejected_short": 3,
        "rejected_marker": 3,
        "rejected_conn": 1,
        "rejected_path": 1,
    }
    # A forged datagram must not burn its packet number: the genuine one still lands.
    process(rx, good)
    assert bytes(buf) == data and rx.counters["rejected_replay"] == 0


def test_out_of_bounds_offset_is_a_frame_drop() -> None:
    rx, buf = make_receiver(100)
    dgs = burst_datagrams(bytes(range(200)), max_payload=50)  # offsets 0, 50, 100, 150
    res = process(rx, dgs)
    assert len(res.records) == 2 and rx.counters["rejected_frame"] == 2
    assert bytes(buf) == bytes(range(100)) and rx.ranges(SHARD) == [(0, 100)]


def test_replay_window_edges() -> None:
    rx, _ = make_receiver(8)
    one = burst_datagrams(b"a", first_pn=5000, length=1)
    process(rx, one)
    assert rx.highest_pn(0) == 5000
    inside = burst_datagrams(b"a", first_pn=5000 - WINDOW + 1, length=1)
    outside = burst_datagrams(b"a", first_pn=5000 - WINDOW, length=1)
    process(rx, inside + outside + inside)
    assert rx.counters["accepted_data"] == 2 and rx.counters["rejected_replay"] == 2
    jump = burst_datagrams(b"a", first_pn=20000, length=1)
    process(rx, jump + inside)
    assert rx.highest_pn(0) == 20000 and rx.counters["rejected_replay"] == 3


def test_replay_window_per_path_and_slide() -> None:
    rx, _ = make_receiver(8)
    for pn in range(0, 10000, 7):
        process(rx, burst_datagrams(b"a", first_pn=pn, length=1, path_id=pn % 2))
    accepted = rx.counters["accepted_data"]
    assert accepted == len(range(0, 10000, 7))
    replays = [burst_datagrams(b"a", first_pn=pn, length=1, path_id=pn % 2)[0] for pn in range(0, 10000, 7)]
    process(rx, replays)
    assert rx.counters["accepted_data"] == accepted  # all are seen or below the window


def test_key_phases() -> None:
    rx, buf = make_receiver(20)
    next_key = protector(key=bytes(range(2, 34)))
    phase1 = burst_datagrams(b"k" * 20, key=next_key, key_phase=1, max_payload=10)
    process(rx, phase1[:1])
    assert rx.counters["rejected_key"] == 1
    rx.set_key(1, next_key)
    process(rx, phase1)
    assert bytes(buf) == b"k" * 20
    assert rx.counters["opened_phase1"] == 2 and rx.counters["opened_phase0"] == 0


def test_control_and_unregistered_data_go_to_python() -> None:
    rx, buf = make_receiver(10)
    key = protector()
    probe = key.seal(struct.pack(">BBHIQ", 0x21, 0, 1, CONN, 3), b"\x06" + bytes(8))
    other_shard = burst_datagrams(b"z" * 10, shard_id=SHARD + 1, first_pn=4)
    data_plus_padding = key.seal(
        struct.pack(">BBHIQ", 0x21, 0, 0, CONN, 9), struct.pack(">BIQH", 1, SHARD, 0, 2) + b"ab\0"
    )
    res = process(rx, [probe, *other_shard, data_plus_padding], t=42)
    assert [(c.path_id, c.packet_number, c.rx_time_ns) for c in res.controls] == [
        (1, 3, 42),
        (0, 4, 42),
        (0, 9, 42),
    ]
    assert res.controls[0].plaintext == b"\x06" + bytes(8)
    assert res.controls[1].plaintext[15:] == b"z" * 10
    assert rx.counters["accepted_control"] == 3 and bytes(buf) == bytes(10)
    rx.remove_shard(SHARD)
    res = process(rx, burst_datagrams(b"q" * 10, first_pn=50))
    assert len(res.controls) == 1 and bytes(buf) == bytes(10)


def test_numpy_destination() -> None:
    src = np.arange(256, dtype=np.float32)
    dst = np.zeros_like(src)
    rx = native.Receiver(CONN, 1)
    rx.set_key(0, protector())
    rx.add_shard(SHARD, dst)
    process(rx, burst_datagrams(src.tobytes(), max_payload=333))
    assert np.array_equal(src, dst) and rx.is_complete(SHARD)


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 999), st.integers(1, 300)), min_size=1, max_size=60))
def test_ranges_match_a_reference_merge(chunks: list[tuple[int, int]]) -> None:
    rx = native.Receiver(CONN, 1)
    rx.set_key(0, native.Protector("none", b"", b""))
    buf = bytearray(1000)
    rx.add_shard(SHARD, buf)
    data = bytes(range(250)) * 4
    none = native.Protector("none", b"", b"")
    dgs = []
    for pn, (off, ln) in enumerate(chunks):
        ln = min(ln, 1000 - off)
        dgs += burst_datagrams(data, first_pn=pn, key=none, offset=off, length=ln, max_payload=300)
    process(rx, dgs)
    expected = merge([(o, o + min(n, 1000 - o)) for o, n in chunks])
    assert rx.ranges(SHARD) == expected
    assert rx.received_bytes(SHARD) == sum(b - a for a, b in expected)
    for a, b in expected:
        assert buf[a:b] == data[a:b]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="n_paths"):
        native.Receiver(CONN, 0)
    with pytest.raises(ValueError, match="conn_id"):
        native.Receiver(-1, 1)
    rx, buf = make_receiver(10)
    with pytest.raises(ValueError, match="already registered"):
        rx.add_shard(SHARD, bytearray(3))
    with pytest.raises(BufferError):
        rx.add_shard(1, b"read-only")  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="not registered"):
        rx.ranges(12345)
    with pytest.raises(KeyError):
        rx.remove_shard(12345)
    with pytest.raises(ValueError, match="phase"):
        rx.set_key(2, None)
    with pytest.raises(TypeError, match="protector"):
        rx._c.set_key(0, object())
    with pytest.raises(ValueError, match="path_id"):
        rx.highest_pn(2)
    with pytest.raises(ValueError, match="multiple of 24"):
        rx._c.process(b"x" * 10, b"\0" * 23)
    with pytest.raises(ValueError, match="outside"):
        rx._c.process(b"x" * 10, np.array([(5, 6, 0)], dtype=native.DESC_DTYPE).tobytes())
    with pytest.raises(ValueError, match="outside"):
        rx._c.process(b"x" * 10, np.array([(-1, 2, 0)], dtype=native.DESC_DTYPE).tobytes())
    with pytest.raises(BufferError):
        buf.extend(b"pinned while registered")
    rx.remove_shard(SHARD)
    buf.extend(b"released")


# -- folding placed records into runs ------------------------------------------------


def fold_reference(rows: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int, int, int, int, int]]:
    """Rows (path, pn, shard, offset, length) folded one by one in Python."""
    runs: list[list[int]] = []
    prev: tuple[int, int, int, int, int] | None = None
    for row in rows:
        path, pn, shard, offset, length = row
        if prev is not None and (path, shard) == (prev[0], prev[2]) and pn == prev[1] + 1 \
                and offset == prev[3] + prev[4]:
            runs[-1][2] += 1
            runs[-1][5] += length
        else:
            runs.append([path, pn, 1, shard, offset, length])
        prev = row
    return [(a, b, c, d, e, f) for a, b, c, d, e, f in runs]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 1), st.integers(1, 3),
                          st.integers(0, 2)), max_size=60))
def test_fold_runs_matches_folding_one_record_at_a_time(steps: list[tuple[int, int, int, int, int]]) -> None:
    """Records mostly continue a run (next pn, next bytes) and sometimes break it in every way."""
    rows: list[tuple[int, int, int, int, int]] = []
    path, pn, shard, offset = 0, 1 << 40, 7, 0
    for path_step, pn_jump, shard_step, length_k, offset_jump in steps:
        length = 1400 * length_k
        if rows:
            pn += 1 if pn_jump == 0 else pn_jump * 5
            offset += rows[-1][4] + (0 if offset_jump < 2 else 1400)
            path = (path + (path_step == 2)) % 3
            shard += shard_step
        rows.append((path, pn, shard, offset, length))
    records = np.zeros(len(rows), dtype=native.RECORD_DTYPE)
    for i, (p, n, s, o, length) in enumerate(rows):
        records[i] = (n, o, 123, s, p, length)
    assert native.fold_runs(records) == fold_reference(rows)


def test_fold_runs_refuses_what_is_not_whole_records() -> None:
    with pytest.raises(TypeError, match="RECORD_DTYPE"):
        native.fold_runs(np.zeros(3, dtype=np.uint64))
    from wanxport import _native  # type: ignore[attr-defined]

    with pytest.raises(ValueError, match="whole number"):
        _native.fold_runs(bytes(33))
    assert _native.fold_runs(b"") == []


def test_quic_looking_datagrams_are_handed_back_not_rejected() -> None:
    """On a port shared with the control channel the first byte demultiplexes:
    0x40 set is QUIC (handed back untouched, with its batch index), both top
    bits clear is ours, 0x80 alone is neither (rejected as a bad marker)."""
    data = bytes(range(200))
    rx, buf = make_receiver(200)
    good = burst_datagrams(data)
    rng = random.Random(13)
    random_quic = bytes([rng.randrange(256) | 0x40]) + rng.randbytes(40)
    initial = bytes([0xC3]) + b"\x00\x00\x00\x01" + bytes([8]) + rng.randbytes(8) + b"\x00" * 1180
    neither = b"\x80" + good[0][1:]
    res = process(rx, [random_quic, good[0], initial, neither, good[1]])
    assert res.quic == [(0, random_quic), (2, initial)]
    assert len(res.records) == 2 and bytes(buf) == data
    assert rx.counters["passed_quic"] == 2 and rejected(rx) == {"rejected_marker": 1}
