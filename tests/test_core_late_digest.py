"""Digests that follow their shard (``core.late_digest``): the data leaves unhashed, the receiver
verifies once the digest is in, and a wrong byte or a wrong digest still fails the shard."""

from __future__ import annotations

from test_core_session import Pair, all_acknowledged, data_frames, make_config, payloads

from wanxport.core.digest import shard_digest
from wanxport.core.flow import ReceiveBudget
from wanxport.core.incoming import IncomingData, allocate_bytearray
from wanxport.core.late_digest import MAX_EARLY, LateDigests
from wanxport.wire.frames import (
    DataFrame,
    Frame,
    ShardDigestFrame,
    ShardOpenFrame,
    decode_frames,
    encode_frames,
)
from wanxport.wire.header import HEADER_LEN


def frames_to_b(pair: Pair) -> list[Frame]:
    return [f for d in pair.delivered if d.side == "b" for f in d.frames]


def submit_unhashed(pair: Pair, shard_id: int, data: bytes) -> None:
    pair.a.submit(shard_id, data, pair.now, digest_later=True)
    pair.service("a")


def test_data_leaves_before_the_digest_and_the_shard_waits_for_it() -> None:
    (data,) = payloads(1, 60_000)
    pair = Pair(make_config(fec="off"), owd_s=[0.01, 0.02], rate_bps=[50e6, 50e6])
    submit_unhashed(pair, 0, data)
    pair.run(until=2.0)  # every byte can arrive meanwhile; the digest has not been given
    frames = frames_to_b(pair)
    assert sum(f.length for f in data_frames(frames)) >= len(data)
    assert [f.digest for f in frames if isinstance(f, ShardOpenFrame)][0] is None
    assert pair.received("b") == [], "no verdict without the digest"
    pair.a.set_digest(0, shard_digest(data))
    pair.service("a")
    pair.run(until=10.0, stop=all_acknowledged(1))
    assert [(e.shard_id, e.ok, e.digest) for e in pair.received("b")] == [(0, True, shard_digest(data))]
    assert [(e.shard_id, e.ok) for e in pair.acknowledged("a")] == [(0, True)]
    assert any(isinstance(f, ShardDigestFrame) for f in frames_to_b(pair))
    assert bytes(pair.buffers["b"][0]) == data


def test_a_digest_known_before_the_open_rides_in_it() -> None:
    (data,) = payloads(1, 20_000, seed=3)
    pair = Pair(make_config(), owd_s=[0.01, 0.01], rate_bps=[50e6, 50e6])
    pair.a.submit(0, data, pair.now, digest_later=True)
    pair.a.set_digest(0, shard_digest(data))
    pair.service("a")
    pair.run(until=10.0, stop=all_acknowledged(1))
    frames = frames_to_b(pair)
    assert not any(isinstance(f, ShardDigestFrame) for f in frames)
    assert {f.digest for f in frames if isinstance(f, ShardOpenFrame)} == {shard_digest(data)}
    assert [e.ok for e in pair.received("b")] == [True]


def test_a_substituted_digest_or_byte_still_fails_the_shard() -> None:
    shards = payloads(2, 30_000, seed=4)
    corrupted = [False]

    def mutate(side: str, path_id: int, at: float, datagram: bytes) -> bytes:
        frames = decode_frames(datagram[HEADER_LEN:])
        if corrupted[0] or side != "a" or not (len(frames) == 1 and isinstance(frames[0], DataFrame)
                                               and frames[0].shard_id == 1 and frames[0].offset > 0):
            return datagram
        damaged = bytearray(datagram)
        damaged[HEADER_LEN + 15 + 3] ^= 0x01  # a byte of the DATA frame's data
        corrupted[0] = True
        return bytes(damaged)

    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[20e6, 20e6], mutate=mutate)
    for shard_id, data in enumerate(shards):
        submit_unhashed(pair, shard_id, data)
    pair.run(until=1.0)
    pair.a.set_digest(0, shard_digest(shards[0][:-1] + b"?"))  # not what was sent
    pair.a.set_digest(1, shard_digest(shards[1]))  # right, but a byte changes on the way
    pair.service("a")
    pair.run(until=20.0, stop=all_acknowledged(2))
    assert corrupted[0]
    assert sorted((e.shard_id, e.ok) for e in pair.received("b")) == [(0, False), (1, False)]
    assert sorted((e.shard_id, e.ok) for e in pair.acknowledged("a")) == [(0, False), (1, False)]


def test_early_and_conflicting_digests() -> None:
    incoming = IncomingData(ReceiveBudget(1 << 20), allocate_bytearray)
    late = LateDigests(incoming)
    assert late.learn(5, b"d" * 32)  # before its shard opened: held
    assert incoming.open(ShardOpenFrame(5, 10, None))
    assert late.opened(5) and incoming.shards[5].digest == b"d" * 32
    assert not late.learn(5, b"e" * 32) and "differs" in late.refusal
    assert not late.learn(5, b"short") and "5 bytes" in late.refusal
    for shard_id in range(MAX_EARLY):
        assert late.learn(100 + shard_id, b"x" * 32)
    assert not late.learn(99, b"x" * 32) and "not opened" in late.refusal
    assert incoming.open(ShardOpenFrame(100, 10, None)) and late.opened(100)  # no longer held
    assert late.learn(99, b"x" * 32)
    incoming.finish(incoming.shards[5], 0.0)
    assert late.learn(5, b"f" * 32), "a digest for a shard already handed over is moot"


def test_unhashed_open_and_digest_frames_round_trip() -> None:
    frames: list[Frame] = [ShardOpenFrame(7, 1 << 40, None, b'{"a":1}'),
                           ShardDigestFrame(7, bytes(range(32))), ShardOpenFrame(8, 3, b"z" * 32)]
    encoded = encode_frames(frames)
    assert len(encoded) == sum(f.wire_size for f in frames)
    assert decode_frames(encoded) == frames


def test_a_lost_digest_is_sent_again() -> None:
    (data,) = payloads(1, 30_000, seed=5)
    lost = [0]

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        if side == "a" and not lost[0] and any(isinstance(f, ShardDigestFrame) for f in frames):
            lost[0] += 1
            return True
        return False

    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[50e6, 50e6], drop=drop)
    submit_unhashed(pair, 0, data)
    pair.run(until=0.5)
    pair.a.set_digest(0, shard_digest(data))
    pair.service("a")
    pair.run(until=20.0, stop=all_acknowledged(1))
    assert lost[0] == 1
    assert [(e.shard_id, e.ok) for e in pair.received("b")] == [(0, True)]
