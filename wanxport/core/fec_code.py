"""The erasure code of the tail: block shapes, how much repair, and the native codec.

Why a module of its own: the sender (``core.fec``), the receiver
(``core.fec_receive``) and the tests must agree on exactly one definition of a
block, its symbols and the code. A block covers ``length`` bytes of a shard as
``k`` symbols of ``symbol`` bytes (the last zero-padded); ``wanxport._fec``
(ISA-L, the fastest of the candidates on these block shapes, ``benchmarks/fec_codes.py``) encodes and rebuilds
whole blocks in C, one call per block, never per datagram.
"""

from __future__ import annotations

from math import exp

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


def lost_symbols_cdf(parts: list[tuple[int, float, float]], limit: int) -> list[float]:
    """P(at most j of a block's data symbols are lost), j = 0..``limit``.

    ``parts`` are (symbols, loss rate, mean burst length) of each path's share
    of the block. A path loses its datagrams in bursts (a Gilbert-Elliott link
    drops runs of geometric length): loss events are Poisson with mean
    ``symbols * loss / burst``, each erasing a geometric number of symbols of
    mean ``burst`` (a compound Poisson, the Pólya–Aeppli distribution), so a
    bursty path needs more repair than an i.i.d. one at the same rate. Burst 1
    is the i.i.d. case (Poisson).
    """
    pmf: list[float] | None = None
    for symbols, loss, burst in parts:
        events = symbols * loss / burst
        if events <= 0.0:
            continue
        own = _polya_aeppli(events, 1.0 / burst, limit)
        if pmf is None:
            pmf = own
        else:
            pmf = [sum(pmf[i] * own[n - i] for i in range(n + 1)) for n in range(limit + 1)]
    if pmf is None:
        return [1.0] * (limit + 1)
    cdf, total = [], 0.0
    for p in pmf:
        total += p
        cdf.append(min(1.0, total))
    return cdf


def _polya_aeppli(events: float, q: float, limit: int) -> list[float]:
    """P(n symbols lost), n = 0..``limit``: Poisson(``events``) bursts, each of a geometric
    number of symbols (a burst ends after each with probability ``q``).

    The compound's generating function P(s) = exp(events * (q s / (1 - (1 - q) s) - 1))
    satisfies (1 - (1 - q) s)^2 P'(s) = events * q * P(s), which gives a three-term
    recurrence: O(limit) per path instead of Panjer's O(limit^2) sums (the sender prices
    every block at the end of every message, on the event loop's thread).
    """
    theta = 1.0 - q
    out = [exp(-events)] + [0.0] * limit
    if limit:
        out[1] = events * q * out[0]
    for n in range(1, limit):
        grow = (events * q + 2.0 * theta * n) * out[n]
        out[n + 1] = (grow - theta * theta * (n - 1) * out[n - 1]) / (n + 1)
    return out


def failure_curve(parts: list[tuple[int, float, float]], max_m: int, k: int | None = None,
                  down_to: float = 0.0) -> list[float]:
    """P(the block fails) with m = 0, 1, ... repair symbols, up to ``max_m`` (and what GF(2^8) allows),
    or up to the first m whose failure is at most ``down_to``: no target at or above it needs
    more (the curve falls with m), and each further m costs a pass over the ones before it.

    ``parts`` are the block's symbols still at risk (``lost_symbols_cdf``); a
    block of ``k`` symbols (default: their sum) may hold others already
    received. It fails when its lost data symbols plus its lost repair symbols
    (i.i.d. at the parts' mean loss) exceed m. ``[0.0]`` when nothing is at risk.
    """
    at_risk = sum(symbols for symbols, _, _ in parts)
    k = at_risk if k is None else k
    loss = sum(symbols * rate for symbols, rate, _ in parts) / at_risk if at_risk else 0.0
    if loss <= 0.0:
        return [0.0]
    limit = max(0, min(max_m, MAX_BLOCK_SYMBOLS - k))
    cdf = lost_symbols_cdf(parts, limit)
    curve = []
    lost = [1.0]  # P(r of the m repair symbols lost), r = 0..m: a binomial row, built up in m
    for m in range(limit + 1):
        if m:
            kept = 1.0 - loss
            lost = ([lost[0] * kept] + [lost[r] * kept + lost[r - 1] * loss for r in range(1, m)]
                    + [lost[m - 1] * loss])
        curve.append(max(0.0, 1.0 - sum(lost[r] * cdf[m - r] for r in range(m + 1))))
        if curve[-1] <= down_to:
            break
    return curve


def repair_for(curve: list[float], target: float) -> int:
    """The fewest repair symbols whose failure probability (``failure_curve``) is under ``target``."""
    for m, failure in enumerate(curve):
        if failure <= target:
            return m
    return len(curve) - 1


def repair_count(parts: list[tuple[int, float, float]], target: float, max_m: int,
                 k: int | None = None) -> int:
    """The fewest repair symbols that bring a block's failure probability under ``target``.

    0 when the paths lose (almost) nothing; at most ``max_m`` (and what GF(2^8) allows).
    """
    return repair_for(failure_curve(parts, max_m, k, target), target)


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
