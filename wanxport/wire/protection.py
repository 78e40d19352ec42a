"""Packet protection: the AEAD seam of the wire format (docs/wire-format.md).

``cryptography``'s AEAD classes are the reference implementation that the
native data path is tested against byte for byte. ``NullProtection`` exists
for the simulator and tests, where cryptography would only cost time.
"""

from __future__ import annotations

import struct
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

KEY_LEN = 32
IV_LEN = 12
TAG_LEN = 16
CIPHERS = ("aes-256-gcm", "chacha20-poly1305")

_NONCE_TAIL = struct.Struct(">HQ")


class Protection(Protocol):
    """Seals and opens packet payloads with the header as associated data."""

    name: str
    overhead: int

    def seal(self, header: bytes, path_id: int, packet_number: int, plaintext: bytes) -> bytes: ...

    def open(
        self, header: bytes | memoryview, path_id: int, packet_number: int, sealed: bytes | memoryview
    ) -> bytes | None:
        """The plaintext, or None when authentication fails."""
        ...


def make_nonce(iv: bytes, path_id: int, packet_number: int) -> bytes:
    """IV XOR (0x0000 || path_id || packet_number): unique while pns are not reused per path."""
    tail = int.from_bytes(iv, "big") ^ int.from_bytes(
        b"\x00\x00" + _NONCE_TAIL.pack(path_id, packet_number), "big"
    )
    return tail.to_bytes(IV_LEN, "big")


class AeadProtection:
    """AES-256-GCM or ChaCha20-Poly1305 with one key and IV (one direction, one key phase)."""

    overhead = TAG_LEN

    def __init__(self, cipher: str, key: bytes, iv: bytes) -> None:
        if cipher not in CIPHERS:
            raise ValueError(f"cipher {cipher!r} is not supported; valid: {', '.join(CIPHERS)}")
        if len(key) != KEY_LEN or len(iv) != IV_LEN:
            raise ValueError(f"key must be {KEY_LEN} bytes and iv {IV_LEN} bytes")
        self.name = cipher
        self._aead = AESGCM(key) if cipher == "aes-256-gcm" else ChaCha20Poly1305(key)
        self._iv = iv

    def seal(self, header: bytes, path_id: int, packet_number: int, plaintext: bytes) -> bytes:
        return self._aead.encrypt(make_nonce(self._iv, path_id, packet_number), plaintext, header)

    def open(
        self, header: bytes | memoryview, path_id: int, packet_number: int, sealed: bytes | memoryview
    ) -> bytes | None:
        try:
            return self._aead.decrypt(
                make_nonce(self._iv, path_id, packet_number), bytes(sealed), bytes(header)
            )
        except InvalidTag:
            return None


class NullProtection:
    """No encryption, no tag: for the simulator and tests only."""

    name = "none"
    overhead = 0

    def seal(self, header: bytes, path_id: int, packet_number: int, plaintext: bytes) -> bytes:
        return plaintext

    def open(
        self, header: bytes | memoryview, path_id: int, packet_number: int, sealed: bytes | memoryview
    ) -> bytes | None:
        return bytes(sealed)
