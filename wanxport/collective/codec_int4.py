"""The int4 codec: 4-bit integers with one float32 scale per block, for pseudo-gradients.

A model's outer step (DiLoCo) tolerates coarse values because the error-feedback residual
carries what one step loses into the next; at 4 bits a float32 array crosses the WAN in
about an eighth of its bytes, which is what streaming DiLoCo needs on links of a few Gb/s.

Format of ``count`` elements: ``ceil(count / 2)`` bytes of packed nibbles (element 2i in
the low nibble of byte i, element 2i+1 in the high one; a pad nibble when ``count`` is odd),
then one float32 scale per block of ``INT4_BLOCK`` elements (the last block may be short).
A nibble holds ``q + 8`` with ``q = rint(x / s)`` in -7..7 and ``s = max|block| / 7``, so
the code is symmetric around zero and a block of zeros decodes to zeros.

Error bound (per element x of a finite float32 input): ``|x - dec(enc(x))| <= s * (1/2 + 2**-14)``,
about ``max|block| / 14``: rounding to the nearest of 15 levels costs at most half a level,
and the 2**-14 covers float32 rounding of ``x / s`` and ``q * s`` (|q| <= 7).
Decoding is one float32 multiply per element in a fixed order, so every site that decodes
the same bytes holds the same values (what keeps compressed all-reduces bitwise identical).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

INT4_BLOCK = 128
LEVELS = 7  # |q| <= 7: 15 levels, symmetric
F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]


def encoded_bytes(count: int) -> int:
    return (count + 1) // 2 + 4 * (-(-count // INT4_BLOCK))


def scales(x: F32) -> F32:
    """One scale per block: its largest magnitude over ``LEVELS``."""
    blocks = -(-x.size // INT4_BLOCK)
    padded = np.zeros(blocks * INT4_BLOCK, dtype=np.float32)
    np.abs(x, out=padded[: x.size])
    peaks = padded.reshape(blocks, INT4_BLOCK).max(axis=1)
    return (peaks / np.float32(LEVELS)).astype(np.float32)


def rescale_subnormal(x: F32, scaled: F32, per_block: F32, inverse: F32, block_size: int) -> None:
    """Scale again, in float64, the blocks whose peak is so small (below about 4e-37) that the
    float32 inverse of their scale overflowed: 0 x inf is NaN, which no level or int8 holds."""
    for block in np.flatnonzero(np.isinf(inverse)):
        span = slice(int(block) * block_size, min(x.size, (int(block) + 1) * block_size))
        scaled[span] = x[span].astype(np.float64) / np.float64(per_block[block])


def encode(x: F32, out: U8) -> U8:
    """The wire bytes of the 1-D float32 array ``x`` into ``out`` (``encoded_bytes`` long).
    A non-finite value makes its own block's scale non-finite (it decodes as NaN or inf
    there), never another block's."""
    with np.errstate(invalid="ignore", over="ignore"):  # a subnormal scale's inverse: redone in _encode
        return _encode(x, out)


def _encode(x: F32, out: U8) -> U8:
    count = x.size
    per_block = scales(x)
    inverse = np.divide(np.float32(1.0), per_block, out=np.zeros_like(per_block), where=per_block > 0)
    blocks = per_block.size
    scaled = np.zeros(blocks * INT4_BLOCK + 1, dtype=np.float32)  # one spare: the pad nibble
    np.multiply(np.pad(x, (0, blocks * INT4_BLOCK - count)).reshape(blocks, INT4_BLOCK), inverse[:, None],
                out=scaled[: blocks * INT4_BLOCK].reshape(blocks, INT4_BLOCK))
    rescale_subnormal(x, scaled, per_block, inverse, INT4_BLOCK)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -LEVELS, LEVELS, out=scaled)
    nibbles = (scaled[: 2 * ((count + 1) // 2)] + np.float32(8)).astype(np.uint8)
    packed = (count + 1) // 2
    out[:packed] = nibbles[0::2] | (nibbles[1::2] << 4)
    out[packed: packed + 4 * blocks].view(np.float32)[:] = per_block
    return out


def decode(data: U8, count: int, out: F32) -> F32:
    """The float32 values ``data`` encodes (``count`` of them) into ``out``."""
    packed = (count + 1) // 2
    blocks = -(-count // INT4_BLOCK)
    per_block = data[packed: packed + 4 * blocks].view(np.float32)
    nibbles = np.empty(2 * packed, dtype=np.int8)
    nibbles[0::2] = data[:packed] & 0x0F
    nibbles[1::2] = data[:packed] >> 4
    nibbles -= 8
    per_element = np.repeat(per_block, INT4_BLOCK)[:count]
    with np.errstate(invalid="ignore"):  # a non-finite scale times a zero level
        np.multiply(nibbles[:count], per_element, out=out, dtype=np.float32)
    return out


def error_bound(x: F32) -> F32:
    """Per-element bound on ``|x - decode(encode(x))|``."""
    per_element = np.repeat(scales(x), INT4_BLOCK)[: x.size]
    return (per_element * np.float32(0.5 + 2.0 ** -14)).astype(np.float32)
