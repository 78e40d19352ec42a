"""Fuzz target: what a path's port parses before any authentication.

A datagram from anyone reaches, in order: the first-byte demultiplexer
(``is_quic`` / ``is_data_plane``), for QUIC-looking bytes aioquic's header
parser as the control server calls it (``pull_quic_header``, which must fail
only with ValueError), and for data-plane bytes the header decoder and the
receiver's pre-authentication checks. Invariants: the demultiplexer's two
answers never both hold; a decoded header re-encodes to the same 16 bytes;
a receiver counts each datagram under exactly one reason and accepts only
what authenticated (the key is real AES-256-GCM; the corpus holds one genuine
datagram, so mutations start next to the checks a forger must pass).

    python fuzz/fuzz_header.py -runs=1000000 /tmp/fuzz-header fuzz/corpus/header
"""

from __future__ import annotations

import harness


def load() -> harness.Check:
    from aioquic.buffer import Buffer
    from aioquic.quic.packet import pull_quic_header

    from wanxport.wire.errors import WireError
    from wanxport.wire.header import HEADER_LEN, decode_header, is_data_plane, is_quic
    from wanxport.wire.protection import AeadProtection
    from wanxport.wire.receiver import ReferenceReceiver

    receiver = ReferenceReceiver(conn_id=0x10203040, n_paths=4)
    receiver.set_key(0, AeadProtection("aes-256-gcm", bytes(range(32)), bytes(12)))

    def check(data: bytes) -> None:
        quic, ours = is_quic(data), is_data_plane(data)
        assert not (quic and ours), "a datagram demultiplexed both ways"
        if quic:
            try:
                pull_quic_header(Buffer(data=data), host_cid_length=8)
            except ValueError:
                pass
        try:
            header = decode_header(data)
        except WireError:
            pass
        else:
            assert header.encode() == data[:HEADER_LEN], "header does not round-trip"
        before = dict(receiver.counters)
        result = receiver.process([data])
        delta = {k: v - before[k] for k, v in receiver.counters.items() if v != before[k]}
        opened = delta.pop("opened_phase0", 0) + delta.pop("opened_phase1", 0)
        assert list(delta.values()) == [1], f"not counted under exactly one reason: {delta}"
        assert len(result.placed) + len(result.controls) == opened, "accepted without authenticating"
        assert len(result.quic) == int(quic)

    return check


if __name__ == "__main__":
    harness.run(load)
