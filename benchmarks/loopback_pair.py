"""Two native endpoints over two loopback paths: the rig of the single-mechanism benchmarks.

``pacer_headroom.py`` and ``verify_latency.py`` each watch one mechanism of an
endpoint (the pacer's ring, the verdict's latency) while shards move between a
pair; the pair, the moving and the arguments are the same, so they live here.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket  # noqa: E402
from wanxport.aio.endpoint import Endpoint  # noqa: E402
from wanxport.core.config import SessionConfig  # noqa: E402
from wanxport.presets import GATEWAY, overrides, session_config  # noqa: E402
from wanxport.units import parse_size  # noqa: E402

# Datagrams per core packet: fewer than the gateway preset's, so a path's pacer ring sees
# more, smaller hand-overs (what pacer_headroom watches). Each benchmark prints the
# difference from the preset (pair_overrides).
SEGMENTS = 16
PAIR_PRESET = dataclasses.replace(GATEWAY, segments=SEGMENTS)


def pair_config(**session_options: Any) -> SessionConfig:
    """The pair's session: the gateway preset with ``SEGMENTS``, then ``session_options``."""
    return dataclasses.replace(session_config(["p0", "p1"], PAIR_PRESET), **session_options)


def pair_overrides(**session_options: Any) -> dict[str, Any]:
    """How the pair's session differs from the gateway preset users run."""
    return overrides(GATEWAY, pair_config(**session_options), session_config(["p0", "p1"], GATEWAY))


def endpoints(**session_options: Any) -> tuple[Endpoint, Endpoint]:
    """A sends to B (seeded keys); ``session_options`` go to both ends' SessionConfig."""
    rng = random.Random(1)
    forward = DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))
    backward = DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))
    config = pair_config(**session_options)
    sockets = tuple(PathSocket(("127.0.0.1", 0)) for _ in config.paths)
    a = Endpoint(EndpointConfig(config, sockets, forward, backward, 1, 2, datapath="native"))
    b = Endpoint(EndpointConfig(config, sockets, backward, forward, 2, 1, datapath="native"))
    a.connect(b.local_addresses)
    b.connect(a.local_addresses)
    return a, b


async def move_shards(a: Endpoint, b: Endpoint, shards: Iterable[bytes]) -> None:
    """Start both ends, move each shard from A to B in turn (SystemExit unless it verifies),
    close both."""
    a.start()
    b.start()
    try:
        for i, data in enumerate(shards):
            ack = a.submit(i, data)
            got = await b.receive_shard()
            if not (got.ok and await ack):
                raise SystemExit(f"shard {i} did not verify")
    finally:
        await a.close()
        await b.close()


def positive_size(parser: argparse.ArgumentParser, text: str, count: int, count_flag: str) -> int:
    """``--size`` in bytes; exits through ``parser.error`` unless it and ``count`` are positive."""
    try:
        size = parse_size(text)
    except ValueError as exc:
        parser.error(str(exc))
    if size <= 0 or count < 1:
        parser.error(f"--size and {count_flag} must be positive")
    return size
