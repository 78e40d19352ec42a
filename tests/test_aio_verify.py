"""ShardHasher: a shard's digest advanced over frozen prefixes as it arrives (a small one at once)."""

from __future__ import annotations

import asyncio
import random

from wanxport.aio.verify import HASH_STEP_BYTES, INLINE_HASH_BYTES, ShardHasher
from wanxport.core.digest import shard_digest


def data(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


async def test_digest_over_steps_equals_the_whole_buffer_digest() -> None:
    payload = data(3 * HASH_STEP_BYTES + 12345)
    buffer = bytearray(len(payload))
    frozen: list[int] = []
    hasher = ShardHasher(memoryview(buffer), asyncio.get_running_loop(), frozen.append)
    # The prefix arrives in uneven pieces; only growth by a whole step starts a job,
    # and the data path is frozen exactly where each job ends.
    for end in (1000, HASH_STEP_BYTES - 1, HASH_STEP_BYTES + 5, 2 * HASH_STEP_BYTES + 5,
                3 * HASH_STEP_BYTES):
        buffer[:end] = payload[:end]
        hasher.advance(end)
        if hasher._job is not None:
            await hasher._job  # the worker is done before the next piece arrives
    assert hasher.hashed == 2 * HASH_STEP_BYTES + 5
    assert frozen == [HASH_STEP_BYTES + 5, 2 * HASH_STEP_BYTES + 5]
    buffer[:] = payload
    assert await hasher.finish() == shard_digest(payload)


async def test_no_job_starts_while_one_runs() -> None:
    payload = data(8 * HASH_STEP_BYTES)
    frozen: list[int] = []
    hasher = ShardHasher(memoryview(payload), asyncio.get_running_loop(), frozen.append)
    hasher.advance(4 * HASH_STEP_BYTES)
    hasher.advance(len(payload))  # the first job (16 MiB, milliseconds) is still running
    assert frozen == [4 * HASH_STEP_BYTES] and hasher.hashed == 4 * HASH_STEP_BYTES
    assert await hasher.finish() == shard_digest(payload)


async def test_a_changed_byte_changes_the_digest() -> None:
    payload = bytearray(data(2 * HASH_STEP_BYTES))
    hasher = ShardHasher(memoryview(payload), asyncio.get_running_loop())
    hasher.advance(HASH_STEP_BYTES)
    payload[-1] ^= 1  # above the hashed prefix: still part of what is hashed at the end
    assert await hasher.finish() != shard_digest(data(2 * HASH_STEP_BYTES))


async def test_an_empty_or_short_shard_is_hashed_at_finish() -> None:
    for payload in (b"", b"x" * 10):
        hasher = ShardHasher(memoryview(payload), asyncio.get_running_loop())
        hasher.advance(len(payload))
        assert await hasher.finish() == shard_digest(payload)


async def test_a_small_shard_is_hashed_on_the_loop_and_a_large_one_is_not() -> None:
    small = data(64 << 10)
    hasher = ShardHasher(memoryview(small), asyncio.get_running_loop())
    assert hasher.finish_inline() == shard_digest(small)
    large = data(INLINE_HASH_BYTES + 1)
    hasher = ShardHasher(memoryview(large), asyncio.get_running_loop())
    assert hasher.finish_inline() is None  # its rest goes to a worker thread
    assert await hasher.finish() == shard_digest(large)
    started = data(2 * HASH_STEP_BYTES)
    hasher = ShardHasher(memoryview(started), asyncio.get_running_loop())
    hasher.advance(HASH_STEP_BYTES)
    assert hasher.finish_inline() is None  # a job ran in the background: finish() awaits it
    assert await hasher.finish() == shard_digest(started)
