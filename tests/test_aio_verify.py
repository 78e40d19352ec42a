"""ShardHasher: a shard's SHA-256 advanced over frozen prefixes while the shard arrives."""

from __future__ import annotations

import asyncio
import hashlib
import random

from wanxport.aio.verify import HASH_STEP_BYTES, ShardHasher


def data(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


async def test_digest_over_steps_equals_the_whole_buffer_digest() -> None:
    payload = data(3 * HASH_STEP_BYTES + 12345)
    buffer = bytearray(len(payload))
    hasher = ShardHasher(memoryview(buffer), asyncio.get_running_loop())
    frozen: list[int] = []

    def freeze(end: int) -> int:
        frozen.append(end)
        return end

    # The prefix arrives in uneven pieces; only growth by a whole step starts a job.
    for end in (1000, HASH_STEP_BYTES - 1, HASH_STEP_BYTES + 5, 2 * HASH_STEP_BYTES + 5,
                3 * HASH_STEP_BYTES):
        buffer[:end] = payload[:end]
        hasher.advance(lambda end=end: freeze(end))  # type: ignore[misc]
        await asyncio.sleep(0.01)  # let the worker finish before the next piece
    assert hasher.hashed == 2 * HASH_STEP_BYTES + 5
    buffer[:] = payload
    assert await hasher.finish() == hashlib.sha256(payload).digest()
    assert frozen == [1000, HASH_STEP_BYTES - 1, HASH_STEP_BYTES + 5, 2 * HASH_STEP_BYTES + 5,
                      3 * HASH_STEP_BYTES]


async def test_no_prefix_is_frozen_while_a_job_runs() -> None:
    payload = data(4 * HASH_STEP_BYTES)
    hasher = ShardHasher(memoryview(payload), asyncio.get_running_loop())
    calls = 0

    def freeze() -> int:
        nonlocal calls
        calls += 1
        return len(payload)

    hasher.advance(freeze)
    hasher.advance(freeze)  # the first job (16 MiB, milliseconds) is still running
    assert calls == 1
    assert await hasher.finish() == hashlib.sha256(payload).digest()


async def test_a_changed_byte_changes_the_digest() -> None:
    payload = bytearray(data(2 * HASH_STEP_BYTES))
    hasher = ShardHasher(memoryview(payload), asyncio.get_running_loop())
    hasher.advance(lambda: HASH_STEP_BYTES)
    payload[-1] ^= 1  # above the frozen prefix: still part of what is hashed at the end
    assert await hasher.finish() != hashlib.sha256(data(2 * HASH_STEP_BYTES)).digest()


async def test_an_empty_or_short_shard_is_hashed_at_finish() -> None:
    for payload in (b"", b"x" * 10):
        hasher = ShardHasher(memoryview(payload), asyncio.get_running_loop())
        hasher.advance(lambda payload=payload: len(payload))  # type: ignore[misc]
        assert await hasher.finish() == hashlib.sha256(payload).digest()
