"""Packet header checks and the per-path replay window (docs/wire-format.md)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire.errors import WireError
from wanxport.wire.header import (
    HEADER_LEN,
    MARKER,
    MAX_PACKET_NUMBER,
    Header,
    decode_header,
    encode_header,
    is_data_plane,
)
from wanxport.wire.replay import WINDOW, ReplayWindow


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF), st.integers(0, MAX_PACKET_NUMBER),
       st.integers(0, 1), st.binary(max_size=8))
def test_header_round_trip(path_id: int, conn_id: int, pn: int, phase: int, tail: bytes) -> None:
    raw = encode_header(path_id, conn_id, pn, phase)
    assert len(raw) == HEADER_LEN
    assert raw == Header(path_id, conn_id, pn, phase).encode()
    assert raw[0] == 0x21 == MARKER
    assert decode_header(raw + tail) == Header(path_id, conn_id, pn, phase)
    assert is_data_plane(raw)


def test_header_layout_is_big_endian() -> None:
    raw = encode_header(0x0102, 0x03040506, 0x0708090A0B0C0D0E, 1)
    assert raw == bytes([0x21, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])


@pytest.mark.parametrize("length", range(HEADER_LEN))
def test_short_header(length: int) -> None:
    with pytest.raises(WireError) as info:
        decode_header(encode_header(1, 2, 3)[:length])
    assert info.value.reason == "short"


@pytest.mark.parametrize("marker", [0x00, 0x20, 0x22, 0x61, 0xC1, 0x41, 0xFF])
def test_wrong_marker(marker: int) -> None:
    raw = bytes([marker]) + encode_header(1, 2, 3)[1:]
    with pytest.raises(WireError) as info:
        decode_header(raw)
    assert info.value.reason == "marker"


@pytest.mark.parametrize("flags", [0x02, 0x03, 0x80, 0xFE])
def test_reserved_flag_bits(flags: int) -> None:
    raw = bytearray(encode_header(1, 2, 3))
    raw[1] = flags
    with pytest.raises(WireError) as info:
        decode_header(bytes(raw))
    assert info.value.reason == "flags"


@pytest.mark.parametrize("pn", [MAX_PACKET_NUMBER + 1, 1 << 63, (1 << 64) - 1])
def test_packet_number_above_2_62(pn: int) -> None:
    raw = struct.pack(">BBHIQ", MARKER, 0, 0, 0, pn)
    with pytest.raises(WireError) as info:
        decode_header(raw)
    assert info.value.reason == "packet_number"


def test_quic_first_bytes_are_not_data_plane() -> None:
    assert not is_data_plane(b"")
    assert not is_data_plane(b"\x40")  # QUIC short header: fixed bit set
    assert not is_data_plane(b"\xc0")  # QUIC long header
    assert is_data_plane(b"\x21")


# -- replay window ----------------------------------------------------------------


class WindowModel:
    """The specification: each number once, nothing 4096 or more below the highest accepted."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.highest = -1

    def check(self, pn: int) -> bool:
        return pn not in self.seen and self.highest - pn < WINDOW

    def record(self, pn: int) -> None:
        self.seen.add(pn)
        self.highest = max(self.highest, pn)


@st.composite
def pn_steps(draw: st.DrawFn) -> list[int]:
    """Mostly nearby numbers, sometimes at the window's edges or far ahead."""
    pns = []
    base = 0
    for _ in range(draw(st.integers(1, 80))):
        kind = draw(st.sampled_from(["near", "near", "edge", "jump", "back"]))
        if kind == "near":
            pn = base + draw(st.integers(-8, 8))
        elif kind == "edge":
            pn = base - WINDOW + draw(st.integers(-2, 2))
        elif kind == "jump":
            pn = base + draw(st.sampled_from([WINDOW - 1, WINDOW, WINDOW + 1, 10**6, MAX_PACKET_NUMBER // 2]))
        else:
            pn = base - draw(st.integers(0, 3 * WINDOW))
        pn = min(max(pn, 0), MAX_PACKET_NUMBER)
        pns.append(pn)
        base = max(base, pn)
    return pns


@settings(max_examples=150, deadline=None, derandomize=True)
@given(pn_steps())
def test_replay_window_matches_model(pns: list[int]) -> None:
    window, model = ReplayWindow(), WindowModel()
    for pn in pns:
        expected = model.check(pn)
        assert window.check(pn) == expected, (pn, model.highest)
        assert window.check(pn) == expected, "check must not record"
        if expected:
            window.record(pn)
            model.record(pn)
        assert window.highest == model.highest
        assert 0 <= window._bits < 1 << WINDOW, "the bitmap stays bounded"
    for pn in model.seen:
        assert not window.check(pn), "an accepted number is never accepted again"


def test_window_edge_is_4096() -> None:
    window = ReplayWindow()
    window.record(10_000)
    assert window.check(10_000 - (WINDOW - 1))
    assert not window.check(10_000 - WINDOW)
    assert window.check(10_001)
    assert not window.check(10_000)


def test_far_ahead_jump_forgets_old_bitmap_but_keeps_the_window() -> None:
    window = ReplayWindow()
    for pn in range(100):
        window.record(pn)
    window.record(50 + WINDOW)  # 0..49 are now outside the window; 50..99 inside
    assert not window.check(49)
    for pn in range(50, 100):
        assert not window.check(pn)
    assert window.check(100)
    window.record(10**9)
    assert not window.check(10**9)
    assert window.check(10**9 - 1)
    assert not window.check(50 + WINDOW)


def test_duplicate_first_packet_number_zero() -> None:
    window = ReplayWindow()
    assert window.check(0)
    window.record(0)
    assert not window.check(0)
    assert window.check(1)
