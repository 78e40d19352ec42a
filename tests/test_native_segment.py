"""build_data_datagrams: segmentation + sealing of a burst, checked with ``cryptography``."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

KEY = bytes(range(1, 33))
IV = bytes(range(50, 62))
CIPHERS = {"aes-256-gcm": AESGCM, "chacha20-poly1305": ChaCha20Poly1305}


def nonce(path_id: int, pn: int) -> bytes:
    return bytes(a ^ b for a, b in zip(IV, b"\0\0" + struct.pack(">HQ", path_id, pn), strict=True))


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_burst_layout_and_contents(cipher: str) -> None:
    shard = random.Random(1).randbytes(10_000)
    p = native.Protector(cipher, KEY, IV)
    burst = native.build_data_datagrams(p, 0xAABBCCDD, 2, 1000, 1, 77, shard, 123, 5000, 1400)
    assert (burst.count, burst.stride) == (4, 16 + 15 + 1400 + 16)
    assert burst.lengths() == [1447, 1447, 1447, 16 + 15 + 800 + 16]
    assert len(burst.buffer) == sum(burst.lengths())
    aead = CIPHERS[cipher](KEY)
    for i in range(burst.count):
        dg = bytes(burst.datagram(i))
        marker, flags, path_id, conn_id, pn = struct.unpack_from(">BBHIQ", dg)
        assert (marker, flags, path_id, conn_id, pn) == (0x21, 1, 2, 0xAABBCCDD, 1000 + i)
        plain = aead.decrypt(nonce(2, pn), dg[16:], dg[:16])
        ftype, shard_id, offset, length = struct.unpack_from(">BIQH", plain)
        assert (pn, offset, length) == burst.chunk(i)
        assert (ftype, shard_id) == (1, 77)
        assert plain[15:] == shard[offset : offset + length]
        assert len(plain) == 15 + length


def test_numpy_shard_and_exact_multiple() -> None:
    arr = np.arange(1000, dtype=np.uint32)  # 4000 bytes
    p = native.Protector("aes-256-gcm", KEY, IV)
    burst = native.build_data_datagrams(p, 1, 0, 0, 0, 5, arr, 0, 4000, 1000)
    assert burst.count == 4 and burst.lengths() == [burst.stride] * 4
    empty = native.build_data_datagrams(p, 1, 0, 0, 0, 5, arr, 4000, 0, 1000)
    assert (empty.count, len(empty.buffer)) == (0, 0)


def test_none_cipher_stride_has_no_tag() -> None:
    p = native.Protector("none", b"", b"")
    burst = native.build_data_datagrams(p, 1, 0, 0, 0, 5, b"x" * 10, 0, 10, 4)
    assert burst.stride == 16 + 15 + 4 and burst.count == 3
    assert bytes(burst.datagram(2))[31:] == b"xx"


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"offset": -1}, ValueError, "offset"),
        ({"offset": 101}, ValueError, "offset"),
        ({"length": 2}, ValueError, "length"),  # offset 99 + 2 > 100
        ({"length": -5}, ValueError, "length"),
        ({"max_payload": 0}, ValueError, "max_payload"),
        ({"max_payload": 70000}, ValueError, "max_payload"),
        ({"key_phase": 2}, ValueError, "key_phase"),
        ({"path_id": 65536}, ValueError, "path_id"),
        ({"conn_id": -1}, ValueError, "conn_id"),
        ({"shard_id": 1 << 32}, ValueError, "shard_id"),
        ({"first_pn": (1 << 62) - 1}, ValueError, "first_pn"),  # 1 datagram fits, 2 do not
        ({"first_pn": 1 << 62}, ValueError, "first_pn"),
        ({"conn_id": "1"}, TypeError, "conn_id"),
        ({"protector": object()}, TypeError, "protector"),
        ({"shard_buffer": "text"}, TypeError, ""),
    ],
)
def test_bad_arguments_raise(change: dict[str, object], exc: type[Exception], match: str) -> None:
    args: dict[str, object] = {
        "protector": native.Protector("aes-256-gcm", KEY, IV)._c,
        "conn_id": 1,
        "path_id": 0,
        "first_pn": 0,
        "key_phase": 0,
        "shard_id": 1,
        "shard_buffer": bytes(100),
        "offset": 99,
        "length": 1,
        "max_payload": 1,
    }
    if change.get("first_pn") == (1 << 62) - 1:
        args["offset"], args["length"] = 0, 2
    args.update(change)
    with pytest.raises(exc, match=match or None):
        native._native.build_data_datagrams(**args)
