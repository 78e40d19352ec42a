"""Copying a training's state to the members whose copy is stale, over the epoch's sessions.

The state is whatever a site needs to take part from the next step (parameters,
optimizer state, the step): a ``StateHolder`` turns it into named arrays and back.
The member furthest along (the highest step, then the furthest call; the lowest
rank among equals) sends it to every member that is behind or whose state is not
current (a joiner), point to point on the epoch's group: a size header, a JSON
manifest (names, dtypes, shapes), then every array's bytes in one message. The
bytes arrive as they left, so the copy is bit-identical.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .errors import CollectiveError
from .group import Group

STATE_TAG = 0x5157  # the point-to-point tag of the state's messages


class StateHolder(Protocol):
    """What ``ElasticGroup.boundary`` copies: ``pack`` gives named arrays (read only while
    sending), ``unpack`` takes the arrays received (its own copies)."""

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
    if group.site == source:
        arrays = {name: np.ascontiguousarray(a) for name, a in state.pack().items()}
        listed = [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]
        manifest = json.dumps({"step": step, "arrays": listed})
        text = np.frombuffer(manifest.encode(), dtype=np.uint8)
        body = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays.values()]) if arrays else \
            np.empty(0, np.uint8)
        sizes = np.array([text.nbytes, body.nbytes], dtype=np.int64)
        for peer in receivers:
            await group.send(sizes, peer, STATE_TAG)
            await group.send(text, peer, STATE_TAG)
            await group.send(body, peer, STATE_TAG)
        return step
    if group.site not in receivers:
        return int(table[source, 1])
    sizes = await group.recv(np.zeros(2, dtype=np.int64), source, STATE_TAG)
    text = await group.recv(np.empty(int(sizes[0]), dtype=np.uint8), source, STATE_TAG)
    body = await group.recv(np.empty(int(sizes[1]), dtype=np.uint8), source, STATE_TAG)
    manifest = json.loads(text.tobytes())
    received: dict[str, npt.NDArray[Any]] = {}
    offset = 0
    for name, dtype, shape in manifest["arrays"]:
        kind = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        received[name] = body[offset:offset + count * kind.itemsize].view(kind).reshape(shape)
        offset += count * kind.itemsize
    state.unpack(received)
    return int(manifest["step"])
