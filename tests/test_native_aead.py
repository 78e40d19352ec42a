"""Native AEAD (Protector, seal/open) against ``cryptography``, the reference AEAD."""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

CIPHERS = {"aes-256-gcm": AESGCM, "chacha20-poly1305": ChaCha20Poly1305}
KEY = bytes(range(32))
IV = bytes(range(100, 112))


def header(path_id: int, pn: int, conn_id: int = 0x01020304, flags: int = 0) -> bytes:
    return struct.pack(">BBHIQ", 0x21, flags, path_id, conn_id, pn)


def nonce(iv: bytes, path_id: int, pn: int) -> bytes:
    tail = b"\x00\x00" + struct.pack(">HQ", path_id, pn)
    return bytes(a ^ b for a, b in zip(iv, tail, strict=True))


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
@pytest.mark.parametrize(
    ("path_id", "pn", "plaintext"),
    [(0, 0, b""), (3, 12345, b"hello world"), (65535, (1 << 62) - 1, bytes(range(256)) * 5)],
)
def test_seal_matches_reference(cipher: str, path_id: int, pn: int, plaintext: bytes) -> None:
    p = native.Protector(cipher, KEY, IV)
    hdr = header(path_id, pn)
    datagram = native.seal_packet(p, hdr, plaintext)
    expected = CIPHERS[cipher](KEY).encrypt(nonce(IV, path_id, pn), plaintext, hdr)
    assert datagram == hdr + expected
    assert len(datagram) == 16 + len(plaintext) + 16


def test_known_answer_aes_gcm() -> None:
    """Pins the nonce construction: independent of this file's nonce() helper."""
    p = native.Protector("aes-256-gcm", bytes(32), bytes(12))
    # path 0, pn 0 -> nonce = IV = zeros: the tag of empty plaintext under the
    # all-zero key with 16 zero-ish AAD bytes, as computed by cryptography.
    hdr = header(0, 0, conn_id=0)
    ref = AESGCM(bytes(32)).encrypt(bytes(12), b"", hdr)
    assert native.seal_packet(p, hdr, b"") == hdr + ref


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_open_reference_sealed(cipher: str) -> None:
    p = native.Protector(cipher, KEY, IV)
    hdr = header(7, 99)
    sealed = CIPHERS[cipher](KEY).encrypt(nonce(IV, 7, 99), b"control frame", hdr)
    assert native.open_packet(p, hdr + sealed) == b"control frame"


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    cipher=st.sampled_from(sorted(CIPHERS)),
    key=st.binary(min_size=32, max_size=32),
    iv=st.binary(min_size=12, max_size=12),
    path_id=st.integers(0, 65535),
    pn=st.integers(0, (1 << 62) - 1),
    plaintext=st.binary(max_size=1500),
)
def test_random_cross_both_directions(
    cipher: str, key: bytes, iv: bytes, path_id: int, pn: int, plaintext: bytes
) -> None:
    p = native.Protector(cipher, key, iv)
    ref = CIPHERS[cipher](key)
    hdr = header(path_id, pn)
    datagram = native.seal_packet(p, hdr, plaintext)
    assert ref.decrypt(nonce(iv, path_id, pn), datagram[16:], hdr) == plaintext
    assert native.open_packet(p, hdr + ref.encrypt(nonce(iv, path_id, pn), plaintext, hdr)) == (plaintext)


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_every_flipped_bit_is_rejected(cipher: str) -> None:
    p = native.Protector(cipher, KEY, IV)
    datagram = native.seal_packet(p, header(1, 5), b"0123456789")
    for byte in range(len(datagram)):
        bad = bytearray(datagram)
        bad[byte] ^= 0x10
        assert native.open_packet(p, bad) is None, byte


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_wrong_key_and_truncation_rejected(cipher: str) -> None:
    datagram = native.seal_packet(native.Protector(cipher, KEY, IV), header(1, 5), b"abc")
    other = native.Protector(cipher, bytes(32), IV)
    assert native.open_packet(other, datagram) is None
    p = native.Protector(cipher, KEY, IV)
    for cut in (0, 1, 15, 16, 31, len(datagram) - 1):
        assert native.open_packet(p, datagram[:cut]) is None


def test_batches_match_single_calls() -> None:
    p = native.Protector("aes-256-gcm", KEY, IV)
    packets = [(header(i % 3, i), bytes([i]) * i) for i in range(20)]
    sealed = p.seal_batch(packets)
    assert sealed == [p.seal(h, pt) for h, pt in packets]
    tampered = list(sealed)
    tampered[4] = tampered[4][:-1] + bytes([tampered[4][-1] ^ 1])
    opened = p.open_batch([*tampered, b"short"])
    assert opened[:4] == [pt for _, pt in packets[:4]]
    assert opened[4] is None
    assert opened[5:20] == [pt for _, pt in packets[5:]]
    assert opened[20] is None
    assert p.seal_batch([]) == [] and p.open_batch([]) == []


def test_none_cipher_has_no_tag() -> None:
    p = native.Protector("none", b"", b"")
    assert (p.cipher, p.tag_len) == ("none", 0)
    assert p.seal(header(0, 1), b"xyz") == header(0, 1) + b"xyz"
    assert p.open(header(0, 1) + b"xyz") == b"xyz"


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (("aes-256-gcm", bytes(31), IV), ValueError, "key: must be 32 bytes"),
        (("aes-256-gcm", KEY, bytes(8)), ValueError, "iv: must be 12 bytes"),
        (("des", KEY, IV), ValueError, "cipher"),
        (("aes-256-gcm", "not bytes", IV), TypeError, "bytes-like"),
    ],
)
def test_bad_protector_arguments(args: tuple[object, ...], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        native.Protector(*args)  # type: ignore[arg-type]


def test_bad_seal_arguments() -> None:
    p = native.Protector("aes-256-gcm", KEY, IV)
    with pytest.raises(ValueError, match="header: must be 16 bytes"):
        p.seal(b"\x21" * 15, b"")
    with pytest.raises(ValueError, match="plaintext"):
        p.seal(header(0, 0), bytes(70000))
    with pytest.raises(TypeError, match="protector"):
        native._native.seal_packet(object(), header(0, 0), b"")
    with pytest.raises(TypeError, match="packets"):
        p.seal_batch([b"not a tuple"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not initialised"):
        native._native.seal_packet(
            native._native.Protector.__new__(native._native.Protector), header(0, 0), b""
        )


def test_one_protector_shared_by_threads() -> None:
    """Seal/open release the GIL; the per-key lock keeps concurrent use correct."""
    p = native.Protector("aes-256-gcm", KEY, IV)
    ref = AESGCM(KEY)
    packets = [(header(t, i), bytes([t]) * 300) for t in range(4) for i in range(200)]

    def work(t: int) -> bool:
        mine = [pk for pk in packets if pk[0][3] == t]
        sealed = p.seal_batch(mine)
        return p.open_batch(sealed) == [pt for _, pt in mine] and all(
            ref.decrypt(nonce(IV, t, i), s[16:], s[:16]) == mine[i][1] for i, s in enumerate(sealed)
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))
