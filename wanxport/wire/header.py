"""The 16-byte cleartext packet header (docs/wire-format.md).

The header is authenticated as AEAD associated data, so a receiver may read it
before opening the packet, but trusts none of it until the tag verifies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from wanxport.wire.errors import WireError

VERSION = 1
MARKER = 0x20 | VERSION
HEADER_LEN = 16
MAX_PACKET_NUMBER = (1 << 62) - 1
KEY_PHASE_BIT = 0x01
QUIC_FIXED_BIT = 0x40

_HEADER = struct.Struct(">BBHIQ")


@dataclass(frozen=True, slots=True)
class Header:
    """Packet header fields; ``key_phase`` selects one of the two live keys."""

    path_id: int
    conn_id: int
    packet_number: int
    key_phase: int = 0

    def encode(self) -> bytes:
        return _HEADER.pack(
            MARKER, self.key_phase & KEY_PHASE_BIT, self.path_id, self.conn_id, self.packet_number
        )


def encode_header(path_id: int, conn_id: int, packet_number: int, key_phase: int = 0) -> bytes:
    """Header bytes without building a Header object (hot path of the reference sender)."""
    return _HEADER.pack(MARKER, key_phase & KEY_PHASE_BIT, path_id, conn_id, packet_number)


def decode_header(datagram: bytes | memoryview) -> Header:
    """Parse and check the header; raises WireError naming the reason."""
    if len(datagram) < HEADER_LEN:
        raise WireError("short", f"{len(datagram)} bytes")
    marker, flags, path_id, conn_id, pn = _HEADER.unpack_from(datagram, 0)
    if marker != MARKER:
        raise WireError("marker", f"0x{marker:02x}")
    if flags & ~KEY_PHASE_BIT:
        raise WireError("flags", f"0x{flags:02x}")
    if pn > MAX_PACKET_NUMBER:
        raise WireError("packet_number", str(pn))
    return Header(path_id, conn_id, pn, flags & KEY_PHASE_BIT)


def is_data_plane(datagram: bytes | memoryview) -> bool:
    """True when the first byte cannot belong to QUIC (QUIC always sets 0x40)."""
    return len(datagram) > 0 and datagram[0] & 0xC0 == 0


def is_quic(datagram: bytes | memoryview) -> bool:
    """True when QUIC's fixed bit (0x40) is set: on a path's port shared with the
    control channel, the datagram is aioquic's (our control side never greases
    the bit, RFC 9287). Neither this nor ``is_data_plane``: garbage."""
    return len(datagram) > 0 and bool(datagram[0] & QUIC_FIXED_BIT)
