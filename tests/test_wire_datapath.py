"""Reference data path: sealing and opening datagrams (docs/wire-format.md, "Protection").

An opener must return None and count the reason for every bad datagram (forged,
replayed, truncated, misaddressed), never raise and never let a forgery spend
a packet number of the replay window.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire.datapath import PacketOpener, PacketSealer
from wanxport.wire.frames import (
    CloseFrame,
    CreditFrame,
    DataFrame,
    Frame,
    ProbeFrame,
    ShardDoneFrame,
)
from wanxport.wire.header import HEADER_LEN, encode_header
from wanxport.wire.protection import TAG_LEN, AeadProtection, NullProtection, Protection, make_nonce

CONN = 0xC0FFEE
PATHS = 3
KEY_A, IV_A = bytes(range(32)), bytes(range(100, 112))
KEY_B, IV_B = bytes(range(1, 33)), bytes(range(100, 112))


def aead(cipher: str, key: bytes = KEY_A, iv: bytes = IV_A) -> Protection:
    return AeadProtection(cipher, key, iv)


CIPHERS = ["aes-256-gcm", "chacha20-poly1305"]


def pair(cipher: str) -> tuple[PacketSealer, PacketOpener]:
    keys: dict[int, Protection] = {0: aead(cipher)}
    return PacketSealer(CONN, keys), PacketOpener(CONN, PATHS, {0: aead(cipher)})


def plain(frames: list[Frame]) -> list[Frame]:
    return [DataFrame(f.shard_id, f.offset, f.length, bytes(f.data)) if isinstance(f, DataFrame)
            and f.data is not None else f for f in frames]


FRAMES: list[Frame] = [DataFrame(7, 4096, 5, b"hello"), CreditFrame(1 << 20), ProbeFrame(9)]


@pytest.mark.parametrize("cipher", CIPHERS)
def test_aead_round_trip_and_ciphertext_hides_plaintext(cipher: str) -> None:
    sealer, opener = pair(cipher)
    datagram = sealer.seal(2, 41, FRAMES)
    assert datagram[:HEADER_LEN] == encode_header(2, CONN, 41)
    assert b"hello" not in datagram
    opened = opener.open(datagram)
    assert opened is not None
    assert (opened.header.path_id, opened.header.packet_number, opened.header.conn_id) == (2, 41, CONN)
    assert plain(opened.frames) == FRAMES
    assert opener.dropped == 0


def test_null_protection_round_trip() -> None:
    sealer = PacketSealer(CONN, {0: NullProtection()})
    opener = PacketOpener(CONN, PATHS, {0: NullProtection()})
    datagram = sealer.seal(0, 0, FRAMES)
    assert b"hello" in datagram
    opened = opener.open(datagram)
    assert opened is not None and plain(opened.frames) == FRAMES


@pytest.mark.parametrize("cipher", CIPHERS)
def test_matches_cryptography_reference(cipher: str) -> None:
    """The nonce is IV XOR (0^2 || path_id || pn) and the header is the associated data."""
    sealer, _ = pair(cipher)
    datagram = sealer.seal(1, 0x0102030405, [ProbeFrame(3)])
    nonce = make_nonce(IV_A, 1, 0x0102030405)
    assert nonce == bytes(a ^ b for a, b in zip(IV_A, bytes(2) + (1).to_bytes(2, "big")
                                                 + (0x0102030405).to_bytes(8, "big"), strict=True))
    ref = AESGCM(KEY_A) if cipher == "aes-256-gcm" else ChaCha20Poly1305(KEY_A)
    plaintext = ref.decrypt(nonce, datagram[HEADER_LEN:], datagram[:HEADER_LEN])
    assert plaintext == bytes([6]) + (3).to_bytes(8, "big")  # PROBE, token 3


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(CIPHERS), st.data())
def test_any_flipped_bit_is_a_counted_drop(cipher: str, data: st.DataObject) -> None:
    sealer, opener = pair(cipher)
    datagram = bytearray(sealer.seal(1, 5, FRAMES))
    bit = data.draw(st.integers(0, len(datagram) * 8 - 1))
    datagram[bit // 8] ^= 1 << (bit % 8)
    assert opener.open(bytes(datagram)) is None
    assert opener.dropped == 1
    if bit // 8 >= HEADER_LEN or 8 <= bit // 8 < HEADER_LEN and bit // 8 != 8:
        assert opener.drops["auth"] == 1  # payload, tag or packet number
    # the genuine packet still opens: the forgery did not consume its packet number
    assert opener.open(sealer.seal(1, 5, FRAMES)) is not None


@pytest.mark.parametrize("cipher", CIPHERS)
def test_wrong_key_or_iv(cipher: str) -> None:
    sealer, _ = pair(cipher)
    for key, iv in [(KEY_B, IV_A), (KEY_A, bytes(12))]:
        opener = PacketOpener(CONN, PATHS, {0: aead(cipher, key, iv)})
        assert opener.open(sealer.seal(0, 1, FRAMES)) is None
        assert opener.drops == {"auth": 1}


def test_other_cipher_same_key_fails_auth() -> None:
    sealer, _ = pair("aes-256-gcm")
    opener = PacketOpener(CONN, PATHS, {0: aead("chacha20-poly1305")})
    assert opener.open(sealer.seal(0, 1, FRAMES)) is None
    assert opener.drops == {"auth": 1}


@pytest.mark.parametrize("cipher", CIPHERS)
def test_replay_is_dropped_per_path(cipher: str) -> None:
    sealer, opener = pair(cipher)
    first = sealer.seal(0, 3, FRAMES)
    assert opener.open(first) is not None
    assert opener.open(first) is None
    assert opener.drops == {"replay": 1}
    assert opener.open(sealer.seal(1, 3, FRAMES)) is not None, "packet numbers are per path"
    assert opener.open(sealer.seal(0, 2, FRAMES)) is not None, "older but unseen is fine"
    assert opener.open(sealer.seal(0, 3 + 5000, FRAMES)) is not None
    assert opener.open(sealer.seal(0, 4, FRAMES)) is None, "below the 4096 window"
    assert opener.drops == {"replay": 2}


@pytest.mark.parametrize("cipher", CIPHERS)
def test_truncated(cipher: str) -> None:
    sealer, opener = pair(cipher)
    datagram = sealer.seal(0, 1, FRAMES)
    for cut in range(len(datagram)):
        assert opener.open(datagram[:cut]) is None
    assert opener.drops["short"] == HEADER_LEN + TAG_LEN
    assert opener.drops["auth"] == len(datagram) - HEADER_LEN - TAG_LEN
    assert opener.dropped == len(datagram)
    assert opener.open(datagram) is not None


def test_wrong_conn_id_unknown_path_unknown_key_phase() -> None:
    keys: dict[int, Protection] = {0: aead("aes-256-gcm")}
    opener = PacketOpener(CONN, PATHS, keys)
    assert opener.open(PacketSealer(CONN + 1, keys).seal(0, 1, FRAMES)) is None
    assert opener.open(PacketSealer(CONN, keys).seal(PATHS, 1, FRAMES)) is None
    assert opener.open(PacketSealer(CONN, {1: aead("aes-256-gcm")}, key_phase=1).seal(0, 1, FRAMES)) is None
    assert opener.drops == {"conn": 1, "path": 1, "key_phase": 1}


def test_key_phase_selects_the_key() -> None:
    k0, k1 = aead("aes-256-gcm"), aead("aes-256-gcm", KEY_B)
    opener = PacketOpener(CONN, PATHS, {0: k0, 1: k1})
    assert opener.open(PacketSealer(CONN, {1: k1}, key_phase=1).seal(0, 1, FRAMES)) is not None
    assert opener.open(PacketSealer(CONN, {1: k0}, key_phase=1).seal(0, 2, FRAMES)) is None
    assert opener.drops == {"auth": 1}


def test_authenticated_but_malformed_frames_are_counted_and_do_not_spend_the_number() -> None:
    keys: dict[int, Protection] = {0: aead("aes-256-gcm")}
    opener = PacketOpener(CONN, PATHS, keys)
    key = keys[0]
    for payload, reason in [(b"", "empty"), (b"\x3f", "frame_type"), (b"\x00\x01", "padding"),
                            (b"\x08\x00\x01\x00\x02\xc3\x28", "utf8"), (b"\x01\x00", "truncated")]:
        header = encode_header(0, CONN, 7)
        assert opener.open(header + key.seal(header, 0, 7, payload)) is None
        assert opener.drops[reason] == 1, reason
    assert opener.open(PacketSealer(CONN, keys).seal(0, 7, [ShardDoneFrame(1, 0)])) is not None


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.binary(max_size=120), st.sampled_from(["aes-256-gcm", "null"]))
def test_random_datagrams_never_raise(datagram: bytes, kind: str) -> None:
    keys: dict[int, Protection] = {0: NullProtection() if kind == "null" else aead("aes-256-gcm")}
    opener = PacketOpener(CONN, PATHS, keys)
    for candidate in (datagram, encode_header(0, CONN, 1) + datagram):
        before = opener.dropped
        result = opener.open(candidate)
        assert (result is None) == (opener.dropped == before + 1)
        assert result is None or kind == "null", "nothing forged opens under AEAD"


def test_null_protection_corruption_reaches_frames_unnoticed() -> None:
    """Why the session must verify digests: with null protection a flipped data byte opens fine."""
    sealer = PacketSealer(CONN, {0: NullProtection()})
    opener = PacketOpener(CONN, PATHS, {0: NullProtection()})
    datagram = bytearray(sealer.seal(0, 0, [DataFrame(1, 0, 4, b"abcd"), CloseFrame(0, "")]))
    datagram[HEADER_LEN + 15] ^= 0x01
    opened = opener.open(bytes(datagram))
    assert opened is not None and bytes(opened.frames[0].data) == b"`bcd"  # type: ignore[union-attr]
