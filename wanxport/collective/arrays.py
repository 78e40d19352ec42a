"""The array work of the collectives: fixed-order sums, a part's encoding, body checks,
and running large numpy work in a worker thread (numpy drops the GIL) so the event
loop keeps serving every path's acknowledgements meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from . import codec
from .errors import CollectiveError
from .message import Call, Header, body_of, new_payload, payload_of

REDUCE_OPS = ("sum", "mean")


def check_reduce(op: str, dtype: np.dtype[Any]) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"op: unknown {op!r}; valid: {', '.join(map(repr, REDUCE_OPS))}")
    if op == "mean" and not np.issubdtype(dtype, np.inexact):
        raise ValueError(f"op='mean' needs a floating dtype, got {dtype}")


def check_body(call: Call, header: Header, body: npt.NDArray[np.uint8], site: str) -> None:
    if header.elements == 0:
        want = 0
    elif call.op in ("all_gather", "broadcast") or call.compress is None:
        want = header.elements * np.dtype(call.dtype).itemsize
    else:
        want = codec.encoded_bytes(call.compress, header.elements)
    if body.nbytes != want or header.offset + header.elements > call.count:
        raise CollectiveError(f"{call.op} #{call.seq}: site {site} sent a malformed part "
                              f"({body.nbytes} B for {header.elements} elements at {header.offset})", site)


def fixed_sum(out: npt.NDArray[Any], parts: list[npt.NDArray[Any]], reduce: str, n: int) -> None:
    """``out = ((parts[0] + parts[1]) + ...)`` in site order; "mean" divides after."""
    np.copyto(out, parts[0])
    for part in parts[1:]:
        np.add(out, part, out=out)
    if reduce == "mean":
        np.divide(out, out.dtype.type(n), out=out)


def encode_part(compress: str | None, part: npt.NDArray[Any],
                 ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[Any]]:
    """A reduced part's message buffer and the value every site will hold for it."""
    if compress is None or not part.size:
        return payload_of(part), part
    payload = new_payload(codec.encoded_bytes(compress, part.size))
    codec.encode(compress, part, body_of(payload))
    return payload, codec.decode(compress, body_of(payload), part.size)


async def off_loop(nbytes: int, fn: Any, *args: Any) -> Any:
    """Run ``fn`` in a worker thread when the arrays are large, inline when small."""
    if nbytes > 1 << 18:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


@contextlib.contextmanager
def refusing(refuse: Callable[[ValueError], None]) -> Iterator[None]:
    """Within the block a ValueError (the caller's bad argument) is first ``refuse``d: the
    call takes its number and the other end hears why. Then it propagates."""
    try:
        yield
    except ValueError as exc:
        refuse(exc)
        raise
