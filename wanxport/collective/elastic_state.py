"""Copying a training's state to the members whose copy is stale, over the epoch's sessions.

The state is whatever a site needs to take part from the next step (parameters,
optimizer state, the step): a ``StateHolder`` turns it into named arrays and back.
The member furthest along (the highest step, then the furthest call; then the one whose
links to the joiners carried most) sends it to every member that is behind or whose
state is not current (a joiner), point to point on the epoch's group: a size header, a
JSON manifest (names, dtypes, shapes), then the arrays' bytes. Arrays the holder declares
shared (equal at every member as far along) are split in ranges among all those members,
sized by what their links carried, so a joiner's copy uses every member's link to it;
each range comes with the digest of all the shared bytes, and the joiner loads nothing
unless the ranges tile and match it. The bytes arrive as they left, so the copy is
bit-identical to the sender's state.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from wanxport.core.digest import shard_digest

from .errors import CollectiveError
from .group import Group

log = logging.getLogger("wanxport.collective.elastic")

STATE_TAG = 0x5157  # the point-to-point tag of the state's messages
HELPER_MIN_SHARE = 0.5  # a helper whose links carried less than this of the best one's sends nothing
HEAD_BYTES = 16 + 32  # a shared range's header: start, end (int64) and the digest of all shared bytes


class StateHolder(Protocol):
    """What ``ElasticGroup.boundary`` copies: ``pack`` gives named arrays (read only while
    sending), ``unpack`` takes the arrays received (its own copies).

    A holder may also list in ``shared_arrays`` the names of arrays that every member as far
    along holds bit for bit alike (a DiLoCo's global parameters and outer momentum; not its
    inner optimizer's moments, which are each site's own). Each such member then sends a
    range of those to a joiner, so the copy fills every member's link to it."""

    def pack(self) -> Mapping[str, npt.NDArray[Any]]: ...
    def unpack(self, arrays: dict[str, npt.NDArray[Any]]) -> None: ...


