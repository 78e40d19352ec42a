"""Running an all-reduce on a plan's trees (``schedule``): relay, ring and single-tree schedules.

For each part, concurrently: a site waits for its children's partial sums, adds its
own contribution to them in site-index order (``((x_a + x_b) + x_c) + ...`` over the
site and its children, sorted), and sends the result to its parent; the part's root
ends with the total, and the total travels back down the tree unchanged: a site
that forwards it passes on the bytes it received. So every site ends with the
root's bytes, bitwise identical, whatever the tree.

With compression what travels is quantised, never what accumulates: a site decodes
its children's partial sums, adds them in float32 to its own exact contribution, and
encodes only the sum it sends. Each hop adds one codec error of the partial sum it
carries (the owner's total is encoded once more on the way down, and the owner keeps
the decoded value like everyone else), and each site's error-feedback residual is
the error of what it sent, fed into its next contribution to the same tensor.

Messages: phase 0 is a header-only hello to every neighbour (each site checks every
neighbour's signature on every call, whatever the tree); part k goes up in phase
1 + 2k and down in phase 2 + 2k.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import codec
from .arrays import encode_part, fixed_sum, off_loop
from .costmodel import part_bounds
from .errors import CollectiveError
from .message import Call, Header, body_of, new_payload, payload_of
from .schedule import NO_PARENT, Plan, Tree

if TYPE_CHECKING:
    from .calls import Tally
    from .group import Got
    from .link import Link


Payload = npt.NDArray[np.uint8] | None


def up_phase(part: int) -> int:
    return 1 + 2 * part


def down_phase(part: int) -> int:
    return 2 + 2 * part


class TreeSchedules:
    """The tree half of ``Group``'s all-reduce (a mixin: it runs on the group's plumbing)."""

    if TYPE_CHECKING:  # what it uses of ``Group``
        site: int
        size: int
        names: list[str]
        links: dict[int, Link]
        feedback: codec.ErrorFeedback
        _tallies: dict[int, Tally]

        async def _exchange(self, call: Call, phase: int, sends: dict[int, tuple[int, int, Payload]],
                            ) -> dict[int, Got]: ...
        async def _receive_checked(self, call: Call, peer: int, phase: int) -> Got: ...
        def _decode(self, call: Call, message: Got) -> npt.NDArray[Any]: ...

    async def _all_reduce_trees(self, call: Call, flat: npt.NDArray[Any], key: object, plan: Plan) -> None:
        """``flat`` becomes the all-reduce of every site's ``flat`` along ``plan``."""
        compensate = self.feedback.compensate
        target = flat if call.compress is None else await off_loop(flat.nbytes, compensate, key, flat)
        residual = None if call.compress is None else np.zeros_like(flat)
        bounds = part_bounds(call.count, plan.parts)
        await asyncio.gather(
            self._exchange(call, 0, {p: (0, 0, None) for p in self.links}),
            *(self._tree_part(call, flat, target, residual, tree, k, bounds[k])
              for k, tree in enumerate(plan.trees)))
        if residual is not None:
            self.feedback.store(key, residual)

    async def _tree_part(self, call: Call, flat: npt.NDArray[Any], target: npt.NDArray[Any],
                         residual: npt.NDArray[Any] | None, tree: Tree, part: int, bounds: tuple[int, int],
                         ) -> None:
        a, b = bounds
        children = tree.children(self.site)
        parent = tree.parent[self.site]
        got = await asyncio.gather(*(self._receive_part(call, c, up_phase(part), bounds) for c in children))

        def add_up() -> npt.NDArray[Any]:
            values = {self.site: target[a:b], **{c: self._decode(call, m) for c, m in zip(children, got,
                                                                                        strict=True)}}
            total = np.empty(b - a, dtype=flat.dtype)
            reduce = call.reduce if parent == NO_PARENT else "sum"  # "mean" divides at the root only
            fixed_sum(total, [values[k] for k in sorted(values)], reduce, self.size)
            return total

        total = await off_loop((b - a) * flat.itemsize, add_up)
        if parent == NO_PARENT:
            payload, value = await off_loop(total.nbytes, encode_part, call.compress, total)
            flat[a:b] = value
        else:
            up = await off_loop(total.nbytes, _encode_partial, call.compress, total, residual, a)
            self._send_part(call, parent, up_phase(part), bounds, up)
            message = await self._receive_part(call, parent, down_phase(part), bounds)
            flat[a:b] = await off_loop(flat.nbytes, self._decode, call, message)
            payload = payload_of(message[2])
        for child in children:
            self._send_part(call, child, down_phase(part), bounds, payload)

    async def _receive_part(self, call: Call, peer: int, phase: int, bounds: tuple[int, int]) -> Got:
        message = await self._receive_checked(call, peer, phase)
        header = message[1]
        if (header.offset, header.elements) != (bounds[0], bounds[1] - bounds[0]):
            raise CollectiveError(f"{call.op} #{call.seq}: site {self.names[peer]} sent elements "
                                  f"{header.offset}+{header.elements} in phase {phase}, the plan's part is "
                                  f"{bounds[0]}+{bounds[1] - bounds[0]}", self.names[peer])
        return message

    def _send_part(self, call: Call, peer: int, phase: int, bounds: tuple[int, int],
                   payload: npt.NDArray[np.uint8]) -> None:
        a, b = bounds
        if b == a:
            payload = new_payload(0)
        self.links[peer].send(Header(call, phase, a, b - a), payload)
        tally = self._tallies.get(call.seq)
        if tally is not None:
            tally.sent += payload.nbytes


def _encode_partial(compress: str | None, total: npt.NDArray[Any], residual: npt.NDArray[Any] | None,
                    offset: int) -> npt.NDArray[np.uint8]:
    """The message for a partial sum going up; with compression its codec error becomes this
    site's residual for those elements."""
    if compress is None or not total.size:
        return payload_of(total)
    payload = new_payload(codec.encoded_bytes(compress, total.size))
    codec.encode(compress, total, body_of(payload))
    assert residual is not None
    residual[offset:offset + total.size] = total - codec.decode(compress, body_of(payload), total.size)
    return payload
