"""Frame codec (docs/wire-format.md): every frame round-trips, and malformed input is a WireError.

The decoder is the first code that touches a peer's bytes after authentication,
so it must turn *anything* malformed into a ``WireError`` (a counted drop),
never another exception and never a silently wrong frame.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire.errors import WireError
from wanxport.wire.frames import (
    DATA,
    MAX_OFFSET,
    AckFrame,
    CloseFrame,
    CreditFrame,
    DataFrame,
    Frame,
    PaddingFrame,
    ProbeAckFrame,
    ProbeFrame,
    ShardAckFrame,
    ShardDigestFrame,
    ShardDoneFrame,
    ShardOpenFrame,
    decode_frames,
    encode_frame,
    encode_frames,
)

U16, U32, U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1
FAST = settings(max_examples=60, deadline=None, derandomize=True)


# -- strategies ---------------------------------------------------------------


@st.composite
def data_frames(draw: st.DrawFn) -> DataFrame:
    data = draw(st.binary(max_size=300))
    offset = draw(st.integers(0, MAX_OFFSET - len(data)))
    return DataFrame(draw(st.integers(0, U32)), offset, len(data), data)


@st.composite
def ack_frames(draw: st.DrawFn) -> AckFrame:
    """1..256 inclusive ranges, highest first, with at least one number between neighbours."""
    count = draw(st.integers(1, 256))
    points = sorted(draw(st.sets(st.integers(0, MAX_OFFSET - 1), min_size=2 * count, max_size=2 * count)))
    ranges = [(points[2 * i], points[2 * i + 1]) for i in range(count)]
    ranges = [r for i, r in enumerate(ranges) if i == 0 or r[0] > ranges[i - 1][1] + 1]
    if draw(st.booleans()):
        ranges[0] = (ranges[0][0], ranges[0][0])  # a single-number range is valid
    return AckFrame(draw(st.integers(0, U16)), draw(st.integers(0, U32)), tuple(reversed(ranges)))


@st.composite
def shard_ack_frames(draw: st.DrawFn) -> ShardAckFrame:
    """0..256 half-open ranges, ascending, with a gap between neighbours."""
    count = draw(st.integers(0, 40))
    points = sorted(draw(st.sets(st.integers(0, MAX_OFFSET), min_size=2 * count, max_size=2 * count)))
    ranges = [(points[2 * i], points[2 * i + 1]) for i in range(count)]
    ranges = [r for i, r in enumerate(ranges) if i == 0 or r[0] > ranges[i - 1][1]]
    return ShardAckFrame(draw(st.integers(0, U32)), tuple(ranges))


control_frames = st.one_of(
    ack_frames(),
    shard_ack_frames(),
    st.builds(
        ShardOpenFrame,
        st.integers(0, U32),
        st.integers(0, MAX_OFFSET),
        st.one_of(st.none(), st.binary(min_size=32, max_size=32)),  # None: opened unhashed
        st.text(max_size=40).map(str.encode),
    ),
    st.builds(ShardDigestFrame, st.integers(0, U32), st.binary(min_size=32, max_size=32)),
    st.builds(ShardDoneFrame, st.integers(0, U32), st.integers(0, 2)),
    st.builds(ProbeFrame, st.integers(0, U64)),
    st.builds(ProbeAckFrame, st.integers(0, U64)),
    st.builds(CloseFrame, st.integers(0, U16), st.text(max_size=40)),
    st.builds(CreditFrame, st.integers(0, U64)),
)
any_frame = st.one_of(data_frames(), control_frames)


@st.composite
def packets(draw: st.DrawFn) -> list[Frame]:
    """A valid payload: frames back to back, optionally ending in PADDING (which eats the rest)."""
    frames: list[Frame] = draw(st.lists(any_frame, min_size=1, max_size=6))
    if draw(st.booleans()):
        frames.append(PaddingFrame(draw(st.integers(1, 64))))
    return frames


def normalise(frame: Frame) -> Frame:
    """Decoded DATA frames hold a memoryview of the packet; compare them as bytes."""
    if isinstance(frame, DataFrame):
        return DataFrame(frame.shard_id, frame.offset, frame.length,
                         None if frame.data is None else bytes(frame.data))
    return frame


def frame_bytes(frame: Frame) -> bytes:
    out = bytearray()
    encode_frame(frame, out)
    return bytes(out)


def decode_or_wire_error(payload: bytes) -> list[Frame] | None:
    """Decode; a WireError becomes None, any other exception fails the test."""
    try:
        return decode_frames(payload)
    except WireError as exc:
        assert exc.reason, "a WireError must name its counter key"
        return None


# -- round trips ----------------------------------------------------------------


@FAST
@given(packets())
def test_every_frame_type_round_trips(frames: list[Frame]) -> None:
    payload = encode_frames(frames)
    decoded = decode_frames(payload)
    assert [normalise(f) for f in decoded] == [normalise(f) for f in frames]
    assert sum(f.wire_size for f in frames) == len(payload)


@FAST
@given(any_frame)
def test_wire_size_matches_encoding(frame: Frame) -> None:
    assert frame.wire_size == len(frame_bytes(frame))


def test_extreme_values_round_trip() -> None:
    frames: list[Frame] = [
        DataFrame(U32, MAX_OFFSET - 3, 3, b"abc"),
        AckFrame(U16, U32, ((MAX_OFFSET - 1, MAX_OFFSET - 1), (0, 0))),
        ShardAckFrame(U32, ((0, 1), (MAX_OFFSET - 1, MAX_OFFSET))),
        ShardAckFrame(0, ()),
        ShardOpenFrame(U32, MAX_OFFSET, bytes(range(32)), b'{"dtype": "bf16"}'),
        ShardDoneFrame(0, 2),
        ProbeFrame(U64),
        ProbeAckFrame(0),
        CloseFrame(U16, "fin ✓"),
        CreditFrame(U64),
        PaddingFrame(1),
    ]
    assert [normalise(f) for f in decode_frames(encode_frames(frames))] == frames


def test_ack_frame_allows_exactly_256_ranges() -> None:
    ranges = tuple((2 * i, 2 * i) for i in reversed(range(256)))
    assert decode_frames(encode_frames([AckFrame(0, 0, ranges)])) == [AckFrame(0, 0, ranges)]


# -- truncation and garbage -----------------------------------------------------


@settings(max_examples=40, deadline=None, derandomize=True)
@given(packets())
def test_every_prefix_decodes_to_whole_frames_or_raises_wire_error(frames: list[Frame]) -> None:
    """Cutting a packet anywhere: at a frame boundary it is the leading frames, else a WireError."""
    payload = encode_frames(frames)
    boundaries = {0: 0}
    pos = 0
    for i, frame in enumerate(frames):
        pos += frame.wire_size
        boundaries[pos] = i + 1
    padding_start = pos - frames[-1].wire_size if isinstance(frames[-1], PaddingFrame) else None
    for cut in range(1, len(payload)):
        decoded = decode_or_wire_error(payload[:cut])
        if cut in boundaries:
            assert decoded is not None
            assert [normalise(f) for f in decoded] == [normalise(f) for f in frames[: boundaries[cut]]]
        elif padding_start is not None and cut > padding_start:
            assert decoded is not None and decoded[-1] == PaddingFrame(cut - padding_start)
        else:
            assert decoded is None, f"prefix of {cut}/{len(payload)} bytes decoded to {decoded}"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.binary(min_size=0, max_size=200))
def test_random_bytes_only_ever_raise_wire_error(payload: bytes) -> None:
    decode_or_wire_error(payload)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(packets(), st.data())
def test_mutated_packets_only_ever_raise_wire_error(frames: list[Frame], data: st.DataObject) -> None:
    payload = bytearray(encode_frames(frames))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    decode_or_wire_error(bytes(payload) + data.draw(st.binary(max_size=20)))


def test_empty_payload_is_an_error() -> None:
    with pytest.raises(WireError):
        decode_frames(b"")


@pytest.mark.parametrize("kind", [0x0D, 0x0F, 0x21, 0x80, 0xFF])
def test_unknown_frame_type(kind: int) -> None:
    with pytest.raises(WireError) as info:
        decode_frames(frame_bytes(ProbeFrame(1)) + bytes([kind]) + bytes(16))
    assert info.value.reason == "frame_type"


@pytest.mark.parametrize("padding", [b"\x00\x01", b"\x00\x00\x00\x80", b"\x00" * 30 + b"\x01"])
def test_non_zero_padding(padding: bytes) -> None:
    with pytest.raises(WireError) as info:
        decode_frames(frame_bytes(CreditFrame(5)) + padding)
    assert info.value.reason == "padding"


def test_padding_swallows_the_rest_so_frames_cannot_follow_it() -> None:
    with pytest.raises(WireError):
        decode_frames(bytes(3) + frame_bytes(ProbeFrame(1)))


def test_bad_utf8_in_close_reason() -> None:
    body = struct.pack(">BHH", 0x08, 1, 2) + b"\xc3\x28"
    with pytest.raises(WireError) as info:
        decode_frames(body)
    assert info.value.reason == "utf8"


def test_bad_utf8_in_shard_open_metadata() -> None:
    frame = ShardOpenFrame(1, 10, bytes(32), b"\xff\xfe")
    with pytest.raises(WireError):
        decode_frames(frame_bytes(frame))


def test_data_frame_beyond_2_62() -> None:
    body = struct.pack(">BIQH", DATA, 1, MAX_OFFSET - 1, 2) + b"xy"
    with pytest.raises(WireError) as info:
        decode_frames(body)
    assert info.value.reason == "offset"
    decode_frames(struct.pack(">BIQH", DATA, 1, MAX_OFFSET - 2, 2) + b"xy")  # exactly at the limit


def test_shard_open_size_beyond_2_62() -> None:
    with pytest.raises(WireError):
        decode_frames(struct.pack(">BIQ32sH", 0x04, 1, MAX_OFFSET + 1, bytes(32), 0))


def test_shard_done_unknown_status() -> None:
    with pytest.raises(WireError) as info:
        decode_frames(struct.pack(">BIB", 0x05, 1, 3))
    assert info.value.reason == "status"


def _ack(ranges: list[tuple[int, int]], count: int | None = None) -> bytes:
    body = struct.pack(">BHIH", 0x02, 0, 0, len(ranges) if count is None else count)
    return body + b"".join(struct.pack(">QQ", lo, hi) for lo, hi in ranges)


def _shard_ack(ranges: list[tuple[int, int]], count: int | None = None) -> bytes:
    body = struct.pack(">BIH", 0x03, 0, len(ranges) if count is None else count)
    return body + b"".join(struct.pack(">QQ", lo, hi) for lo, hi in ranges)


@pytest.mark.parametrize(
    "payload",
    [
        _ack([]),  # at least one range
        _ack([(2 * i, 2 * i) for i in reversed(range(257))]),  # at most 256
        _ack([(5, 4)]),  # first > last
        _ack([(1, 2), (5, 6)]),  # ascending
        _ack([(5, 6), (3, 4)]),  # touching
        _ack([(5, 6), (3, 5)]),  # overlapping
        _ack([(5, 6), (5, 6)]),  # duplicate
        _ack([(0, MAX_OFFSET)]),  # beyond the largest packet number
        _ack([(9, 9)], count=2),  # count runs past the end
    ],
    ids=["none", "257", "inverted", "ascending", "touching", "overlapping", "duplicate", "huge", "short"],
)
def test_malformed_ack_ranges(payload: bytes) -> None:
    assert decode_or_wire_error(payload) is None


@pytest.mark.parametrize(
    "payload",
    [
        _shard_ack([(2 * i, 2 * i + 1) for i in range(257)]),  # at most 256
        _shard_ack([(4, 4)]),  # empty range
        _shard_ack([(5, 4)]),  # inverted
        _shard_ack([(5, 6), (1, 2)]),  # descending
        _shard_ack([(1, 3), (3, 5)]),  # touching
        _shard_ack([(1, 4), (3, 5)]),  # overlapping
        _shard_ack([(0, MAX_OFFSET + 1)]),  # beyond 2^62
        _shard_ack([(0, 1)], count=3),  # count runs past the end
    ],
    ids=["257", "empty", "inverted", "descending", "touching", "overlapping", "huge", "short"],
)
def test_malformed_shard_ack_ranges(payload: bytes) -> None:
    assert decode_or_wire_error(payload) is None


def test_malformed_frame_anywhere_drops_the_whole_packet() -> None:
    good = frame_bytes(CreditFrame(1)) + frame_bytes(ProbeFrame(2))
    assert decode_or_wire_error(good + _ack([(1, 2), (5, 6)])) is None
    assert decode_or_wire_error(_ack([(1, 2), (5, 6)]) + good) is None
