"""A receiving session's per-packet state stays bounded however many shards it receives."""

from __future__ import annotations

from test_core_session import Pair, all_acknowledged, make_config, payloads

from wanxport.core.numbering import FORGET_AT_LEAST

BATCH, SHARD_BYTES = 4, 250_000


def test_a_receiver_forgets_the_wire_numbers_of_its_acknowledgements() -> None:
    """A receiver sends acknowledgements, which nothing tracks and no ACK answers, so
    its wire numbering was trimmed only when an ACK of one of its few tracked packets
    (a shard's verdict) came back on that path: on a path that carries none, every
    acknowledgement kept 8 bytes, up to 2^20 a path (the gateway daemon's receiver
    grew its live heap by ~2 MiB in 15 minutes of the soak). Batch after batch of
    shards must leave it within the trimming bound. An ACK for every data packet
    (``ack_threshold=1``), most of the data on path 1, so it sends many there."""
    pair = Pair(make_config(ack_threshold=1), owd_s=[0.02, 0.01], rate_bps=[50e6, 200e6])
    receiver = pair.b
    kept: list[list[int]] = []
    for batch in range(6):
        for shard_id, data in enumerate(payloads(BATCH, SHARD_BYTES, seed=batch), start=batch * BATCH):
            pair.submit("a", shard_id, data)
        pair.run(pair.now + 30.0, stop=all_acknowledged((batch + 1) * BATCH))
        assert len(pair.acknowledged("a")) == (batch + 1) * BATCH
        kept.append([len(numbering) for numbering in receiver._tx.wire])
    sent = [path.loss.next_pn for path in receiver.paths]
    assert max(sent) > 3 * FORGET_AT_LEAST, sent  # enough to grow past the bound on one path
    assert all(n <= 2 * FORGET_AT_LEAST for per_path in kept for n in per_path), (kept, sent)
