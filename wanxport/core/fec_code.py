"""The erasure code of the tail: block shapes, how much repair, and the native codec.

Why a module of its own: the sender (``core.fec``), the receiver
(``core.fec_receive``) and the tests must agree on exactly one definition of a
block, its symbols and the code. A block covers ``length`` bytes of a shard as
``k`` symbols of ``symbol`` bytes (the last zero-padded); ``wanxport._fec``
(ISA-L, chosen by measurement: docs/results/fec-codes.md) encodes and rebuilds
whole blocks in C, one call per block, never per datagram.
"""

from __future__ import annotations

from math import comb

from wanxport import _fec
from wanxport.wire.frames import MAX_BLOCK_SYMBOLS

Buffer = bytes | bytearray | memoryview

# Data symbols per block at most: leaves room for m up to 55 under GF(2^8)'s 255.
MAX_K = 200


def encode(data: Buffer, k: int, m: int, symbol: int) -> list[bytes]:
    """The ``m`` repair symbols of the block ``data`` (its covered bytes)."""
    out = _fec.encode(data, k, m, symbol)
    return [out[j * symbol:(j + 1) * symbol] for j in range(m)]


def decode(data: Buffer, k: int, m: int, symbol: int, missing: list[int],
           repairs: dict[int, Buffer]) -> list[bytes]:
    """The data symbols ``missing`` (ascending), rebuilt from ``data`` and ``repairs``.

    ``data`` is the block's bytes as held (missing symbols any content);
    ``repairs`` maps repair index to symbol and has at least ``len(missing)``.
    """
    present = bytearray(b"\x01") * k
    for i in missing:
        present[i] = 0
    used = sorted(repairs)[:len(missing)]
    joined = b"".join(bytes(repairs[j]) for j in used)
    out = _fec.decode(data, k, m, symbol, bytes(present), joined, bytes(used))
    return [out[t * symbol:(t + 1) * symbol] for t in range(len(missing))]


def failure_probability(k: int, m: int, loss: float) -> float:
    """P(more than ``m`` of the block's ``k + m`` datagrams are lost), i.i.d. ``loss``."""
    n = k + m
    kept = sum(comb(n, i) * loss ** i * (1.0 - loss) ** (n - i) for i in range(m + 1))
    return max(0.0, 1.0 - kept)


def repair_count(k: int, loss: float, target: float, max_m: int) -> int:
    """The fewest repair symbols that bring a block's failure probability under ``target``.

    0 when the path mix loses nothing; at most ``max_m`` (and what GF(2^8) allows).
    """
    if loss <= 0.0:
        return 0
    limit = min(max_m, MAX_BLOCK_SYMBOLS - k)
    m = 1
    while m < limit and failure_probability(k, m, loss) > target:
        m += 1
    return m


def block_shapes(length: int, symbol: int) -> list[tuple[int, int]]:
    """``length`` bytes cut into near-equal blocks of at most ``MAX_K`` symbols: (offset, bytes)."""
    symbols = -(-length // symbol)
    blocks = -(-symbols // MAX_K)
    out: list[tuple[int, int]] = []
    start = 0
    for b in range(blocks):
        k = symbols // blocks + (1 if b < symbols % blocks else 0)
        size = min(k * symbol, length - start)
        out.append((start, size))
        start += size
    return out
