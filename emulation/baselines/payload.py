"""The deterministic payload both ends derive from a seed, without storing it.

The payload is a sequence of 1 MiB blocks; block ``i`` is the output of numpy's
PCG64 seeded with ``(seed, i)``. Any byte range can therefore be generated on
its own, which is what lets ``tcp-parallel`` give each connection a slice and
lets a sender start anywhere.

Integrity: every slice is hashed (sha256) by the sender as it writes and by the
receiver as it reads; the payload digest is the sha256 of the slice digests in
offset order. Equal slice digests over slices that tile [0, size) mean equal
bytes, so comparing the two payload digests verifies the reassembled payload
without keeping it in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

BLOCK = 1 << 20


def block(seed: int, index: int) -> bytes:
    """Block ``index`` of the payload of ``seed``."""
    return np.random.Generator(np.random.PCG64([seed, index])).bytes(BLOCK)


def chunks(seed: int, offset: int, length: int) -> Iterator[memoryview]:
    """The payload bytes ``[offset, offset + length)`` as consecutive views."""
    end = offset + length
    pos = offset
    while pos < end:
        index, skip = divmod(pos, BLOCK)
        take = min(BLOCK - skip, end - pos)
        yield memoryview(block(seed, index))[skip:skip + take]
        pos += take


def split(size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous (offset, length) slices tiling [0, size), as even as possible."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    base, extra = divmod(size, parts)
    slices = []
    offset = 0
    for k in range(parts):
        length = base + (1 if k < extra else 0)
        slices.append((offset, length))
        offset += length
    return slices


def payload_digest(slice_digests: list[tuple[int, str]]) -> str:
    """sha256 over the hex slice digests ordered by offset (see the module docstring)."""
    h = hashlib.sha256()
    for _, digest in sorted(slice_digests):
        h.update(bytes.fromhex(digest))
    return h.hexdigest()