class ArrayState:
    """A ``StateHolder`` of plain numpy arrays, kept in ``arrays`` (replaced on ``unpack``)."""

    def __init__(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        self.arrays = arrays

    def pack(self) -> Mapping[str, npt.NDArray[Any]]:
        return self.arrays

    def unpack(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        self.arrays = arrays


def source_and_receivers(table: npt.NDArray[np.int64]) -> tuple[int, list[int]]:
    """From an epoch's agreement (rows: [current, step, first call not done, done beyond,
    bytes/s its last links to the sites being admitted carried]): the rank that sends and
    the ranks that receive. Among the members furthest along, the one whose links to the
    joiners carried the most sends (a restarted site comes back on the same network: a
    holder behind a thin link would take many times longer), else the lowest rank."""
    current = [r for r in range(len(table)) if table[r, 0] == 1]
    if not current:
        raise CollectiveError("no live member holds a current state (every one restarted): start over "
                              "from a checkpoint")
    carried = table[:, 4] if table.shape[1] > 4 else np.zeros(len(table), dtype=np.int64)
    source = max(current, key=lambda r: (int(table[r, 1]), int(table[r, 2]), int(carried[r]), -r))
    ahead = (table[source, 1], table[source, 2])
    receivers = [r for r in range(len(table)) if r != source
                 and (table[r, 0] != 1 or (table[r, 1], table[r, 2]) != ahead)]
    return source, receivers


async def transfer_state(group: Group, table: npt.NDArray[np.int64], state: StateHolder, step: int) -> int:
    """Send or receive the state as ``table`` says; the step every member runs next."""
    source, receivers = source_and_receivers(table)
    helpers = level_with(table, source)
    if group.site in helpers:
        if receivers:
            await _send_state(group, table, state, step, source, helpers, receivers)
        return step if group.site == source else int(table[source, 1])
    return await _receive_state(group, state, source, helpers)


def level_with(table: npt.NDArray[np.int64], source: int) -> list[int]:
    """The members whose state is current and as far along as the source's (the source among
    them): each holds the shared arrays exactly as the source does."""
    ahead = (table[source, 1], table[source, 2])
    return [r for r in range(len(table)) if table[r, 0] == 1 and (table[r, 1], table[r, 2]) == ahead]


def shared_ranges(shared: int, private: int, table: npt.NDArray[np.int64], source: int,
                  helpers: list[int]) -> dict[int, tuple[int, int]]:
    """Each helper's byte range of the shared arrays: the source also sends the private bytes,
    and a helper's share follows what its links to the joiners carried (equal when any is
    unknown), so that every helper's sending should end at the same time. A helper whose
    links carried under ``HELPER_MIN_SHARE`` of the best one's sends nothing: what a link
    carried understates a fast link more than a slow one (small messages are latency-bound),
    and a share on the slow link would then be the last to arrive."""
    carried = [int(table[h, 4]) if table.shape[1] > 4 else 0 for h in helpers]
    weights = [float(c) for c in carried] if all(carried) else [1.0] * len(helpers)
    best = max(weights)
    weights = [w if w >= HELPER_MIN_SHARE * best or h == source else 0.0
               for h, w in zip(helpers, weights, strict=True)]
    total_w = sum(weights)
    finish = (shared + private) / total_w
    share = [finish * w - (private if h == source else 0) for h, w in zip(helpers, weights, strict=True)]
    if min(share) < 0:  # the source's private bytes alone outlast the others' shares
        others = total_w - weights[helpers.index(source)]
        share = [(shared if h == source else 0.0) if others <= 0 else
                 0.0 if h == source else shared * w / others for h, w in zip(helpers, weights, strict=True)]
    ranges, start = {}, 0
    for k, h in enumerate(helpers):
        end = shared if k == len(helpers) - 1 else min(shared, start + round(share[k]))
        ranges[h] = (start, end)
        start = end
    return ranges


def _bodies(state: StateHolder) -> tuple[dict[str, npt.NDArray[Any]], set[str], np.ndarray, np.ndarray]:
    """The arrays, the names declared shared, and the private and shared bytes back to back."""
    arrays = {name: np.ascontiguousarray(a) for name, a in state.pack().items()}
    shared = set(getattr(state, "shared_arrays", ())) & set(arrays)

    def joined(names: list[str]) -> np.ndarray:
        parts = [arrays[n].reshape(-1).view(np.uint8) for n in names]
        return np.concatenate(parts) if parts else np.empty(0, np.uint8)

    return (arrays, shared, joined([n for n in arrays if n not in shared]),
            joined([n for n in arrays if n in shared]))


async def _send_state(group: Group, table: npt.NDArray[np.int64], state: StateHolder, step: int,
                      source: int, helpers: list[int], receivers: list[int]) -> None:
    """The source sends the manifest, the private bytes and its range of the shared ones;
    every other helper its range of the shared ones, each with the digest of them all."""
    arrays, shared, private, common = _bodies(state)
    digest = shard_digest(common.data)
    start, end = shared_ranges(common.nbytes, private.nbytes, table, source, helpers)[group.site]
    log.info("state to members %s: %d private bytes%s, shared bytes [%d, %d) of %d from here (links "
             "carried %s B/s)", receivers, private.nbytes, "" if group.site == source else " (not from here)",
             start, end, common.nbytes, [int(table[h, 4]) if table.shape[1] > 4 else 0 for h in helpers])
    head = np.concatenate([np.array([start, end], dtype=np.int64).view(np.uint8),
                           np.frombuffer(digest, dtype=np.uint8)])
    if group.site == source:
        listed = [[name, a.dtype.str, list(a.shape), name in shared] for name, a in arrays.items()]
        manifest = json.dumps({"step": step, "arrays": listed, "shared_digest": digest.hex()})
        text = np.frombuffer(manifest.encode(), dtype=np.uint8)
        sizes = np.array([text.nbytes, private.nbytes, common.nbytes], dtype=np.int64)
    for peer in receivers:
        if group.site == source:
            await group.send(sizes, peer, STATE_TAG)
            await group.send(text, peer, STATE_TAG)
            await group.send(private, peer, STATE_TAG)
        await group.send(head, peer, STATE_TAG)
        if end > start:
            await group.send(common[start:end], peer, STATE_TAG)


async def _receive_state(group: Group, state: StateHolder, source: int, helpers: list[int]) -> int:
    """The manifest and private bytes from the source, a range of the shared bytes from each
    helper; the shared bytes must tile and match the digest every helper sent."""

    async def part(peer: int) -> tuple[int, int, bytes, np.ndarray]:
        head = await group.recv(np.empty(HEAD_BYTES, dtype=np.uint8), peer, STATE_TAG)
        start, end = (int(v) for v in head[:16].view(np.int64))
        if not 0 <= start <= end:
            raise CollectiveError(f"state: member {peer} sent the range [{start}, {end})")
        body = await group.recv(np.empty(end - start, dtype=np.uint8), peer, STATE_TAG) if end > start \
            else np.empty(0, np.uint8)
        return start, end, head[16:].tobytes(), body

    async def from_source() -> tuple[dict[str, Any], np.ndarray, tuple[int, int, bytes, np.ndarray]]:
        sizes = await group.recv(np.zeros(3, dtype=np.int64), source, STATE_TAG)
        text = await group.recv(np.empty(int(sizes[0]), dtype=np.uint8), source, STATE_TAG)
        private = await group.recv(np.empty(int(sizes[1]), dtype=np.uint8), source, STATE_TAG)
        return json.loads(text.tobytes()), private, await part(source)

    first, *rest = await asyncio.gather(from_source(), *(part(h) for h in helpers if h != source))
    manifest, private, own = first
    expected = bytes.fromhex(manifest["shared_digest"])
    digests_agree = all(p[2] == expected for p in [own, *rest])
    parts = sorted((p for p in [own, *rest] if p[1] > p[0]), key=lambda p: p[0])  # helpers left out send none
    common = np.concatenate([p[3] for p in parts]) if parts else np.empty(0, np.uint8)
    starts = [0, *(p[1] for p in parts[:-1])]
    tiled = [p[0] for p in parts] == starts[:len(parts)]
    if not tiled or not digests_agree or shard_digest(common.data) != expected:
        raise CollectiveError("state: the members level with the sender do not hold the arrays it "
                              "declares shared alike (ranges or digests differ); nothing was loaded")
    received: dict[str, npt.NDArray[Any]] = {}
    offsets = {False: 0, True: 0}
    for name, dtype, shape, is_shared in manifest["arrays"]:
        kind, body = np.dtype(dtype), common if is_shared else private
        count = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
        at = offsets[is_shared]
        received[name] = body[at:at + count].view(kind).reshape(shape)
        offsets[is_shared] = at + count
    state.unpack(received)
    return int(manifest["step"])
