"""Gradient codecs for the cross-site bytes: bf16, int8 and int4 (``codec_int4``) with per-block scales.

Both are vectorised numpy over float32 (no per-element Python) and deterministic, so every
site that decodes the same bytes gets the same float32 values: that is what keeps compressed
all-reduce results bitwise identical across sites (each site decodes every contribution,
its own included, and sums them in site order).

Error bounds (per element x of the encoded float32 input, finite values):

- ``bf16``: round to nearest even on the top 16 bits: ``|x - dec(enc(x))| <= 2**-8 * |x|``
  (half a unit in the last place of an 8-bit significand); subnormals and values past
  bfloat16's range (about 3.4e38) are not covered.
- ``int8``: blocks of ``INT8_BLOCK`` elements, scale ``s = max|x| / 127`` per block stored as
  float32, ``q = rint(x / s)``: ``|x - dec(enc(x))| <= s * (1/2 + 2**-14)``, about
  ``max|block| / 254`` (the 2**-14 covers float32 rounding of ``x / s`` and ``q * s`` at |q| <= 127).

- ``int4``: ``codec_int4`` (blocks of ``INT4_BLOCK``, 15 levels): about ``max|block| / 14``.

``error_bound`` returns the bound array a checker compares against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from . import codec_int4

CODECS = ("bf16", "int8", "int4")
INT8_BLOCK = 256
F32 = npt.NDArray[np.float32]


def check_codec(compress: str | None, dtype: np.dtype[Any]) -> None:
    """ValueError (one line) unless ``compress`` can encode arrays of ``dtype``."""
    if compress is None:
        return
    if compress not in CODECS:
        raise ValueError(f"compress: unknown {compress!r}; valid: None, {', '.join(map(repr, CODECS))}")
    if dtype != np.float32:
        raise ValueError(f"compress={compress!r} needs float32 arrays, got {dtype}")


def encoded_bytes(compress: str | None, count: int, itemsize: int = 4) -> int:
    """How many bytes ``count`` elements take on the wire under ``compress``."""
    if compress is None:
        return count * itemsize
    if compress == "bf16":
        return 2 * count
    if compress == "int4":
        return codec_int4.encoded_bytes(count)
    blocks = -(-count // INT8_BLOCK)
    return count + 4 * blocks


def encode(compress: str, x: F32, out: npt.NDArray[np.uint8] | None = None) -> npt.NDArray[np.uint8]:
    """The wire bytes of the 1-D float32 array ``x`` (into ``out``, ``encoded_bytes`` long, if given)."""
    if out is None:
        out = np.empty(encoded_bytes(compress, x.size), dtype=np.uint8)
    if compress == "bf16":
        _encode_bf16(x, out[: 2 * x.size].view(np.uint16))
    elif compress == "int4":
        codec_int4.encode(x, out)
    else:
        _encode_int8(x, out)
    return out


def decode(compress: str, data: npt.NDArray[np.uint8], count: int, out: F32 | None = None) -> F32:
    """The float32 values ``data`` encodes (``count`` of them), into ``out`` when given."""
    if out is None:
        out = np.empty(count, dtype=np.float32)
    if compress == "bf16":
        bits = data[: 2 * count].view(np.uint16)
        out.view(np.uint32)[:] = bits.astype(np.uint32) << 16
        return out
    if compress == "int4":
        return codec_int4.decode(data, count, out)
    blocks = -(-count // INT8_BLOCK)
    scales = data[count: count + 4 * blocks].view(np.float32)
    q = data[:count].view(np.int8)
    full = (count // INT8_BLOCK) * INT8_BLOCK
    if full:
        np.multiply(q[:full].reshape(-1, INT8_BLOCK), scales[: full // INT8_BLOCK, None],
                    out=out[:full].reshape(-1, INT8_BLOCK), dtype=np.float32)
    if full < count:
        np.multiply(q[full:], scales[-1], out=out[full:], dtype=np.float32)
    return out


def error_bound(compress: str | None, x: F32) -> F32:
    """Per-element bound on ``|x - decode(encode(x))|`` (zeros without compression)."""
    if compress is None:
        return np.zeros_like(x)
    if compress == "bf16":
        return (np.abs(x) * np.float32(2.0 ** -8)).astype(np.float32)
    if compress == "int4":
        return codec_int4.error_bound(x)
    scales = _int8_scales(x)
    per = np.repeat(scales, INT8_BLOCK)[: x.size]
    return (per * np.float32(0.5 + 2.0 ** -14)).astype(np.float32)


def _encode_bf16(x: F32, out: npt.NDArray[np.uint16]) -> None:
    bits = x.view(np.uint32)
    rounded = bits >> 16
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += bits
    rounded >>= 16
    out[:] = rounded
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0  # rounding could carry a NaN's payload into the sign


def _int8_scales(x: F32) -> F32:
    blocks = -(-x.size // INT8_BLOCK)
    full = (x.size // INT8_BLOCK) * INT8_BLOCK
    peaks = np.empty(blocks, dtype=np.float32)
    if full:
        np.max(np.abs(x[:full].reshape(-1, INT8_BLOCK)), axis=1, out=peaks[: full // INT8_BLOCK])
    if full < x.size:
        peaks[-1] = np.max(np.abs(x[full:]))
    return (peaks / np.float32(127.0)).astype(np.float32)


def _encode_int8(x: F32, out: npt.NDArray[np.uint8]) -> None:
    count = x.size
    scales = _int8_scales(x)
    q = out[:count].view(np.int8)
    full = (count // INT8_BLOCK) * INT8_BLOCK
    scaled = np.empty(count, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # subnormal scales: redone below
        inverse = np.divide(np.float32(1.0), scales, out=np.zeros_like(scales), where=scales > 0)
        if full:
            np.multiply(x[:full].reshape(-1, INT8_BLOCK), inverse[: full // INT8_BLOCK, None],
                        out=scaled[:full].reshape(-1, INT8_BLOCK))
        if full < count:
            np.multiply(x[full:], inverse[-1], out=scaled[full:])
    codec_int4.rescale_subnormal(x, scaled, scales, inverse, INT8_BLOCK)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -127, 127, out=scaled)
    q[:] = scaled
    out[count:].view(np.float32)[:] = scales


class ErrorFeedback:
    """Per-tensor residuals: what compression lost in one step is added to the next.

    ``compensate`` returns input + residual (the value to encode); ``record`` stores
    (that value - what the peers will decode) as the next residual. Keyed by a
    caller-given name, else by the buffer's address and size.
    """

    def __init__(self) -> None:
        self._residuals: dict[object, F32] = {}

    @staticmethod
    def key(name: str | None, array: npt.NDArray[Any]) -> object:
        if name is not None:
            return name
        return ("buffer", array.__array_interface__["data"][0], array.nbytes)

    def compensate(self, key: object, x: F32) -> F32:
        residual = self._residuals.get(key)
        if residual is None or residual.shape != x.shape:
            return x.copy()
        return x + residual

    def record(self, key: object, target: F32, sent: F32) -> None:
        self._residuals[key] = target - sent

    def store(self, key: object, residual: F32 | None) -> None:
        """The next residual of ``key`` as given (a site that sends partial sums computes it);
        ``None``: none (an attempt that did not count is undone this way too)."""
        if residual is None:
            self._residuals.pop(key, None)
        else:
            self._residuals[key] = residual

    def residual(self, key: object) -> F32 | None:
        return self._residuals.get(key)

    def clear(self) -> None:
        self._residuals.clear()
